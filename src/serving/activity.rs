//! What one connection is doing: whether its first request head has come,
//! when each request in flight started, since when none is, and since when
//! a response has waited for its peer to take what it has to send.
//!
//! Requests only record what they do; nothing wakes the connection's task.
//! Its one timer is re-armed lazily when it fires, so a request costs two
//! short lock sections, not a timer reset and two extra polls of the
//! connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::response::Response;
use tokio::time::Instant;

/// What one connection is doing.
#[derive(Debug)]
pub(super) struct Activity {
    seen: AtomicBool,
    state: Mutex<InFlight>,
}

/// The requests in flight on one connection.
#[derive(Debug)]
struct InFlight {
    /// Start of each request in flight, by a number drawn from `next`.
    started: HashMap<u64, Instant>,
    /// Since when each response that has something to send has waited for
    /// its peer to take it (by the same numbers).
    stalled: HashMap<u64, Instant>,
    next: u64,
    /// When the last request in flight ended (or the connection opened).
    idle_since: Instant,
}

impl Activity {
    pub(super) fn new() -> Self {
        Activity {
            seen: AtomicBool::new(false),
            state: Mutex::new(InFlight {
                started: HashMap::new(),
                stalled: HashMap::new(),
                next: 0,
                idle_since: Instant::now(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, InFlight> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a request head has arrived.
    pub(super) fn seen(&self) -> bool {
        self.seen.load(Ordering::Acquire)
    }

    /// A request head arrived: in flight until the returned value is
    /// dropped (with the response body, sent or not).
    pub(super) fn start(self: &Arc<Self>) -> Busy {
        self.seen.store(true, Ordering::Release);
        let mut state = self.state();
        let number = state.next;
        state.next = state.next.wrapping_add(1);
        state.started.insert(number, Instant::now());
        Busy {
            activity: Arc::clone(self),
            number,
            watch_stall: false,
        }
    }

    /// Since when the longest-waiting response has waited for its peer to
    /// take what it has to send.
    pub(super) fn stalled_since(&self) -> Option<Instant> {
        self.state().stalled.values().min().copied()
    }

    /// The start of the oldest request in flight, or (none in flight) the
    /// time the connection has been idle since.
    pub(super) fn oldest(&self) -> Result<Instant, Instant> {
        let state = self.state();
        match state.started.values().min() {
            Some(oldest) => Ok(*oldest),
            None => Err(state.idle_since),
        }
    }

    /// How long the connection has gone without a request in flight (zero
    /// while one is).
    pub(super) fn idle_for(&self) -> Duration {
        match self.oldest() {
            Ok(_) => Duration::ZERO,
            Err(since) => since.elapsed(),
        }
    }

    /// Whether a request is in flight.
    pub(super) fn busy(&self) -> bool {
        self.oldest().is_ok()
    }
}

/// One request in flight on a connection.
#[derive(Debug)]
pub(super) struct Busy {
    activity: Arc<Activity>,
    number: u64,
    /// Whether the response records when it waits for its peer.
    watch_stall: bool,
}

impl Busy {
    /// The response has something for its peer (its head, or a frame just
    /// handed over) and waits for the peer to take it, or (`false`) was
    /// asked for more: its peer is reading.
    fn waiting_on_peer(&self, waiting: bool) {
        if !self.watch_stall {
            return;
        }
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

/// `response` whose body holds `busy` until it is dropped (the request is
/// in flight until then) and, with `watch_stall`, reports whether it waits
/// for its peer: from the moment its head is handed over, and after each
/// frame, until the connection asks for more. A body waiting for its own
/// data (a long poll) is not waiting for the peer.
pub(super) fn with_write_progress(
    response: Response,
    mut busy: Busy,
    watch_stall: bool,
) -> Response {
    busy.watch_stall = watch_stall;
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
        if !self.busy.watch_stall {
            return std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        }
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
