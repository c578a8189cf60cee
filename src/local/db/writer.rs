//! The writer thread: takes every batch of ops waiting, applies them in one
//! transaction (a group commit), retries a failed one a few times within
//! [`WRITE_BUDGET`], then publishes the newest op on disk.
//!
//! A batch that cannot be written stops the writer for good: every op sent
//! after it was built on state that never reached the disk, so none is
//! written, and the saved mark never passes the lost batch. The server then
//! stops rather than serve what it could not save.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, params};

use super::{Failure, MAX_BATCH, Op, Progress, QueryLimits, Sent, fail_callbacks};
use crate::local::faults::{failpoint, point};

/// How long the writer waits idle before it checkpoints the write-ahead
/// log (truncating it), and between tries while a reader holds it.
const IDLE_CHECKPOINT: Duration = Duration::from_secs(2);
/// Pages of write-ahead log (4 KiB each) past which a log that cannot be
/// emptied is reported.
const WAL_WARN_PAGES: i64 = 16 * 1024;
/// Tries of one batch before it is reported lost.
const WRITE_TRIES: u32 = 3;
/// Pause between tries of a failed batch.
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// The longest a batch is retried: with the busy timeout of each try, a
/// lost batch is reported well within the longest wait of an
/// acknowledgement (`FLUSH_WAIT`, 30 s), so a request that got "not
/// saved" is never saved later.
pub(super) const WRITE_BUDGET: Duration = Duration::from_secs(12);

/// The writer thread's state.
pub(super) struct Writer {
    conn: Connection,
    limits: QueryLimits,
    progress: Arc<Progress>,
    count: u64,
    bytes: u64,
}

/// Why one try of a batch failed, and whether the commit itself failed
/// with an I/O error (the batch may then be on disk after all).
struct TryError {
    error: rusqlite::Error,
    maybe_applied: bool,
}

impl From<rusqlite::Error> for TryError {
    fn from(error: rusqlite::Error) -> Self {
        TryError {
            error,
            maybe_applied: false,
        }
    }
}

fn injected(e: std::io::Error) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(e))
}

impl Writer {
    pub(super) fn new(conn: Connection, limits: QueryLimits, progress: Arc<Progress>) -> Self {
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

    pub(super) fn run(mut self, rx: mpsc::Receiver<Sent>) {
        let mut written_since_checkpoint = false;
        loop {
            let sent = match rx.recv_timeout(IDLE_CHECKPOINT) {
                Ok(sent) => sent,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if written_since_checkpoint {
                        written_since_checkpoint = !self.checkpoint();
                    }
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            written_since_checkpoint = true;
            let (first, mut last, mut size) = (sent.first, sent.last, sent.bytes);
            let mut batch = sent.ops;
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(sent) => {
                        last = sent.last;
                        size = size.saturating_add(sent.bytes);
                        batch.extend(sent.ops);
                    }
                    Err(_) => break,
                }
            }
            if self.progress.has_failed() {
                // Built on state that never reached the disk: not written.
                self.progress.backlog.fetch_sub(size, Ordering::SeqCst);
                fail_callbacks(batch);
                continue;
            }
            let mut then = Vec::new();
            let mut ops = Vec::with_capacity(batch.len());
            for op in batch {
                match op {
                    Op::Then(f) => then.push(f),
                    op => ops.push(op),
                }
            }
            let outcome = self.write(&ops);
            self.progress.backlog.fetch_sub(size, Ordering::SeqCst);
            match outcome {
                Ok(()) => self
                    .progress
                    .mark
                    .send_modify(|m| m.saved = m.saved.max(last)),
                Err(maybe_applied) => {
                    tracing::error!(
                        ops = ops.len(),
                        "the state database could not be written; nothing more will be, and the server stops"
                    );
                    self.progress.mark.send_modify(|m| {
                        m.failed = Some(Failure {
                            first,
                            last,
                            maybe_applied,
                        });
                    });
                }
            }
            let ok = outcome.is_ok();
            for f in then {
                f(ok);
            }
        }
    }

