//! How `nexus-local` is served: its connection limits on the serving
//! core ([`crate::serving`]), and the pace its request bodies must keep.
//!
//! At most `MAX_CONNECTIONS` are open at once; past it new connections
//! wait in the listener's backlog while the connection idle the longest is
//! reclaimed, and once fewer than `RECLAIM_BELOW` slots are free each new
//! connection reclaims one, so idle and silent connections cannot keep a
//! caller out. A peer (a remote IP address) holds at most `max_per_peer`
//! connections: past it, its new connection replaces its own connection
//! idle the longest, or is closed at once when all of its connections are
//! busy. At most `MAX_AWAITING_HEAD` connections may wait for their first
//! request head. A connection without a request in flight for
//! `IDLE_TIMEOUT` is closed; a request body must keep arriving (see
//! [`paced_body`]).

use std::time::{Duration, Instant};

use axum::body::Body;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::serving::{AtCapacity, Limits, LogOnly, PeerFull, Server};

/// How long a client has to send a request head; then the connection is
/// closed (a silent peer gets no lasting connection).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections may finish after shutdown begins.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// Most connections open at once.
pub(crate) const MAX_CONNECTIONS: usize = 256;
/// Default most connections one peer (remote IP address) may hold: three
/// quarters of `MAX_CONNECTIONS`, so loopback clients (who all share
/// 127.0.0.1) have room and other peers still find 64 slots.
pub(crate) const DEFAULT_MAX_PER_PEER: usize = 192;
/// Most connections waiting for their first request head at once.
const MAX_AWAITING_HEAD: usize = 64;
/// Free connection slots under which each accepted connection reclaims
/// the connection idle the longest.
const RECLAIM_BELOW: usize = 16;
/// A connection without a request in flight for this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// HTTP/2 pings: sent after this much silence, the connection closed when
/// one is not answered within the same time.
const H2_KEEP_ALIVE: Duration = Duration::from_secs(15);
/// A request body must deliver at least `BODY_MIN_BYTES` every
/// `BODY_WINDOW` (or end), else it is cut: a body trickled a byte a second
/// holds no connection for long.
const BODY_WINDOW: Duration = Duration::from_secs(10);
const BODY_MIN_BYTES: usize = 16 * 1024;

/// The limits of [`serve`] a caller chooses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    /// How long a client has to send a request head.
    pub(crate) header_read_timeout: Duration,
    /// Most connections one peer (remote IP address) may hold.
    pub(crate) max_per_peer: usize,
}

/// Serves `app` on `listener` until `stop` is cancelled, then lets open
/// connections finish (up to a grace time).
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    stop: CancellationToken,
    limits: ConnectionLimits,
) {
    let limits = Limits {
        max_connections: MAX_CONNECTIONS,
        at_capacity: AtCapacity::Reclaim {
            below: RECLAIM_BELOW,
        },
        max_per_peer: limits.max_per_peer,
        peer_full: PeerFull::ReplaceIdle,
        max_awaiting_head: Some(MAX_AWAITING_HEAD),
        head_timeout: limits.header_read_timeout,
        idle_timeout: IDLE_TIMEOUT,
        response_deadline: None,
        max_requests_per_connection: None,
        h2_keep_alive: (H2_KEEP_ALIVE, H2_KEEP_ALIVE),
        threads: 1,
        // No reconnect throttle: every local client shares the loopback
        // address, no response is cut for going unread, and idle or
        // silent connections are reclaimed at capacity instead.
        reconnect: None,
    };
    let kill = crate::serving::cut_after(&stop, CLOSE_GRACE);
    let server = Server::new(app, limits, std::sync::Arc::new(LogOnly));
    if let Err(e) = server.serve(listener, stop, kill).await {
        tracing::error!(error = %e, "the server stopped");
    }
}

/// `body` cut with an error when it delivers fewer than `BODY_MIN_BYTES`
/// in a `BODY_WINDOW` before it ends.
pub(crate) fn paced_body(body: Body) -> Body {
    let stream = body.into_data_stream();
    let paced = futures::stream::unfold(
        (stream, Instant::now(), 0usize, false),
        |(mut stream, mut since, mut got, done)| async move {
            if done {
                return None;
            }
            let left = (since + BODY_WINDOW).saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, stream.next()).await {
                Ok(Some(Ok(chunk))) => {
                    got = got.saturating_add(chunk.len());
                    if got >= BODY_MIN_BYTES {
                        (since, got) = (Instant::now(), 0);
                    }
                    Some((Ok(chunk), (stream, since, got, false)))
                }
                Ok(Some(Err(e))) => {
                    Some((Err(std::io::Error::other(e)), (stream, since, got, true)))
                }
                Ok(None) => None,
                Err(_) => Some((
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the request body arrived too slowly",
                    )),
                    (stream, since, got, true),
                )),
            }
        },
    );
    Body::from_stream(paced)
}
