//! Contexts, sources, indexes, tasks, sessions and queries: kept in memory,
//! optionally persisted to a data directory.
//!
//! One `std::sync::Mutex` guards everything. No lock is ever held across an
//! `.await`, and slow work (expanding archives, indexing, searching) runs on
//! copies taken out of the lock, so the critical sections stay short.
//!
//! Layout of a data directory:
//! - `state.json`: contexts, tasks, sessions and finished queries;
//! - `contexts/{id}/sources/{path}`: source files;
//! - `contexts/{id}/index-{generation}/` and `chunks-{generation}.json`: the
//!   curated index.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::error::{LocalError, LocalResult};
use super::events::EventLog;
use super::search::{Chunk, ContextIndex};
use crate::types;

/// The model every local answer is attributed to.
pub(crate) const LOCAL_MODEL: &str = "local-extractive";
/// The principal and project every local caller is.
pub(crate) const LOCAL_PRINCIPAL: &str = "local";
pub(crate) const LOCAL_PROJECT: &str = "local";
pub(crate) const LOCAL_PROJECT_NAME: &str = "nexus-local";

/// Most queries kept; the oldest finished ones are forgotten first.
const MAX_QUERIES: usize = 10_000;
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

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", new_id_raw())
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
    pub(crate) sample_queries: Vec<String>,
    /// Bumped by every curation; names the index directory.
    pub(crate) index_generation: u64,
    pub(crate) sources: BTreeMap<String, SourceMeta>,
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
}

/// A session as the server keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SessionEntry {
    pub(crate) session: types::Session,
    /// The scoped contexts, by id (slugs may change).
    pub(crate) context_ids: Vec<String>,
    pub(crate) query_ids: Vec<String>,
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
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredQuery {
    query: types::Query,
    trace: Option<types::Trace>,
}

/// What `state.json` holds.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Snapshot {
    contexts: Vec<ContextRecord>,
    tasks: Vec<types::TaskResponse>,
    sessions: Vec<SessionEntry>,
    queries: Vec<StoredQuery>,
}

#[derive(Debug, Default)]
pub(crate) struct Inner {
    pub(crate) contexts: BTreeMap<String, ContextRecord>,
    /// Source bytes by context id and path.
    pub(crate) sources: HashMap<String, BTreeMap<String, Bytes>>,
    pub(crate) indexes: HashMap<String, Arc<ContextIndex>>,
    pub(crate) tasks: BTreeMap<String, TaskEntry>,
    pub(crate) sessions: HashMap<String, SessionEntry>,
    pub(crate) queries: HashMap<String, QueryEntry>,
    query_order: VecDeque<String>,
}

/// The server's data.
#[derive(Debug)]
pub(crate) struct Store {
    inner: Mutex<Inner>,
    data_dir: Option<PathBuf>,
    /// Serializes writes of `state.json`.
    persist_lock: tokio::sync::Mutex<()>,
}

impl Store {
    /// An empty in-memory store.
    pub(crate) fn in_memory() -> Self {
        Store {
            inner: Mutex::new(Inner::default()),
            data_dir: None,
            persist_lock: tokio::sync::Mutex::new(()),
        }
    }

    /// A store persisted in `dir`, loaded from it when it holds state.
    /// Work that was running when the previous server stopped is marked failed.
    pub(crate) fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut inner = Inner::default();
        let state_file = dir.join("state.json");
        if state_file.exists() {
            let text = std::fs::read_to_string(&state_file)?;
            let snap: Snapshot = serde_json::from_str(&text).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", state_file.display()),
                )
            })?;
            load_snapshot(dir, snap, &mut inner);
        }
        Ok(Store {
            inner: Mutex::new(inner),
            data_dir: Some(dir.to_path_buf()),
            persist_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Locks the data. Never hold the guard across an `.await`.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `state.json` (no-op in memory). Errors are logged: the
    /// in-memory state stays authoritative.
    pub(crate) async fn persist(&self) {
        let Some(dir) = self.data_dir.clone() else {
            return;
        };
        let _guard = self.persist_lock.lock().await;
        let text = {
            let inner = self.lock();
            let snap = snapshot(&inner);
            match serde_json::to_vec_pretty(&snap) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(error = %e, "could not serialize the state");
                    return;
                }
            }
        };
        let res = tokio::task::spawn_blocking(move || {
            let tmp = dir.join("state.json.tmp");
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, dir.join("state.json"))
        })
        .await;
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "could not write state.json"),
            Err(e) => tracing::error!(error = %e, "state writer stopped"),
        }
    }

    /// The directory of one context's files, when persisted.
    pub(crate) fn context_dir(&self, context_id: &str) -> Option<PathBuf> {
        self.data_dir
            .as_ref()
            .map(|d| d.join("contexts").join(context_id))
    }
}

