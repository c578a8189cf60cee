//! The server's records (contexts and their sources, tasks, sessions,
//! query turns) as kept in memory, and the rules that change them. Every
//! change marks the rows it touched, for the store to write.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

use super::connectors::ConnectorRecord;
use super::error::{LocalError, LocalResult};
use super::events::EventLog;
use super::ledger::Ledger;
use super::search::{Chunk, ContextIndex};
use crate::types;

/// The model every local answer is attributed to.
pub(crate) const LOCAL_MODEL: &str = "local-extractive";
/// The principal and project every local caller is.
pub(crate) const LOCAL_PRINCIPAL: &str = "local";
pub(crate) const LOCAL_PROJECT: &str = "local";
pub(crate) const LOCAL_PROJECT_NAME: &str = "nexus-local";

/// Most tasks kept; the oldest finished ones are forgotten first.
const MAX_TASKS: usize = 10_000;
/// Most sessions kept; the oldest idle ones are forgotten first.
const MAX_SESSIONS: usize = 10_000;
/// Most contexts.
const MAX_CONTEXTS: usize = 1_000;

static ID_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh id body: milliseconds and a process counter, fixed width so ids
/// sort by creation.
pub(crate) fn new_id_raw() -> String {
    let millis = Utc::now().timestamp_millis().max(0) as u64;
    let n = ID_COUNTER.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
    format!("{millis:012x}{n:06x}")
}

pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", new_id_raw())
}

/// A record as JSON text (records always serialize).
pub(crate) fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "{}".to_owned())
}

/// Size and time of a source, as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SourceMeta {
    pub(crate) size: u64,
    pub(crate) mtime: DateTime<Utc>,
}

/// A context as the server keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ContextRecord {
    pub(crate) id: String,
    pub(crate) slug: String,
    pub(crate) name: String,
    pub(crate) kind: String,
    pub(crate) description: Option<String>,
    pub(crate) guide: Option<String>,
    pub(crate) manifest: Option<types::Manifest>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
    pub(crate) last_curated_at: Option<DateTime<Utc>>,
    pub(crate) last_source_import_at: Option<DateTime<Utc>>,
    pub(crate) curate_task_id: Option<String>,
    pub(crate) import_task_id: Option<String>,
    #[serde(skip)]
    pub(crate) curating: bool,
    #[serde(skip)]
    pub(crate) importing: bool,
    /// Jobs that need the source tree to stay as it is (a fork copying
    /// it, a removal deleting files): no import starts while any runs.
    #[serde(skip)]
    pub(crate) sources_held: u32,
    pub(crate) sample_queries: Vec<String>,
    /// Bumped by every curation; names the index directory.
    pub(crate) index_generation: u64,
    /// Kept as rows of their own in the database.
    #[serde(default, skip_serializing)]
    pub(crate) sources: BTreeMap<String, SourceMeta>,
    /// What the latest curation recorded.
    #[serde(default)]
    pub(crate) ledger: Option<Ledger>,
}

impl ContextRecord {
    /// The API's view of this context.
    pub(crate) fn to_response(&self) -> types::ContextResponse {
        types::ContextResponse {
            created_at: self.created_at,
            created_by: LOCAL_PRINCIPAL.to_owned(),
            curate_task_id: self.curate_task_id.clone(),
            description: self.description.clone(),
            explore_task_id: None,
            groom_artifact_count: None,
            groom_task_id: None,
            guide: self.guide.clone(),
            has_sources: !self.sources.is_empty(),
            id: self.id.clone(),
            import_task_id: self.import_task_id.clone(),
            is_curating: self.curating,
            is_exploring: false,
            is_grooming: false,
            is_importing: self.importing,
            is_optimizing: false,
            is_restoring: false,
            kind: types::ContextKind(self.kind.clone()),
            last_curated_at: self.last_curated_at,
            last_groomed_at: None,
            last_optimized_at: None,
            last_source_import_at: self.last_source_import_at,
            manifest: self.manifest.clone(),
            manifest_suggestion: None,
            name: self.name.clone(),
            optimize_iterations: None,
            optimize_score: None,
            optimize_task_id: None,
            restore_task_id: None,
            sample_queries: self.sample_queries.clone(),
            slug: self.slug.clone(),
            stats: None,
            updated_at: self.updated_at,
            workspace: None,
        }
    }

    /// Whether a turn may search this context now.
    pub(crate) fn is_queryable(&self) -> bool {
        self.kind == "work" || self.last_curated_at.is_some()
    }
}

