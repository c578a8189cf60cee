//! Contexts, sources, indexes, tasks, sessions and queries: kept in memory,
//! optionally persisted to a data directory.
//!
//! One `std::sync::Mutex` guards everything. No lock is ever held across an
//! `.await`, and slow work (expanding archives, indexing, searching) runs on
//! copies taken out of the lock, so the critical sections stay short.
//!
//! Persistence is off the request path: handlers change the state and call
//! [`Store::changed`]; one writer task saves it (coalescing changes) with
//! [`durable::write_keeping_previous`]. What must survive a crash before it
//! is acknowledged waits with [`Store::flush`].
//!
//! Layout of a data directory:
//! - `.lock`: held exclusively by the server using the directory;
//! - `state.json` (and `state.json.prev`, the version before): contexts,
//!   tasks, sessions and queries;
//! - `staging/`: uploads being checked (cleared on start);
//! - `contexts/{id}/sources/{path}`: source files;
//! - `contexts/{id}/index-{generation}/` and `chunks-{generation}.json`: the
//!   curated index.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::durable;
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
    /// Past its point of no return: a cancellation no longer stops it.
    pub(crate) committed: bool,
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
    pub(crate) indexes: HashMap<String, Arc<ContextIndex>>,
    pub(crate) tasks: BTreeMap<String, TaskEntry>,
    pub(crate) sessions: HashMap<String, SessionEntry>,
    pub(crate) queries: HashMap<String, QueryEntry>,
    query_order: VecDeque<String>,
}

/// The name of the state file in a data directory.
const STATE_FILE: &str = "state.json";
/// The name of the lock file in a data directory.
const LOCK_FILE: &str = ".lock";
/// The directory of staged uploads, below the files root.
const STAGING_DIR: &str = "staging";
/// Longest wait of [`Store::flush`] for the writer.
const FLUSH_WAIT: Duration = Duration::from_secs(30);
/// How long the writer lets changes gather before a write.
const COALESCE: Duration = Duration::from_millis(20);
/// Pause after a failed write of `state.json` before trying again.
const RETRY_WRITE: Duration = Duration::from_secs(1);

/// Why a data directory cannot be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// Another server holds the directory's lock.
    Locked(PathBuf),
    /// An I/O failure.
    Io(std::io::Error),
}

impl From<std::io::Error> for OpenError {
    fn from(e: std::io::Error) -> Self {
        OpenError::Io(e)
    }
}

/// The state file's writer: changes bump `changes`, the writer task saves
/// the newest state and publishes the change number it saved.
#[derive(Debug)]
struct Persistence {
    dir: PathBuf,
    /// Held for the store's lifetime: the exclusive lock on the directory.
    _lock: std::fs::File,
    /// The number of the newest change.
    changes: AtomicU64,
    /// Wakes the writer (a stored permit coalesces many changes into one write).
    wake: tokio::sync::Notify,
    /// The number of the newest change on disk.
    saved: tokio::sync::watch::Sender<u64>,
}

/// The server's data.
#[derive(Debug)]
pub(crate) struct Store {
    inner: Mutex<Inner>,
    /// Where source files, indexes and staged uploads live: the data
    /// directory, or a private temporary directory removed on drop.
    files: PathBuf,
    /// Whether `files` is private to this store (removed on drop).
    private_files: bool,
    persistence: Option<Persistence>,
}

impl Drop for Store {
    fn drop(&mut self) {
        if self.private_files {
            let _ = std::fs::remove_dir_all(&self.files);
        } else {
            let _ = std::fs::remove_dir_all(self.files.join(STAGING_DIR));
        }
    }
}

impl Store {
    /// An empty store whose state lives in memory; source files go to a
    /// private temporary directory.
    pub(crate) fn in_memory() -> Self {
        let files = std::env::temp_dir().join(format!("nexus-local-{}", new_secret_name()));
        Store {
            inner: Mutex::new(Inner::default()),
            files,
            private_files: true,
            persistence: None,
        }
    }

