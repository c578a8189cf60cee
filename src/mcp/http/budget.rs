//! Budgets: requests in flight, over all callers and per caller, and what
//! holds a slot until a response's body has been sent.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use tokio::sync::Notify;

/// Who a request counts against: a hash of its key, or the client
/// network when it has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(in crate::mcp) enum CallerId {
    /// A caller key, by its per-process hash.
    Key(u64),
    /// Clients without a key, by their network (see [`CallerId::network`]).
    Addr(IpAddr),
    /// The one client of a stdio server: the process that started it.
    Process,
}

/// Requests in flight of one client network without a key, together (at
/// most the per-caller limit): keyless callers share a small anonymous
/// budget, within the quarantine of unproven keys.
pub(crate) const ANONYMOUS_PER_NETWORK: usize = 8;

impl CallerId {
    /// The keyless caller of address `ip`: an IPv4 address, or an IPv6
    /// /64 (one host's usual share; an IPv4-mapped address is its IPv4).
    pub(super) fn network(ip: IpAddr) -> Self {
        CallerId::Addr(crate::serving::client_network(ip))
    }

    fn limit(self, per_caller: usize) -> usize {
        match self {
            CallerId::Key(_) | CallerId::Process => per_caller,
            CallerId::Addr(_) => per_caller.min(ANONYMOUS_PER_NETWORK),
        }
    }
}

/// Why a request got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::mcp) enum Over {
    /// Every slot of the server is taken.
    Server,
    /// Every slot of this caller is taken.
    Caller,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    /// Requests of unproven keys in flight.
    unproven: usize,
    callers: HashMap<CallerId, usize>,
}

/// Requests in flight: at most `max` in all, `per_caller` for one caller,
/// and an eighth of `max` for unproven keys together. A session's GET
/// stream counts against its caller only.
#[derive(Debug)]
pub(in crate::mcp) struct Budgets {
    max: usize,
    per_caller: usize,
    quarantine: usize,
    counts: Mutex<Counts>,
    idle: Notify,
}

impl Budgets {
    pub(in crate::mcp) fn new(max: usize, per_caller: usize) -> Self {
        Budgets {
            max: max.max(1),
            per_caller: per_caller.max(1),
            quarantine: (max / 8).max(1),
            counts: Mutex::new(Counts::default()),
            idle: Notify::new(),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        // Plain counters; a poisoned lock still holds consistent ones.
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A slot for one request of `caller` (of an unproven key unless
    /// `proven`), held until the value is dropped.
    pub(in crate::mcp) fn admit(
        self: &Arc<Self>,
        caller: CallerId,
        proven: bool,
    ) -> Result<Slot, Over> {
        let mut counts = self.counts();
        let mine = counts.callers.get(&caller).copied().unwrap_or(0);
        if mine >= caller.limit(self.per_caller) {
            return Err(Over::Caller);
        }
        if counts.total >= self.max || (!proven && counts.unproven >= self.quarantine) {
            return Err(Over::Server);
        }
        counts.total += 1;
        if !proven {
            counts.unproven += 1;
        }
        counts.callers.insert(caller, mine + 1);
        Ok(Slot {
            budgets: Arc::clone(self),
            caller,
            kind: SlotKind::Request { proven },
        })
    }

    /// A slot for one GET stream of `caller`: counted against the caller
    /// only, for as long as the stream is open.
    pub(super) fn admit_stream(self: &Arc<Self>, caller: CallerId) -> Result<Slot, Over> {
        let mut counts = self.counts();
        let mine = counts.callers.get(&caller).copied().unwrap_or(0);
        if mine >= self.per_caller {
            return Err(Over::Caller);
        }
        counts.callers.insert(caller, mine + 1);
        Ok(Slot {
            budgets: Arc::clone(self),
            caller,
            kind: SlotKind::Stream,
        })
    }

    /// A slot for a request that only ends what `caller` holds (a
    /// session's `DELETE`): counted against nothing, so that a caller at
    /// its limit can still end a session and the calls running in it.
    pub(super) fn admit_ending(self: &Arc<Self>, caller: CallerId) -> Slot {
        Slot {
            budgets: Arc::clone(self),
            caller,
            kind: SlotKind::Ending,
        }
    }

    /// Resolves once no request holds a slot.
    pub(in crate::mcp) async fn until_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.counts().total == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// What a slot counts against.
#[derive(Debug, Clone, Copy)]
enum SlotKind {
    /// A request: the server's, the caller's and maybe the quarantine's.
    Request { proven: bool },
    /// A GET stream: the caller's only.
    Stream,
    /// A request that only ends what its caller holds: nothing.
    Ending,
}

/// One request's slot.
#[derive(Debug)]
pub(in crate::mcp) struct Slot {
    budgets: Arc<Budgets>,
    caller: CallerId,
    kind: SlotKind,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let SlotKind::Ending = self.kind {
            return;
        }
        let mut counts = self.budgets.counts();
        if let SlotKind::Request { proven } = self.kind {
            counts.total = counts.total.saturating_sub(1);
            if !proven {
                counts.unproven = counts.unproven.saturating_sub(1);
            }
        }
        if let Some(mine) = counts.callers.get_mut(&self.caller) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                counts.callers.remove(&self.caller);
            }
        }
        if counts.total == 0 {
            drop(counts);
            self.budgets.idle.notify_waiters();
        }
    }
}

/// A response body that holds `hold` until it is sent (or dropped), and
/// hands it to `at_end` once its last frame is out.
struct Held<G> {
    inner: Body,
    hold: G,
    at_end: fn(&mut G),
}

impl<G: Unpin> hyper::body::Body for Held<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            (this.at_end)(&mut this.hold);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `response` with `hold` kept until its body has been sent.
pub(super) fn hold_until_end<G: Send + Unpin + 'static>(response: Response, hold: G) -> Response {
    hold_and_finish(response, hold, |_| {})
}

