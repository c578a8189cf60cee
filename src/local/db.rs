//! The state database: one SQLite file (`state.db`, WAL mode) holding
//! contexts, their sources, tasks, sessions, query turns and their events
//! as rows.
//!
//! One writer thread owns the writing connection. Changes reach it as
//! [`Op`]s over a channel, numbered in the order they were sent; it applies
//! every op waiting at that moment in one transaction (a group commit) and
//! then publishes the number of the newest op on disk (see `writer`: a
//! batch that cannot be written stops all writing, and the saved mark never
//! passes it). What must survive a crash before it is acknowledged waits for that number
//! ([`Db::wait_saved`]), or rides on an [`Op::Then`] callback run after the
//! commit. Readers use their own connection; WAL lets them read while the
//! writer writes.
//!
//! This module calls nothing above it: it stores and reads documents that
//! the store serializes.

use std::num::NonZeroU64;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use rusqlite::Connection;

use super::events::Frame;

/// The name of the database file in a data directory.
pub(crate) const DB_FILE: &str = "state.db";
/// Most ops one transaction takes (the rest wait for the next one).
const MAX_BATCH: usize = 4096;
/// Bytes the write-ahead log is truncated to once checkpointed.
pub(crate) const WAL_SIZE_LIMIT: i64 = 4 * 1024 * 1024;

/// How long one statement waits for a write lock held by another
/// connection (a `sqlite3` shell, say) before it fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(4);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS contexts (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sources (
    context_id TEXT NOT NULL, path TEXT NOT NULL, size INTEGER NOT NULL, mtime TEXT NOT NULL,
    PRIMARY KEY (context_id, path)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tasks (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS queries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
    terminal INTEGER NOT NULL, bytes INTEGER NOT NULL, doc TEXT NOT NULL, trace TEXT,
    session_id TEXT);