    /// A store persisted in `dir`, loaded from it when it holds state.
    /// Takes the directory's exclusive lock. Work that was running when the
    /// previous server stopped is marked failed; a torn `state.json` is
    /// replaced by its previous version (what is lost is logged).
    pub(crate) fn open(dir: &Path) -> Result<Self, OpenError> {
        durable::create_dir_all(dir)?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(OpenError::Locked(lock_path)),
            Err(std::fs::TryLockError::Error(e)) => return Err(OpenError::Io(e)),
        }
        let _ = std::fs::remove_dir_all(dir.join(STAGING_DIR));
        let mut inner = Inner::default();
        if let Some(snap) = read_state(dir) {
            load_snapshot(dir, snap, &mut inner);
        }
        Ok(Store {
            inner: Mutex::new(inner),
            files: dir.to_path_buf(),
            private_files: false,
            persistence: Some(Persistence {
                dir: dir.to_path_buf(),
                _lock: lock,
                changes: AtomicU64::new(0),
                wake: tokio::sync::Notify::new(),
                saved: tokio::sync::watch::Sender::new(0),
            }),
        })
    }

    /// Locks the data. Never hold the guard across an `.await`.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the state is saved to a data directory.
    pub(crate) fn is_persistent(&self) -> bool {
        self.persistence.is_some()
    }

    /// Records that the state changed: the writer saves it soon, off the
    /// request path. Returns the change's number.
    pub(crate) fn changed(&self) -> u64 {
        let Some(p) = &self.persistence else {
            return 0;
        };
        let n = p.changes.fetch_add(1, Ordering::SeqCst) + 1;
        p.wake.notify_one();
        n
    }

    /// Records a change and waits until it is on disk (at most
    /// `FLUSH_WAIT`). Used before acknowledging what must survive a crash.
    ///
    /// # Errors
    /// The writer could not save the state in time.
    pub(crate) async fn flush(&self) -> LocalResult<()> {
        let Some(p) = &self.persistence else {
            return Ok(());
        };
        let n = self.changed();
        let mut rx = p.saved.subscribe();
        match tokio::time::timeout(FLUSH_WAIT, rx.wait_for(|saved| *saved >= n)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(LocalError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "the server could not save its state; see its log",
            )),
        }
    }

    /// The single writer of `state.json`: waits for changes, copies the
    /// state out of the lock, serializes and writes it durably on a blocking
    /// thread. Changes made during a write are saved by the next one. Ends
    /// after a last write once `stop` is cancelled.
    pub(crate) async fn run_writer(self: &Arc<Self>, stop: CancellationToken) {
        let Some(p) = &self.persistence else {
            return;
        };
        loop {
            let stopping = tokio::select! {
                _ = p.wake.notified() => false,
                _ = stop.cancelled() => true,
            };
            if !stopping {
                // Let a burst of changes gather into one write.
                tokio::select! {
                    _ = tokio::time::sleep(COALESCE) => {}
                    _ = stop.cancelled() => {}
                }
            }
            let target = p.changes.load(Ordering::SeqCst);
            if target > *p.saved.borrow() || stopping {
                let store = self.clone();
                let written = tokio::task::spawn_blocking(move || store.write_state_now()).await;
                match written {
                    Ok(Ok(())) => {
                        p.saved.send_modify(|s| *s = (*s).max(target));
                    }
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "could not write state.json; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(RETRY_WRITE) => {}
                            _ = stop.cancelled() => {}
                        }
                        p.wake.notify_one();
                    }
                    Err(e) => tracing::error!(error = %e, "the state writer stopped"),
                }
            }
            if stopping {
                return;
            }
        }
    }

    /// Copies the state (short lock), then serializes and writes it.
    fn write_state_now(&self) -> std::io::Result<()> {
        let Some(p) = &self.persistence else {
            return Ok(());
        };
        let snap = snapshot(&self.lock());
        let text = serde_json::to_vec(&snap).map_err(std::io::Error::other)?;
        durable::write_keeping_previous(&p.dir.join(STATE_FILE), &text)
    }

    /// The directory of one context's files (sources and indexes).
    pub(crate) fn context_dir(&self, context_id: &str) -> PathBuf {
        self.files.join("contexts").join(context_id)
    }

    /// A fresh private directory for staging one upload.
    pub(crate) fn staging_dir(&self) -> PathBuf {
        self.files.join(STAGING_DIR).join(new_secret_name())
    }
}