/// `response` with `hold` kept until its body has been sent or dropped,
/// and handed to `at_end` once the body has been read to its end.
pub(super) fn hold_and_finish<G: Send + Unpin + 'static>(
    response: Response,
    hold: G,
    at_end: fn(&mut G),
) -> Response {
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(Held {
            inner: body,
            hold,
            at_end,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_caller_at_its_limit_leaves_room_for_others() {
        let budgets = Arc::new(Budgets::new(3, 2));
        let a = CallerId::Addr(IpAddr::from([10, 0, 0, 1]));
        let b = CallerId::Key(7);
        let first = budgets.admit(a, true).unwrap();
        let _second = budgets.admit(a, true).unwrap();
        assert_eq!(budgets.admit(a, true).unwrap_err(), Over::Caller);
        let _third = budgets.admit(b, true).unwrap();
        assert_eq!(budgets.admit(b, true).unwrap_err(), Over::Server);
        drop(first);
        assert!(budgets.admit(a, true).is_ok());
    }

    #[test]
    fn keyless_callers_share_a_small_budget_per_network() {
        let budgets = Arc::new(Budgets::new(256, 32));
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        assert_eq!(CallerId::network(a), CallerId::network(b), "one /64");
        let held: Vec<Slot> = (0..ANONYMOUS_PER_NETWORK)
            .map(|_| budgets.admit(CallerId::network(a), false).unwrap())
            .collect();
        assert_eq!(
            budgets.admit(CallerId::network(b), false).unwrap_err(),
            Over::Caller
        );
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert!(budgets.admit(CallerId::network(other), false).is_ok());
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(
            CallerId::network(mapped),
            CallerId::Addr(IpAddr::from([10, 0, 0, 1]))
        );
        drop(held);
    }

    #[test]
    fn unproven_keys_share_a_small_quarantine_and_streams_count_per_caller() {
        let budgets = Arc::new(Budgets::new(16, 4));
        let held: Vec<Slot> = (0..2)
            .map(|i| budgets.admit(CallerId::Key(i), false).unwrap())
            .collect();
        assert_eq!(
            budgets.admit(CallerId::Key(9), false).unwrap_err(),
            Over::Server,
            "the quarantine (16 / 8) is full"
        );
        assert!(
            budgets.admit(CallerId::Key(10), true).is_ok(),
            "proven keys pass"
        );
        let a = CallerId::Key(20);
        let _streams: Vec<Slot> = (0..4).map(|_| budgets.admit_stream(a).unwrap()).collect();
        assert_eq!(budgets.admit(a, true).unwrap_err(), Over::Caller);
        assert_eq!(budgets.counts().total, 2, "streams are not in the total");
        drop(held);
    }
}
