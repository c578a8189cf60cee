//! Query turns and sessions: recording them, feedback, the eviction of
//! forgotten turns and of idle sessions beyond the limit.

use super::*;

impl Inner {
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

    /// Records a new query turn.
    pub(crate) fn insert_query(&mut self, entry: QueryEntry) {
        let id = entry.query.id.clone();
        self.query_order.push_back(id.clone());
        self.dirty.queries.insert(id.clone());
        self.dirty.created.insert(id.clone());
        self.queries.insert(id, entry);
    }

    /// A turn in memory, to change: its row is written with the change.
    pub(crate) fn query_mut(&mut self, id: &str) -> Option<&mut QueryEntry> {
        let q = self.queries.get_mut(id)?;
        self.dirty.queries.insert(id.to_owned());
        Some(q)
    }

    /// A session, to change: its row is written with the change.
    pub(crate) fn session_mut(&mut self, id: &str) -> Option<&mut SessionEntry> {
        let s = self.sessions.get_mut(id)?;
        self.dirty.sessions.insert(id.to_owned());
        Some(s)
    }

    /// Holds back the rows of a turn just accepted and of its session:
    /// they are written with the turn's end ([`Inner::query_mut`],
    /// [`Inner::release_session`]), in one change.
    pub(crate) fn save_with_end(&mut self, query_id: &str, session_id: &str) {
        self.dirty.queries.remove(query_id);
        self.dirty.sessions.remove(session_id);
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
        self.dirty.created.insert(entry.session.id.clone());
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

/// A new session id.
pub(crate) fn new_session_id() -> String {
    new_id("ses")
}

/// A new query id.
pub(crate) fn new_query_id() -> String {
    new_id("qry")
}
