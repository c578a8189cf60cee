//! The HTTP server loop: hyper-util connections (HTTP/1.1 with a
//! header-read timeout, or HTTP/2 with keep-alive pings), with
//! `TCP_NODELAY`, until shutdown. At most `MAX_CONNECTIONS` are open at
//! once; once fewer than `RECLAIM_BELOW` slots are free, each new
//! connection asks the one that has gone longest without an open request
//! (an idle keep-alive connection, or one that never sent a request) to
//! close, so idle and silent connections cannot keep a caller out; only
//! when every connection has a request open do new ones wait to be
//! accepted.
//!
//! A peer (a remote IP address) holds at most `max_per_peer` connections:
//! past it, its new connection replaces its own connection idle the
//! longest, or is closed at once when all of its connections are busy.
//! At most `MAX_HANDSHAKING` connections may be waiting for their first
//! request head; past it the oldest of them is closed, so silent
//! connections never take the slots other clients need. A connection asked
//! to close before its first request closes at once (there is nothing to
//! finish).
//!
//! A connection that moves no byte either way for `IDLE_TIMEOUT` is
//! closed, whatever its protocol; a request body must keep arriving (see
//! [`paced_body`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use futures::StreamExt;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio_util::sync::CancellationToken;

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
const MAX_HANDSHAKING: usize = 64;
/// Free connection slots under which each accepted connection reclaims
/// the connection idle the longest.
const RECLAIM_BELOW: usize = 16;
/// How often a full server looks again for a connection to reclaim.
const RECLAIM_CHECK: Duration = Duration::from_secs(1);
/// A connection that moves no byte for this long is closed.
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
    let header_read_timeout = limits.header_read_timeout;
    let max_per_peer = limits.max_per_peer.clamp(1, MAX_CONNECTIONS);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_KEEP_ALIVE)
        .keep_alive_timeout(H2_KEEP_ALIVE);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let live = Arc::new(LiveConnections::default());
    let started = Instant::now();
    loop {
        // A free slot first: past the cap, connections wait in the
        // listener's backlog instead of taking descriptors, while one that
        // falls idle is reclaimed (checked every `RECLAIM_CHECK`).
        let slot = loop {
            if slots.available_permits() == 0 {
                live.reclaim_longest_idle(None);
            }
            tokio::select! {
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => break Some(slot),
                    Err(_) => break None,
                },
                () = tokio::time::sleep(RECLAIM_CHECK) => {}
                () = stop.cancelled() => break None,
            }
        };
        let Some(slot) = slot else {
            break;
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait, then go on.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        // Event streams are many small writes: without TCP_NODELAY, Nagle's
        // algorithm meets the peer's delayed ACK and stalls frames ~40 ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let use_state = Arc::new(ConnectionUse {
            peer: peer.ip(),
            open_requests: AtomicU64::new(0),
            last_ended: AtomicU64::new(millis_since(started)),
            started,
            handshaking: AtomicBool::new(true),
            close: stop.child_token(),
        });
        let Some(registered) = live.admit(use_state.clone(), max_per_peer) else {
            tracing::debug!(%peer, "the peer holds its most connections, all busy; connection closed");
            continue;
        };
        if slots.available_permits() < RECLAIM_BELOW {
            live.reclaim_longest_idle(Some(&registered));
        }
        let inner = TowerToHyperService::new(app.clone());
        let tagged = use_state.clone();
        let service =
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                tagged.handshaking.store(false, Ordering::SeqCst);
                req.extensions_mut().insert(tagged.clone());
                hyper::service::Service::call(&inner, req)
            });
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(tcp), service)
            .into_owned();
        tokio::spawn(async move {
            let _slot = slot;
            let _registered = registered;
            let idle = async {
                loop {
                    tokio::time::sleep(IDLE_TIMEOUT / 3).await;
                    if use_state.idle_for() >= IDLE_TIMEOUT {
                        return;
                    }
                }
            };
            let mut idle = std::pin::pin!(idle);
            let mut connection = std::pin::pin!(connection);
            let mut closing = false;
            // Asked to close (reclaimed, or the server stops): the open
            // request, if any, finishes; an idle connection closes now.
            let result = loop {
                tokio::select! {
                    r = connection.as_mut() => break r,
                    () = use_state.close.cancelled(), if !closing => {
                        if use_state.handshaking.load(Ordering::SeqCst) {
                            tracing::debug!(%peer, "connection closed before its first request");
                            return;
                        }
                        closing = true;
                        connection.as_mut().graceful_shutdown();
                    }
                    () = &mut idle => {
                        tracing::debug!(%peer, "idle connection closed");
                        return;
                    }
                }
            };
            if let Err(e) = result {
                let timed_out = e
                    .downcast_ref::<hyper::Error>()
                    .is_some_and(hyper::Error::is_timeout);
                if timed_out {
                    tracing::debug!(%peer, "request head not received in time; connection closed");
                } else {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            }
        });
        // The new connection's task reads its first request head before
        // the next accept, so a flood of silent connections cannot push an
        // honest one out of the handshake phase before it is read.
        tokio::task::yield_now().await;
    }
    // Every connection was asked to close with `stop`; each gives its slot
    // back when it has.
    let all = u32::try_from(MAX_CONNECTIONS).unwrap_or(u32::MAX);
    if tokio::time::timeout(CLOSE_GRACE, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::debug!("connections still open at shutdown");
    }
}

