//! Sessions: who owns each one, the caps on how many live (in all and per
//! caller), and which one gives way when the server is full.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use super::budget::CallerId;
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
}

#[derive(Debug, Default)]
struct Table {
    entries: HashMap<String, Entry>,
    /// Sessions being created (counted against the caps).
    creating: usize,
    creating_by: HashMap<CallerId, usize>,
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
}

/// Why no session may be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Full {
    /// Every session is busy and the server is at its cap.
    Server,
    /// This caller is at its own cap.
    Caller,
}

/// The live sessions, their owners and caps.
#[derive(Debug)]
pub(super) struct Sessions {
    manager: Arc<LocalSessionManager>,
    table: Mutex<Table>,
    pub(super) max: usize,
    pub(super) per_caller: usize,
    metrics: Arc<Metrics>,
}

impl Sessions {
    pub(super) fn new(
        manager: Arc<LocalSessionManager>,
        max: usize,
        per_caller: usize,
        metrics: Arc<Metrics>,
    ) -> Self {
        Sessions {
            manager,
            table: Mutex::new(Table::default()),
            max: max.max(1),
            per_caller: per_caller.max(1),
            metrics,
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
        table.entries.retain(|id, _| live.contains(id));
        self.metrics
            .sessions()
            .set(i64::try_from(table.entries.len()).unwrap_or(i64::MAX));
    }

    /// Reserves room for a session of `caller`: closes the least recently
    /// used idle session when the server is full.
    pub(super) async fn reserve(self: &Arc<Self>, caller: CallerId) -> Result<Reservation, Full> {
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
                if total >= self.max && !pruned {
                    continue;
                }
                let victim = if total >= self.max {
                    let oldest = table
                        .entries
                        .iter()
                        .filter(|(_, e)| e.busy == 0)
                        .min_by_key(|(_, e)| e.used)
                        .map(|(id, _)| id.clone());
                    match oldest {
                        Some(id) => {
                            table.entries.remove(&id);
                            Some(id)
                        }
                        None => return Err(Full::Server),
                    }
                } else {
                    None
                };
                table.creating += 1;
                *table.creating_by.entry(caller).or_insert(0) += 1;
                victim
            };
            if let Some(id) = victim {
                tracing::info!("session cap reached: closed the least recently used idle session");
                let _ = self.manager.close_session(&Arc::from(id.as_str())).await;
            }
            return Ok(Reservation {
                sessions: Arc::clone(self),
                caller,
            });
        }
        Err(Full::Server)
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
        })
    }

    /// Forgets session `id` (deleted by its owner).
    pub(super) fn remove(&self, id: &str) {
        let mut table = self.table();
        table.entries.remove(id);
        self.metrics
            .sessions()
            .set(i64::try_from(table.entries.len()).unwrap_or(i64::MAX));
    }
}

/// Room for one session being created.
#[derive(Debug)]
pub(super) struct Reservation {
    sessions: Arc<Sessions>,
    caller: CallerId,
}

impl Reservation {
    /// Records the created session `id` for `owner`.
    pub(super) fn bind(self, id: String, owner: Option<[u8; 32]>) {
        let mut table = self.sessions.table();
        let used = table.tick();
        table.entries.insert(
            id,
            Entry {
                owner,
                caller: self.caller,
                used,
                busy: 0,
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
