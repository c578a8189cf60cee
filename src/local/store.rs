//! The store: the records in memory ([`Inner`], behind one mutex) and the
//! state database ([`Db`]) they are written to, row by row.
//!
//! No lock is ever held across an `.await`, and slow work (expanding
//! archives, indexing, searching) runs on copies taken out of the lock.
//! A change marks the rows it touched; [`Store::changed`] sends those rows
//! to the database writer (under the lock, so rows reach it in the order
//! they changed) and [`Store::flush`] also waits until they are committed.
//! What must survive a crash waits before it is acknowledged.
//!
//! Contexts (with their sources), tasks and sessions are loaded at start;
//! query turns are not: the running ones and the most recent ended ones
//! are in memory, the others are read from the database when asked for
//! (see `turns`). A turn is a row tagged with its session; a session's
//! document lists no turns.
//!
//! Layout of a data directory:
//! - `.lock`: held exclusively by the server using the directory;
//! - `state.db` (with `state.db-wal`, `state.db-shm`): the SQLite state
//!   database;
//! - `staging/`: uploads being checked (cleared on start);
//! - `contexts/{id}/sources/{path}`: source files;
//! - `contexts/{id}/index-{generation}/` and `chunks-{generation}.json`: the
//!   curated index.
//!
//! Without a data directory the same layout lives in a private scratch
//! directory (mode 0700) under the system's temporary directory, removed
//! when the server stops or, after a crash, when the next one starts.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::connectors::ConnectorRecord;
use super::db::{self, Db, Durability, Loaded, Op, QueryLimits, Saved};
use super::error::{LocalError, LocalResult};
use super::events::EventLog;
use super::migrate;
use super::paths::safe_join;
pub(crate) use super::records::*;

mod inner;
mod ownership;
mod recovery;
mod scratch;
mod task_files;
mod tokens;
mod turns;
use crate::types;
pub(crate) use inner::{Inner, new_query_id, new_session_id};
pub(crate) use recovery::{MoveRecord, state_missing};
pub(crate) use task_files::lines_file;
pub(crate) use turns::SessionPage;

/// The name of the lock file in a data directory.
const LOCK_FILE: &str = ".lock";
/// The directory of staged uploads, below the files root.
const STAGING_DIR: &str = "staging";
/// Longest wait of [`Store::flush`] for the writer.
const FLUSH_WAIT: Duration = Duration::from_secs(30);
/// Ended turns kept in memory besides the database.
const CACHED_QUERIES: usize = 32;

/// Why a data directory cannot be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// Another server holds the directory's lock.
    Locked(PathBuf),
    /// The directory is not one the server made: it is left untouched.
    Foreign {
        /// The directory.
        path: PathBuf,
        /// Why it is not taken for a data directory.
        why: String,
    },
    /// Acknowledged data the state names is missing (the state database,
    /// source files): the start is refused rather than forget it; the
    /// message says what is missing and how to recover.
    Damaged {
        /// The directory.
        path: PathBuf,
        /// What is missing, and how to recover.
        why: String,
    },
    /// An I/O failure.
    Io(std::io::Error),
}

impl From<std::io::Error> for OpenError {
    fn from(e: std::io::Error) -> Self {
        OpenError::Io(e)
    }
}

/// A turn as read: from memory, or from the database.
#[derive(Debug)]
pub(crate) struct QueryView {
    pub(crate) trace: Option<types::Trace>,
    pub(crate) log: Arc<EventLog>,
    /// The token that cancels it while it runs.
    pub(crate) cancel: Option<CancellationToken>,
}

/// The server's data.
#[derive(Debug)]
pub(crate) struct Store {
    inner: Mutex<Inner>,
    db: Db,
    /// Where source files, indexes and staged uploads live: the data
    /// directory, or a private scratch directory removed on drop.
    files: PathBuf,
    /// Whether `files` is private to this store (removed on drop).
    private_files: bool,
    /// The bearer tokens the database held at start, and their key.
    saved_tokens: Mutex<tokens::SavedTokens>,
    /// Bytes of events that running turns logged and did not hand to the
    /// database writer yet (see [`EventLog::counted_in`]).
    turn_bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Held for the store's lifetime: the exclusive lock on `files`.
    _lock: std::fs::File,
}

