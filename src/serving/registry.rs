//! The open connections of a server (shared by its serving threads): the
//! connection slots, how many each peer holds, which wait for their first
//! request head, and which to close to make room.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::activity::Activity;
use super::{AtCapacity, Hooks, Limits, PeerFull};

/// How often a full server looks again for a connection to reclaim.
const RECLAIM_CHECK: Duration = Duration::from_secs(1);

/// One open connection as the registry sees it.
#[derive(Debug)]
pub(super) struct Conn {
    /// The remote IP address.
    peer: IpAddr,
    pub(super) activity: Arc<Activity>,
    /// Cancelled to ask the connection to close (reclaimed, or shutdown).
    pub(super) close: CancellationToken,
}

impl Conn {
    /// Not asked to close yet.
    fn staying(&self) -> bool {
        !self.close.is_cancelled()
    }
}

/// The open connections of a server.
#[derive(Debug)]
pub(super) struct Registry {
    slots: Arc<Semaphore>,
    max_connections: usize,
    at_capacity: AtCapacity,
    max_per_peer: usize,
    peer_full: PeerFull,
    max_awaiting_head: Option<usize>,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Registry {
    pub(super) fn new(limits: &Limits) -> Self {
        let max_connections = limits.max_connections.max(1);
        Registry {
            slots: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            at_capacity: limits.at_capacity,
            max_per_peer: limits.max_per_peer.clamp(1, max_connections),
            peer_full: limits.peer_full,
            max_awaiting_head: limits.max_awaiting_head,
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        }
    }

    fn open(&self) -> MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Before accepting: with [`AtCapacity::Reclaim`], a free slot (`None`
    /// once `stop` is cancelled), so that past the cap connections wait in
    /// the listener's backlog instead of taking descriptors, while one that
    /// falls idle is reclaimed (checked every `RECLAIM_CHECK`). Otherwise
    /// `Some(None)`: the slot is taken after accepting.
    pub(super) async fn before_accept(
        &self,
        stop: &CancellationToken,
    ) -> Option<Option<OwnedSemaphorePermit>> {
        if self.at_capacity == AtCapacity::Refuse {
            return Some(None);
        }
        loop {
            if self.slots.available_permits() == 0 {
                self.reclaim_longest_idle(None);
            }
            tokio::select! {
                slot = Arc::clone(&self.slots).acquire_owned() => return slot.ok().map(Some),
                () = tokio::time::sleep(RECLAIM_CHECK) => {}
                () = stop.cancelled() => return None,
            }
        }
    }

    /// Registers a connection from `peer` until the returned guard is
    /// dropped, within every limit: the total (`slot`, when taken before
    /// accepting), the peer's and the cap on connections awaiting a head.
    /// `None` (after telling `hooks`) when it is refused.
    pub(super) fn admit(
        self: &Arc<Self>,
        slot: Option<OwnedSemaphorePermit>,
        peer: SocketAddr,
        close: CancellationToken,
        hooks: &dyn Hooks,
    ) -> Option<Registered> {
        let slot = match slot {
            Some(slot) => slot,
            None => match Arc::clone(&self.slots).try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    hooks.refused_at_capacity(peer, self.max_connections);
                    return None;
                }
            },
        };
        let conn = Arc::new(Conn {
            peer: peer.ip(),
            activity: Arc::new(Activity::new()),
            close,
        });
        let mut open = self.open();
        if !hooks.uncapped(conn.peer) && !self.room_for_peer(&open, conn.peer) {
            hooks.refused_for_peer(peer, self.max_per_peer);
            return None;
        }
        self.room_to_await_head(&open);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        open.insert(id, Arc::clone(&conn));
        drop(open);
        if let AtCapacity::Reclaim { below } = self.at_capacity
            && self.slots.available_permits() < below
        {
            self.reclaim_longest_idle(Some(id));
        }
        Some(Registered {
            registry: Arc::clone(self),
            id,
            conn,
            _slot: slot,
        })
    }

    /// Whether `peer` may open one more connection: below its cap, or
    /// (with [`PeerFull::ReplaceIdle`]) once its own connection idle the
    /// longest is asked to close.
    fn room_for_peer(&self, open: &HashMap<u64, Arc<Conn>>, peer: IpAddr) -> bool {
        let own = || open.values().filter(|c| c.staying() && c.peer == peer);
        if own().count() < self.max_per_peer {
            return true;
        }
        if self.peer_full == PeerFull::Refuse {
            return false;
        }
        let Some(idle) = own()
            .filter(|c| !c.activity.busy())
            .max_by_key(|c| c.activity.idle_for())
        else {
            return false;
        };
        tracing::debug!(%peer, "the peer holds its most connections: closing its connection idle the longest");
        idle.close.cancel();
        true
    }

    /// Past the cap on connections awaiting their first request head, asks
    /// the oldest of them to close.
    fn room_to_await_head(&self, open: &HashMap<u64, Arc<Conn>>) {
        let Some(max) = self.max_awaiting_head else {
            return;
        };
        let awaiting = || open.values().filter(|c| c.staying() && !c.activity.seen());
        if awaiting().count() < max {
            return;
        }
        if let Some(oldest) = awaiting().max_by_key(|c| c.activity.idle_for()) {
            tracing::debug!(peer = %oldest.peer, "too many connections without a request: closing the oldest");
            oldest.close.cancel();
        }
    }

    /// Asks the connection that has gone longest without a request in
    /// flight (and was not asked yet), other than `keep`, to close.
    fn reclaim_longest_idle(&self, keep: Option<u64>) {
        let open = self.open();
        let longest = open
            .iter()
            .filter(|(id, _)| keep != Some(**id))
            .map(|(_, c)| c)
            .filter(|c| c.staying() && !c.activity.busy())
            .max_by_key(|c| c.activity.idle_for());
        if let Some(conn) = longest {
            tracing::debug!(peer = %conn.peer, "near the connection cap: closing the connection idle the longest");
            conn.close.cancel();
        }
    }
}

/// A registered connection and its slot; both given back on drop.
#[derive(Debug)]
pub(super) struct Registered {
    registry: Arc<Registry>,
    id: u64,
    pub(super) conn: Arc<Conn>,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.open().remove(&self.id);
    }
}
