//! [`TurnSlot`]: the right to run one turn of a session, and the checks
//! that a session's earlier turn has ended.

use std::fmt;
use std::sync::Arc;

use super::session::{Running, Session, Shared, WhenBusy};
use crate::Client;
use crate::client::Poller;
use crate::error::{Error, Result};

/// The right to run one turn of a session.
///
/// [`TurnSlot::release`] says the turn was seen to end; dropping the slot
/// without that leaves the turn remembered by the session (it may still run).
pub(crate) struct TurnSlot {
    shared: Arc<Shared>,
    generation: u64,
    released: bool,
}

impl fmt::Debug for TurnSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnSlot")
            .field("generation", &self.generation)
            .field("released", &self.released)
            .finish()
    }
}

/// The turn in the way has ended.
struct Ended;

/// What [`TurnSlot::acquire`] found in the way.
enum Blocker {
    /// A turn held in this process, by id when known.
    Held(Option<String>),
    /// A turn left running (dropped or detached), by id when known.
    Left(Option<String>, u64),
}

impl TurnSlot {
    /// Takes the session's slot, first checking that no earlier turn still
    /// runs (see [`Session`]), waiting for it when `when_busy` says so.
    ///
    /// # Errors
    /// [`Error::SessionBusy`] when an earlier turn still runs (after the
    /// wait, if any, which lasts at most `wait_limit`), with an empty id
    /// when it is held in this process and not named yet.
    pub(crate) async fn acquire(
        session: &Session,
        when_busy: &WhenBusy,
        wait_limit: std::time::Duration,
    ) -> Result<TurnSlot> {
        let mut poller = None;
        loop {
            let blocker = match session.shared.try_take() {
                Ok(slot) => return Ok(slot),
                Err(blocker) => blocker,
            };
            let query_id = match blocker {
                // Held here, but its owner may never read on: the server
                // knows whether it ended.
                Blocker::Held(id) => {
                    match session.shared.check_held(&session.client, id.clone()).await {
                        Some(Ended) => continue,
                        None => id.or_else(|| session.shared.running_on_server_id()),
                    }
                }
                Blocker::Left(id, generation) => {
                    match session
                        .shared
                        .check_left(&session.client, id, generation)
                        .await
                    {
                        // The earlier turn ended: try again at once.
                        None => continue,
                        Some(id) => Some(id),
                    }
                }
            };
            let wait = match when_busy {
                WhenBusy::Wait(wait) => wait,
                WhenBusy::Fail => return Err(busy(query_id)),
            };
            tracing::debug!(
                query_id = query_id.as_deref(),
                "waiting for the session's running turn"
            );
            if !poller
                .get_or_insert_with(|| Poller::with_timeout(wait, wait_limit))
                .pause()
                .await
            {
                return Err(busy(query_id));
            }
        }
    }

    /// Records what a turn reported about the session. A session keeps the
    /// id it was created with or given: a turn's report of another one is
    /// never adopted (the turn's own checks make it an error).
    pub(crate) fn learn(&self, session_id: Option<&str>, query_id: Option<&str>) {
        let mut start = self.shared.lock();
        if let Some(s) = session_id.filter(|s| !s.is_empty()) {
            match start.session_id.as_deref() {
                None => start.session_id = Some(s.to_owned()),
                Some(known) if known != s => {
                    tracing::warn!(
                        session_id = known,
                        reported = s,
                        "a turn reported another session; keeping this one"
                    );
                    return;
                }
                Some(_) => {}
            }
        }
        if let Some(q) = query_id.filter(|q| !q.is_empty()) {
            if start.last_query_id.as_deref() != Some(q) {
                start.last_query_id = Some(q.to_owned());
            }
            if let Some(r) = start.running.as_mut()
                && r.generation == self.generation
                && r.query_id.is_none()
            {
                r.query_id = Some(q.to_owned());
            }
        }
    }

    /// Makes the session remember `query_id` (a turn found running
    /// elsewhere) in place of this slot's turn, which never started.
    pub(crate) fn adopt(&self, query_id: &str) {
        let mut start = self.shared.lock();
        if let Some(r) = start.running.as_mut()
            && r.generation == self.generation
        {
            r.query_id = Some(query_id.to_owned());
        }
    }

    /// The turn was seen to end (or never started): the session is free.
    pub(crate) fn release(mut self) {
        self.released = true;
        let mut start = self.shared.lock();
        if start
            .running
            .as_ref()
            .is_some_and(|r| r.generation == self.generation)
        {
            start.running = None;
        }
    }
}

