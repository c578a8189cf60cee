//! What the MCP server supplies to the serving core ([`crate::serving`])
//! besides its router: its connection limits from [`HttpOptions`], and
//! hooks that count connections and refusals (trusted proxies are not
//! capped per address).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use super::refusals::Refusals;
use super::{HttpOptions, TrustedProxy};
use crate::mcp::metrics::Metrics;
use crate::serving::{AtCapacity, Hooks, Limits, PeerFull, ReconnectLimit, ResponseDeadline};

/// The longest an HTTP/2 ping may go unanswered before its connection is
/// closed.
const H2_PING_TIMEOUT_MAX: Duration = Duration::from_secs(20);

/// Client networks the reconnect throttle remembers (about 100 bytes
/// each).
const RECONNECT_NETWORKS: usize = 4096;

/// The serving core's limits for `options`: past either connection cap a
/// connection is refused at once; a response has the request deadline.
pub(super) fn limits(options: &HttpOptions) -> Limits {
    Limits {
        max_connections: options.max_connections.max(1),
        at_capacity: AtCapacity::Refuse,
        max_per_peer: options.effective_max_connections_per_peer(),
        peer_full: PeerFull::Refuse,
        max_awaiting_head: None,
        head_timeout: options.header_read_timeout,
        idle_timeout: options.idle_timeout,
        response_deadline: Some(ResponseDeadline {
            request_timeout: options.request_timeout,
            write_stall_timeout: options.write_stall_timeout,
        }),
        max_requests_per_connection: Some(options.max_requests_per_connection.max(1)),
        h2_keep_alive: (
            options.idle_timeout,
            options.idle_timeout.min(H2_PING_TIMEOUT_MAX),
        ),
        threads: options.threads.max(1),
        reconnect: Some(ReconnectLimit {
            pace: options.reconnect_pace,
            max_networks: RECONNECT_NETWORKS,
        }),
    }
}

/// Counts connections in the metrics and refusals (rate-limited warnings).
#[derive(Debug)]
pub(super) struct McpHooks {
    pub(super) metrics: Arc<Metrics>,
    pub(super) refusals: Arc<Refusals>,
    /// Trusted proxies: their connections are not capped per address.
    pub(super) trusted: Arc<[TrustedProxy]>,
}

impl Hooks for McpHooks {
    fn uncapped(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|t| t.contains(ip))
    }

    fn opened(&self) {
        self.metrics.connections().inc();
    }

    fn closed(&self) {
        self.metrics.connections().dec();
    }

    fn accept_failed(&self, error: &std::io::Error, retry_in: Duration) {
        self.refusals.accept_failed(error, retry_in);
    }

    fn refused_at_capacity(&self, peer: SocketAddr, limit: usize) {
        self.refusals.refuse_connection(peer, limit);
    }

    fn refused_for_peer(&self, peer: SocketAddr, limit: usize) {
        self.refusals.refuse_peer_connection(peer, limit);
    }

    fn silent(&self, peer: SocketAddr) {
        self.refusals.refuse_silent(peer);
    }

    fn unread(&self, peer: SocketAddr) {
        self.refusals.refuse_unread(peer);
    }

    fn throttled(&self, peer: SocketAddr) {
        self.refusals.refuse_reconnect(peer);
    }
}