CREATE TABLE IF NOT EXISTS events (
    query_id TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (query_id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS moves (
    id INTEGER PRIMARY KEY AUTOINCREMENT, context_id TEXT NOT NULL, files TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS connectors (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS task_files (
    task_id TEXT NOT NULL, path TEXT NOT NULL, mtime TEXT NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (task_id, path)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tokens (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, digest BLOB NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS forks (context_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS token_key (
    id INTEGER PRIMARY KEY CHECK (id = 1), fingerprint BLOB NOT NULL);
";

/// How durable a commit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// `synchronous=FULL`: every commit is flushed to disk before it is
    /// reported (survives a crash of the process or the machine).
    Full,
    /// `synchronous=OFF`: a scratch database that dies with the process.
    Scratch,
}

/// Limits of the kept query turns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueryLimits {
    /// Most turns kept.
    pub(crate) count: u64,
    /// Most bytes of turns (documents, traces and events) kept.
    pub(crate) bytes: u64,
}

/// One source row: path, size and time (RFC 3339).
pub(crate) type SourceRow = (String, u64, String);

/// A change for the writer.
pub(crate) enum Op {
    PutContext {
        id: String,
        doc: String,
        /// Made since the last write: its row is inserted, and a row
        /// already there with its id fails the write, never replaced.
        new: bool,
    },
    DeleteContext {
        id: String,
    },
    /// Upserts source rows; with `replace`, the context's other rows go.
    PutSources {
        context_id: String,
        rows: Vec<SourceRow>,
        replace: bool,
    },
    PutTask {
        id: String,
        doc: String,
        /// Made since the last write: its row is inserted, and a row
        /// already there with its id fails the write, never replaced.
        new: bool,
    },
    DeleteTask {
        id: String,
    },
    PutSession {
        id: String,
        doc: String,
        /// Made since the last write: its row is inserted, and a row
        /// already there with its id fails the write, never replaced.
        new: bool,
    },
    DeleteSession {
        id: String,
    },
    /// Upserts a turn (one row of its session); `events` (once it has
    /// ended) replace its event rows.
    PutQuery {
        id: String,
        session_id: String,
        terminal: bool,
        doc: String,
        trace: Option<String>,
        events: Option<Vec<Arc<Frame>>>,
        /// A turn made since the last write: its row is inserted, never
        /// written over another turn's.
        new: bool,
    },
    /// Replaces the document of a stored turn only (its trace and events
    /// stay): feedback on a turn no longer in memory.
    PutQueryDoc {
        id: String,
        doc: String,
    },
    /// Records files about to be moved into a context (`files` is JSON).
    BeginMove {
        id: u64,
        context_id: String,
        files: String,
    },
    /// The moves of `BeginMove { id }` are recorded in the sources.
    EndMove {
        id: u64,
    },
    PutConnector {
        id: String,
        doc: String,
        /// Made since the last write: its row is inserted, and a row
        /// already there with its id fails the write, never replaced.
        new: bool,
    },
    DeleteConnector {
        id: String,
    },
    /// Stores one file a task produced (replacing one of the same path).
    PutTaskFile {
        task_id: String,
        path: String,
        mtime: String,
        data: Vec<u8>,
    },
    DeleteTaskFile {
        task_id: String,
        path: String,
    },
    /// Remembers a bearer token by its digest (never the token).
    PutToken {
        digest: Vec<u8>,
    },
    /// Forgets a bearer token.
    DeleteToken {
        digest: Vec<u8>,
    },
    /// Records that a fork's directory is about to be moved into
    /// `contexts/{context_id}`: until [`Op::EndFork`] (saved with its
    /// record), a start removes that directory (the fork was never
    /// acknowledged).
    BeginFork {
        context_id: String,
    },
    /// Ends [`Op::BeginFork`].
    EndFork {
        context_id: String,
    },
    /// Records the fingerprint of the API key the saved tokens belong to;
    /// with `revoke`, forgets every saved token first (they belong to
    /// another key).
    PutTokenKey {
        fingerprint: Vec<u8>,
        revoke: bool,
    },
    /// Runs after the commit of everything sent before it; `true` when
    /// that commit succeeded.
    Then(Box<dyn FnOnce(bool) + Send>),
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::PutContext { .. } => "PutContext",
            Op::DeleteContext { .. } => "DeleteContext",
            Op::PutSources { .. } => "PutSources",
            Op::PutTask { .. } => "PutTask",
            Op::DeleteTask { .. } => "DeleteTask",
            Op::PutSession { .. } => "PutSession",
            Op::DeleteSession { .. } => "DeleteSession",
            Op::PutQuery { .. } => "PutQuery",
            Op::PutQueryDoc { .. } => "PutQueryDoc",
            Op::BeginMove { .. } => "BeginMove",
            Op::EndMove { .. } => "EndMove",
            Op::PutConnector { .. } => "PutConnector",
            Op::DeleteConnector { .. } => "DeleteConnector",
            Op::PutTaskFile { .. } => "PutTaskFile",
            Op::DeleteTaskFile { .. } => "DeleteTaskFile",
            Op::PutToken { .. } => "PutToken",
            Op::DeleteToken { .. } => "DeleteToken",
            Op::PutTokenKey { .. } => "PutTokenKey",
            Op::BeginFork { .. } => "BeginFork",
            Op::EndFork { .. } => "EndFork",
            Op::Then(_) => "Then",
        })
    }
}

/// A stored turn as read back.
#[derive(Debug)]
pub(crate) struct StoredQuery {
    pub(crate) doc: String,
    pub(crate) trace: Option<String>,
    pub(crate) events: Vec<Frame>,
}

/// What a database held when it was opened (queries are not loaded).
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub(crate) contexts: Vec<(String, String)>,
    pub(crate) sources: Vec<(String, SourceRow)>,
    pub(crate) tasks: Vec<String>,
    pub(crate) sessions: Vec<String>,
    pub(crate) connectors: Vec<String>,
    /// Unfinished moves: `(move id, context id, files JSON)`.
    pub(crate) moves: Vec<(u64, String, String)>,
    /// Turns that were running: `(id, doc)`.
    pub(crate) running_queries: Vec<(String, String)>,
    /// Digests of the bearer tokens issued, oldest first.
    pub(crate) tokens: Vec<Vec<u8>>,
    /// Forks moved into place and never published: their context ids.
    pub(crate) forks: Vec<String>,
    /// The fingerprint of the API key those tokens belong to, if recorded.
    pub(crate) token_key: Option<Vec<u8>>,
}

/// The batch that could not be written: its first and last op numbers, and
/// whether its commit failed with an I/O error (it may be on disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Failure {
    first: u64,
    last: u64,
    maybe_applied: bool,
}

/// What the writer has done.
#[derive(Debug, Clone, Copy, Default)]
struct Mark {
    /// The number of the newest op committed; never past a lost batch.
    saved: u64,
    /// Set once a batch could not be written; nothing is written after it.
    failed: Option<Failure>,
}

