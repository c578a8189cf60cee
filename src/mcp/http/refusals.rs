//! Refusals: each one counted by reason in the metrics, answered, and
//! logged as a warning at a bounded rate (a flood of refusals must not
//! become a flood of log lines; each request still gets its access-log
//! line).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode};

use crate::mcp::metrics::Metrics;

/// Refusal warnings logged per window; more are counted and summed up.
const WARNINGS_PER_WINDOW: u32 = 10;
/// The rate limit's window.
const WINDOW: Duration = Duration::from_secs(10);

/// A peer address as a log field: `127.0.0.1:5000`, or `-` when unknown
/// (never `Some(…)`).
pub(super) fn shown_peer(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "-".to_owned(), |p| p.to_string())
}

/// Why a connection or request was refused (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reason {
    ConnectionLimit,
    SilentConnection,
    UnreadResponse,
    BadKey,
    KeylessSession,
    BodyTimeout,
    BodyTooLarge,
    InvalidMessage,
    ServerBusy,
    CallerBusy,
    SessionsFull,
    CallerSessions,
    UnknownSession,
    KeyRefused,
    Quarantine,
    StreamOpen,
    PeerConnections,
    HostOrigin,
    AcceptFailed,
    ReconnectThrottled,
}

impl Reason {
    fn label(self) -> &'static str {
        match self {
            Reason::ConnectionLimit => "connection_limit",
            Reason::SilentConnection => "silent_connection",
            Reason::UnreadResponse => "unread_response",
            Reason::BadKey => "bad_key",
            Reason::KeylessSession => "keyless_session",
            Reason::BodyTimeout => "body_timeout",
            Reason::BodyTooLarge => "body_too_large",
            Reason::InvalidMessage => "invalid_message",
            Reason::ServerBusy => "server_busy",
            Reason::CallerBusy => "caller_busy",
            Reason::SessionsFull => "sessions_full",
            Reason::CallerSessions => "caller_sessions",
            Reason::UnknownSession => "unknown_session",
            Reason::KeyRefused => "key_refused",
            Reason::Quarantine => "quarantine_full",
            Reason::StreamOpen => "stream_open",
            Reason::PeerConnections => "peer_connections",
            Reason::HostOrigin => "host_origin",
            Reason::AcceptFailed => "accept_failed",
            Reason::ReconnectThrottled => "reconnect_throttled",
        }
    }
}

#[derive(Debug)]
struct Window {
    start: Instant,
    logged: u32,
    dropped: u64,
}

/// Counts refusals and logs them at a bounded rate.
#[derive(Debug)]
pub(super) struct Refusals {
    metrics: Arc<Metrics>,
    window: Mutex<Window>,
}

impl Refusals {
    pub(super) fn new(metrics: Arc<Metrics>) -> Self {
        Refusals {
            metrics,
            window: Mutex::new(Window {
                start: Instant::now(),
                logged: 0,
                dropped: 0,
            }),
        }
    }

    /// Counts one refusal; whether to log it, and how many were not logged
    /// in the window before.
    fn note(&self, reason: Reason) -> Option<u64> {
        self.metrics.refusal(reason.label());
        let mut window = self
            .window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        let mut unlogged = 0;
        if now.duration_since(window.start) >= WINDOW {
            unlogged = window.dropped;
            *window = Window {
                start: now,
                logged: 0,
                dropped: 0,
            };
        }
        if window.logged >= WARNINGS_PER_WINDOW {
            window.dropped = window.dropped.saturating_add(1);
            return None;
        }
        window.logged += 1;
        Some(unlogged)
    }

    /// Counts, logs (rate-limited) and answers one refused request; the
    /// reason is told to the client as plain text.
    pub(super) fn refuse(
        &self,
        reason: Reason,
        status: StatusCode,
        peer: Option<SocketAddr>,
        method: &Method,
        text: &str,
    ) -> Response {
        if let Some(unlogged) = self.note(reason) {
            tracing::warn!(
                peer = %shown_peer(peer),
                %method,
                status = status.as_u16(),
                reason = reason.label(),
                unlogged_before = unlogged,
                "refused request: {text}"
            );
        }
        let body = match status.canonical_reason() {
            Some(name) => format!("{name}: {text}"),
            None => text.to_owned(),
        };
        (status, body).into_response()
    }

    /// Counts and logs a request refused by a layer with its own answer.
    pub(super) fn refused(&self, reason: Reason, peer: Option<SocketAddr>, status: StatusCode) {
        if let Some(unlogged) = self.note(reason) {
            tracing::warn!(
                peer = %shown_peer(peer),
                status = status.as_u16(),
                reason = reason.label(),
                unlogged_before = unlogged,
                "refused request"
            );
        }
    }

    /// A connection past the cap, closed at once.
    pub(super) fn refuse_connection(&self, peer: SocketAddr, limit: usize) {
        if let Some(unlogged) = self.note(Reason::ConnectionLimit) {
            tracing::warn!(%peer, limit, unlogged_before = unlogged, "refused connection: too many open connections");
        }
    }

    /// A failed `accept` (out of file descriptors, most often): counted,
    /// and logged at a bounded rate.
    pub(super) fn accept_failed(&self, error: &std::io::Error, retry_in: Duration) {
        if let Some(unlogged) = self.note(Reason::AcceptFailed) {
            tracing::warn!(
                error = %error,
                retry_in_ms = u64::try_from(retry_in.as_millis()).unwrap_or(u64::MAX),
                unlogged_before = unlogged,
                "accept failed; no new connection until it succeeds (raise `ulimit -n` or lower --max-connections)"
            );
        }
    }

    /// A connection past its peer address's cap, closed at once.
    pub(super) fn refuse_peer_connection(&self, peer: SocketAddr, limit: usize) {
        if let Some(unlogged) = self.note(Reason::PeerConnections) {
            tracing::warn!(%peer, limit, unlogged_before = unlogged, "refused connection: too many open connections from this address");
        }
    }

    /// A connection with a response its peer did not read by the request
    /// deadline, cut (with every request on it).
    pub(super) fn refuse_unread(&self, peer: SocketAddr) {
        if let Some(unlogged) = self.note(Reason::UnreadResponse) {
            tracing::warn!(%peer, unlogged_before = unlogged, "connection cut: a response was not read by the request deadline");
        }
    }

    /// A connection from a network reconnecting faster than the throttle
    /// allows after a cut, closed at once.
    pub(super) fn refuse_reconnect(&self, peer: SocketAddr) {
        if let Some(unlogged) = self.note(Reason::ReconnectThrottled) {
            tracing::warn!(%peer, unlogged_before = unlogged, "refused connection: reconnecting too fast after a connection was cut for making no progress");
        }
    }

    /// A connection that sent no complete request head in time, cut.
    pub(super) fn refuse_silent(&self, peer: SocketAddr) {
        if let Some(unlogged) = self.note(Reason::SilentConnection) {
            tracing::warn!(%peer, unlogged_before = unlogged, "connection closed: no request head received in time");
        }
    }
}