impl Drop for Store {
    fn drop(&mut self) {
        self.db.close();
        // A data directory's staged uploads stay: an import may still be
        // moving files from them (a stop behaves like a crash), and the
        // next start finishes or clears them.
        if self.private_files {
            let _ = std::fs::remove_dir_all(&self.files);
        }
    }
}

/// Takes the exclusive lock of a directory.
fn lock_dir(dir: &Path) -> Result<std::fs::File, OpenError> {
    let lock_path = dir.join(LOCK_FILE);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(std::fs::TryLockError::WouldBlock) => Err(OpenError::Locked(lock_path)),
        Err(std::fs::TryLockError::Error(e)) => Err(OpenError::Io(e)),
    }
}

impl Store {
    /// A store persisted in `dir`, which must be the server's own (see
    /// `ownership`): a foreign folder is refused untouched. Takes the
    /// directory's exclusive lock,
    /// migrates a `state.json` of earlier versions once, and loads the
    /// contexts, tasks and sessions. Work that was running when the
    /// previous server stopped is marked failed; file moves that were not
    /// recorded are recorded from what is on disk.
    pub(crate) fn open(dir: &Path, limits: QueryLimits) -> Result<Self, OpenError> {
        // Private: every question and answer is in here. A directory the
        // server did not make here keeps its mode.
        if ownership::claim(dir)? {
            #[cfg(unix)]
            std::fs::set_permissions(
                dir,
                <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700),
            )?;
        }
        let lock = lock_dir(dir)?;
        migrate::migrate(dir)?;
        let damaged = |why| OpenError::Damaged {
            path: dir.to_path_buf(),
            why,
        };
        if let Some(why) = recovery::state_missing(dir) {
            return Err(damaged(why));
        }
        let (db, loaded) = Db::open(&dir.join(db::DB_FILE), Durability::Full, limits)?;
        let store = Store {
            inner: Mutex::new(Inner::default()),
            db,
            files: dir.to_path_buf(),
            private_files: false,
            saved_tokens: Mutex::default(),
            turn_bytes: Arc::default(),
            _lock: lock,
        };
        // Interrupted imports are finished from their staging directories
        // first; then what is staged goes, and files no row names.
        if let Some(why) = store.restore(loaded) {
            return Err(damaged(why));
        }
        recovery::clear_staging(dir);
        {
            let inner = store.lock();
            recovery::sweep(
                dir,
                inner.contexts.values().map(|c| {
                    (
                        c.id.as_str(),
                        c.last_curated_at.map(|_| c.index_generation),
                        c.sources.keys().map(String::as_str).collect(),
                    )
                }),
            );
        }
        Ok(store)
    }

    /// Builds the records from what the database held and writes the
    /// repairs; when recorded sources are missing, writes nothing and
    /// says what is missing.
    fn restore(&self, mut loaded: Loaded) -> Option<String> {
        *self.saved_tokens.lock().unwrap_or_else(|p| p.into_inner()) = tokens::SavedTokens {
            digests: std::mem::take(&mut loaded.tokens),
            key: loaded.token_key.take(),
            bound: false,
            unrecorded_key: None,
        };
        let mut inner = self.lock();
        let mut repairs = Vec::new();
        for (id, doc) in loaded.contexts {
            match serde_json::from_str::<ContextRecord>(&doc) {
                Ok(ctx) => {
                    inner.contexts.insert(ctx.id.clone(), ctx);
                }
                Err(e) => {
                    tracing::error!(context = %id, error = %e, "a context row is unreadable; skipped")
                }
            }
        }
        for (context_id, (path, size, mtime)) in loaded.sources {
            if let Some(ctx) = inner.contexts.get_mut(&context_id) {
                let mtime = DateTime::parse_from_rfc3339(&mtime)
                    .map(|t| t.with_timezone(&Utc))
                    .unwrap_or_else(|_| Utc::now());
                ctx.sources.insert(path, SourceMeta { size, mtime });
            }
        }
        // Moves that were under way are finished from their staging
        // directory (an import is all or nothing), then recorded.
        let finished_imports = self.finish_moves(&mut inner, loaded.moves, &mut repairs);
        self.remove_unpublished_forks(&inner, loaded.forks, &mut repairs);
        if let Some(why) = recovery::sources_missing(&self.check_sources(&mut inner)) {
            return Some(why);
        }
        restore_tasks(&mut inner, loaded.tasks, &finished_imports);
        for doc in loaded.connectors {
            match serde_json::from_str::<ConnectorRecord>(&doc) {
                Ok(c) => {
                    inner.connectors.insert(c.id.clone(), c);
                }
                Err(e) => tracing::error!(error = %e, "a connector row is unreadable; skipped"),
            }
        }
        for doc in loaded.sessions {
            match serde_json::from_str::<SessionEntry>(&doc) {
                Ok(s) => {
                    inner.sessions.insert(s.session.id.clone(), s);
                }
                Err(e) => tracing::error!(error = %e, "a session row is unreadable; skipped"),
            }
        }
        for (id, doc) in loaded.running_queries {
            let Ok(mut q) = serde_json::from_str::<types::Query>(&doc) else {
                tracing::error!(query = %id, "a query row is unreadable; skipped");
                continue;
            };
            q.status = crate::status::word::FAILED.into();
            q.error = Some("the server stopped while the turn ran".to_owned());
            repairs.push(Op::PutQuery {
                id,
                session_id: q.session_id.clone(),
                terminal: true,
                doc: to_json(&q),
                trace: None,
                events: None,
                new: false,
            });
        }
        let mut ops = drain(&mut inner);
        ops.extend(repairs);
        self.db.send(ops);
        None
    }

    /// Finishes the moves that were under way from their staging
    /// directories and records their files; each move's end goes to
    /// `repairs`. Returns, by import task, how many files could not be
    /// stored.
    fn finish_moves(
        &self,
        inner: &mut Inner,
        moves: Vec<(u64, String, String)>,
        repairs: &mut Vec<Op>,
    ) -> std::collections::HashMap<String, usize> {
        let mut finished_imports = std::collections::HashMap::new();
        for (move_id, context_id, record) in moves {
            let record = MoveRecord::parse(&record);
            let sources_dir = self.context_dir(&context_id).join("sources");
            if let Some(ctx) = inner.contexts.get_mut(&context_id) {
                let missing = recovery::roll_forward(&self.files, &record, &sources_dir);
                if let Some(task_id) = record.task_id.clone() {
                    finished_imports.insert(task_id, missing);
                }
                let now = Utc::now();
                let mut found = Vec::new();
                for (path, _) in record.files {
                    let meta =
                        safe_join(&sources_dir, &path).and_then(|p| std::fs::metadata(p).ok());
                    if let Some(meta) = meta.filter(std::fs::Metadata::is_file) {
                        ctx.sources.insert(
                            path.clone(),
                            SourceMeta {
                                size: meta.len(),
                                mtime: now,
                            },
                        );
                        found.push(path);
                    }
                }
                tracing::warn!(context = %ctx.slug, files = found.len(), "an import stopped while moving files; finished it");
                inner.dirty.contexts.insert(context_id.clone());
                inner.mark_sources(&context_id, found.into_iter());
            }
            repairs.push(Op::EndMove { id: move_id });
        }
        finished_imports
    }

    /// Removes the directories of forks moved into place and never
    /// published (never acknowledged): the server made each one under a
    /// new id and recorded it before the move, so nothing else is there.
    /// A fork whose record exists was published; only its mark goes.
    fn remove_unpublished_forks(&self, inner: &Inner, forks: Vec<String>, repairs: &mut Vec<Op>) {
        for context_id in forks {
            if !inner.contexts.contains_key(&context_id) {
                let dir = self.context_dir(&context_id);
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {
                        tracing::warn!(context = %context_id, "removed a fork that stopped before it was saved")
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::error!(dir = %dir.display(), error = %e, "an unsaved fork could not be removed");
                        continue;
                    }
                }
            }
            repairs.push(Op::EndFork { context_id });
        }
    }

    /// Takes each source file's size, and opens each curated context's
    /// index (a context whose index cannot be opened is to be curated
    /// again). Returns the recorded sources whose files are gone
    /// (`slug/path`); their rows stay.
    fn check_sources(&self, inner: &mut Inner) -> Vec<String> {
        let mut missing = Vec::new();
        let ids: Vec<String> = inner.contexts.keys().cloned().collect();
        for id in ids {
            let ctx_dir = self.context_dir(&id);
            let Some(ctx) = inner.contexts.get_mut(&id) else {
                continue;
            };
            for (path, meta) in ctx.sources.iter_mut() {
                match safe_join(&ctx_dir.join("sources"), path)
                    .and_then(|p| std::fs::metadata(p).ok())
                {
                    Some(m) if m.is_file() => meta.size = m.len(),
                    _ => missing.push(format!("{}/{path}", ctx.slug)),
                }
            }
            let mut index = None;
            if ctx.last_curated_at.is_some() {
                match open_index(&ctx_dir, ctx.index_generation) {
                    Ok(i) => index = Some(Arc::new(i)),
                    Err(e) => {
                        tracing::warn!(context = %ctx.slug, error = %e, "index could not be opened; curate again");
                        ctx.last_curated_at = None;
                        inner.dirty.contexts.insert(id.clone());
                    }
                }
            }
            if let Some(index) = index {
                inner.indexes.insert(id, index);
            }
        }
        missing
    }

    /// Locks the records, dropping from memory the turns the database
    /// forgot (past `--max-queries` or the bytes limit), so none is served
    /// once its eviction is committed.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let evicted = self.db.take_evicted();
        if !evicted.is_empty() {
            inner.forget_queries(&evicted);
        }
        inner
    }

    /// The records, to read: nothing changes through this guard. Never
    /// hold it across an `.await`.
    pub(crate) fn read(&self) -> Records<'_> {
        Records(self.lock())
    }

    /// One change to the records, under their lock. The rows it touches
    /// (and the ops pushed on it) reach the database writer together, in
    /// one send, when it is committed or dropped: no other change carries
    /// them, so the [`Ticket`] of its commit reports exactly this change's
    /// outcome. Never hold it across an `.await`.
    pub(crate) fn change(&self) -> Change<'_> {
        Change {
            store: self,
            inner: self.lock(),
            ops: Vec::new(),
            sent: false,
        }
    }

    /// Whether the state lives in a data directory (files are flushed to
    /// disk and indexes kept there).
    pub(crate) fn is_persistent(&self) -> bool {
        !self.private_files
    }

    /// Sends the rows `inner` marked changed, then `extra`, as one unit;
    /// returns its number and the callback to run at once (without a data
    /// directory).
    fn send_changes(
        &self,
        inner: &mut Inner,
        extra: Vec<Op>,
        then: Option<AfterCommit>,
    ) -> (u64, Option<AfterCommit>) {
        let queries: Vec<String> = inner.dirty.queries.iter().cloned().collect();
        let mut ops = drain(inner);
        ops.extend(extra);
        // Without a data directory nothing waits for the scratch database.
        let mut now = None;
        match then {
            Some(f) if self.is_persistent() => ops.push(Op::Then(f)),
            f => now = f,
        }
        let n = if ops.is_empty() {
            self.db.sent()
        } else {
            self.db.send(ops)
        };
        for id in queries {
            if let Some(q) = inner.queries.get_mut(&id) {
                q.saved_seq = n;
            }
        }
        inner.evict_cached_queries(self.db.saved(), CACHED_QUERIES);
        (n, now)
    }

    /// Waits until the change of `ticket` is committed (at most
    /// `FLUSH_WAIT`). Used before acknowledging what must survive a crash.
    ///
    /// # Errors
    /// 503 `not_saved` when none of it was written, 500 `outcome_unknown`
    /// when that is not known.
    pub(crate) async fn saved(&self, ticket: Ticket) -> LocalResult<()> {
        self.wait_saved(ticket.0).await
    }

    /// Waits until everything sent so far is committed, for work that
    /// saves nothing of its own (a background wait on the writer).
    ///
    /// # Errors
    /// 503 when the database could not be written in time.
    pub(crate) async fn settled(&self) -> LocalResult<()> {
        self.wait_saved(self.db.sent()).await
    }

    /// Waits until write `n` is committed.
    ///
    /// # Errors
    /// 503 when it could not be written in time.
    pub(crate) async fn wait_saved(&self, n: u64) -> LocalResult<()> {
        // Without a data directory nothing survives the process: the
        // scratch database is written behind, with no wait.
        if !self.is_persistent() {
            return Ok(());
        }
        saved_or_error(self.db.wait_saved(n, FLUSH_WAIT).await)
    }

    /// Whether a write failed: then nothing more is written, what is in
    /// memory may be ahead of the disk, and the server stops.
    pub(crate) fn has_failed(&self) -> bool {
        self.db.has_failed()
    }

    /// Stops all writing (then the server stops): a change outside the
    /// database failed half way and the next start finishes it.
    pub(crate) fn stop_writing(&self, why: &str) {
        tracing::error!(
            why,
            "the state cannot be kept consistent in this process; stopping"
        );
        self.db.stop_writing();
    }

    /// Resolves once a write has failed.
    pub(crate) async fn failed(&self) {
        self.db.failed().await;
    }

    /// Bytes of the state database and of its write-ahead log (0 when
    /// absent; reads file sizes).
    pub(crate) fn database_sizes(&self) -> (u64, u64) {
        let size = |suffix: &str| {
            std::fs::metadata(self.files.join(format!("{}{suffix}", db::DB_FILE)))
                .map_or(0, |m| m.len())
        };
        (size(""), size("-wal"))
    }

    /// Bytes waiting to be written to the database: the writes sent to it
    /// and not yet committed, and the events running turns logged (written
    /// when each turn ends).
    pub(crate) fn write_backlog(&self) -> u64 {
        self.db
            .backlog_bytes()
            .saturating_add(self.turn_bytes.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Bytes of the writes sent to the database and not yet committed.
    pub(crate) fn database_backlog(&self) -> u64 {
        self.db.backlog_bytes()
    }

    /// The total that a running turn's event log adds its bytes to.
    pub(crate) fn turn_bytes(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.turn_bytes.clone()
    }

    /// Writes what is pending and stops the database writer.
    pub(crate) fn close(&self) {
        drop(self.change());
        self.db.close();
    }

    /// Records that `files` are about to be moved into a context's source
    /// tree, so a crash before their sources are recorded is repaired at
    /// the next start; returns the move's id for [`Store::end_move`].
    pub(crate) fn begin_move(&self, context_id: &str, record: &MoveRecord) -> (u64, u64) {
        let id = move_id();
        let n = self.db.send([Op::BeginMove {
            id,
            context_id: context_id.to_owned(),
            files: serde_json::to_string(record).unwrap_or_else(|_| "{}".to_owned()),
        }]);
        (id, n)
    }

    /// Records, durably, that a fork's directory is about to be moved to
    /// `contexts/{context_id}`, so a stop before its record is saved has
    /// the next start remove it; the publishing change ends it with
    /// [`Op::EndFork`].
    ///
    /// # Errors
    /// 503 or 500 when it could not be saved.
    pub(crate) async fn begin_fork(&self, context_id: &str) -> LocalResult<()> {
        let n = self.db.send([Op::BeginFork {
            context_id: context_id.to_owned(),
        }]);
        self.wait_saved(n).await
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

/// The answer to a change whose write ended as `saved`: 503 with code
/// `not_saved` when it was not applied (it never will be), 500 with code
/// `outcome_unknown` when it may or may not be on disk.
pub(crate) fn saved_or_error(saved: Saved) -> LocalResult<()> {
    match saved {
        Saved::Yes => Ok(()),
        Saved::No => Err(LocalError::not_saved()),
        Saved::Unknown => Err(LocalError::outcome_unknown()),
    }
}

/// What runs once a change is committed (`true`) or known not to be.
type AfterCommit = Box<dyn FnOnce(bool) + Send>;

/// The records under their lock, to read ([`Store::read`]).
#[derive(Debug)]
pub(crate) struct Records<'a>(MutexGuard<'a, Inner>);

impl std::ops::Deref for Records<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

/// A change to the records ([`Store::change`]): the only way to change
/// them. Dropped without [`Change::commit`], it still sends what it
/// changed (memory and disk never part), but nobody learns its outcome.
#[derive(Debug)]
pub(crate) struct Change<'a> {
    store: &'a Store,
    inner: MutexGuard<'a, Inner>,
    /// Ops sent after the changed rows, in the same unit.
    ops: Vec<Op>,
    /// Whether it was sent (by a commit).
    sent: bool,
}

/// The number of one change's send: [`Store::saved`] waits for it.
#[must_use = "wait for the ticket before acknowledging the change"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket(u64);

impl std::ops::Deref for Change<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl std::ops::DerefMut for Change<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.inner
    }
}

