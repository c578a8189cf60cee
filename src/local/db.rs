//! The state database: one SQLite file (`state.db`, WAL mode) holding
//! contexts, their sources, tasks, sessions, query turns and their events
//! as rows.
//!
//! One writer thread owns the writing connection. Changes reach it as
//! [`Op`]s over a channel, numbered in the order they were sent; it applies
//! every op waiting at that moment in one transaction (a group commit) and
//! then publishes the number of the newest op on disk. What must survive a
//! crash before it is acknowledged waits for that number
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

use rusqlite::{Connection, OptionalExtension, params};

use super::events::Frame;

/// The name of the database file in a data directory.
pub(crate) const DB_FILE: &str = "state.db";
/// Most ops one transaction takes (the rest wait for the next one).
const MAX_BATCH: usize = 4096;
/// Tries of one batch before its ops are reported lost.
const WRITE_TRIES: u32 = 5;
/// Failed batches remembered for [`Db::wait_saved`].
const LOST_KEPT: usize = 64;
/// Pause between tries of a failed batch.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS contexts (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sources (
    context_id TEXT NOT NULL, path TEXT NOT NULL, size INTEGER NOT NULL, mtime TEXT NOT NULL,
    PRIMARY KEY (context_id, path)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tasks (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS queries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
    terminal INTEGER NOT NULL, bytes INTEGER NOT NULL, doc TEXT NOT NULL, trace TEXT);