    /// Folds the write-ahead log into the database and truncates it, so a
    /// reader that held it long (a `sqlite3` shell) does not leave it big
    /// once gone. `true` when the log could be emptied (no reader in the
    /// way).
    fn checkpoint(&mut self) -> bool {
        let row = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            });
        match row {
            Ok((0, _, _)) => true,
            Ok((_, log_pages, _)) => {
                // A reader keeps the log from being emptied: say how big
                // it has grown, so whoever holds it open can be found.
                if log_pages > WAL_WARN_PAGES {
                    tracing::warn!(
                        wal_pages = log_pages,
                        "the state database's write-ahead log cannot shrink while another program reads state.db"
                    );
                }
                false
            }
            Err(e) => {
                tracing::debug!(error = %e, "checkpoint failed");
                false
            }
        }
    }

    /// Commits `ops`, retrying within [`WRITE_BUDGET`]. `Err(maybe_applied)`
    /// when every try failed.
    fn write(&mut self, ops: &[Op]) -> Result<(), bool> {
        let started = Instant::now();
        let mut maybe_applied = false;
        for attempt in 1..=WRITE_TRIES {
            let (count, bytes) = (self.count, self.bytes);
            match self.commit(ops) {
                Ok(evicted) => {
                    // Known before the batch is marked saved.
                    self.progress.forgot(evicted);
                    return Ok(());
                }
                Err(e) => {
                    (self.count, self.bytes) = (count, bytes);
                    maybe_applied |= e.maybe_applied;
                    tracing::error!(error = %e.error, attempt, "writing the state database failed");
                    if attempt == WRITE_TRIES || started.elapsed() + RETRY_PAUSE >= WRITE_BUDGET {
                        break;
                    }
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
        }
        Err(maybe_applied)
    }

    /// One try of a batch; returns the turns it forgot.
    fn commit(&mut self, ops: &[Op]) -> Result<Vec<String>, TryError> {
        let tx = self.conn.transaction()?;
        for op in ops {
            apply(&tx, op, &mut self.count, &mut self.bytes)?;
        }
        let mut evicted = Vec::new();
        evict(
            &tx,
            self.limits,
            &mut self.count,
            &mut self.bytes,
            &mut evicted,
        )?;
        failpoint(point::DB_COMMIT).map_err(injected)?;
        tx.commit().map_err(|error| {
            // An I/O error while committing may leave the batch on disk
            // (written, not known to be synced); a busy or full database
            // rolls back.
            let maybe_applied = matches!(
                error.sqlite_error_code(),
                Some(rusqlite::ErrorCode::SystemIoFailure)
            );
            TryError {
                error,
                maybe_applied,
            }
        })?;
        // Committed: an injected error here is not a failure of the batch.
        if let Err(e) = failpoint(point::DB_COMMITTED) {
            tracing::warn!(error = %e, "failpoint after a commit ignored");
        }
        Ok(evicted)
    }
}

pub(super) fn apply(
    tx: &rusqlite::Transaction<'_>,
    op: &Op,
    count: &mut u64,
    bytes: &mut u64,
) -> rusqlite::Result<()> {
    match op {
        Op::PutContext { id, doc, new } => put_doc(tx, "contexts", id, doc, *new)?,
        Op::DeleteContext { id } => {
            delete_where(tx, "contexts", "id", id)?;
            delete_where(tx, "sources", "context_id", id)?;
        }
        Op::PutSources {
            context_id,
            rows,
            replace,
        } => {
            if *replace {
                delete_where(tx, "sources", "context_id", context_id)?;
            }
            let mut stmt = tx.prepare_cached(
                "INSERT INTO sources (context_id, path, size, mtime) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(context_id, path) DO UPDATE SET size = ?3, mtime = ?4",
            )?;
            for (path, size, mtime) in rows {
                let size = i64::try_from(*size).unwrap_or(i64::MAX);
                stmt.execute(params![context_id, path, size, mtime])?;
            }
        }
        Op::PutTask { id, doc, new } => put_doc(tx, "tasks", id, doc, *new)?,
        Op::DeleteTask { id } => {
            delete_where(tx, "tasks", "id", id)?;
            delete_where(tx, "task_files", "task_id", id)?;
        }
        Op::PutSession { id, doc, new } => put_doc(tx, "sessions", id, doc, *new)?,
        Op::DeleteSession { id } => delete_where(tx, "sessions", "id", id)?,
        Op::PutQuery { .. } => put_query(tx, op, count, bytes)?,
        Op::PutQueryDoc { id, doc } => put_query_doc(tx, id, doc, bytes)?,
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
            delete_where(tx, "moves", "id", id)?;
        }
        Op::PutConnector { id, doc, new } => put_doc(tx, "connectors", id, doc, *new)?,
        Op::DeleteConnector { id } => delete_where(tx, "connectors", "id", id)?,
        Op::PutTaskFile { .. }
        | Op::DeleteTaskFile { .. }
        | Op::PutToken { .. }
        | Op::DeleteToken { .. }
        | Op::PutTokenKey { .. }
        | Op::BeginFork { .. }
        | Op::EndFork { .. } => apply_aside(tx, op)?,
        Op::Then(_) => {}
    }
    Ok(())
}