/// A task and the token that stops it.
#[derive(Debug, Clone)]
pub(crate) struct TaskEntry {
    pub(crate) task: types::TaskResponse,
    pub(crate) cancel: CancellationToken,
    /// Past its point of no return: a cancellation no longer stops it.
    pub(crate) committed: bool,
}

/// A session as the server keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SessionEntry {
    pub(crate) session: types::Session,
    /// The scoped contexts, by id (slugs may change).
    pub(crate) context_ids: Vec<String>,
    /// The turn running now, if any.
    #[serde(skip)]
    pub(crate) in_flight: Option<String>,
}

/// A query turn, its event log and the token that cancels it.
#[derive(Debug, Clone)]
pub(crate) struct QueryEntry {
    pub(crate) query: types::Query,
    pub(crate) trace: Option<types::Trace>,
    pub(crate) log: Arc<EventLog>,
    pub(crate) cancel: CancellationToken,
    /// The number of the newest write of this turn sent to the database.
    pub(crate) saved_seq: u64,
    /// Whether its events have been sent to the database.
    pub(crate) events_saved: bool,
}

/// What changed since the last write to the database.
#[derive(Debug, Default)]
pub(crate) struct Dirty {
    pub(crate) contexts: BTreeSet<String>,
    /// Sources by context: `None` replaces them all, else these paths.
    pub(crate) sources: BTreeMap<String, Option<BTreeSet<String>>>,
    pub(crate) tasks: BTreeSet<String>,
    pub(crate) sessions: BTreeSet<String>,
    pub(crate) queries: BTreeSet<String>,
    pub(crate) connectors: BTreeSet<String>,
}

impl Dirty {
    pub(crate) fn is_empty(&self) -> bool {
        self.contexts.is_empty()
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
    pub(crate) contexts: BTreeMap<String, ContextRecord>,
    pub(crate) indexes: HashMap<String, Arc<ContextIndex>>,
    pub(crate) tasks: BTreeMap<String, TaskEntry>,
    pub(crate) sessions: HashMap<String, SessionEntry>,
    pub(crate) queries: HashMap<String, QueryEntry>,
    pub(crate) query_order: VecDeque<String>,
    pub(crate) connectors: BTreeMap<String, ConnectorRecord>,
    /// The jobs working on each context's files (curations, imports,
    /// workflows), by context id: a deletion waits for them to stop.
    pub(crate) context_jobs: HashMap<String, TaskTracker>,
    pub(crate) dirty: Dirty,
}

/// Opens the persisted index of one generation.
pub(crate) fn open_index(ctx_dir: &Path, generation: u64) -> Result<ContextIndex, String> {
    let chunks_file = ctx_dir.join(format!("chunks-{generation}.json"));
    let text = std::fs::read(&chunks_file).map_err(|e| e.to_string())?;
    let chunks: Vec<Chunk> = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    ContextIndex::open(&ctx_dir.join(format!("index-{generation}")), chunks)
        .map_err(|e| e.to_string())
}

/// Whether a slug is acceptable: 1-64 of `a-z 0-9 - _`, starting alphanumeric.
pub(crate) fn valid_slug(slug: &str) -> bool {
    (1..=64).contains(&slug.len())
        && slug
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && slug.as_bytes()[0].is_ascii_alphanumeric()
}
impl Inner {
    /// A context by slug or id.
    pub(crate) fn context(&self, key: &str) -> LocalResult<&ContextRecord> {
        self.context_id(key)
            .and_then(|id| self.contexts.get(&id))
            .ok_or_else(|| LocalError::not_found(format!("context {key:?} not found")))
    }

    pub(crate) fn context_mut(&mut self, key: &str) -> LocalResult<&mut ContextRecord> {
        let id = self
            .context_id(key)
            .ok_or_else(|| LocalError::not_found(format!("context {key:?} not found")))?;
        self.contexts
            .get_mut(&id)
            .ok_or_else(|| LocalError::not_found(format!("context {key:?} not found")))
    }

    pub(crate) fn context_id(&self, key: &str) -> Option<String> {
        if self.contexts.contains_key(key) {
            return Some(key.to_owned());
        }
        self.contexts
            .values()
            .find(|c| c.slug == key)
            .map(|c| c.id.clone())
    }

