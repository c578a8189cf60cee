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
pub use pages::{DEFAULT_MAX_ITEMS, DEFAULT_PAGE_SIZE, ListFiles, Page, Pages};
pub use queries::Queries;
pub use sessions::{ListSessions, Sessions};
pub use sources::{ImportProgress, Sources, UploadProgress};
pub use tasks::{ListTasks, TaskWait, Tasks};

use crate::{Client, Result, types};

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
    pub async fn models(&self) -> Result<types::ModelCatalog> {
        self.call("list_models", self.api().list_models(None)).await
    }
}

impl types::ContextResponse {
    /// Whether the context can be queried now: a `work` context at once, a
    /// `search` context once it has been curated.
    ///
    /// ```
    /// # let json = serde_json::json!({"id":"1","slug":"docs","name":"Docs","kind":"search",
    /// #   "created_by":"me","description":"","is_optimizing":false,"has_sources":true,
    /// #   "is_curating":false,"is_importing":false,"is_exploring":false,"is_restoring":false,
    /// #   "is_grooming":false,"created_at":"2026-07-01T00:00:00Z","updated_at":"2026-07-01T00:00:00Z"});
    /// let ctx: nexus_knowql::types::ContextResponse = serde_json::from_value(json).unwrap();
    /// assert!(!ctx.is_queryable()); // a search context that was never curated
    /// ```
    pub fn is_queryable(&self) -> bool {
        self.kind.as_str() == "work" || self.last_curated_at.is_some()
    }
}

impl types::Query {
    /// The answer text: every `output[].content[].text`, concatenated.
    pub fn answer_text(&self) -> String {
        self.output
            .iter()
            .flat_map(|o| o.content.iter())
            .map(|c| c.text.as_str())
            .collect()
    }

    /// Whether the turn has ended (`completed`, `failed` or `cancelled`).
    pub fn is_terminal(&self) -> bool {
        matches!(self.status.as_str(), "completed" | "failed" | "cancelled")
    }
}