/// The open connections, to find the one to reclaim near the cap, and how
/// many each peer holds.
#[derive(Debug, Default)]
struct LiveConnections {
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<ConnectionUse>>>,
}

impl LiveConnections {
    /// Registers `conn` until the returned guard is dropped, within its
    /// peer's `max_per_peer` and the `MAX_HANDSHAKING` cap: past either,
    /// a connection without an open request is asked to close (the peer's
    /// own, then the oldest silent one). `None` when the peer's
    /// connections are all busy: `conn` is refused.
    fn admit(
        self: &Arc<Self>,
        conn: Arc<ConnectionUse>,
        max_per_peer: usize,
    ) -> Option<Registered> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let staying = |c: &&Arc<ConnectionUse>| !c.close.is_cancelled();
        let held = open
            .values()
            .filter(staying)
            .filter(|c| c.peer == conn.peer)
            .count();
        if held >= max_per_peer {
            let own = open
                .values()
                .filter(staying)
                .filter(|c| c.peer == conn.peer && c.open_requests.load(Ordering::SeqCst) == 0)
                .max_by_key(|c| c.idle_for())?;
            tracing::debug!(peer = %conn.peer, "the peer holds its most connections: closing its connection idle the longest");
            own.close.cancel();
        }
        let handshaking = open
            .values()
            .filter(staying)
            .filter(|c| c.handshaking.load(Ordering::SeqCst))
            .count();
        if handshaking >= MAX_HANDSHAKING {
            let oldest = open
                .values()
                .filter(staying)
                .filter(|c| c.handshaking.load(Ordering::SeqCst))
                .max_by_key(|c| c.idle_for());
            if let Some(oldest) = oldest {
                tracing::debug!(peer = %oldest.peer, "too many connections without a request: closing the oldest");
                oldest.close.cancel();
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        open.insert(id, conn);
        Some(Registered(self.clone(), id))
    }

    /// Asks the connection that has gone longest without an open request
    /// (and was not asked yet), other than `keep`, to close.
    fn reclaim_longest_idle(&self, keep: Option<&Registered>) {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let longest = open
            .iter()
            .filter(|(id, _)| keep.is_none_or(|k| k.1 != **id))
            .map(|(_, c)| c)
            .filter(|c| !c.close.is_cancelled() && c.open_requests.load(Ordering::SeqCst) == 0)
            .max_by_key(|c| c.idle_for());
        if let Some(conn) = longest {
            tracing::debug!(peer = %conn.peer, "near the connection cap: closing the connection idle the longest");
            conn.close.cancel();
        }
    }
}

/// A registered connection; unregistered on drop.
struct Registered(Arc<LiveConnections>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.1);
    }
}

/// How a connection is used: requests open (until their response body
/// ends) and when the last one ended. A connection with none open for
/// `IDLE_TIMEOUT` is closed, whatever its protocol (HTTP/2 pings do not
/// count as use).
#[derive(Debug)]
pub(crate) struct ConnectionUse {
    /// The remote IP address.
    peer: IpAddr,
    open_requests: AtomicU64,
    /// Milliseconds after `started` when the last request ended.
    last_ended: AtomicU64,
    started: Instant,
    /// Until the first request head is read.
    handshaking: AtomicBool,
    /// Cancelled to ask the connection to close (reclaimed, or shutdown).
    close: CancellationToken,
}

fn millis_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl ConnectionUse {
    fn idle_for(&self) -> Duration {
        if self.open_requests.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.last_ended.load(Ordering::SeqCst));
        self.started.elapsed().saturating_sub(last)
    }
}

/// One open request of a connection; ends when dropped.
pub(crate) struct OpenRequest(Arc<ConnectionUse>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0
            .last_ended
            .store(millis_since(self.0.started), Ordering::SeqCst);
        self.0.open_requests.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts `req` as open on its connection (see [`until_body_ends`]).
pub(crate) fn open_request(req: &axum::extract::Request) -> Option<OpenRequest> {
    let conn = req.extensions().get::<Arc<ConnectionUse>>().cloned()?;
    conn.open_requests.fetch_add(1, Ordering::SeqCst);
    Some(OpenRequest(conn))
}

/// Keeps `open` until `resp`'s body ends or is dropped.
pub(crate) fn until_body_ends(
    resp: axum::response::Response,
    open: Option<OpenRequest>,
) -> axum::response::Response {
    let Some(open) = open else {
        return resp;
    };
    resp.map(|body| {
        Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _open = &open;
            chunk
        }))
    })
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
