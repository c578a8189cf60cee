//! The reconnect throttle: a client network whose connection the core cut
//! for making no progress (a response its peer did not take by the
//! write-stall timeout or the request deadline) opens new connections at a
//! slower pace for a while, so a peer that reconnects at once to hold
//! request slots again gets few of them.
//!
//! Networks that were never cut are not slowed at all: an honest client
//! that keeps its connections alive, or opens a new one for each request,
//! never meets the throttle. A network that was cut earns one new
//! connection a pace, up to [`BURST`] saved, and each cut costs it one:
//! after its first cut it may open `BURST - 1` at once. The pace starts at
//! [`ReconnectLimit::pace`] and doubles with each further cut (up to
//! 2^[`MAX_DOUBLINGS`] times); a network without a cut for
//! [`FORGIVEN_AFTER`] is forgotten. The table of networks is bounded
//! (`ReconnectLimit::max_networks` entries of about 100 bytes each, the
//! network whose last cut is oldest forgotten first).
//!
//! The throttle sees the TCP peer. A trusted proxy's connections are
//! exempt (like from the per-peer cap): the real client is known only
//! from a request's head, so behind a proxy the throttle applies to
//! requests instead ([`ForwardedClients`]): a cut of a proxy's connection
//! is charged to the client its last request was forwarded for, and that
//! client's network then gets one request a pace.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Connections a network that was cut may open at once.
pub(crate) const BURST: u32 = 4;
/// Most doublings of the pace: 32 times [`ReconnectLimit::pace`].
pub(crate) const MAX_DOUBLINGS: u32 = 5;
/// A network without a cut for this long is forgotten.
pub(crate) const FORGIVEN_AFTER: Duration = Duration::from_secs(600);

/// The client network of `ip`: an IPv4 address, or the /64 of an IPv6
/// address (one host's usual share; an IPv4-mapped address is its IPv4).
pub(crate) fn client_network(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
        v4 => v4,
    }
}

/// How a server throttles the reconnects of networks it cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReconnectLimit {
    /// The pace of new connections of a network after its first cut.
    pub(crate) pace: Duration,
    /// Most networks remembered at once (at least 1).
    pub(crate) max_networks: usize,
}

/// What is remembered of one network that was cut.
#[derive(Debug, Clone, Copy)]
struct Record {
    /// Cuts while remembered.
    cuts: u32,
    last_cut: Instant,
    /// Connections it may open now (at most [`BURST`]; below zero after
    /// cuts in a row), as of `refilled`.
    tokens: f64,
    refilled: Instant,
}

impl Record {
    fn pace(&self, limit: &ReconnectLimit) -> Duration {
        let doublings = self.cuts.saturating_sub(1).min(MAX_DOUBLINGS);
        limit.pace.saturating_mul(1 << doublings)
    }

    /// Adds what the time since the last refill earned: one connection a
    /// pace, up to [`BURST`].
    fn refill(&mut self, limit: &ReconnectLimit, now: Instant) {
        let pace = self.pace(limit).as_secs_f64();
        let earned = now.saturating_duration_since(self.refilled).as_secs_f64() / pace;
        self.tokens = (self.tokens + earned).min(f64::from(BURST));
        self.refilled = now;
    }
}

/// The networks a server cut, and their pace.
#[derive(Debug)]
pub(crate) struct Reconnects {
    limit: Option<ReconnectLimit>,
    /// Whether any network is remembered: a server that cut nobody admits
    /// without taking the lock.
    any: AtomicBool,
    networks: Mutex<HashMap<IpAddr, Record>>,
}

impl Reconnects {
    /// The throttle of `limit` (`None`, or a zero pace: nobody is
    /// throttled).
    pub(crate) fn new(limit: Option<ReconnectLimit>) -> Self {
        Reconnects {
            limit: limit.filter(|l| !l.pace.is_zero()),
            any: AtomicBool::new(false),
            networks: Mutex::new(HashMap::new()),
        }
    }

    fn networks(&self) -> MutexGuard<'_, HashMap<IpAddr, Record>> {
        self.networks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a new connection from `ip` is admitted now (taking one of
    /// its network's connections when it was cut).
    pub(crate) fn admit(&self, ip: IpAddr) -> bool {
        let Some(limit) = self.limit else {
            return true;
        };
        if !self.any.load(Ordering::Acquire) {
            return true;
        }
        let network = client_network(ip);
        let now = Instant::now();
        let mut networks = self.networks();
        let Some(record) = networks.get_mut(&network) else {
            return true;
        };
        if now.saturating_duration_since(record.last_cut) >= FORGIVEN_AFTER {
            networks.remove(&network);
            self.any.store(!networks.is_empty(), Ordering::Release);
            return true;
        }
        record.refill(&limit, now);
        if record.tokens < 1.0 {
            return false;
        }
        record.tokens -= 1.0;
        true
    }

    /// The core cut a connection from `ip` for making no progress: its
    /// network's pace slows, and the cut costs it a connection more.
    pub(crate) fn cut(&self, ip: IpAddr) {
        let Some(limit) = self.limit else {
            return;
        };
        let network = client_network(ip);
        let now = Instant::now();
        let mut networks = self.networks();
        let remembered = networks
            .get(&network)
            .is_some_and(|r| now.saturating_duration_since(r.last_cut) < FORGIVEN_AFTER);
        if !remembered {
            networks.remove(&network);
            make_room(&mut networks, limit.max_networks.max(1), now);
            networks.insert(
                network,
                Record {
                    cuts: 1,
                    last_cut: now,
                    tokens: f64::from(BURST - 1),
                    refilled: now,
                },
            );
            self.any.store(true, Ordering::Release);
            return;
        }
        if let Some(record) = networks.get_mut(&network) {
            record.refill(&limit, now);
            record.cuts = record.cuts.saturating_add(1);
            record.last_cut = now;
            record.tokens = (record.tokens - 1.0).max(-f64::from(BURST));
        }
    }

    /// Networks remembered now.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.networks().len()
    }
}