/// Where the writer stands.
#[derive(Debug)]
struct Progress {
    /// The number of the newest op sent.
    sent: AtomicU64,
    /// Bytes of the ops sent and not yet written (or given up).
    backlog: AtomicU64,
    mark: tokio::sync::watch::Sender<Mark>,
    /// Turns the writer forgot (`--max-queries`, bytes) in a committed
    /// batch, not yet dropped from memory; filled before the batch is
    /// marked saved.
    evicted: std::sync::Mutex<Vec<String>>,
    /// Whether `evicted` holds any (a cheap check on every records lock).
    has_evicted: std::sync::atomic::AtomicBool,
}

impl Progress {
    fn has_failed(&self) -> bool {
        self.mark.borrow().failed.is_some()
    }

    /// Notes turns forgotten by a committed batch.
    fn forgot(&self, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        self.evicted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(ids);
        self.has_evicted.store(true, Ordering::SeqCst);
    }
}

/// What became of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Saved {
    /// Committed to disk.
    Yes,
    /// Not written, and never will be.
    No,
    /// Not known: the wait ended first, or the commit failed with an I/O
    /// error after which the write may be on disk.
    Unknown,
}

/// The ops of one [`Db::send`], numbered `first..=last`: they reach the
/// writer together, so a batch never splits them and a `Then` among them
/// reports the commit of the ops sent with it.
#[derive(Debug)]
struct Sent {
    first: u64,
    last: u64,
    /// The ops' bytes, counted in the backlog until they are written.
    bytes: u64,
    ops: Vec<Op>,
}

