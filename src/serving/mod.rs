//! The serving core both HTTP servers (`nexus-mcp` over HTTP and
//! `nexus-local`) run on: accepting connections, the connection limits,
//! HTTP/1.1 and HTTP/2 settings, the deadlines of a connection, graceful
//! shutdown and the stop signal. A server supplies its router
//! (`axum::Router`), its `Limits` and, when it counts or logs what
//! happens to connections, its `Hooks`.
//!
//! What the core promises, whatever the server:
//! - at most `Limits::max_connections` connections are open; past it a
//!   new one is refused or, with `AtCapacity::Reclaim`, waits in the
//!   listener's backlog while the connection idle the longest is closed;
//! - one peer (a remote IP address) holds at most
//!   `Limits::max_per_peer` connections;
//! - a connection must send a complete first request head within
//!   `Limits::head_timeout`, whatever its protocol, and at most
//!   `Limits::max_awaiting_head` wait for one at once (the oldest is
//!   closed past it); a connection asked to close before its first request
//!   closes at once;
//! - a connection without a request in flight for `Limits::idle_timeout`
//!   is closed; with `Limits::response_deadline`, a response its peer
//!   does not read in time cuts its connection;
//! - with `Limits::reconnect`, a client network (an IPv4 address, an IPv6
//!   /64) whose connection was cut for a response it did not read opens
//!   new connections at a slower pace for a while (see `throttle.rs`);
//!   behind a trusted proxy, the client a request is forwarded for sends
//!   requests at that pace instead (`ForwardedClients`, checked by the
//!   server once it has read who the client is);
//! - at shutdown no connection is accepted any more, open ones close once
//!   their requests are done, and what is left is cut when `kill` fires.

// Each server chooses some of the policies: built for one alone, the
// other's go unused.
#![cfg_attr(not(all(feature = "mcp", feature = "local")), allow(dead_code))]

mod accept;
mod activity;
mod connection;
mod registry;
mod signal;
mod throttle;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio_util::sync::CancellationToken;

#[doc(hidden)]
pub use signal::stop_signal;
pub(crate) use throttle::{ForwardedClients, ReconnectLimit, client_network};

/// About thirty years: "never" for a deadline or an expiry.
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// `start + wait`, or about thirty years on when the clock cannot represent
/// that: a timeout or a cache lifetime from configuration may be any size.
pub(crate) fn instant_after(start: tokio::time::Instant, wait: Duration) -> tokio::time::Instant {
    start
        .checked_add(wait)
        .or_else(|| start.checked_add(FAR_FUTURE))
        .unwrap_or(start)
}

/// What a server does when every connection slot is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtCapacity {
    /// Refuse the new connection at once.
    Refuse,
    /// Leave new connections in the listener's backlog and close the
    /// connection gone longest without a request in flight; once fewer
    /// than `below` slots are free, each new connection reclaims one too.
    Reclaim {
        /// Free slots under which each new connection reclaims one.
        below: usize,
    },
}

/// What a server does with a connection from a peer that holds its most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerFull {
    /// Refuse the new connection.
    Refuse,
    /// Close the peer's own connection idle the longest instead; refuse
    /// the new one only when all of the peer's connections are busy.
    ReplaceIdle,
}

/// How long a response may take once its request has begun.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResponseDeadline {
    /// Time a request has from its head to the end of its response.
    pub(crate) request_timeout: Duration,
    /// How long a response may wait for its peer to take what it has to
    /// send.
    pub(crate) write_stall_timeout: Duration,
}

/// The limits a server chooses.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Most connections open at once (at least 1).
    pub(crate) max_connections: usize,
    /// What happens past `max_connections`.
    pub(crate) at_capacity: AtCapacity,
    /// Most connections one peer (remote IP address) may hold.
    pub(crate) max_per_peer: usize,
    /// What happens past `max_per_peer`.
    pub(crate) peer_full: PeerFull,
    /// Most connections waiting for their first request head at once.
    pub(crate) max_awaiting_head: Option<usize>,
    /// How long a client has to send a request head.
    pub(crate) head_timeout: Duration,
    /// A connection without a request in flight for this long is closed.
    pub(crate) idle_timeout: Duration,
    /// Deadlines of a response, if any.
    pub(crate) response_deadline: Option<ResponseDeadline>,
    /// Requests in flight on one connection (and HTTP/2 streams); more get
    /// 503.
    pub(crate) max_requests_per_connection: Option<usize>,
    /// HTTP/2 pings: sent after `.0` of silence; the connection is closed
    /// when one is not answered within `.1`.
    pub(crate) h2_keep_alive: (Duration, Duration),
    /// Threads accepting connections, each on its own single-threaded
    /// runtime (the caller's included).
    pub(crate) threads: usize,
    /// The pace of reconnects of client networks cut for making no
    /// progress; `None`: no throttle.
    pub(crate) reconnect: Option<ReconnectLimit>,
}

impl Limits {
    /// The hyper-util connection builder these limits ask for.
    fn builder(&self) -> auto::Builder<TokioExecutor> {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.head_timeout);
        let mut h2 = builder.http2();
        h2.timer(TokioTimer::new())
            .keep_alive_interval(Some(self.h2_keep_alive.0))
            .keep_alive_timeout(self.h2_keep_alive.1);
        if let Some(per_connection) = self.max_requests_per_connection {
            h2.max_concurrent_streams(u32::try_from(per_connection.max(1)).unwrap_or(u32::MAX));
        }
        builder
    }
}