CREATE TABLE IF NOT EXISTS events (
    query_id TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (query_id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS moves (
    id INTEGER PRIMARY KEY AUTOINCREMENT, context_id TEXT NOT NULL, files TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS connectors (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS task_files (
    task_id TEXT NOT NULL, path TEXT NOT NULL, mtime TEXT NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (task_id, path)) WITHOUT ROWID;
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
    },
    DeleteTask {
        id: String,
    },
    PutSession {
        id: String,
        doc: String,
    },
    DeleteSession {
        id: String,
    },
    /// Upserts a turn; `events` (once it has ended) replace its event rows.
    PutQuery {
        id: String,
        terminal: bool,
        doc: String,
        trace: Option<String>,
        events: Option<Vec<Arc<Frame>>>,
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
            Op::BeginMove { .. } => "BeginMove",
            Op::EndMove { .. } => "EndMove",
            Op::PutConnector { .. } => "PutConnector",
            Op::DeleteConnector { .. } => "DeleteConnector",
            Op::PutTaskFile { .. } => "PutTaskFile",
            Op::DeleteTaskFile { .. } => "DeleteTaskFile",
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
}

/// Where the writer stands.
#[derive(Debug)]
struct Progress {
    /// The number of the newest op sent.
    sent: AtomicU64,
    /// The first and last numbers of the batches that could not be written
    /// (at most `LOST_KEPT` ranges; the oldest are merged, never dropped).
    lost: Mutex<std::collections::VecDeque<(u64, u64)>>,
    /// The number of the newest op committed.
    saved: tokio::sync::watch::Sender<u64>,
}

/// The ops of one [`Db::send`], numbered `first..=last`: they reach the
/// writer together, so a batch never splits them and a `Then` among them
/// reports the commit of the ops sent with it.
#[derive(Debug)]
struct Sent {
    first: u64,
    last: u64,
    ops: Vec<Op>,
}

/// The database: a channel to its writer and a reading connection.
#[derive(Debug)]
pub(crate) struct Db {
    tx: Mutex<Option<mpsc::Sender<Sent>>>,
    reader: Mutex<Connection>,
    progress: Arc<Progress>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn sql_err(e: rusqlite::Error) -> std::io::Error {
    std::io::Error::other(e)
}

fn connect(path: &Path, durability: Durability) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
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
        let mut conn = connect(path, durability).map_err(sql_err)?;
        conn.execute_batch(SCHEMA).map_err(sql_err)?;
        let loaded = load(&mut conn).map_err(sql_err)?;
        let reader = connect(path, durability).map_err(sql_err)?;
        let progress = Arc::new(Progress {
            sent: AtomicU64::new(0),
            lost: Mutex::new(std::collections::VecDeque::new()),
            saved: tokio::sync::watch::Sender::new(0),
        });
        let (tx, rx) = mpsc::channel();
        let writer_progress = progress.clone();
        let writer = std::thread::Builder::new()
            .name("nexus-local-db".to_owned())
            .spawn(move || Writer::new(conn, limits, writer_progress).run(rx))?;
        Ok((
            Db {
                tx: Mutex::new(Some(tx)),
                reader: Mutex::new(reader),
                progress,
                writer: Mutex::new(Some(writer)),
            },
            loaded,
        ))
    }

    /// Sends ops to the writer; returns the number of the last one. Call
    /// under the lock that guards the documents, so ops reach the writer
    /// in the order the documents changed. After [`Db::close`], `Then`
    /// callbacks run at once (reporting failure) and nothing is written.
    pub(crate) fn send(&self, ops: impl IntoIterator<Item = Op>) -> u64 {
        let ops: Vec<Op> = ops.into_iter().collect();
        let guard = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let (Some(tx), Some(count)) = (
            guard.as_ref(),
            u64::try_from(ops.len()).ok().and_then(NonZeroU64::new),
        ) else {
            fail_callbacks(ops);
            return self.progress.sent.load(Ordering::SeqCst);
        };
        // Numbers are handed out under the lock, so they reach the writer
        // in order.
        let first = self
            .progress
            .sent
            .fetch_add(count.get(), Ordering::SeqCst)
            .saturating_add(1);
        let last = first.saturating_add(count.get() - 1);
        if let Err(mpsc::SendError(sent)) = tx.send(Sent { first, last, ops }) {
            fail_callbacks(sent.ops);
        }
        last
    }

    /// The number of the newest op sent.
    pub(crate) fn sent(&self) -> u64 {
        self.progress.sent.load(Ordering::SeqCst)
    }

    /// The number of the newest op committed.
    pub(crate) fn saved(&self) -> u64 {
        *self.progress.saved.borrow()
    }

    /// Waits until op `n` is committed, at most `wait`. `false` when it
    /// could not be written or the wait ended first.
    pub(crate) async fn wait_saved(&self, n: u64, wait: Duration) -> bool {
        let mut rx = self.progress.saved.subscribe();
        let ok = tokio::time::timeout(wait, rx.wait_for(|saved| *saved >= n))
            .await
            .is_ok_and(|r| r.is_ok());
        ok && !self
            .progress
            .lost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|(first, last)| (*first..=*last).contains(&n))
    }

    /// Stops the writer after it has written everything sent so far.
    pub(crate) fn close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = w.join();
        }
    }

    fn read<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Option<T> {
        let conn = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        match f(&conn) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::error!(error = %e, "reading the state database failed");
                None
            }
        }
    }

    /// A stored turn with its events, if kept.
    pub(crate) fn query(&self, id: &str) -> Option<StoredQuery> {
        self.read(|c| {
            let row: Option<(String, Option<String>)> = c
                .query_row("SELECT doc, trace FROM queries WHERE id = ?1", [id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            let Some((doc, trace)) = row else {
                return Ok(None);
            };
            let mut stmt = c.prepare_cached(
                "SELECT seq, event, data FROM events WHERE query_id = ?1 ORDER BY seq",
            )?;
            let events = stmt
                .query_map([id], |r| {
                    Ok(Frame {
                        seq: Some(r.get::<_, i64>(0)?.max(0) as u64),
                        event: r.get(1)?,
                        data: r.get(2)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Some(StoredQuery { doc, trace, events }))
        })
        .flatten()
    }

    /// The files a task produced: `(path, size, mtime)`, by path; `None`
    /// when the database could not be read.
    pub(crate) fn task_files(&self, task_id: &str) -> Option<Vec<(String, u64, String)>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT path, LENGTH(data), mtime FROM task_files WHERE task_id = ?1 ORDER BY path",
            )?;
            let rows = stmt.query_map([task_id], |r| {
                Ok((r.get(0)?, r.get::<_, i64>(1)?.max(0) as u64, r.get(2)?))
            })?;
            rows.collect()
        })
    }

    /// One file a task produced, if kept.
    pub(crate) fn task_file(&self, task_id: &str, path: &str) -> Option<Vec<u8>> {
        self.read(|c| {
            c.query_row(
                "SELECT data FROM task_files WHERE task_id = ?1 AND path = ?2",
                [task_id, path],
                |r| r.get(0),
            )
            .optional()
        })
        .flatten()
    }

    /// A stored turn's document only, if kept.
    pub(crate) fn query_doc(&self, id: &str) -> Option<String> {
        self.read(|c| {
            c.query_row("SELECT doc FROM queries WHERE id = ?1", [id], |r| r.get(0))
                .optional()
        })
        .flatten()
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        self.close();
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
        let mut stmt = conn.prepare("SELECT id, context_id, files FROM moves ORDER BY id")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, i64>(0)?.max(0) as u64, r.get(1)?, r.get(2)?))
        })?;
        out.moves = rows.collect::<rusqlite::Result<_>>()?;
    }
    Ok(out)
}

/// The writer thread's state.
struct Writer {
    conn: Connection,
    limits: QueryLimits,
    progress: Arc<Progress>,
    count: u64,
    bytes: u64,
}