/// A random name for a private file or directory.
fn new_secret_name() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return format!("{}-{}", std::process::id(), new_id_raw());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads `state.json`, falling back to its previous version when it is
/// missing or torn; a torn file is kept aside for inspection. `None` when
/// there is no usable state (a new directory, or both files unreadable).
fn read_state(dir: &Path) -> Option<Snapshot> {
    let path = dir.join(STATE_FILE);
    let prev = durable::previous(&path);
    let parse = |p: &Path| -> Result<Snapshot, String> {
        let bytes = std::fs::read(p).map_err(|e| e.to_string())?;
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    };
    let main_error = match parse(&path) {
        Ok(s) => return Some(s),
        Err(e) if !path.exists() => {
            if !prev.exists() {
                return None;
            }
            e
        }
        Err(e) => {
            let aside = dir.join(format!("state.json.torn-{}", Utc::now().timestamp()));
            tracing::error!(error = %e, kept = %aside.display(), "state.json is unreadable");
            let _ = std::fs::rename(&path, &aside);
            e
        }
    };
    match parse(&prev) {
        Ok(s) => {
            let when = std::fs::metadata(&prev)
                .and_then(|m| m.modified())
                .map(|t| DateTime::<Utc>::from(t).to_rfc3339())
                .unwrap_or_else(|_| "an unknown time".to_owned());
            tracing::error!(
                error = %main_error,
                saved_at = %when,
                contexts = s.contexts.len(),
                tasks = s.tasks.len(),
                sessions = s.sessions.len(),
                queries = s.queries.len(),
                "started from the previous state (state.json.prev); changes made after it was saved are lost"
            );
            Some(s)
        }
        Err(e) => {
            tracing::error!(
                error = %e,
                "neither state.json nor state.json.prev is readable; starting empty (contexts, tasks, sessions and queries are lost; their files stay on disk)"
            );
            None
        }
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
        ctx.sources.retain(|path, _| {
            let on_disk = safe_join(&ctx_dir.join("sources"), path).is_some_and(|p| p.is_file());
            if !on_disk {
                tracing::warn!(context = %ctx.slug, path, "source file missing; dropped");
            }
            on_disk
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
                committed: false,
            },
        );
    }
    for s in snap.sessions {
        inner.sessions.insert(s.session.id.clone(), s);
    }
    for mut q in snap.queries {
        if !q.query.is_terminal() {
            q.query.status = "failed".to_owned();
            q.query.error = Some("the server stopped while the turn ran".to_owned());
        }
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

/// `root/rel` for a relative path already checked by `import::safe_path`,
/// or `None` when it would not stay below `root`.
pub(crate) fn safe_join(root: &Path, rel: &str) -> Option<PathBuf> {
    let checked = super::import::safe_path(rel)?;
    if checked != rel {
        return None;
    }
    let path = root.join(checked);
    path.starts_with(root).then_some(path)
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
        self.contexts.insert(rec.id.clone(), rec.clone());
        Ok(rec)
    }

    /// Applies an update to a context (slug, name, description, guide,
    /// manifest); returns it as updated.
    pub(crate) fn update_context(
        &mut self,
        key: &str,
        req: types::UpdateContextRequest,
    ) -> LocalResult<&ContextRecord> {
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
        Ok(ctx)
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
        Ok(())
    }

    /// Removes a session and cancels its running turn; whether it existed.
    pub(crate) fn delete_session(&mut self, id: &str) -> bool {
        let Some(s) = self.sessions.remove(id) else {
            return false;
        };
        for q in &s.query_ids {
            if let Some(entry) = self.queries.get(q) {
                entry.cancel.cancel();
            }
        }
        true
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
        Ok(ctx.kind == "work")
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
                "cancelled",
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

    /// Frees a session's slot if `query_id` holds it.
    pub(crate) fn release_session(&mut self, session_id: &str, query_id: &str) {
        if let Some(s) = self.sessions.get_mut(session_id)
            && s.in_flight.as_deref() == Some(query_id)
        {
            s.in_flight = None;
            s.session.updated_at = Utc::now();
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