    pub(crate) fn create_context(
        &mut self,
        req: types::CreateContextRequest,
    ) -> LocalResult<ContextRecord> {
        if let Some(m) = &req.manifest {
            super::manifest_bounds::check(m)?;
        }
        if !valid_slug(&req.slug) {
            return Err(LocalError::bad_request(format!(
                "invalid slug {:?}: use 1-64 lower-case letters, digits, '-' or '_'",
                req.slug
            )));
        }
        if req.name.trim().is_empty() {
            return Err(LocalError::bad_request("name must not be empty"));
        }
        let kind = req.kind.map(|k| k.0).unwrap_or_else(|| "search".to_owned());
        if !matches!(kind.as_str(), "search" | "work") {
            return Err(LocalError::bad_request(format!(
                "unknown context kind {kind:?}: use search or work"
            )));
        }
        if self.context_id(&req.slug).is_some() {
            return Err(LocalError::conflict(format!(
                "context {:?} already exists",
                req.slug
            )));
        }
        if self.contexts.len() >= MAX_CONTEXTS {
            return Err(LocalError::conflict(format!(
                "the local server holds at most {MAX_CONTEXTS} contexts"
            )));
        }
        let now = Utc::now();
        let rec = ContextRecord {
            id: new_id("ctx"),
            slug: req.slug,
            name: req.name,
            kind,
            description: req.description,
            guide: req.guide,
            manifest: req.manifest,
            created_at: now,
            updated_at: now,
            last_curated_at: None,
            last_source_import_at: None,
            curate_task_id: None,
            import_task_id: None,
            curating: false,
            importing: false,
            sources_held: 0,
            sample_queries: Vec::new(),
            index_generation: 0,
            sources: BTreeMap::new(),
            ledger: None,
        };
        self.contexts.insert(rec.id.clone(), rec.clone());
        self.dirty.contexts.insert(rec.id.clone());
        Ok(rec)
    }

    /// Applies an update to a context (slug, name, description, guide,
    /// manifest); returns it as updated.
    pub(crate) fn update_context(
        &mut self,
        key: &str,
        req: types::UpdateContextRequest,
    ) -> LocalResult<&ContextRecord> {
        if let Some(m) = &req.manifest {
            super::manifest_bounds::check(m)?;
        }
        let id = self.context(key)?.id.clone();
        if let Some(new_slug) = &req.slug {
            if !valid_slug(new_slug) {
                return Err(LocalError::bad_request(format!(
                    "invalid slug {new_slug:?}"
                )));
            }
            if self.context_id(new_slug).is_some_and(|other| other != id) {
                return Err(LocalError::conflict(format!(
                    "context {new_slug:?} already exists"
                )));
            }
        }
        if req.name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            return Err(LocalError::bad_request("name must not be empty"));
        }
        let ctx = self.context_mut(&id)?;
        if let Some(v) = req.slug {
            ctx.slug = v;
        }
        if let Some(v) = req.name {
            ctx.name = v;
        }
        if let Some(v) = req.description {
            ctx.description = Some(v);
        }
        if let Some(v) = req.guide {
            ctx.guide = Some(v);
        }
        if let Some(v) = req.manifest {
            ctx.manifest = Some(v);
        }
        ctx.updated_at = Utc::now();
        self.dirty.contexts.insert(id.clone());
        self.context(&id)
    }

    /// Records feedback on a query.
    pub(crate) fn set_feedback(
        &mut self,
        id: &str,
        feedback: types::QueryFeedback,
    ) -> LocalResult<()> {
        let q = self
            .queries
            .get_mut(id)
            .ok_or_else(|| LocalError::not_found(format!("query {id:?} not found")))?;
        q.query.feedback = Some(feedback);
        self.dirty.queries.insert(id.to_owned());
        Ok(())
    }

    /// Removes a session and cancels its running turn; whether it existed.
    pub(crate) fn delete_session(&mut self, id: &str) -> bool {
        let Some(s) = self.sessions.remove(id) else {
            return false;
        };
        self.dirty.sessions.insert(id.to_owned());
        if let Some(entry) = s.in_flight.and_then(|q| self.queries.get(&q)) {
            entry.cancel.cancel();
        }
        true
    }

    /// A token for a job about to work on a context's files, held until
    /// the job has ended: a deletion of the context waits for it. Take it
    /// in the same lock as the check that the context exists.
    pub(crate) fn context_job(&mut self, context_id: &str) -> TaskTrackerToken {
        self.context_jobs
            .entry(context_id.to_owned())
            .or_default()
            .token()
    }