impl Drop for TurnSlot {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Dropped before the turn was seen to end: it may still run, so the
        // session remembers it (by id when known) and checks it next time.
        let mut start = self.shared.lock();
        let forget = match start.running.as_mut() {
            Some(r) if r.generation == self.generation => {
                r.held = false;
                // With neither id, nothing can be checked, and the next turn
                // starts a new session anyway.
                r.query_id.is_none() && start.session_id.is_none()
            }
            _ => false,
        };
        if forget {
            start.running = None;
        }
    }
}

/// The error for a session whose turn `query_id` still runs (no id: held
/// in this process and not named by the server yet).
fn busy(query_id: Option<String>) -> Error {
    Error::SessionBusy {
        query_id: query_id.unwrap_or_default(),
    }
}

impl Shared {
    /// Takes the slot when no turn is remembered.
    fn try_take(self: &Arc<Self>) -> Result<TurnSlot, Blocker> {
        let mut start = self.lock();
        match &start.running {
            Some(r) if r.held => Err(Blocker::Held(r.query_id.clone())),
            Some(r) => Err(Blocker::Left(r.query_id.clone(), r.generation)),
            None => {
                let generation = start.next_generation;
                start.next_generation = generation.wrapping_add(1);
                start.running = Some(Running {
                    generation,
                    query_id: None,
                    held: true,
                    on_server: None,
                });
                Ok(TurnSlot {
                    shared: Arc::clone(self),
                    generation,
                    released: false,
                })
            }
        }
    }

    /// Checks a turn left running: `None` when it ended (and is forgotten),
    /// else its id.
    async fn check_left(
        &self,
        client: &Client,
        query_id: Option<String>,
        generation: u64,
    ) -> Option<String> {
        let query_id = match query_id {
            Some(id) => Some(id),
            // Dropped before the server named it: the session's stored turns
            // tell whether one still runs.
            None => match self.session_id() {
                None => None,
                Some(session_id) => match client.sessions().get(&session_id).await {
                    Ok(s) => s
                        .queries
                        .iter()
                        .rev()
                        .find(|q| !q.is_terminal())
                        .map(|q| q.id.clone()),
                    // Cannot tell: let the server decide (a 409 is mapped).
                    Err(_) => None,
                },
            },
        };
        let ended = match &query_id {
            None => true,
            // An answer about another turn tells nothing about this one.
            Some(id) => match client.queries().get(id).await {
                Ok(q) => q.id == *id && q.is_terminal(),
                Err(e) => e.is_not_found(),
            },
        };
        if ended {
            let mut start = self.lock();
            if start
                .running
                .as_ref()
                .is_some_and(|r| r.generation == generation)
            {
                start.running = None;
            }
            return None;
        }
        query_id
    }

    /// Asks the server about a turn held in this process: `Some(Ended)`
    /// when it (or, unnamed, every turn of the session) has ended, and the
    /// session forgot it; `None` while it may run, or when the server
    /// cannot tell.
    async fn check_held(&self, client: &Client, query_id: Option<String>) -> Option<Ended> {
        let ended = match &query_id {
            Some(id) => match client.queries().get(id).await {
                Ok(q) => q.id == *id && q.is_terminal(),
                Err(e) => e.is_not_found(),
            },
            // Not named yet: the session's stored turns tell, once the
            // session is known; a new session has nothing to ask about.
            None => {
                let session_id = self.session_id()?;
                let stored = client.sessions().get(&session_id).await.ok()?;
                let running = stored.queries.iter().rev().find(|q| !q.is_terminal());
                self.note_running_on_server(running.map(|q| q.id.clone()));
                running.is_none() && !stored.queries.is_empty()
            }
        };
        if !ended {
            return None;
        }
        let mut start = self.lock();
        if start
            .running
            .as_ref()
            .is_some_and(|r| r.held && r.query_id == query_id)
        {
            start.running = None;
        }
        Some(Ended)
    }

    /// Remembers which turn the server says still runs, to name it in
    /// [`Error::SessionBusy`].
    fn note_running_on_server(&self, id: Option<String>) {
        let mut start = self.lock();
        if let Some(r) = start.running.as_mut()
            && r.query_id.is_none()
        {
            r.on_server = id;
        }
    }

    /// The running turn the server named for a held, unnamed turn.
    fn running_on_server_id(&self) -> Option<String> {
        self.lock()
            .running
            .as_ref()
            .and_then(|r| r.on_server.clone())
    }

    fn session_id(&self) -> Option<String> {
        self.lock().session_id.clone()
    }
}
