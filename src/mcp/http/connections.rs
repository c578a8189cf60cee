//! Connections: accepting, the connection cap, the deadline until a
//! connection's first request head (whatever the protocol), closing idle
//! connections, serving threads, and shutdown.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{ConnectInfo, Request};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::{BoxError, ServiceBuilder, ServiceExt};

use super::refusals::Refusals;
use crate::mcp::metrics::Metrics;

/// The first wait after a failed `accept`, doubled up to
/// [`ACCEPT_BACKOFF_MAX`] while it keeps failing.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// The longest wait after a failed `accept`.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How long a connection that was asked to close (idle, or at shutdown
/// once requests are done) may take before it is cut.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How long past the request deadline a response may take to reach its
/// peer (its last bytes after the deadline cut a stream) before the
/// connection is cut.
const UNREAD_GRACE: Duration = Duration::from_secs(2);

/// The longest a connection's timer waits between checks while requests
/// may start: a response left unread is cut within this much of being due.
const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(30);

/// Answers a request shed by the per-connection concurrency limit.
pub(super) async fn overloaded(error: BoxError) -> Response {
    let (status, reason) = if error.is::<tower::load_shed::error::Overloaded>() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "server busy: too many requests in flight on this connection; retry later",
        )
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "request failed")
    };
    (status, reason).into_response()
}

/// Logs how a connection ended when it matters.
fn log_connection_end(error: &(dyn std::error::Error + 'static), peer: SocketAddr) {
    tracing::debug!(%peer, error = %error, "connection ended with an error");
}

/// Starts serving thread `index` on its own single-threaded runtime, on a
/// clone of `listener`; the receiver resolves when the thread is done.
pub(super) fn spawn_acceptor(
    index: usize,
    listener: &std::net::TcpListener,
    acceptor: Acceptor,
    stop: CancellationToken,
    kill: CancellationToken,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let listener = listener.try_clone()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (done, finished) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("nexus-mcp-http-{index}"))
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => acceptor.accept_until(listener, stop, kill).await,
                    Err(e) => tracing::error!(error = %e, index, "serving thread cannot listen"),
                }
            });
            let _ = done.send(());
        })?;
    Ok(finished)
}

/// Open connections per peer address, at most `max` each.
#[derive(Debug)]
pub(super) struct PeerCounts {
    pub(super) max: usize,
    /// Trusted proxies: their connections are not capped per address.
    trusted: Arc<[super::TrustedProxy]>,
    open: Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

impl PeerCounts {
    pub(super) fn new(max: usize, trusted: Arc<[super::TrustedProxy]>) -> Self {
        PeerCounts {
            max: max.max(1),
            trusted,
            open: Mutex::new(std::collections::HashMap::new()),
        }
    }