impl Writer {
    fn new(conn: Connection, limits: QueryLimits, progress: Arc<Progress>) -> Self {
        let (count, bytes) = conn
            .query_row(
                "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM queries",
                [],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?.max(0) as u64,
                        r.get::<_, i64>(1)?.max(0) as u64,
                    ))
                },
            )
            .unwrap_or((0, 0));
        Writer {
            conn,
            limits,
            progress,
            count,
            bytes,
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Sent>) {
        while let Ok(sent) = rx.recv() {
            let (first, mut last) = (sent.first, sent.last);
            let mut batch = sent.ops;
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(sent) => {
                        last = sent.last;
                        batch.extend(sent.ops);
                    }
                    Err(_) => break,
                }
            }
            let mut then = Vec::new();
            let mut ops = Vec::with_capacity(batch.len());
            for op in batch {
                match op {
                    Op::Then(f) => then.push(f),
                    op => ops.push(op),
                }
            }
            let mut ok = false;
            for attempt in 1..=WRITE_TRIES {
                let (count, bytes) = (self.count, self.bytes);
                match self.commit(&ops) {
                    Ok(()) => {
                        ok = true;
                        break;
                    }
                    Err(e) => {
                        (self.count, self.bytes) = (count, bytes);
                        tracing::error!(error = %e, attempt, "writing the state database failed");
                        std::thread::sleep(RETRY_PAUSE);
                    }
                }
            }
            if !ok {
                let mut lost = self.progress.lost.lock().unwrap_or_else(|p| p.into_inner());
                if lost.len() >= LOST_KEPT {
                    // The two oldest ranges become one that spans both: a
                    // write between them may then be reported lost when it
                    // was not, but a lost write is never reported saved.
                    if let (Some((from, _)), Some((_, to))) = (lost.pop_front(), lost.pop_front()) {
                        lost.push_front((from, to));
                    }
                }
                lost.push_back((first, last));
            }
            self.progress.saved.send_modify(|s| *s = (*s).max(last));
            for f in then {
                f(ok);
            }
        }
    }

    fn commit(&mut self, ops: &[Op]) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        for op in ops {
            apply(&tx, op, &mut self.count, &mut self.bytes)?;
        }
        evict(&tx, self.limits, &mut self.count, &mut self.bytes)?;
        tx.commit()
    }
}