/// Applies the ops on the tables beside the records: task files, bearer
/// tokens and their key, forks being placed.
fn apply_aside(tx: &rusqlite::Transaction<'_>, op: &Op) -> rusqlite::Result<()> {
    match op {
        Op::PutTaskFile {
            task_id,
            path,
            mtime,
            data,
        } => {
            tx.prepare_cached(
                "INSERT INTO task_files (task_id, path, mtime, data) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(task_id, path) DO UPDATE SET mtime = ?3, data = ?4",
            )?
            .execute(params![task_id, path, mtime, data])?;
        }
        Op::DeleteTaskFile { task_id, path } => {
            tx.prepare_cached("DELETE FROM task_files WHERE task_id = ?1 AND path = ?2")?
                .execute([task_id, path])?;
        }
        Op::PutToken { digest } => {
            tx.prepare_cached("INSERT OR IGNORE INTO tokens (digest) VALUES (?1)")?
                .execute([digest])?;
        }
        Op::DeleteToken { digest } => delete_where(tx, "tokens", "digest", digest)?,
        Op::PutTokenKey {
            fingerprint,
            revoke,
        } => {
            if *revoke {
                tx.prepare_cached("DELETE FROM tokens")?.execute([])?;
            }
            tx.prepare_cached(
                "INSERT INTO token_key (id, fingerprint) VALUES (1, ?1)
                 ON CONFLICT(id) DO UPDATE SET fingerprint = ?1",
            )?
            .execute([fingerprint])?;
        }
        Op::BeginFork { context_id } => {
            tx.prepare_cached("INSERT OR IGNORE INTO forks (context_id) VALUES (?1)")?
                .execute([context_id])?;
        }
        Op::EndFork { context_id } => delete_where(tx, "forks", "context_id", context_id)?,
        _ => {}
    }
    Ok(())
}

/// Deletes the rows of `table` whose `column` is `key`.
fn delete_where(
    tx: &rusqlite::Transaction<'_>,
    table: &'static str,
    column: &'static str,
    key: impl rusqlite::ToSql,
) -> rusqlite::Result<()> {
    tx.prepare_cached(&format!("DELETE FROM {table} WHERE {column} = ?1"))?
        .execute([key])?;
    Ok(())
}