    fn counts(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<std::net::IpAddr, usize>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// One more connection from `ip`, counted until the value is dropped;
    /// `None` past the cap.
    fn open(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<PeerPermit> {
        let mut counts = self.counts();
        let n = counts.entry(ip).or_insert(0);
        if *n >= self.max && !self.trusted.iter().any(|t| t.contains(ip)) {
            return None;
        }
        *n += 1;
        Some(PeerPermit {
            peers: Arc::clone(self),
            ip,
        })
    }
}

/// One open connection of a peer address.
pub(super) struct PeerPermit {
    peers: Arc<PeerCounts>,
    ip: std::net::IpAddr,
}

impl Drop for PeerPermit {
    fn drop(&mut self) {
        let mut counts = self.peers.counts();
        if let Some(n) = counts.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// What one connection is doing: whether a request head has come, when
/// each request in flight started, and since when none is.
///
/// Requests only record what they do; nothing wakes the connection's task.
/// Its one timer is re-armed lazily when it fires (as the event stream's
/// idle timer is), so a request costs two short lock sections, not a timer
/// reset and two extra polls of the connection.
struct Activity {
    seen: AtomicBool,
    state: Mutex<InFlight>,
}

/// The requests in flight on one connection.
struct InFlight {
    /// Start of each request in flight, by a number drawn from `next`.
    started: std::collections::HashMap<u64, Instant>,
    /// Since when each response that has something to send has waited for
    /// its peer to take it (by the same numbers).
    stalled: std::collections::HashMap<u64, Instant>,
    next: u64,
    /// When the last request in flight ended (or the connection opened).
    idle_since: Instant,
}

impl Activity {
    fn new() -> Self {
        Activity {
            seen: AtomicBool::new(false),
            state: Mutex::new(InFlight {
                started: std::collections::HashMap::new(),
                stalled: std::collections::HashMap::new(),
                next: 0,
                idle_since: Instant::now(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, InFlight> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request head arrived: in flight until the returned value is
    /// dropped (with the response body, sent or not).
    fn start(self: &Arc<Self>) -> Busy {
        self.seen.store(true, Ordering::Release);
        let mut state = self.state();
        let number = state.next;
        state.next = state.next.wrapping_add(1);
        state.started.insert(number, Instant::now());
        Busy {
            activity: Arc::clone(self),
            number,
        }
    }

    /// Since when the longest-waiting response has waited for its peer to
    /// take what it has to send.
    fn stalled_since(&self) -> Option<Instant> {
        self.state().stalled.values().min().copied()
    }

    /// The start of the oldest request in flight, or (none in flight) the
    /// time the connection has been idle since.
    fn oldest(&self) -> Result<Instant, Instant> {
        let state = self.state();
        match state.started.values().min() {
            Some(oldest) => Ok(*oldest),
            None => Err(state.idle_since),
        }
    }
}

/// One request in flight on a connection.
struct Busy {
    activity: Arc<Activity>,
    number: u64,
}

impl Busy {
    /// The response has something for its peer (its head, or a frame just
    /// handed over) and waits for the peer to take it, or (`false`) was
    /// asked for more: its peer is reading.
    fn waiting_on_peer(&self, waiting: bool) {
        let mut state = self.activity.state();
        if waiting {
            state.stalled.insert(self.number, Instant::now());
        } else {
            state.stalled.remove(&self.number);
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.activity.state();
        state.started.remove(&self.number);
        state.stalled.remove(&self.number);
        if state.started.is_empty() {
            state.idle_since = Instant::now();
        }
    }
}

/// What every serving thread shares: the app and the connection limits.
#[derive(Clone)]
pub(super) struct Acceptor {
    pub(super) app: axum::Router,
    pub(super) connections: Arc<Semaphore>,
    pub(super) max_connections: usize,
    /// Open connections by peer address.
    pub(super) peers: Arc<PeerCounts>,
    pub(super) per_connection: usize,
    pub(super) header_read_timeout: Duration,
    pub(super) idle_timeout: Duration,
    /// Time a request has from its head to the end of its response; a
    /// response not sent by then (its peer does not read) cuts the
    /// connection, so that no peer holds a slot by not reading.
    pub(super) request_timeout: Duration,
    /// How long a response may wait for its peer to take what it has to
    /// send before the connection is cut.
    pub(super) write_stall_timeout: Duration,
    pub(super) metrics: Arc<Metrics>,
    pub(super) refusals: Arc<Refusals>,
}

impl Acceptor {
    /// Accepts and serves connections on the current runtime until `stop`
    /// is cancelled, then asks open connections to close once their
    /// requests are done and waits for them; `kill` cuts them.
    pub(super) async fn accept_until(
        &self,
        listener: tokio::net::TcpListener,
        stop: CancellationToken,
        kill: CancellationToken,
    ) {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(u32::try_from(self.per_connection).unwrap_or(u32::MAX))
            .keep_alive_interval(Some(self.idle_timeout))
            .keep_alive_timeout(self.idle_timeout.min(Duration::from_secs(20)));
        let tracker = TaskTracker::new();
        let mut backoff = ACCEPT_BACKOFF_MIN;
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => {
                        backoff = ACCEPT_BACKOFF_MIN;
                        accepted
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: nothing can be
                        // accepted until a connection closes. Wait (longer each
                        // time, up to a second) instead of spinning, and say so
                        // once per window.
                        self.refusals.accept_failed(&e, backoff);
                        tokio::select! {
                            () = tokio::time::sleep(backoff) => {}
                            () = stop.cancelled() => break,
                        }
                        backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                        continue;
                    }
                },
                () = stop.cancelled() => break,
            };
            let Ok(permit) = Arc::clone(&self.connections).try_acquire_owned() else {
                self.refusals.refuse_connection(peer, self.max_connections);
                drop(tcp);
                continue;
            };
            let Some(peer_permit) = self.peers.open(peer.ip()) else {
                self.refusals.refuse_peer_connection(peer, self.peers.max);
                drop(tcp);
                continue;
            };
            // Answers go out as several small SSE writes; without TCP_NODELAY,
            // Nagle's algorithm and the client's delayed ACK add about 40 ms.
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "could not set TCP_NODELAY");
            }
            let acceptor = self.clone();
            let builder = builder.clone();
            let (stop, kill) = (stop.clone(), kill.clone());
            tracker.spawn(async move {
                acceptor.connection(&builder, tcp, peer, stop, kill).await;
                drop(peer_permit);
                drop(permit);
            });
        }
        // Shutdown has begun: stop listening at once, so that new clients
        // are refused by the system instead of queueing unserved.
        drop(listener);
        tracker.close();
        tracker.wait().await;
    }

    /// Serves one connection until it ends, is closed for silence or
    /// idleness, or is cut by `kill`.
    async fn connection(
        self,
        builder: &auto::Builder<TokioExecutor>,
        tcp: tokio::net::TcpStream,
        peer: SocketAddr,
        stop: CancellationToken,
        kill: CancellationToken,
    ) {
        let opened = Instant::now();
        let gauge = self.metrics.connections().clone();
        gauge.inc();
        let activity = Arc::new(Activity::new());
        let app = self.app.clone();
        let tracked = Arc::clone(&activity);
        let service = tower::service_fn(move |mut request: Request<hyper::body::Incoming>| {
            let busy = tracked.start();
            request.extensions_mut().insert(ConnectInfo(peer));
            let app = app.clone();
            async move {
                let response = app.oneshot(request.map(axum::body::Body::new)).await;
                response.map(|r| with_write_progress(r, busy))
            }
        });
        let service = ServiceBuilder::new()
            .layer(HandleErrorLayer::new(overloaded))
            .load_shed()
            .concurrency_limit(self.per_connection)
            .service(service);
        let connection =
            builder.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(service));
        tokio::pin!(connection);
        // Checked each time the timer fires: before the first request head,
        // the header deadline; while requests run, that the oldest one's
        // response is out by its deadline (HTTP/2 flow control and pings
        // keep a connection open, never a response its peer does not
        // read); once idle, the idle deadline of the last request. Between
        // those it fires at least every `check_every`, so that a request
        // started after the timer was armed is seen in time.
        let check_every = (self.request_timeout / 4)
            .min(self.write_stall_timeout / 2)
            .clamp(Duration::from_millis(250), MAX_CHECK_INTERVAL);
        let header_deadline = crate::mcp::instant_after(opened, self.header_read_timeout);
        let timer = tokio::time::sleep_until(
            header_deadline
                .min(crate::mcp::instant_after(opened, self.idle_timeout))
                .min(crate::mcp::instant_after(opened, check_every)),
        );
        tokio::pin!(timer);
        let stopped = stop.cancelled();
        tokio::pin!(stopped);
        let killed = kill.cancelled();
        tokio::pin!(killed);
        let mut closing = false;
        let mut stopping = false;
        loop {
            tokio::select! {
                biased;
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        log_connection_end(&*e, peer);
                    }
                    break;
                }
                () = &mut timer => {
                    if closing {
                        break;
                    }
                    let now = Instant::now();
                    if !activity.seen.load(Ordering::Acquire) {
                        if now < header_deadline {
                            timer.as_mut().reset(header_deadline.min(crate::mcp::instant_after(now, check_every)));
                            continue;
                        }
                        // Nothing earned yet: cut at once, whatever the protocol.
                        self.refusals.refuse_silent(peer);
                        break;
                    }
                    let due = match activity.oldest() {
                        Ok(oldest) => {
                            let cut = crate::mcp::instant_after(
                                oldest,
                                self.request_timeout.saturating_add(UNREAD_GRACE),
                            );
                            // A response its peer has not taken anything of
                            // for the write-stall timeout is cut too.
                            let stall_cut = activity.stalled_since().map(|since| {
                                crate::mcp::instant_after(since, self.write_stall_timeout)
                            });
                            let cut = stall_cut.map_or(cut, |stall| stall.min(cut));
                            if cut <= now {
                                // Dropping the connection resets its streams and
                                // drops their bodies, and with them their slots.
                                self.refusals.refuse_unread(peer);
                                break;
                            }
                            cut
                        }
                        Err(idle_since) => crate::mcp::instant_after(idle_since, self.idle_timeout),
                    };
                    if due > now {
                        timer.as_mut().reset(due.min(crate::mcp::instant_after(now, check_every)));
                    } else {
                        tracing::debug!(%peer, "idle connection closed");
                        connection.as_mut().graceful_shutdown();
                        closing = true;
                        timer.as_mut().reset(crate::mcp::instant_after(now, CLOSE_GRACE));
                    }
                }
                () = &mut stopped, if !stopping => {
                    stopping = true;
                    connection.as_mut().graceful_shutdown();
                }
                () = &mut killed => break,
            }
        }
        gauge.dec();
    }
}

/// `response` whose body reports to `busy` whether it waits for its peer:
/// from the moment its head is handed over, and after each frame, until
/// the connection asks for more. A body waiting for its own data (a long
/// poll) is not waiting for the peer. Dropped with the body, `busy` ends
/// the request on its connection.
fn with_write_progress(response: Response, busy: Busy) -> Response {
    busy.waiting_on_peer(true);
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, axum::body::Body::new(Progress { inner: body, busy }))
}

/// A response body that tells its connection when its peer takes frames.
struct Progress {
    inner: axum::body::Body,
    busy: Busy,
}

impl hyper::body::Body for Progress {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, axum::Error>>> {
        self.busy.waiting_on_peer(false);
        // When the body has data again, it waits on the connection (which
        // asks for it only while its peer takes what it sends).
        let waker = std::task::Waker::from(Arc::new(ReadyAgain {
            activity: Arc::clone(&self.busy.activity),
            number: self.busy.number,
            inner: cx.waker().clone(),
        }));
        let mut ready_again = std::task::Context::from_waker(&waker);
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(&mut ready_again);
        // A frame handed over waits on the peer, the last one too: the
        // body is dropped only once the connection has sent it.
        if matches!(polled, std::task::Poll::Ready(Some(Ok(_)))) {
            self.busy.waiting_on_peer(true);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The waker a response body gets: once the body has data again, its
/// request waits for the connection to take it.
struct ReadyAgain {
    activity: Arc<Activity>,
    number: u64,
    inner: std::task::Waker,
}

impl std::task::Wake for ReadyAgain {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = self.activity.state();
        if state.started.contains_key(&self.number) {
            state
                .stalled
                .entry(self.number)
                .or_insert_with(Instant::now);
        }
        drop(state);
        self.inner.wake_by_ref();
    }
}