    /// Removes a context; returns it, the tokens of its running tasks and
    /// the tracker of its jobs (closed: wait on it before removing its
    /// files).
    pub(crate) fn delete_context(
        &mut self,
        key: &str,
    ) -> LocalResult<(ContextRecord, Vec<CancellationToken>, TaskTracker)> {
        let id = self
            .context_id(key)
            .ok_or_else(|| LocalError::not_found(format!("context {key:?} not found")))?;
        let rec = self
            .contexts
            .remove(&id)
            .ok_or_else(|| LocalError::not_found(format!("context {key:?} not found")))?;
        self.indexes.remove(&id);
        self.dirty.contexts.insert(id.clone());
        self.dirty.sources.remove(&id);
        let tokens = self
            .tasks
            .values()
            .filter(|t| t.task.context_id.as_deref() == Some(id.as_str()))
            .filter(|t| !task_is_terminal(t.task.state.as_str()))
            .map(|t| t.cancel.clone())
            .collect();
        let jobs = self.context_jobs.remove(&id).unwrap_or_default();
        jobs.close();
        Ok((rec, tokens, jobs))
    }

    /// Replaces the source list of a context (its files are already in place).
    pub(crate) fn replace_sources(
        &mut self,
        context_id: &str,
        sources: BTreeMap<String, SourceMeta>,
        now: DateTime<Utc>,
    ) -> LocalResult<()> {
        let ctx = self.context_mut(context_id)?;
        ctx.sources = sources;
        ctx.last_source_import_at = Some(now);
        ctx.updated_at = now;
        let id = ctx.id.clone();
        self.dirty.contexts.insert(id.clone());
        self.dirty.sources.insert(id, None);
        Ok(())
    }

    /// Records files moved into a context's source tree; returns whether it
    /// is a work context.
    pub(crate) fn add_sources(
        &mut self,
        context_id: &str,
        files: &[(String, u64)],
        now: DateTime<Utc>,
    ) -> LocalResult<bool> {
        let ctx = self.context_mut(context_id)?;
        for (path, size) in files {
            ctx.sources.insert(
                path.clone(),
                SourceMeta {
                    size: *size,
                    mtime: now,
                },
            );
        }
        ctx.last_source_import_at = Some(now);
        ctx.updated_at = now;
        let is_work = ctx.kind == "work";
        let id = ctx.id.clone();
        self.dirty.contexts.insert(id.clone());
        self.mark_sources(&id, files.iter().map(|(p, _)| p.clone()));
        Ok(is_work)
    }

    /// Swaps in a curated index and marks the context queryable.
    pub(crate) fn apply_index(
        &mut self,
        context_id: &str,
        index: Arc<ContextIndex>,
        generation: u64,
        samples: Vec<String>,
        now: DateTime<Utc>,
    ) -> LocalResult<()> {
        let ctx = self.context_mut(context_id)?;
        ctx.last_curated_at = Some(now);
        ctx.updated_at = now;
        ctx.index_generation = generation;
        ctx.sample_queries = samples;
        self.dirty.contexts.insert(context_id.to_owned());
        self.indexes.insert(context_id.to_owned(), index);
        Ok(())
    }

    /// Registers a new running task.
    pub(crate) fn new_task(
        &mut self,
        workflow: &str,
        context_id: Option<&str>,
        session_id: Option<&str>,
        input: types::TaskInput,
        cancel: CancellationToken,
    ) -> types::TaskResponse {
        let now = Utc::now();
        let task = types::TaskResponse {
            agent_id: None,
            archived_at: None,
            context_id: context_id.map(str::to_owned),
            created_at: now,
            created_by: LOCAL_PRINCIPAL.to_owned(),
            error: None,
            id: new_id("tsk"),
            input,
            last_activity_at: Some(now),
            output: None,
            parent_task_id: None,
            progress: Some(types::TaskProgress {
                eta_seconds: None,
                label: "queued".to_owned(),
                pct: 0.0,
                phase: 0,
                phases: 1,
            }),
            project_id: LOCAL_PROJECT.to_owned(),
            running_from: Some(now),
            runtime_seconds: 0,
            schedule: None,
            scheduled_at: None,
            session_id: session_id.map(str::to_owned),
            state: types::TaskState("running".to_owned()),
            steps: Vec::new(),
            timeout_at: None,
            timeout_seconds: None,
            tokens_completion: 0,
            tokens_prompt: 0,
            workflow: types::Workflow(workflow.to_owned()),
        };
        self.tasks.insert(
            task.id.clone(),
            TaskEntry {
                task: task.clone(),
                cancel,
                committed: false,
            },
        );
        self.dirty.tasks.insert(task.id.clone());
        self.evict_tasks();
        task
    }