impl Change<'_> {
    /// Adds an op written with this change's rows, in the same
    /// transaction.
    pub(crate) fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    /// Sends the change and releases the records.
    pub(crate) fn commit(self) -> Ticket {
        self.commit_with(None)
    }

    /// Like [`Change::commit`], then runs `then` once the change is
    /// committed (`true`) or known not to be (`false`); at once without
    /// a data directory.
    pub(crate) fn commit_then(self, then: impl FnOnce(bool) + Send + 'static) -> Ticket {
        self.commit_with(Some(Box::new(then)))
    }

    fn commit_with(mut self, then: Option<AfterCommit>) -> Ticket {
        let (n, now) = self.send(then);
        // The records are released before the callback runs.
        drop(self);
        if let Some(f) = now {
            f(true);
        }
        Ticket(n)
    }

    fn send(&mut self, then: Option<AfterCommit>) -> (u64, Option<AfterCommit>) {
        self.sent = true;
        let ops = std::mem::take(&mut self.ops);
        self.store.send_changes(&mut self.inner, ops, then)
    }
}

impl Drop for Change<'_> {
    fn drop(&mut self) {
        if !self.sent {
            let _ = self.send(None);
        }
    }
}

/// A move id: unique and increasing within a directory's life.
fn move_id() -> u64 {
    let micros = Utc::now().timestamp_micros().max(0) as u64;
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let prev = LAST.fetch_max(micros, std::sync::atomic::Ordering::SeqCst);
    if prev >= micros {
        LAST.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    } else {
        micros
    }
}

