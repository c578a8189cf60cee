//! Reading the state database: a few connections of their own, so reads
//! run side by side (WAL lets them read while the writer writes). Every
//! read blocks its thread: callers on the async runtime run them on the
//! blocking pool.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension};

use super::{Db, Durability, StoredQuery, connect};
use crate::local::events::Frame;

/// Reading connections kept open.
const READERS: usize = 4;

/// A few reading connections; a read takes a free one, else waits for
/// one in turn.
#[derive(Debug)]
pub(super) struct Readers {
    conns: Vec<Mutex<Connection>>,
    next: AtomicUsize,
}

impl Readers {
    pub(super) fn open(path: &Path, durability: Durability) -> rusqlite::Result<Readers> {
        let conns = (0..READERS)
            .map(|_| connect(path, durability).map(Mutex::new))
            .collect::<rusqlite::Result<_>>()?;
        Ok(Readers {
            conns,
            next: AtomicUsize::new(0),
        })
    }

    fn take(&self) -> MutexGuard<'_, Connection> {
        for conn in &self.conns {
            if let Ok(c) = conn.try_lock() {
                return c;
            }
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        self.conns[i].lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One turn of a session as stored: its id and document.
pub(crate) type SessionTurn = (String, String);

impl Db {
    pub(super) fn read<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Option<T> {
        let conn = self.readers.take();
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

    /// One page of a session's stored turns, newest first: at most `limit`
    /// after skipping the `skip` newest. `None` when the database could not
    /// be read.
    pub(crate) fn session_turns(
        &self,
        session_id: &str,
        limit: u32,
        skip: u32,
    ) -> Option<Vec<SessionTurn>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT id, doc FROM queries WHERE session_id = ?1
                 ORDER BY seq DESC LIMIT ?2 OFFSET ?3",
            )?;
            let rows = stmt.query_map(rusqlite::params![session_id, limit, skip], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
            rows.collect()
        })
    }
}