/// The database: a channel to its writer and a few reading connections.
#[derive(Debug)]
pub(crate) struct Db {
    tx: Mutex<Option<mpsc::Sender<Sent>>>,
    readers: reads::Readers,
    progress: Arc<Progress>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn sql_err(e: rusqlite::Error) -> std::io::Error {
    std::io::Error::other(e)
}

/// Creates the database file readable by its owner only (SQLite gives its
/// `-wal` and `-shm` files the same mode), or narrows an existing one.
fn make_private(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            if std::fs::metadata(&p).is_ok() {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

fn connect(path: &Path, durability: Durability) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    // The log is cut back to this size after a checkpoint that empties it.
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    let sync = match durability {
        Durability::Full => "FULL",
        Durability::Scratch => "OFF",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    Ok(conn)
}

impl Db {
    /// Opens (creating) the database at `path` and starts its writer.
    pub(crate) fn open(
        path: &Path,
        durability: Durability,
        limits: QueryLimits,
    ) -> std::io::Result<(Db, Loaded)> {
        make_private(path)?;
        let mut conn = connect(path, durability).map_err(sql_err)?;
        conn.execute_batch(SCHEMA).map_err(sql_err)?;
        add_session_column(&conn).map_err(sql_err)?;
        let loaded = load(&mut conn).map_err(sql_err)?;
        let readers = reads::Readers::open(path, durability).map_err(sql_err)?;
        let progress = Arc::new(Progress {
            sent: AtomicU64::new(0),
            backlog: AtomicU64::new(0),
            mark: tokio::sync::watch::Sender::new(Mark::default()),
            evicted: std::sync::Mutex::default(),
            has_evicted: std::sync::atomic::AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel();
        let writer_progress = progress.clone();
        let writer = std::thread::Builder::new()
            .name("nexus-local-db".to_owned())
            .spawn(move || writer::Writer::new(conn, limits, writer_progress).run(rx))?;
        Ok((
            Db {
                tx: Mutex::new(Some(tx)),
                readers,
                progress,
                writer: Mutex::new(Some(writer)),
            },
            loaded,
        ))
    }

    /// Sends ops to the writer; returns the number of the last one. Call
    /// under the lock that guards the documents, so ops reach the writer
    /// in the order the documents changed. After [`Db::close`] or a
    /// failed write, `Then` callbacks run at once (reporting failure) and
    /// nothing is written; the ops are still numbered, so a wait for them
    /// reports them not saved.
    pub(crate) fn send(&self, ops: impl IntoIterator<Item = Op>) -> u64 {
        let ops: Vec<Op> = ops.into_iter().collect();
        let guard = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let Some(count) = u64::try_from(ops.len()).ok().and_then(NonZeroU64::new) else {
            return self.progress.sent.load(Ordering::SeqCst);
        };
        let tx = guard.as_ref().filter(|_| !self.progress.has_failed());
        let Some(tx) = tx else {
            fail_callbacks(ops);
            return self
                .progress
                .sent
                .fetch_add(count.get(), Ordering::SeqCst)
                .saturating_add(count.get());
        };
        // Numbers are handed out under the lock, so they reach the writer
        // in order.
        let first = self
            .progress
            .sent
            .fetch_add(count.get(), Ordering::SeqCst)
            .saturating_add(1);
        let last = first.saturating_add(count.get() - 1);
        let bytes = ops.iter().fold(0u64, |n, op| n.saturating_add(op.bytes()));
        self.progress.backlog.fetch_add(bytes, Ordering::SeqCst);
        let sent = Sent {
            first,
            last,
            bytes,
            ops,
        };
        if let Err(mpsc::SendError(sent)) = tx.send(sent) {
            self.progress
                .backlog
                .fetch_sub(sent.bytes, Ordering::SeqCst);
            fail_callbacks(sent.ops);
        }
        last
    }

    /// Bytes of the writes sent and not yet committed.
    pub(crate) fn backlog_bytes(&self) -> u64 {
        self.progress.backlog.load(Ordering::SeqCst)
    }

    /// Whether a write failed (then nothing more is written).
    pub(crate) fn has_failed(&self) -> bool {
        self.progress.has_failed()
    }

    /// Stops all writing as if a write had failed: a step of the state
    /// outside the database (a file move) failed half way, and only the next
    /// start can finish it. Writes sent and not yet committed have an
    /// unknown outcome.
    pub(crate) fn stop_writing(&self) {
        let sent = self.progress.sent.load(Ordering::SeqCst);
        self.progress.mark.send_modify(|m| {
            if m.failed.is_none() {
                m.failed = Some(Failure {
                    first: m.saved.saturating_add(1),
                    last: sent,
                    maybe_applied: true,
                });
            }
        });
    }

    /// Resolves once a write has failed.
    pub(crate) async fn failed(&self) {
        let mut rx = self.progress.mark.subscribe();
        let _ = rx.wait_for(|m| m.failed.is_some()).await;
    }

    /// The number of the newest op sent.
    pub(crate) fn sent(&self) -> u64 {
        self.progress.sent.load(Ordering::SeqCst)
    }

    /// The number of the newest op committed (never past a lost one).
    /// The turns forgotten on disk since the last call (oldest ended
    /// turns past the limits), for memory to forget them too.
    pub(crate) fn take_evicted(&self) -> Vec<String> {
        if !self.progress.has_evicted.swap(false, Ordering::SeqCst) {
            return Vec::new();
        }
        std::mem::take(
            &mut *self
                .progress
                .evicted
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    pub(crate) fn saved(&self) -> u64 {
        self.progress.mark.borrow().saved
    }

    /// Waits until op `n` is committed or known lost, at most `wait`.
    pub(crate) async fn wait_saved(&self, n: u64, wait: Duration) -> Saved {
        let closed = self.tx.lock().unwrap_or_else(|p| p.into_inner()).is_none();
        if closed && self.saved() < n {
            // Sent after the writer stopped: never written.
            return Saved::No;
        }
        let mut rx = self.progress.mark.subscribe();
        let decided =
            tokio::time::timeout(wait, rx.wait_for(|m| m.saved >= n || m.failed.is_some())).await;
        let mark = match decided {
            Ok(Ok(mark)) => *mark,
            // The writer is gone: only what it published counts.
            Ok(Err(_)) => *self.progress.mark.borrow(),
            Err(_) => return Saved::Unknown,
        };
        match mark.failed {
            _ if mark.saved >= n => Saved::Yes,
            Some(f) if f.maybe_applied && (f.first..=f.last).contains(&n) => Saved::Unknown,
            Some(_) => Saved::No,
            None => Saved::Unknown,
        }
    }

    /// Like [`Db::wait_saved`], blocking the thread: `true` once op `n` is
    /// committed, `false` when it failed or `wait` passed first.
    pub(crate) fn wait_saved_blocking(&self, n: u64, wait: Duration) -> bool {
        let end = std::time::Instant::now() + wait;
        loop {
            let mark = *self.progress.mark.borrow();
            if mark.saved >= n {
                return true;
            }
            if mark.failed.is_some() || std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops the writer after it has written everything sent so far.
    pub(crate) fn close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = w.join();
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        self.close();
    }
}

impl Op {
    /// The bytes this op carries (documents, events, files), about.
    fn bytes(&self) -> u64 {
        let n = match self {
            Op::PutContext { doc, .. }
            | Op::PutTask { doc, .. }
            | Op::PutSession { doc, .. }
            | Op::PutConnector { doc, .. }
            | Op::PutQueryDoc { doc, .. } => doc.len(),
            Op::PutSources { rows, .. } => rows.iter().fold(0usize, |n, (p, _, m)| {
                n.saturating_add(p.len() + m.len() + 8)
            }),
            Op::PutQuery {
                doc, trace, events, ..
            } => events.iter().flatten().fold(
                doc.len()
                    .saturating_add(trace.as_ref().map_or(0, String::len)),
                |n, f| n.saturating_add(f.event.len() + f.data.len()),
            ),
            Op::BeginMove { files, .. } => files.len(),
            Op::PutTaskFile { path, data, .. } => path.len().saturating_add(data.len()),
            _ => 0,
        };
        (n as u64).saturating_add(64)
    }
}

/// Reports failure to the `Then` callbacks among ops that will not be
/// written.
fn fail_callbacks(ops: Vec<Op>) {
    for op in ops {
        if let Op::Then(f) = op {
            f(false);
        }
    }
}

/// Gives a database of earlier versions the `session_id` column of its
/// turns (filled from their documents) and the index that pages a
/// session's turns.
fn add_session_column(conn: &Connection) -> rusqlite::Result<()> {
    let has_column = conn
        .prepare("SELECT 1 FROM pragma_table_info('queries') WHERE name = 'session_id'")?
        .exists([])?;
    if !has_column {
        conn.execute_batch(
            "BEGIN;
             ALTER TABLE queries ADD COLUMN session_id TEXT;
             UPDATE queries SET session_id = json_extract(doc, '$.session_id');
             COMMIT;",
        )?;
    }
    conn.execute_batch("CREATE INDEX IF NOT EXISTS queries_by_session ON queries (session_id, seq)")
}

fn load(conn: &mut Connection) -> rusqlite::Result<Loaded> {
    let mut out = Loaded::default();
    let pairs = |sql: &str| -> rusqlite::Result<Vec<(String, String)>> {
        let mut stmt = conn.prepare(sql)?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect()
    };
    out.contexts = pairs("SELECT id, doc FROM contexts")?;
    out.tasks = pairs("SELECT id, doc FROM tasks ORDER BY id")?
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    out.sessions = pairs("SELECT id, doc FROM sessions")?
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    out.connectors = pairs("SELECT id, doc FROM connectors ORDER BY id")?
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    out.running_queries = pairs("SELECT id, doc FROM queries WHERE terminal = 0")?;
    {
        let mut stmt = conn.prepare("SELECT context_id, path, size, mtime FROM sources")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                (
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?.max(0) as u64,
                    r.get::<_, String>(3)?,
                ),
            ))
        })?;
        out.sources = rows.collect::<rusqlite::Result<_>>()?;
    }
    {
        let mut stmt = conn.prepare("SELECT digest FROM tokens ORDER BY seq")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        out.tokens = rows.collect::<rusqlite::Result<_>>()?;
    }
    {
        let mut stmt = conn.prepare("SELECT context_id FROM forks")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        out.forks = rows.collect::<rusqlite::Result<_>>()?;
    }
    {
        use rusqlite::OptionalExtension;
        out.token_key = conn
            .query_row("SELECT fingerprint FROM token_key WHERE id = 1", [], |r| {
                r.get(0)
            })
            .optional()?;
    }
    {
        let mut stmt = conn.prepare("SELECT id, context_id, files FROM moves ORDER BY id")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, i64>(0)?.max(0) as u64, r.get(1)?, r.get(2)?))
        })?;
        out.moves = rows.collect::<rusqlite::Result<_>>()?;
    }
    Ok(out)
}

/// Writes `rows` into a new database at `path` in one transaction (the
/// migration of a `state.json` directory).
pub(crate) fn create_with(path: &Path, ops: Vec<Op>) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut conn = connect(path, Durability::Full).map_err(sql_err)?;
    conn.execute_batch(SCHEMA).map_err(sql_err)?;
    let tx = conn.transaction().map_err(sql_err)?;
    let (mut count, mut bytes) = (0, 0);
    for op in &ops {
        writer::apply(&tx, op, &mut count, &mut bytes).map_err(sql_err)?;
    }
    tx.commit().map_err(sql_err)?;
    // Fold the WAL into the main file, so one file holds everything.
    conn.pragma_update(None, "journal_mode", "DELETE")
        .map_err(sql_err)?;
    drop(conn);
    std::fs::File::open(path)?.sync_all()
}

mod reads;
#[cfg(test)]
pub(crate) mod tests;
mod writer;