fn apply(
    tx: &rusqlite::Transaction<'_>,
    op: &Op,
    count: &mut u64,
    bytes: &mut u64,
) -> rusqlite::Result<()> {
    match op {
        Op::PutContext { id, doc } => {
            tx.prepare_cached("INSERT OR REPLACE INTO contexts (id, doc) VALUES (?1, ?2)")?
                .execute(params![id, doc])?;
        }
        Op::DeleteContext { id } => {
            tx.prepare_cached("DELETE FROM contexts WHERE id = ?1")?
                .execute([id])?;
            tx.prepare_cached("DELETE FROM sources WHERE context_id = ?1")?
                .execute([id])?;
        }
        Op::PutSources {
            context_id,
            rows,
            replace,
        } => {
            if *replace {
                tx.prepare_cached("DELETE FROM sources WHERE context_id = ?1")?
                    .execute([context_id])?;
            }
            let mut stmt = tx.prepare_cached(
                "INSERT OR REPLACE INTO sources (context_id, path, size, mtime) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (path, size, mtime) in rows {
                let size = i64::try_from(*size).unwrap_or(i64::MAX);
                stmt.execute(params![context_id, path, size, mtime])?;
            }
        }
        Op::PutTask { id, doc } => {
            tx.prepare_cached("INSERT OR REPLACE INTO tasks (id, doc) VALUES (?1, ?2)")?
                .execute(params![id, doc])?;
        }
        Op::DeleteTask { id } => {
            tx.prepare_cached("DELETE FROM tasks WHERE id = ?1")?
                .execute([id])?;
            tx.prepare_cached("DELETE FROM task_files WHERE task_id = ?1")?
                .execute([id])?;
        }
        Op::PutSession { id, doc } => {
            tx.prepare_cached("INSERT OR REPLACE INTO sessions (id, doc) VALUES (?1, ?2)")?
                .execute(params![id, doc])?;
        }
        Op::DeleteSession { id } => {
            tx.prepare_cached("DELETE FROM sessions WHERE id = ?1")?
                .execute([id])?;
        }
        Op::PutQuery {
            id,
            terminal,
            doc,
            trace,
            events,
        } => {
            let old: Option<i64> = tx
                .prepare_cached("SELECT bytes FROM queries WHERE id = ?1")?
                .query_row([id], |r| r.get(0))
                .optional()?;
            let mut size = doc.len() as u64 + trace.as_ref().map_or(0, |t| t.len() as u64);
            match events {
                Some(frames) => {
                    tx.prepare_cached("DELETE FROM events WHERE query_id = ?1")?
                        .execute([id])?;
                    let mut stmt = tx.prepare_cached(
                        "INSERT INTO events (query_id, seq, event, data) VALUES (?1, ?2, ?3, ?4)",
                    )?;
                    for f in frames {
                        let seq = f.seq.map_or(0, |s| i64::try_from(s).unwrap_or(i64::MAX));
                        stmt.execute(params![id, seq, f.event, f.data])?;
                        size = size.saturating_add((f.event.len() + f.data.len()) as u64);
                    }
                }
                None => {
                    // The events already stored still count.
                    let stored: i64 = tx
                        .prepare_cached(
                            "SELECT COALESCE(SUM(LENGTH(CAST(data AS BLOB)) + LENGTH(CAST(event AS BLOB))), 0) FROM events WHERE query_id = ?1",
                        )?
                        .query_row([id], |r| r.get(0))?;
                    size = size.saturating_add(stored.max(0) as u64);
                }
            }
            let size_i = i64::try_from(size).unwrap_or(i64::MAX);
            tx.prepare_cached(
                "INSERT INTO queries (id, terminal, bytes, doc, trace) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(id) DO UPDATE SET terminal = ?2, bytes = ?3, doc = ?4, trace = ?5",
            )?
            .execute(params![id, terminal, size_i, doc, trace])?;
            match old {
                Some(o) => *bytes = bytes.saturating_sub(o.max(0) as u64),
                None => *count = count.saturating_add(1),
            }
            *bytes = bytes.saturating_add(size);
        }
        Op::BeginMove {
            id,
            context_id,
            files,
        } => {
            let id = i64::try_from(*id).unwrap_or(i64::MAX);
            tx.prepare_cached("INSERT INTO moves (id, context_id, files) VALUES (?1, ?2, ?3)")?
                .execute(params![id, context_id, files])?;
        }
        Op::EndMove { id } => {
            let id = i64::try_from(*id).unwrap_or(i64::MAX);
            tx.prepare_cached("DELETE FROM moves WHERE id = ?1")?
                .execute([id])?;
        }
        Op::PutConnector { id, doc } => {
            tx.prepare_cached("INSERT OR REPLACE INTO connectors (id, doc) VALUES (?1, ?2)")?
                .execute(params![id, doc])?;
        }
        Op::DeleteConnector { id } => {
            tx.prepare_cached("DELETE FROM connectors WHERE id = ?1")?
                .execute([id])?;
        }
        Op::PutTaskFile {
            task_id,
            path,
            mtime,
            data,
        } => {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO task_files (task_id, path, mtime, data) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![task_id, path, mtime, data])?;
        }
        Op::DeleteTaskFile { task_id, path } => {
            tx.prepare_cached("DELETE FROM task_files WHERE task_id = ?1 AND path = ?2")?
                .execute([task_id, path])?;
        }
        Op::Then(_) => {}
    }
    Ok(())
}

/// Forgets the oldest ended turns (and their events) while more than
/// `limits` are kept.
fn evict(
    tx: &rusqlite::Transaction<'_>,
    limits: QueryLimits,
    count: &mut u64,
    bytes: &mut u64,
) -> rusqlite::Result<()> {
    while *count > limits.count || *bytes > limits.bytes {
        let victims: Vec<(String, i64)> = {
            let mut stmt = tx.prepare_cached(
                "SELECT id, bytes FROM queries WHERE terminal = 1 ORDER BY seq LIMIT 64",
            )?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        if victims.is_empty() {
            break;
        }
        for (id, size) in victims {
            if *count <= limits.count && *bytes <= limits.bytes {
                break;
            }
            tx.prepare_cached("DELETE FROM queries WHERE id = ?1")?
                .execute([&id])?;
            tx.prepare_cached("DELETE FROM events WHERE query_id = ?1")?
                .execute([&id])?;
            *count = count.saturating_sub(1);
            *bytes = bytes.saturating_sub(size.max(0) as u64);
        }
    }
    Ok(())
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
        apply(&tx, op, &mut count, &mut bytes).map_err(sql_err)?;
    }
    tx.commit().map_err(sql_err)?;
    // Fold the WAL into the main file, so one file holds everything.
    conn.pragma_update(None, "journal_mode", "DELETE")
        .map_err(sql_err)?;
    drop(conn);
    std::fs::File::open(path)?.sync_all()
}

#[cfg(test)]
pub(crate) mod tests;
