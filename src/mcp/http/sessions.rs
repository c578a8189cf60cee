//! Sessions: who owns each one, the caps on how many live (in all, per
//! caller, and for unproven keys), which one gives way when the server is
//! full, and the one GET stream each may hold.
//!
//! A session of a key the upstream has not accepted yet (see `proof`) is
//! quarantined: such sessions are at most a small share of the cap, and
//! room for one is made only by closing another quarantined one. A proven
//! caller's `initialize` at the cap closes the least recently used idle
//! quarantined session first, then the least recently used idle proven
//! one; a session with an open GET stream or a request in flight is never
//! closed to make room.
//!
//! A session's end (its owner's `DELETE`, its idle expiry, its closing to
//! make room) fires its `ended` token, which every call running in it
//! carries: the call is cancelled, a Nexus turn it started with it, and
//! its ledger slot is held until that cancel is answered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use tokio_util::sync::CancellationToken;

use super::budget::CallerId;
use super::call_streams::SessionEnds;
use crate::mcp::metrics::Metrics;

/// One live session as the guard knows it.
#[derive(Debug)]
struct Entry {
    /// The key digest that created it (`None`: no key).
    owner: Option<[u8; 32]>,
    caller: CallerId,
    /// When it was last used, on the table's clock.
    used: u64,
    /// Requests in flight on it.
    busy: usize,
    /// Its open GET stream (at most one).
    streaming: bool,
    /// Whether its key was proven when it was created (or since).
    proven: bool,
    /// Fired when the session ends: its running calls are cancelled.
    ended: CancellationToken,
}

impl Entry {
    fn idle(&self) -> bool {
        self.busy == 0 && !self.streaming
    }
}

#[derive(Debug, Default)]
struct Table {
    entries: HashMap<String, Entry>,
    /// Sessions being created (counted against the caps).
    creating: usize,
    creating_by: HashMap<CallerId, usize>,
    /// Quarantined sessions being created.
    creating_unproven: usize,
    clock: u64,
}

impl Table {
    fn of(&self, caller: CallerId) -> usize {
        self.entries.values().filter(|e| e.caller == caller).count()
            + self.creating_by.get(&caller).copied().unwrap_or(0)
    }

    fn tick(&mut self) -> u64 {
        self.clock = self.clock.wrapping_add(1);
        self.clock
    }

    fn quarantined(&self) -> usize {
        self.entries.values().filter(|e| !e.proven).count() + self.creating_unproven
    }

    /// The least recently used idle session, quarantined ones only or
    /// quarantined ones first.
    fn victim(&self, quarantined_only: bool) -> Option<String> {
        let oldest = |proven: bool| {
            self.entries
                .iter()
                .filter(|(_, e)| e.proven == proven && e.idle())
                .min_by_key(|(_, e)| e.used)
                .map(|(id, _)| id.clone())
        };
        oldest(false).or_else(|| if quarantined_only { None } else { oldest(true) })
    }
}

/// Why no session may be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Full {
    /// Every session is busy and the server is at its cap.
    Server,
    /// This caller is at its own cap.
    Caller,
    /// Unproven keys hold all the sessions they may, all busy.
    Quarantine,
}

/// The live sessions, their owners and caps.
#[derive(Debug)]
pub(super) struct Sessions {
    manager: Arc<LocalSessionManager>,
    table: Mutex<Table>,
    pub(super) max: usize,
    pub(super) per_caller: usize,
    /// Sessions of unproven keys, in all.
    pub(super) quarantine: usize,
    metrics: Arc<Metrics>,
    /// Each session's end, fired when its worker is gone.
    ends: SessionEnds,
}