fn snapshot(inner: &Inner) -> Snapshot {
    Snapshot {
        contexts: inner.contexts.values().cloned().collect(),
        tasks: inner.tasks.values().map(|t| t.task.clone()).collect(),
        sessions: inner.sessions.values().cloned().collect(),
        queries: inner
            .query_order
            .iter()
            .filter_map(|id| inner.queries.get(id))
            .filter(|q| q.query.is_terminal())
            .map(|q| StoredQuery {
                query: q.query.clone(),
                trace: q.trace.clone(),
            })
            .collect(),
    }
}

fn load_snapshot(dir: &Path, snap: Snapshot, inner: &mut Inner) {
    for mut ctx in snap.contexts {
        let ctx_dir = dir.join("contexts").join(&ctx.id);
        let mut sources = BTreeMap::new();
        ctx.sources.retain(|path, _| {
            match std::fs::read(ctx_dir.join("sources").join(path)) {
                Ok(data) => {
                    sources.insert(path.clone(), Bytes::from(data));
                    true
                }
                Err(e) => {
                    tracing::warn!(context = %ctx.slug, path, error = %e, "source file missing; dropped");
                    false
                }
            }
        });
        if ctx.last_curated_at.is_some() {
            match open_index(&ctx_dir, ctx.index_generation) {
                Ok(index) => {
                    inner.indexes.insert(ctx.id.clone(), Arc::new(index));
                }
                Err(e) => {
                    tracing::warn!(context = %ctx.slug, error = %e, "index could not be opened; curate again");
                    ctx.last_curated_at = None;
                }
            }
        }
        inner.sources.insert(ctx.id.clone(), sources);
        inner.contexts.insert(ctx.id.clone(), ctx);
    }
    for mut task in snap.tasks {
        if !task_is_terminal(task.state.as_str()) {
            task.state = types::TaskState("failed".to_owned());
            task.error = Some("the server stopped while the task ran".to_owned());
        }
        inner.tasks.insert(
            task.id.clone(),
            TaskEntry {
                task,
                cancel: CancellationToken::new(),
            },
        );
    }
    for s in snap.sessions {
        inner.sessions.insert(s.session.id.clone(), s);
    }
    for q in snap.queries {
        let id = q.query.id.clone();
        inner.query_order.push_back(id.clone());
        inner.queries.insert(
            id,
            QueryEntry {
                log: EventLog::finished(&q.query),
                query: q.query,
                trace: q.trace,
                cancel: CancellationToken::new(),
            },
        );
    }
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
            sample_queries: Vec::new(),
            index_generation: 0,
            sources: BTreeMap::new(),
        };
        self.sources.insert(rec.id.clone(), BTreeMap::new());
        self.contexts.insert(rec.id.clone(), rec.clone());
        Ok(rec)
    }

    /// Removes a context; returns it and the tokens of its running tasks.
    pub(crate) fn delete_context(
        &mut self,
        key: &str,
    ) -> LocalResult<(ContextRecord, Vec<CancellationToken>)> {
        let id = self
            .context_id(key)
            .ok_or_else(|| LocalError::not_found(format!("context {key:?} not found")))?;
        let rec = self
            .contexts
            .remove(&id)
            .ok_or_else(|| LocalError::not_found(format!("context {key:?} not found")))?;
        self.sources.remove(&id);
        self.indexes.remove(&id);
        let tokens = self
            .tasks
            .values()
            .filter(|t| t.task.context_id.as_deref() == Some(id.as_str()))
            .filter(|t| !task_is_terminal(t.task.state.as_str()))
            .map(|t| t.cancel.clone())
            .collect();
        Ok((rec, tokens))
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
            },
        );
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
                }
                None => break,
            }
        }
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
            if state == "completed"
                && let Some(p) = t.task.progress.as_mut()
            {
                p.pct = 100.0;
                p.phase = p.phases;
                p.label = "done".to_owned();
            }
        }
    }

    /// Records a new query turn.
    pub(crate) fn insert_query(&mut self, entry: QueryEntry) {
        let id = entry.query.id.clone();
        self.query_order.push_back(id.clone());
        self.queries.insert(id, entry);
        while self.queries.len() > MAX_QUERIES {
            let Some(pos) = self
                .query_order
                .iter()
                .position(|id| self.queries.get(id).is_none_or(|q| q.query.is_terminal()))
            else {
                break;
            };
            if let Some(old) = self.query_order.remove(pos) {
                self.queries.remove(&old);
            }
        }
    }

    /// Adds a session, forgetting the oldest idle ones beyond the limit.
    pub(crate) fn insert_session(&mut self, entry: SessionEntry) {
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
                }
                None => break,
            }
        }
    }
}

/// Whether a task state is final.
pub(crate) fn task_is_terminal(state: &str) -> bool {
    matches!(state, "completed" | "cancelled" | "failed")
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
        inner.end_task(&t.id, "cancelled", None, None);
        inner.end_task(&t.id, "completed", None, None);
        assert_eq!(inner.tasks[&t.id].task.state.as_str(), "cancelled");
    }
}