/// The rows the changes marked in `inner.dirty`, as writes.
fn drain(inner: &mut Inner) -> Vec<Op> {
    if inner.dirty.is_empty() {
        return Vec::new();
    }
    let dirty = std::mem::take(&mut inner.dirty);
    let mut ops = Vec::new();
    for id in dirty.contexts {
        match inner.contexts.get(&id) {
            Some(ctx) => ops.push(Op::PutContext {
                new: dirty.created.contains(&id),
                id,
                doc: to_json(ctx),
            }),
            None => ops.push(Op::DeleteContext { id }),
        }
    }
    for (id, paths) in dirty.sources {
        let Some(ctx) = inner.contexts.get(&id) else {
            continue;
        };
        let row = |(p, m): (&String, &SourceMeta)| (p.clone(), m.size, m.mtime.to_rfc3339());
        let (rows, replace) = match paths {
            None => (ctx.sources.iter().map(row).collect(), true),
            Some(paths) => (
                paths
                    .iter()
                    .filter_map(|p| ctx.sources.get_key_value(p))
                    .map(row)
                    .collect(),
                false,
            ),
        };
        ops.push(Op::PutSources {
            context_id: id,
            rows,
            replace,
        });
    }
    for id in dirty.tasks {
        match inner.tasks.get(&id) {
            Some(t) => ops.push(Op::PutTask {
                new: dirty.created.contains(&id),
                id,
                doc: to_json(&t.task),
            }),
            None => ops.push(Op::DeleteTask { id }),
        }
    }
    for id in dirty.sessions {
        match inner.sessions.get(&id) {
            Some(s) => ops.push(Op::PutSession {
                new: dirty.created.contains(&id),
                id,
                doc: to_json(s),
            }),
            None => ops.push(Op::DeleteSession { id }),
        }
    }
    for id in dirty.connectors {
        match inner.connectors.get(&id) {
            Some(c) => ops.push(Op::PutConnector {
                new: dirty.created.contains(&id),
                id,
                doc: to_json(c),
            }),
            None => ops.push(Op::DeleteConnector { id }),
        }
    }
    for id in dirty.queries {
        let Some(q) = inner.queries.get_mut(&id) else {
            continue;
        };
        let terminal = q.query.is_terminal();
        let events = if terminal && !q.events_saved {
            q.events_saved = true;
            // From here the writer's backlog counts them.
            q.log.uncount();
            Some(q.log.frames())
        } else {
            None
        };
        ops.push(Op::PutQuery {
            new: dirty.created.contains(&id),
            session_id: q.query.session_id.clone(),
            id,
            terminal,
            doc: to_json(&q.query),
            trace: q.trace.as_ref().map(to_json),
            events,
        });
    }
    ops
}

