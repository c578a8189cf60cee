//! The records in memory ([`Inner`]) and the verbs that change them: its
//! maps are private to the store, and every verb marks the rows it
//! touched (`dirty`) for the store to write with the change that made it.
//! Nothing outside the store reaches a map but through these verbs or the
//! read-only views below.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::local::connectors::ConnectorRecord;
use crate::local::error::{LocalError, LocalResult};
use crate::local::records::*;
use crate::local::search::ContextIndex;
use crate::types;

mod contexts;
mod tasks;
mod turns;

pub(crate) use turns::{new_query_id, new_session_id};

/// Most tasks kept; the oldest finished ones are forgotten first.
const MAX_TASKS: usize = 10_000;
/// Most sessions kept; the oldest idle ones are forgotten first.
const MAX_SESSIONS: usize = 10_000;
/// Most contexts.
const MAX_CONTEXTS: usize = 1_000;

/// What changed since the last write to the database.
#[derive(Debug, Default)]
pub(super) struct Dirty {
    /// Ids of the records made since then: their rows are inserted, never
    /// written over an existing row.
    pub(super) created: BTreeSet<String>,
    pub(super) contexts: BTreeSet<String>,
    /// Sources by context: `None` replaces them all, else these paths.
    pub(super) sources: BTreeMap<String, Option<BTreeSet<String>>>,
    pub(super) tasks: BTreeSet<String>,
    pub(super) sessions: BTreeSet<String>,
    pub(super) queries: BTreeSet<String>,
    pub(super) connectors: BTreeSet<String>,
}

impl Dirty {
    pub(super) fn is_empty(&self) -> bool {
        self.created.is_empty()
            && self.contexts.is_empty()
            && self.sources.is_empty()
            && self.tasks.is_empty()
            && self.sessions.is_empty()
            && self.queries.is_empty()
            && self.connectors.is_empty()
    }
}

/// The state in memory: contexts, indexes, tasks, sessions, and the turns
/// running or recently ended (older turns are read from the database).
/// Every change marks what it touched in `dirty`; the store writes those
/// rows.
#[derive(Debug, Default)]
pub(crate) struct Inner {
    pub(super) contexts: BTreeMap<String, ContextRecord>,
    pub(super) indexes: HashMap<String, Arc<ContextIndex>>,
    pub(super) tasks: BTreeMap<String, TaskEntry>,
    pub(super) sessions: HashMap<String, SessionEntry>,
    pub(super) queries: HashMap<String, QueryEntry>,
    pub(super) query_order: VecDeque<String>,
    pub(super) connectors: BTreeMap<String, ConnectorRecord>,
    /// The jobs working on each context's files (curations, imports,
    /// workflows), by context id: a deletion waits for them to stop.
    pub(super) context_jobs: HashMap<String, TaskTracker>,
    /// Slugs of contexts being built aside (a fork copying its sources):
    /// taken, though no record exists until the context is published.
    pub(super) reserved_slugs: BTreeSet<String>,
    pub(super) dirty: Dirty,
}

impl Inner {
    /// Adds (or replaces) a connector; its row is written with the change.
    pub(crate) fn put_connector(&mut self, rec: ConnectorRecord) {
        self.dirty.connectors.insert(rec.id.clone());
        self.dirty.created.insert(rec.id.clone());
        self.connectors.insert(rec.id.clone(), rec);
    }

    /// A connector, to change: its row is written with the change.
    pub(crate) fn connector_mut(&mut self, id: &str) -> Option<&mut ConnectorRecord> {
        let c = self.connectors.get_mut(id)?;
        self.dirty.connectors.insert(id.to_owned());
        Some(c)
    }

    /// Removes a connector; its row goes with the change.
    pub(crate) fn remove_connector(&mut self, id: &str) -> Option<ConnectorRecord> {
        let c = self.connectors.remove(id)?;
        self.dirty.connectors.insert(id.to_owned());
        Some(c)
    }
}

/// Read-only views of the maps.
impl Inner {
    /// The contexts, by id.
    pub(crate) fn contexts(&self) -> &BTreeMap<String, ContextRecord> {
        &self.contexts
    }

    /// The open indexes of curated contexts, by context id.
    pub(crate) fn indexes(&self) -> &HashMap<String, Arc<ContextIndex>> {
        &self.indexes
    }

    /// The tasks kept, by id.
    pub(crate) fn tasks(&self) -> &BTreeMap<String, TaskEntry> {
        &self.tasks
    }

    /// The sessions, by id.
    pub(crate) fn sessions(&self) -> &HashMap<String, SessionEntry> {
        &self.sessions
    }

    /// The turns in memory (running, or recently ended), by id.
    #[cfg(test)]
    pub(crate) fn queries(&self) -> &HashMap<String, QueryEntry> {
        &self.queries
    }

    /// The connectors, by id.
    pub(crate) fn connectors(&self) -> &BTreeMap<String, ConnectorRecord> {
        &self.connectors
    }
}

/// Verbs on what lives in memory only (never written): holds, reserved
/// slugs, running flags and a running turn's steps.
impl Inner {
    /// Holds a context's source tree as it is (no import starts) until
    /// [`Inner::release_sources`].
    pub(crate) fn hold_sources(&mut self, context_id: &str) -> LocalResult<()> {
        let ctx = self
            .contexts
            .get_mut(context_id)
            .ok_or_else(|| LocalError::not_found(format!("context {context_id:?} not found")))?;
        ctx.sources_held = ctx.sources_held.saturating_add(1);
        Ok(())
    }

    /// Ends one hold of [`Inner::hold_sources`].
    pub(crate) fn release_sources(&mut self, context_id: &str) {
        if let Some(ctx) = self.contexts.get_mut(context_id) {
            ctx.sources_held = ctx.sources_held.saturating_sub(1);
        }
    }

    /// Takes a slug for a context being built aside.
    pub(crate) fn reserve_slug(&mut self, slug: &str) {
        self.reserved_slugs.insert(slug.to_owned());
    }

    /// Frees a slug [`Inner::reserve_slug`] took.
    pub(crate) fn release_slug(&mut self, slug: &str) {
        self.reserved_slugs.remove(slug);
    }

    /// Clears a context's running curation or import flag when
    /// `task_id` is the job it names.
    pub(crate) fn end_context_job(&mut self, context_id: &str, task_id: &str) {
        if let Some(ctx) = self.contexts.get_mut(context_id) {
            if ctx.curate_task_id.as_deref() == Some(task_id) {
                ctx.curating = false;
            }
            if ctx.import_task_id.as_deref() == Some(task_id) {
                ctx.importing = false;
            }
        }
    }

    /// Sets a running turn's steps (saved with its end).
    pub(crate) fn set_query_steps(&mut self, query_id: &str, steps: Vec<types::QueryStep>) {
        if let Some(e) = self.queries.get_mut(query_id) {
            e.query.steps = steps;
        }
    }
}