    fn evict_tasks(&mut self) {
        while self.tasks.len() > MAX_TASKS {
            let oldest_done = self
                .tasks
                .iter()
                .find(|(_, t)| task_is_terminal(t.task.state.as_str()))
                .map(|(id, _)| id.clone());
            match oldest_done {
                Some(id) => {
                    self.tasks.remove(&id);
                    self.dirty.tasks.insert(id);
                }
                None => break,
            }
        }
    }

    /// Marks a running task as past its point of no return.
    pub(crate) fn commit_task(&mut self, id: &str) {
        if let Some(t) = self.tasks.get_mut(id) {
            t.committed = true;
        }
    }

    /// Cancels a task on request, unless it has ended or committed its
    /// result (then it reports how it ends). Returns the task as it stands.
    pub(crate) fn cancel_task(&mut self, id: &str) -> LocalResult<types::TaskResponse> {
        let entry = self
            .tasks
            .get(id)
            .ok_or_else(|| LocalError::not_found(format!("task {id:?} not found")))?;
        if !entry.committed && !task_is_terminal(entry.task.state.as_str()) {
            entry.cancel.cancel();
            self.end_task(
                id,
                crate::status::word::CANCELLED,
                None,
                Some("cancelled on request".to_owned()),
            );
        }
        Ok(self.tasks[id].task.clone())
    }

    /// Updates a task's progress (ignored once the task has ended).
    pub(crate) fn task_progress(&mut self, id: &str, phase: i64, phases: i64, label: &str) {
        if let Some(t) = self.tasks.get_mut(id) {
            if task_is_terminal(t.task.state.as_str()) {
                return;
            }
            let now = Utc::now();
            t.task.progress = Some(types::TaskProgress {
                eta_seconds: None,
                label: label.to_owned(),
                pct: if phases > 0 {
                    (phase as f64 / phases as f64 * 100.0).min(100.0)
                } else {
                    0.0
                },
                phase,
                phases,
            });
            t.task.last_activity_at = Some(now);
            t.task.runtime_seconds = (now - t.task.created_at).num_seconds().max(0);
            self.dirty.tasks.insert(id.to_owned());
        }
    }

    /// Ends a task: `completed` with an output, `failed` with an error, or
    /// `cancelled`. A task that already ended keeps its first end.
    pub(crate) fn end_task(
        &mut self,
        id: &str,
        state: &str,
        output: Option<types::TaskOutput>,
        error: Option<String>,
    ) {
        if let Some(t) = self.tasks.get_mut(id) {
            if task_is_terminal(t.task.state.as_str()) {
                return;
            }
            let now = Utc::now();
            t.task.state = types::TaskState(state.to_owned());
            t.task.output = output;
            t.task.error = error;
            t.task.last_activity_at = Some(now);
            t.task.runtime_seconds = (now - t.task.created_at).num_seconds().max(0);
            if state == crate::status::word::COMPLETED
                && let Some(p) = t.task.progress.as_mut()
            {
                p.pct = 100.0;
                p.phase = p.phases;
                p.label = "done".to_owned();
            }
            self.dirty.tasks.insert(id.to_owned());
        }
    }

    /// Records a new query turn.
    pub(crate) fn insert_query(&mut self, entry: QueryEntry) {
        let id = entry.query.id.clone();
        self.query_order.push_back(id.clone());
        self.dirty.queries.insert(id.clone());
        self.queries.insert(id, entry);
    }

    /// Forgets ended turns the database no longer has.
    pub(crate) fn forget_queries(&mut self, ids: &[String]) {
        let gone: HashSet<&str> = ids
            .iter()
            .map(String::as_str)
            .filter(|id| self.queries.get(*id).is_some_and(|q| q.query.is_terminal()))
            .collect();
        if gone.is_empty() {
            return;
        }
        self.query_order.retain(|id| !gone.contains(id.as_str()));
        for id in gone {
            self.queries.remove(id);
            self.dirty.queries.remove(id);
        }
    }