/// Restores task rows: a task that was running is failed, unless it is
/// an import whose move was finished above (`finished_imports`: files
/// that could not be stored, by task).
fn restore_tasks(
    inner: &mut Inner,
    tasks: Vec<String>,
    finished_imports: &std::collections::HashMap<String, usize>,
) {
    for doc in tasks {
        let Ok(mut task) = serde_json::from_str::<types::TaskResponse>(&doc) else {
            tracing::error!("a task row is unreadable; skipped");
            continue;
        };
        if let Some(missing) = finished_imports.get(&task.id) {
            // Its files were all moved and recorded by `finish_moves`.
            let (state, error) = match missing {
                0 => (crate::status::word::COMPLETED, None),
                n => (
                    crate::status::word::FAILED,
                    Some(format!(
                        "the server stopped while the import ran; {n} file(s) could not be stored"
                    )),
                ),
            };
            task.state = state.into();
            task.error = error;
            inner.dirty.tasks.insert(task.id.clone());
        } else if !task.state.is_terminal() {
            task.state = crate::status::word::FAILED.into();
            task.error = Some("the server stopped while the task ran".to_owned());
            inner.dirty.tasks.insert(task.id.clone());
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
}

/// A random name for a private file or directory.
/// Whether `name` is one [`new_secret_name`] makes: 16 lowercase hex digits.
pub(super) fn is_secret_name(name: &str) -> bool {
    name.len() == 16 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

pub(super) fn new_secret_name() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return format!(
            "{:016x}",
            std::process::id() as u64 ^ Utc::now().timestamp_micros() as u64
        );
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
