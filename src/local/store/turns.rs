//! Reading query turns: one by id, a session's turns a page at a time, and
//! feedback on a turn that is only on disk.
//!
//! A turn is one row of the `queries` table, tagged with its session; a
//! session's document holds no list of its turns. Database reads block:
//! callers on the async runtime run them through [`Store::blocking`], and
//! none runs under the records' lock.

use std::sync::Arc;
use std::time::Duration;

use super::{QueryEntry, QueryView, Store, Ticket, to_json};
use crate::local::db::Op;
use crate::local::error::{LocalError, LocalResult};
use crate::local::events::EventLog;
use crate::types;

/// Longest wait of a session page for the rows of its newest turns.
const PAGE_WAIT: Duration = Duration::from_secs(5);

/// One page of a session's turns.
#[derive(Debug)]
pub(crate) struct SessionPage {
    pub(crate) session: types::Session,
    /// Oldest first.
    pub(crate) queries: Vec<types::Query>,
}

impl Store {
    /// Runs `f` (which may read the database) on the blocking pool, off the
    /// async threads.
    ///
    /// # Errors
    /// 500 when the job panicked.
    pub(crate) async fn blocking<T, F>(self: &Arc<Self>, f: F) -> LocalResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> T + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| LocalError::internal("a database read failed", e))
    }

    /// A turn by id: from memory, else from the database (blocks).
    pub(crate) fn query(&self, id: &str) -> Option<QueryView> {
        {
            let inner = self.read();
            if let Some(q) = inner.queries.get(id) {
                return Some(QueryView {
                    trace: q.trace.clone(),
                    log: q.log.clone(),
                    cancel: Some(q.cancel.clone()),
                });
            }
        }
        let stored = self.db.query(id)?;
        let query: types::Query = serde_json::from_str(&stored.doc).ok()?;
        let trace = stored.trace.and_then(|t| serde_json::from_str(&t).ok());
        let log = EventLog::restored(stored.events, &query);
        Some(QueryView {
            trace,
            log,
            cancel: None,
        })
    }

    /// A turn's document by id: from memory, else from the database
    /// (blocks).
    pub(crate) fn query_doc(&self, id: &str) -> Option<types::Query> {
        if let Some(q) = self.read().queries.get(id) {
            return Some(shown(q));
        }
        serde_json::from_str(&self.db.query_doc(id)?).ok()
    }

    /// The newest `limit` turns of a session but `except`, oldest first
    /// (blocks): from the database, with the documents of turns still in
    /// memory (which may be newer). `None` when no such session exists.
    pub(crate) fn newest_turns(
        &self,
        session_id: &str,
        limit: u32,
        except: &str,
    ) -> Option<Vec<types::Query>> {
        let mut page = self.page(session_id, limit.saturating_add(1), 0, Some(except))?;
        page.queries.retain(|q| q.id != except);
        let excess = page.queries.len().saturating_sub(limit as usize);
        page.queries.drain(..excess);
        Some(page.queries)
    }

    /// One page of a session's turns (blocks): the `limit` turns before the
    /// `skip` newest, oldest first. `None` when no such session exists.
    pub(crate) fn session_page_blocking(
        &self,
        session_id: &str,
        limit: u32,
        skip: u32,
    ) -> Option<SessionPage> {
        self.page(session_id, limit, skip, None)
    }

    /// A page, after waiting (at most `PAGE_WAIT`) for the rows of the
    /// session's turns in memory, `except` one, to be written.
    fn page(
        &self,
        session_id: &str,
        limit: u32,
        skip: u32,
        except: Option<&str>,
    ) -> Option<SessionPage> {
        let (session, pending) = self.session_snapshot(session_id, except)?;
        let waited = pending == 0
            || self.db.saved() >= pending
            || self.db.wait_saved_blocking(pending, PAGE_WAIT);
        let rows = self
            .db
            .session_turns(session_id, limit, skip)
            .unwrap_or_default();
        Some(self.assemble(session, session_id, rows, limit, skip == 0 && !waited))
    }

    /// A session's document and the newest write of its turns held in
    /// memory, `except` one (0: none).
    fn session_snapshot(
        &self,
        session_id: &str,
        except: Option<&str>,
    ) -> Option<(types::Session, u64)> {
        let inner = self.read();
        let session = inner.sessions.get(session_id)?.session.clone();
        let pending = inner
            .queries
            .values()
            .filter(|q| q.query.session_id == session_id)
            .filter(|q| except != Some(q.query.id.as_str()))
            .map(|q| q.saved_seq)
            .max()
            .unwrap_or(0);
        Some((session, pending))
    }

    /// Builds a page from stored rows (newest first): turns in memory give
    /// their current document; with `add_unsaved`, turns in memory whose
    /// rows may not be written yet join the newest end.
    fn assemble(
        &self,
        session: types::Session,
        session_id: &str,
        rows: Vec<(String, String)>,
        limit: u32,
        add_unsaved: bool,
    ) -> SessionPage {
        let mut slots: Vec<(String, Slot)> = rows
            .into_iter()
            .map(|(id, doc)| (id, Slot::Stored(doc)))
            .collect();
        {
            let inner = self.read();
            if add_unsaved {
                let saved = self.db.saved();
                let mut unsaved: Vec<&types::Query> = inner
                    .queries
                    .values()
                    .filter(|q| q.query.session_id == session_id)
                    .filter(|q| q.saved_seq > saved || inner.dirty.queries.contains(&q.query.id))
                    .filter(|q| !slots.iter().any(|(id, _)| id == &q.query.id))
                    .map(|q| &q.query)
                    .collect();
                unsaved.sort_by(|a, b| b.created.cmp(&a.created).then(b.id.cmp(&a.id)));
                let mut newest: Vec<(String, Slot)> = unsaved
                    .iter()
                    .map(|q| (q.id.clone(), Slot::Stored(String::new())))
                    .collect();
                newest.append(&mut slots);
                slots = newest;
                slots.truncate(limit as usize);
            }
            for (id, slot) in &mut slots {
                if let Some(q) = inner.queries.get(id.as_str()) {
                    *slot = Slot::Memory(Box::new(shown(q)));
                }
            }
        }
        // Stored documents are parsed out of the lock.
        let mut queries: Vec<types::Query> = slots
            .into_iter()
            .filter_map(|(id, slot)| match slot {
                Slot::Memory(q) => Some(*q),
                Slot::Stored(doc) => match serde_json::from_str(&doc) {
                    Ok(q) => Some(q),
                    Err(e) => {
                        tracing::error!(query = %id, error = %e, "a stored turn is unreadable; left out");
                        None
                    }
                },
            })
            .collect();
        queries.reverse();
        SessionPage { session, queries }
    }

    /// Records feedback on a turn (in memory, or only in the database:
    /// then its document is read and rewritten out of the lock; blocks).
    ///
    /// Returns the ticket of the change.
    ///
    /// # Errors
    /// 404 when the turn is not kept.
    pub(crate) fn set_feedback(
        &self,
        id: &str,
        feedback: types::QueryFeedback,
    ) -> LocalResult<Ticket> {
        {
            let mut change = self.change();
            if change.queries.contains_key(id) {
                change.set_feedback(id, feedback)?;
                return Ok(change.commit());
            }
        }
        let not_found = || LocalError::not_found(format!("query {id:?} not found"));
        let doc = self.db.query_doc(id).ok_or_else(not_found)?;
        let mut q: types::Query = serde_json::from_str(&doc).map_err(|_| not_found())?;
        q.feedback = Some(feedback);
        let mut change = self.change();
        change.push(Op::PutQueryDoc {
            id: id.to_owned(),
            doc: to_json(&q),
        });
        Ok(change.commit())
    }
}

/// A turn in memory as readers see it: a turn whose end is not saved yet
/// (its log not closed) is still in progress, so no reader sees an end a
/// crash could take back.
fn shown(q: &QueryEntry) -> types::Query {
    let mut query = q.query.clone();
    if query.is_terminal() && !q.log.is_finished() {
        query.status = crate::status::word::IN_PROGRESS.into();
        query.error = None;
    }
    query
}

/// Where a turn of a page comes from.
enum Slot {
    /// Its current document, in memory.
    Memory(Box<types::Query>),
    /// Its stored document, not parsed yet.
    Stored(String),
}