/// What a server learns of its connections, and its say on admitting one.
/// Every method has a default: a server overrides what it counts or logs.
pub(crate) trait Hooks: Send + Sync + 'static {
    /// A connection was accepted, before any limit applies: `false`
    /// closes it at once.
    fn on_accept(&self, _peer: SocketAddr) -> bool {
        true
    }

    /// Whether `ip` (a trusted proxy, say) is exempt from the per-peer cap.
    fn uncapped(&self, _ip: IpAddr) -> bool {
        false
    }

    /// A connection is being served.
    fn opened(&self) {}

    /// A connection being served has ended.
    fn closed(&self) {}

    /// `accept` failed; the next is tried in `retry_in`.
    fn accept_failed(&self, error: &std::io::Error, retry_in: Duration) {
        tracing::warn!(error = %error, ?retry_in, "accept failed");
    }

    /// A connection was refused: every slot is taken.
    fn refused_at_capacity(&self, peer: SocketAddr, limit: usize) {
        tracing::debug!(%peer, limit, "refused connection: too many open connections");
    }

    /// A connection was refused: its peer holds its most, all busy.
    fn refused_for_peer(&self, peer: SocketAddr, limit: usize) {
        tracing::debug!(%peer, limit, "refused connection: the peer holds its most connections");
    }

    /// A connection sent no request head in time and was closed.
    fn silent(&self, peer: SocketAddr) {
        tracing::debug!(%peer, "request head not received in time; connection closed");
    }

    /// A response was not read by its deadline; its connection was cut.
    fn unread(&self, peer: SocketAddr) {
        tracing::debug!(%peer, "a response was not read by its deadline; connection cut");
    }

    /// A connection was closed at once: its network reconnects faster than
    /// the throttle allows after a cut.
    fn throttled(&self, peer: SocketAddr) {
        tracing::debug!(%peer, "refused connection: reconnecting too fast after a cut");
    }
}

/// A server that only logs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogOnly;

impl Hooks for LogOnly {}

/// A router served under [`Limits`]; cheap to clone (serving threads
/// share one registry of connections).
#[derive(Clone)]
pub(crate) struct Server {
    app: axum::Router,
    limits: Arc<Limits>,
    registry: Arc<registry::Registry>,
    reconnects: Arc<throttle::Reconnects>,
    hooks: Arc<dyn Hooks>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Serves `app` under `limits`, telling `hooks` what happens.
    pub(crate) fn new(app: axum::Router, limits: Limits, hooks: Arc<dyn Hooks>) -> Self {
        let registry = Arc::new(registry::Registry::new(&limits));
        let reconnects = Arc::new(throttle::Reconnects::new(limits.reconnect));
        Server {
            app,
            limits: Arc::new(limits),
            registry,
            reconnects,
            hooks,
        }
    }

    /// Whether a new connection from `peer` is within the reconnect
    /// throttle (trusted proxies, uncapped, are never throttled).
    fn reconnect_allowed(&self, peer: SocketAddr) -> bool {
        if self.hooks.uncapped(peer.ip()) || self.reconnects.admit(peer.ip()) {
            return true;
        }
        self.hooks.throttled(peer);
        false
    }

    /// The core cut a connection of `peer` for making no progress (a
    /// response it did not read): its network reconnects at a slower pace,
    /// or, for a trusted proxy's connection (`forwarded`), the client its
    /// last request was forwarded for sends requests at that pace.
    /// A silent connection is not counted: it held no request slot, and
    /// loopback or NAT clients share the address of anyone who leaves a
    /// socket unused.
    fn cut_for_no_progress(&self, peer: SocketAddr, forwarded: Option<&ForwardedClients>) {
        match forwarded {
            Some(forwarded) => forwarded.cut(),
            None => self.reconnects.cut(peer.ip()),
        }
    }

    /// What a connection of `peer` tells the server about the clients a
    /// trusted proxy forwards for; `None` for any other peer.
    fn forwarded_clients(&self, peer: SocketAddr) -> Option<ForwardedClients> {
        self.hooks
            .uncapped(peer.ip())
            .then(|| ForwardedClients::new(Arc::clone(&self.reconnects)))
    }

    /// Serves connections from `listener` until `stop` is cancelled, then
    /// lets open connections finish until they are done or `kill` is
    /// cancelled (which cuts them).
    ///
    /// # Errors
    /// An I/O failure of the listener, or a serving thread that cannot
    /// start.
    pub(crate) async fn serve(
        self,
        listener: tokio::net::TcpListener,
        stop: CancellationToken,
        kill: CancellationToken,
    ) -> std::io::Result<()> {
        accept::on_threads(self, listener, stop, kill).await
    }
}

/// A token cancelled `grace` after `stop` is: the `kill` of a server
/// whose connections have `grace` to finish at shutdown.
pub(crate) fn cut_after(stop: &CancellationToken, grace: Duration) -> CancellationToken {
    let kill = CancellationToken::new();
    let (stop, cut) = (stop.clone(), kill.clone());
    tokio::spawn(async move {
        tokio::select! {
            () = async {
                stop.cancelled().await;
                tokio::time::sleep(grace).await;
            } => cut.cancel(),
            () = cut.cancelled() => {}
        }
    });
    kill
}
