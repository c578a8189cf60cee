//! Everyday calls over the generated layer, grouped as the API's tags are.
//!
//! Each group is a short-lived handle borrowed from the [`Client`]:
//! `client.contexts().list()`, `client.tasks().get(id)`, and so on. What is
//! not here stays reachable through [`Client::api`].

mod contexts;
mod knowledge;
mod pages;
mod queries;
mod sessions;
mod sources;
mod tasks;

pub use contexts::{Contexts, CurateOptions};
pub use knowledge::Knowledge;
pub use pages::{DEFAULT_MAX_ITEMS, DEFAULT_PAGE_SIZE, Items, ListFiles, Page, Pages};
pub use queries::Queries;
pub use sessions::{ListSessions, Sessions};
pub use sources::{ImportProgress, Sources, UploadProgress};
pub use tasks::{ListTasks, TaskWait, Tasks};

use crate::{Client, types};

impl Client {
    /// Contexts: list, get, create, update, delete, curate.
    pub fn contexts(&self) -> Contexts<'_> {
        Contexts { client: self }
    }

    /// Source files of one context: upload, import a directory, list.
    pub fn sources<'a>(&'a self, context: &'a str) -> Sources<'a> {
        Sources {
            client: self,
            slug: context,
        }
    }

    /// Curated knowledge of one context: list and read.
    pub fn knowledge<'a>(&'a self, context: &'a str) -> Knowledge<'a> {
        Knowledge {
            client: self,
            slug: context,
        }
    }

    /// Tasks: get, list, cancel, wait.
    pub fn tasks(&self) -> Tasks<'_> {
        Tasks { client: self }
    }

    /// Stored sessions: list, get, delete.
    pub fn sessions(&self) -> Sessions<'_> {
        Sessions { client: self }
    }

    /// Stored query turns: get, cancel, trace, feedback.
    pub fn queries(&self) -> Queries<'_> {
        Queries { client: self }
    }

    /// `GET /models`: the models a query may name.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub fn models(&self) -> crate::client::Call<'_, types::ModelCatalog> {
        crate::client::Call::new(self.call_meta("list_models", self.api().list_models()))
    }
}