/// Writes a record's document: a new record's row is inserted (the id's
/// PRIMARY KEY makes a row already there an error, never a replacement);
/// a known record's row is updated in place.
fn put_doc(
    tx: &rusqlite::Transaction<'_>,
    table: &'static str,
    id: &str,
    doc: &str,
    new: bool,
) -> rusqlite::Result<()> {
    let sql = if new {
        format!("INSERT INTO {table} (id, doc) VALUES (?1, ?2)")
    } else {
        format!(
            "INSERT INTO {table} (id, doc) VALUES (?1, ?2) ON CONFLICT(id) DO UPDATE SET doc = excluded.doc"
        )
    };
    tx.prepare_cached(&sql)?.execute(params![id, doc])?;
    Ok(())
}

/// Upserts a turn's row (and, once it ended, its events), keeping the
/// stored turns' `count` and `bytes` up to date. Other ops are ignored.
fn put_query(
    tx: &rusqlite::Transaction<'_>,
    op: &Op,
    count: &mut u64,
    bytes: &mut u64,
) -> rusqlite::Result<()> {
    let Op::PutQuery {
        id,
        session_id,
        terminal,
        doc,
        trace,
        events,
        new,
    } = op
    else {
        return Ok(());
    };
    let old: Option<i64> = tx
        .prepare_cached("SELECT bytes FROM queries WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?;
    if *new && old.is_some() {
        // Another turn has this id: never written over.
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE),
            Some(format!("a turn with id {id:?} already exists")),
        ));
    }
    if old.is_none() && *terminal && events.is_none() {
        // A change to an ended turn whose row is gone (forgotten
        // past the limits, or its session deleted): nothing to
        // change, and no turn comes back without its events.
        return Ok(());
    }
    let mut size = doc.len() as u64 + trace.as_ref().map_or(0, |t| t.len() as u64);
    match events {
        Some(frames) => {
            delete_where(tx, "events", "query_id", id)?;
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
        "INSERT INTO queries (id, terminal, bytes, doc, trace, session_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT(id) DO UPDATE SET terminal = ?2, bytes = ?3, doc = ?4, trace = ?5",
    )?
    .execute(params![id, terminal, size_i, doc, trace, session_id])?;
    match old {
        Some(o) => *bytes = bytes.saturating_sub(o.max(0) as u64),
        None => *count = count.saturating_add(1),
    }
    *bytes = bytes.saturating_add(size);
    Ok(())
}

/// Replaces a stored turn's document only, keeping `bytes` up to date.
fn put_query_doc(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    doc: &str,
    bytes: &mut u64,
) -> rusqlite::Result<()> {
    let old: Option<i64> = tx
        .prepare_cached("SELECT LENGTH(CAST(doc AS BLOB)) FROM queries WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?;
    // Gone meanwhile (forgotten): nothing to change.
    if let Some(old) = old {
        let new = doc.len() as u64;
        let old = old.max(0) as u64;
        tx.prepare_cached(
            "UPDATE queries SET doc = ?2, bytes = MAX(bytes - ?3 + ?4, 0) WHERE id = ?1",
        )?
        .execute(params![
            id,
            doc,
            i64::try_from(old).unwrap_or(i64::MAX),
            i64::try_from(new).unwrap_or(i64::MAX)
        ])?;
        *bytes = bytes.saturating_sub(old).saturating_add(new);
    }
    Ok(())
}

/// Forgets the oldest ended turns (and their events) while more than
/// `limits` are kept; adds their ids to `forgotten`.
fn evict(
    tx: &rusqlite::Transaction<'_>,
    limits: QueryLimits,
    count: &mut u64,
    bytes: &mut u64,
    forgotten: &mut Vec<String>,
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
            delete_where(tx, "queries", "id", &id)?;
            delete_where(tx, "events", "query_id", &id)?;
            *count = count.saturating_sub(1);
            *bytes = bytes.saturating_sub(size.max(0) as u64);
            forgotten.push(id);
        }
    }
    Ok(())
}