/// Forgets forgiven networks and, while `networks` is still full, the one
/// whose last cut is oldest.
fn make_room(networks: &mut HashMap<IpAddr, Record>, max: usize, now: Instant) {
    if networks.len() < max {
        return;
    }
    networks.retain(|_, r| now.saturating_duration_since(r.last_cut) < FORGIVEN_AFTER);
    while networks.len() >= max {
        let Some(oldest) = networks
            .iter()
            .min_by_key(|(_, r)| r.last_cut)
            .map(|(network, _)| *network)
        else {
            return;
        };
        networks.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle(max_networks: usize) -> Reconnects {
        Reconnects::new(Some(ReconnectLimit {
            pace: Duration::from_secs(1),
            max_networks,
        }))
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn networks_never_cut_are_never_throttled() {
        let reconnects = throttle(16);
        assert!((0..10_000).all(|_| reconnects.admit(ip("10.0.0.1"))));
        reconnects.cut(ip("10.0.0.2"));
        assert!((0..10_000).all(|_| reconnects.admit(ip("10.0.0.1"))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_network_gets_a_burst_then_one_connection_a_pace() {
        let reconnects = throttle(16);
        reconnects.cut(ip("10.0.0.2"));
        // The cut cost it one of its burst.
        let admitted = (0..100)
            .filter(|_| reconnects.admit(ip("10.0.0.2")))
            .count();
        assert_eq!(admitted, usize::try_from(BURST - 1).unwrap());
        tokio::time::advance(Duration::from_millis(1_001)).await;
        assert!(reconnects.admit(ip("10.0.0.2")));
        assert!(!reconnects.admit(ip("10.0.0.2")));
    }

    #[tokio::test(start_paused = true)]
    async fn each_further_cut_doubles_the_pace_and_a_quiet_network_is_forgiven() {
        let reconnects = throttle(16);
        for _ in 0..3 {
            reconnects.cut(ip("10.0.0.2"));
        }
        // Three cuts: one connection left, then one per 4 s.
        assert!(reconnects.admit(ip("10.0.0.2")));
        assert!(!reconnects.admit(ip("10.0.0.2")));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!reconnects.admit(ip("10.0.0.2")), "2 s is half a pace");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(reconnects.admit(ip("10.0.0.2")));
        tokio::time::advance(FORGIVEN_AFTER).await;
        assert!((0..100).all(|_| reconnects.admit(ip("10.0.0.2"))));
        assert_eq!(reconnects.remembered(), 0);
    }

    #[test]
    fn an_ipv6_64_is_one_network_and_the_table_is_bounded() {
        let reconnects = throttle(4);
        reconnects.cut(ip("2001:db8::1"));
        while reconnects.admit(ip("2001:db8::2")) {}
        assert!(!reconnects.admit(ip("2001:db8::ffff:1")), "the same /64");
        assert!(reconnects.admit(ip("2001:db8:0:1::1")), "another /64");
        for host in 0..100u8 {
            reconnects.cut(IpAddr::from([10, 0, 1, host]));
        }
        assert_eq!(reconnects.remembered(), 4);
        assert!(
            reconnects.admit(ip("2001:db8::2")),
            "the oldest is forgotten"
        );
        assert_eq!(client_network(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
    }

    #[test]
    fn a_zero_pace_or_no_limit_throttles_nobody() {
        for reconnects in [
            Reconnects::new(None),
            Reconnects::new(Some(ReconnectLimit {
                pace: Duration::ZERO,
                max_networks: 4,
            })),
        ] {
            for _ in 0..10 {
                reconnects.cut(ip("10.0.0.2"));
            }
            assert!((0..100).all(|_| reconnects.admit(ip("10.0.0.2"))));
        }
    }
}

/// The clients a trusted proxy forwards the requests of one connection
/// for, as the reconnect throttle sees them: each request's client is
/// admitted against its network's pace, and a cut of the connection is
/// charged to the client of its last request (an HTTP/1.1 proxy
/// connection carries one request at a time; on HTTP/2 the last one
/// stands for all). Put on every request of a trusted proxy's connection.
#[derive(Debug, Clone)]
pub(crate) struct ForwardedClients {
    last: Arc<Mutex<Option<IpAddr>>>,
    reconnects: Arc<Reconnects>,
}

impl ForwardedClients {
    pub(super) fn new(reconnects: Arc<Reconnects>) -> Self {
        ForwardedClients {
            last: Arc::new(Mutex::new(None)),
            reconnects,
        }
    }

    /// Whether a request forwarded for `client` is within the throttle
    /// (taking one of its network's requests when it was cut); `client`
    /// becomes the one a cut of this connection is charged to. `None`: the
    /// proxy's own request, admitted and charged to nobody.
    pub(crate) fn admit(&self, client: Option<IpAddr>) -> bool {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = client;
        client.is_none_or(|client| self.reconnects.admit(client))
    }

    /// The connection was cut for making no progress: the client of its
    /// last request is charged with it.
    pub(super) fn cut(&self) {
        let last = *self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = last {
            self.reconnects.cut(client);
        }
    }
}