impl Sessions {
    pub(super) fn new(
        manager: Arc<LocalSessionManager>,
        max: usize,
        per_caller: usize,
        metrics: Arc<Metrics>,
        ends: SessionEnds,
    ) -> Self {
        let max = max.max(1);
        Sessions {
            manager,
            table: Mutex::new(Table::default()),
            max,
            per_caller: per_caller.max(1),
            quarantine: quarantine_share(max),
            metrics,
            ends,
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // Plain values; a poisoned map is still consistent.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forgets sessions that ended on their own (idle expiry).
    async fn prune(&self) {
        let live: std::collections::HashSet<String> = self
            .manager
            .sessions
            .read()
            .await
            .keys()
            .map(|id| id.to_string())
            .collect();
        let mut table = self.table();
        table.entries.retain(|id, entry| {
            let alive = live.contains(id);
            if !alive {
                entry.ended.cancel();
            }
            alive
        });
        self.metrics
            .sessions()
            .set(i64::try_from(table.entries.len()).unwrap_or(i64::MAX));
    }

    /// Reserves room for a session of `caller` (quarantined unless
    /// `proven`): closes the least recently used idle session it may
    /// displace when there is no room (see the module docs).
    pub(super) async fn reserve(
        self: &Arc<Self>,
        caller: CallerId,
        proven: bool,
    ) -> Result<Reservation, Full> {
        for pruned in [false, true] {
            if pruned {
                self.prune().await;
            }
            let victim = {
                let mut table = self.table();
                if table.of(caller) >= self.per_caller {
                    if pruned {
                        return Err(Full::Caller);
                    }
                    continue;
                }
                let total = table.entries.len().saturating_add(table.creating);
                let quarantine_full = !proven && table.quarantined() >= self.quarantine;
                if (total >= self.max || quarantine_full) && !pruned {
                    continue;
                }
                let victim = if quarantine_full || total >= self.max {
                    match table.victim(!proven) {
                        Some(id) => {
                            if let Some(entry) = table.entries.remove(&id) {
                                entry.ended.cancel();
                            }
                            Some(id)
                        }
                        None if proven => return Err(Full::Server),
                        None => return Err(Full::Quarantine),
                    }
                } else {
                    None
                };
                table.creating += 1;
                if !proven {
                    table.creating_unproven += 1;
                }
                *table.creating_by.entry(caller).or_insert(0) += 1;
                victim
            };
            if let Some(id) = victim {
                tracing::info!("session cap reached: closed the least recently used idle session");
                let _ = self.manager.close_session(&Arc::from(id.as_str())).await;
                self.publish();
            }
            return Ok(Reservation {
                sessions: Arc::clone(self),
                caller,
                proven,
            });
        }
        Err(Full::Server)
    }

    /// Sets the open-sessions gauge from the table.
    fn publish(&self) {
        let table = self.table();
        self.metrics
            .sessions()
            .set(i64::try_from(table.entries.len()).unwrap_or(i64::MAX));
    }

    /// Forgets sessions that ended on their own and updates the gauge: run
    /// by the server now and then, so that `open_sessions` stays true.
    pub(super) async fn refresh(&self) {
        self.prune().await;
    }

    /// Marks session `id` as holding its GET stream until the returned
    /// value is dropped; `Err(())` when it already holds one.
    pub(super) fn open_stream(self: &Arc<Self>, id: &str) -> Result<Streaming, ()> {
        let mut table = self.table();
        let Some(entry) = table.entries.get_mut(id) else {
            // Gone meanwhile: the service answers 404 itself.
            return Ok(Streaming {
                sessions: Arc::clone(self),
                id: None,
            });
        };
        if entry.streaming {
            return Err(());
        }
        entry.streaming = true;
        Ok(Streaming {
            sessions: Arc::clone(self),
            id: Some(id.to_owned()),
        })
    }

    /// Marks session `id` proven (its key has been accepted since).
    pub(super) fn prove(&self, id: &str) {
        if let Some(entry) = self.table().entries.get_mut(id) {
            entry.proven = true;
        }
    }

    /// Marks session `id` in use by a request with key digest `owner`;
    /// `None` when there is no such session or it is another caller's.
    pub(super) fn enter(self: &Arc<Self>, id: &str, owner: Option<[u8; 32]>) -> Option<InUse> {
        let mut table = self.table();
        let now = table.tick();
        let entry = table.entries.get_mut(id)?;
        if entry.owner != owner {
            return None;
        }
        entry.used = now;
        entry.busy += 1;
        Some(InUse {
            sessions: Arc::clone(self),
            id: id.to_owned(),
            ended: entry.ended.clone(),
        })
    }

    /// Forgets session `id` (deleted by its owner, or gone), cancelling
    /// the calls still running in it.
    pub(super) fn remove(&self, id: &str) {
        let mut table = self.table();
        if let Some(entry) = table.entries.remove(id) {
            entry.ended.cancel();
        }
        self.metrics
            .sessions()
            .set(i64::try_from(table.entries.len()).unwrap_or(i64::MAX));
    }
}

/// The share of `max` sessions that unproven keys may hold: an eighth,
/// at least 1 and at most 64.
fn quarantine_share(max: usize) -> usize {
    (max / 8).clamp(1, 64)
}

/// Room for one session being created.
#[derive(Debug)]
pub(super) struct Reservation {
    sessions: Arc<Sessions>,
    caller: CallerId,
    proven: bool,
}

impl Reservation {
    /// Records the created session `id` for `owner`.
    pub(super) fn bind(self, id: String, owner: Option<[u8; 32]>) {
        let ended = self.sessions.ends.ended(&id);
        let mut table = self.sessions.table();
        let used = table.tick();
        table.entries.insert(
            id,
            Entry {
                owner,
                caller: self.caller,
                used,
                busy: 0,
                streaming: false,
                proven: self.proven,
                ended,
            },
        );
        self.sessions
            .metrics
            .sessions()
            .set(i64::try_from(table.entries.len()).unwrap_or(i64::MAX));
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut table = self.sessions.table();
        table.creating = table.creating.saturating_sub(1);
        if !self.proven {
            table.creating_unproven = table.creating_unproven.saturating_sub(1);
        }
        if let Some(n) = table.creating_by.get_mut(&self.caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                table.creating_by.remove(&self.caller);
            }
        }
    }
}

/// A request in flight on a session.
#[derive(Debug)]
pub(super) struct InUse {
    sessions: Arc<Sessions>,
    id: String,
    ended: CancellationToken,
}

impl InUse {
    /// What fires when the session ends.
    pub(super) fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        let mut table = self.sessions.table();
        let now = table.tick();
        if let Some(entry) = table.entries.get_mut(&self.id) {
            entry.busy = entry.busy.saturating_sub(1);
            entry.used = now;
        }
    }
}

/// A session's open GET stream; the session may open another once this is
/// dropped (with the stream's body).
#[derive(Debug)]
pub(super) struct Streaming {
    sessions: Arc<Sessions>,
    id: Option<String>,
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let Some(id) = &self.id else {
            return;
        };
        let mut table = self.sessions.table();
        let now = table.tick();
        if let Some(entry) = table.entries.get_mut(id) {
            entry.streaming = false;
            entry.used = now;
        }
    }
}