    /// Forgets from memory the oldest ended turns whose last write is on
    /// disk (`saved`), keeping at most `keep` ended ones; the database
    /// still has them.
    pub(crate) fn evict_cached_queries(&mut self, saved: u64, keep: usize) {
        let mut ended = self
            .query_order
            .iter()
            .filter(|id| self.queries.get(*id).is_some_and(|q| q.query.is_terminal()))
            .count();
        let mut i = 0;
        while ended > keep && i < self.query_order.len() {
            let id = &self.query_order[i];
            let evictable = match self.queries.get(id) {
                None => true,
                Some(q) => {
                    q.query.is_terminal()
                        && q.events_saved
                        && q.saved_seq <= saved
                        && !self.dirty.queries.contains(id)
                }
            };
            if evictable {
                if let Some(old) = self.query_order.remove(i)
                    && self.queries.remove(&old).is_some()
                {
                    ended -= 1;
                }
            } else {
                i += 1;
            }
        }
    }

    /// Marks source rows of a context as changed.
    pub(crate) fn mark_sources(&mut self, context_id: &str, paths: impl Iterator<Item = String>) {
        if let Some(set) = self
            .dirty
            .sources
            .entry(context_id.to_owned())
            .or_insert_with(|| Some(BTreeSet::new()))
        {
            set.extend(paths);
        }
    }

    /// Frees a session's slot if `query_id` holds it.
    pub(crate) fn release_session(&mut self, session_id: &str, query_id: &str) {
        if let Some(s) = self.sessions.get_mut(session_id)
            && s.in_flight.as_deref() == Some(query_id)
        {
            s.in_flight = None;
            s.session.updated_at = Utc::now();
            self.dirty.sessions.insert(session_id.to_owned());
        }
    }

    /// Adds a session, forgetting the oldest idle ones beyond the limit.
    pub(crate) fn insert_session(&mut self, entry: SessionEntry) {
        self.dirty.sessions.insert(entry.session.id.clone());
        self.sessions.insert(entry.session.id.clone(), entry);
        while self.sessions.len() > MAX_SESSIONS {
            let oldest = self
                .sessions
                .values()
                .filter(|s| s.in_flight.is_none())
                .min_by_key(|s| s.session.updated_at)
                .map(|s| s.session.id.clone());
            match oldest {
                Some(id) => {
                    self.sessions.remove(&id);
                    self.dirty.sessions.insert(id);
                }
                None => break,
            }
        }
    }
}

/// Whether a task state is final.
pub(crate) fn task_is_terminal(state: &str) -> bool {
    matches!(
        state,
        crate::status::word::COMPLETED
            | crate::status::word::CANCELLED
            | crate::status::word::FAILED
    )
}

/// A new session id.
pub(crate) fn new_session_id() -> String {
    new_id("ses")
}

/// A new query id.
pub(crate) fn new_query_id() -> String {
    new_id("qry")
}
#[cfg(test)]
mod tests {
    use super::*;

    fn create(inner: &mut Inner, slug: &str) -> LocalResult<ContextRecord> {
        inner.create_context(types::CreateContextRequest {
            description: None,
            guide: None,
            kind: None,
            manifest: None,
            name: slug.to_uppercase(),
            slug: slug.to_owned(),
        })
    }

    #[test]
    fn contexts_resolve_by_slug_or_id_and_slugs_are_unique() {
        let mut inner = Inner::default();
        let rec = create(&mut inner, "docs").unwrap();
        assert_eq!(inner.context("docs").unwrap().id, rec.id);
        assert_eq!(inner.context(&rec.id).unwrap().slug, "docs");
        assert_eq!(create(&mut inner, "docs").unwrap_err().status, 409);
        assert_eq!(create(&mut inner, "Bad Slug").unwrap_err().status, 400);
        assert_eq!(inner.context("nope").unwrap_err().status, 404);
    }

    #[test]
    fn ids_sort_by_creation() {
        let a = new_id_raw();
        let b = new_id_raw();
        assert!(a < b, "{a} < {b}");
    }

    #[test]
    fn a_task_ends_once() {
        let mut inner = Inner::default();
        let input: types::TaskInput = serde_json::from_value(serde_json::json!({})).unwrap();
        let t = inner.new_task("curate", None, None, input, CancellationToken::new());
        inner.end_task(&t.id, crate::status::word::CANCELLED, None, None);
        inner.end_task(&t.id, crate::status::word::COMPLETED, None, None);
        assert_eq!(
            inner.tasks[&t.id].task.state.as_str(),
            crate::status::word::CANCELLED
        );
    }
}
