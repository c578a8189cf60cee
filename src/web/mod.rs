//! Turns served to browsers: a [`TurnRelay`] re-emits verified
//! [`QueryTurn`]s as Server-Sent Events with stable ids, keeps the newest
//! frames of each turn in a bounded ring, and resumes a reconnecting
//! `EventSource` from its `Last-Event-ID`, so the page sees every piece of
//! the answer exactly once, as the SDK does.
//!
//! The relay reads each published turn in a task of its own (a turn goes on
//! while no browser listens), and keeps it for
//! [`RelayConfig::keep_ended`] after its end. A browser that comes back
//! after its frames left the ring gets a `relay.snapshot` frame with the
//! text up to the oldest frame kept, which replaces what it had, then the
//! frames from there on; every other frame is the
//! API's own event name and JSON data (`response.output_text.delta`,
//! `response.step`, ..., `query`), with `relay.error` for a stream that
//! broke beyond the SDK's resume.
//!
//! ```no_run
//! use axum::extract::{Path, State};
//! use axum::http::HeaderMap;
//! use axum::response::Response;
//! use nexus_knowql::web::{RelayConfig, TurnRelay};
//!
//! async fn events(
//!     State(relay): State<TurnRelay>,
//!     Path(id): Path<String>,
//!     headers: HeaderMap,
//! ) -> Response {
//!     relay.respond(&id, &headers)
//! }
//!
//! # async fn run(client: nexus_knowql::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let relay = TurnRelay::new(RelayConfig::default());
//! let session = client.session(["handbook"]).build()?;
//! let id = relay.publish(session.ask("Who approves travel?").stream().await?).await?;
//! let app: axum::Router = axum::Router::new()
//!     .route("/turns/{id}/events", axum::routing::get(events))
//!     .with_state(relay);
//! println!("the page opens EventSource(\"/turns/{id}/events\")");
//! # drop(app);
//! # Ok(()) }
//! ```

mod ring;

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::error::Error;
use crate::query::{QueryEvent, QueryTurn, names};
use ring::{Next, Ring};

/// The `event:` name of a frame that replaces the page's text (`{"text": ...}`).
pub const SNAPSHOT: &str = "relay.snapshot";
/// The `event:` name of a frame that reports a stream the SDK could not
/// finish (`{"message": ...}`).
pub const RELAY_ERROR: &str = "relay.error";

/// The limits of a [`TurnRelay`].
///
/// ```
/// use std::time::Duration;
/// use nexus_knowql::web::RelayConfig;
/// let config = RelayConfig::default()
///     .ring(256, 256 * 1024)
///     .max_turns(100)
///     .keep_ended(Duration::from_secs(120));
/// # drop(config);
/// ```
#[derive(Debug, Clone)]
pub struct RelayConfig {
    ring_frames: usize,
    ring_bytes: usize,
    max_turns: usize,
    max_readers: usize,
    keep_ended: Duration,
    max_age: Duration,
    keep_alive: Duration,
    retry: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            ring_frames: 1024,
            ring_bytes: 1024 * 1024,
            max_turns: 256,
            max_readers: 8,
            keep_ended: Duration::from_secs(300),
            max_age: Duration::from_secs(3600),
            keep_alive: Duration::from_secs(15),
            retry: Duration::from_millis(1000),
        }
    }
}

impl RelayConfig {
    /// The frames kept per turn for reconnecting browsers: at most `frames`
    /// and at most `bytes` (default 1024 frames, 1 MiB); the newest frame
    /// always stays.
    pub fn ring(mut self, frames: usize, bytes: usize) -> Self {
        self.ring_frames = frames.max(1);
        self.ring_bytes = bytes;
        self
    }

    /// The turns kept at once (default 256). A full relay drops the oldest
    /// ended turn, and refuses a new one when none has ended.
    pub fn max_turns(mut self, n: usize) -> Self {
        self.max_turns = n.max(1);
        self
    }

    /// The connections reading one turn at once (default 8).
    pub fn max_readers(mut self, n: usize) -> Self {
        self.max_readers = n.max(1);
        self
    }

    /// How long an ended turn stays for reconnecting browsers (default 5 minutes).
    pub fn keep_ended(mut self, keep: Duration) -> Self {
        self.keep_ended = keep;
        self
    }

    /// How long a turn is relayed at most, ended or not (default 1 hour):
    /// after that it is stopped and dropped.
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = age;
        self
    }

    /// The keep-alive comment interval on idle connections (default 15 s).
    pub fn keep_alive(mut self, interval: Duration) -> Self {
        self.keep_alive = interval;
        self
    }

    /// The reconnect delay sent to browsers (`retry:`, default 1 s).
    pub fn retry(mut self, delay: Duration) -> Self {
        self.retry = delay;
        self
    }
}

/// Why the relay could not serve a request; its [`IntoResponse`] is the
/// HTTP answer (404, 400, 429, 503), without internal detail.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// No such turn (never published, or dropped after its time).
    #[error("no turn {0} is relayed here")]
    UnknownTurn(String),
    /// The `Last-Event-ID` is not a number this turn handed out.
    #[error("Last-Event-ID {0:?} is not an id of this turn")]
    BadEventId(String),
    /// The turn has [`RelayConfig::max_readers`] connections already.
    #[error("turn {0} has too many readers")]
    TooManyReaders(String),
    /// The relay holds [`RelayConfig::max_turns`] running turns.
    #[error("the relay holds {0} running turns, its limit")]
    Full(usize),
    /// The turn ended before the server named it.
    #[error("the turn ended before the server named it")]
    Unnamed(#[source] Option<Error>),
}

impl IntoResponse for RelayError {
    fn into_response(self) -> Response {
        let status = match &self {
            RelayError::UnknownTurn(_) => StatusCode::NOT_FOUND,
            RelayError::BadEventId(_) => StatusCode::BAD_REQUEST,
            RelayError::TooManyReaders(_) => StatusCode::TOO_MANY_REQUESTS,
            RelayError::Full(_) => StatusCode::SERVICE_UNAVAILABLE,
            RelayError::Unnamed(_) => StatusCode::BAD_GATEWAY,
        };
        (status, self.to_string()).into_response()
    }
}

/// One relayed turn: its ring, the readers' wake-up and the task reading it.
struct Entry {
    ring: Mutex<Ring>,
    changed: Notify,
    readers: Mutex<usize>,
    started: Instant,
    ended_at: Mutex<Option<Instant>>,
    pump: Mutex<Option<AbortHandle>>,
}

impl Entry {
    fn ring(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, event: &str, data: String, delta: Option<&str>) {
        self.ring().push(event.to_owned(), data, delta);
        self.changed.notify_waiters();
    }

    fn end(&self) {
        self.ring().end();
        *lock(&self.ended_at) = Some(Instant::now());
        self.changed.notify_waiters();
    }

    fn stop(&self) {
        if let Some(pump) = lock(&self.pump).take() {
            pump.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Inner {
    config: RelayConfig,
    turns: Mutex<HashMap<String, Arc<Entry>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for entry in lock(&self.turns).values() {
            entry.stop();
        }
    }
}

/// Serves verified turns to browsers as Server-Sent Events, each with a
/// bounded replay ring; cheap to clone (one registry inside), bounded in
/// turns, readers per turn and bytes per turn. See the [module docs](self).
#[derive(Clone)]
pub struct TurnRelay {
    inner: Arc<Inner>,
}

impl fmt::Debug for TurnRelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnRelay")
            .field("config", &self.inner.config)
            .field("turns", &lock(&self.inner.turns).len())
            .finish()
    }
}

impl TurnRelay {
    /// An empty relay.
    ///
    /// ```
    /// let relay = nexus_knowql::web::TurnRelay::new(Default::default());
    /// assert!(relay.is_empty());
    /// ```
    pub fn new(config: RelayConfig) -> Self {
        TurnRelay {
            inner: Arc::new(Inner {
                config,
                turns: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The turns held now.
    pub fn len(&self) -> usize {
        lock(&self.inner.turns).len()
    }

    /// Whether no turn is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts relaying `turn` and returns its query id, once the server named
    /// it. A task of the current Tokio runtime reads the turn to its end,
    /// whether or not a browser listens; the relay stops it after
    /// [`RelayConfig::max_age`].
    ///
    /// # Errors
    /// [`RelayError::Full`] when the relay holds its limit of running
    /// turns (the turn is dropped, and goes on on the server);
    /// [`RelayError::Unnamed`] when the turn ended before it was named.
    pub async fn publish(&self, turn: QueryTurn) -> Result<String, RelayError> {
        self.make_room()?;
        let config = &self.inner.config;
        let entry = Arc::new(Entry {
            ring: Mutex::new(Ring::new(config.ring_frames, config.ring_bytes)),
            changed: Notify::new(),
            readers: Mutex::new(0),
            started: Instant::now(),
            ended_at: Mutex::new(None),
            pump: Mutex::new(None),
        });
        let (named, name) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(pump(turn, Arc::clone(&entry), named));
        *lock(&entry.pump) = Some(task.abort_handle());
        let id = match name.await {
            Ok(Ok(id)) => id,
            Ok(Err(e)) => return Err(RelayError::Unnamed(e)),
            Err(_) => return Err(RelayError::Unnamed(None)),
        };
        let mut turns = lock(&self.inner.turns);
        if let Some(old) = turns.insert(id.clone(), entry) {
            old.stop();
        }
        Ok(id)
    }

    /// Drops expired turns, then the oldest ended ones while the relay is full.
    fn make_room(&self) -> Result<(), RelayError> {
        let config = &self.inner.config;
        let mut turns = lock(&self.inner.turns);
        let now = Instant::now();
        turns.retain(|_, e| {
            let ended = *lock(&e.ended_at);
            let keep = now.duration_since(e.started) < config.max_age
                && ended.is_none_or(|t| now.duration_since(t) < config.keep_ended);
            if !keep {
                e.stop();
            }
            keep
        });
        while turns.len() >= config.max_turns {
            let oldest = turns
                .iter()
                .filter_map(|(id, e)| lock(&e.ended_at).map(|t| (t, id.clone())))
                .min();
            match oldest {
                Some((_, id)) => {
                    if let Some(e) = turns.remove(&id) {
                        e.stop();
                    }
                }
                None => return Err(RelayError::Full(turns.len())),
            }
        }
        Ok(())
    }

    /// The frames of turn `query_id` after `last_event_id` (`None`: from the
    /// start), as axum SSE events: the rest of the ring, then each new frame
    /// as it comes, until the turn's end. Ends at once for a reader that has
    /// every frame of an ended turn.
    ///
    /// # Errors
    /// [`RelayError::UnknownTurn`], [`RelayError::BadEventId`] for an id this
    /// turn has not handed out, [`RelayError::TooManyReaders`].
    pub fn subscribe(
        &self,
        query_id: &str,
        last_event_id: Option<u64>,
    ) -> Result<impl Stream<Item = Result<Event, Infallible>> + Send + 'static, RelayError> {
        let entry = lock(&self.inner.turns)
            .get(query_id)
            .cloned()
            .ok_or_else(|| RelayError::UnknownTurn(query_id.to_owned()))?;
        let after = last_event_id.unwrap_or(0);
        if after > entry.ring().last_id() {
            return Err(RelayError::BadEventId(after.to_string()));
        }
        {
            let mut readers = lock(&entry.readers);
            if *readers >= self.inner.config.max_readers {
                return Err(RelayError::TooManyReaders(query_id.to_owned()));
            }
            *readers += 1;
        }
        let reader = Reader {
            entry,
            after,
            retry: Some(self.inner.config.retry),
        };
        Ok(futures::stream::unfold(reader, Reader::next).map(Ok))
    }

    /// The HTTP answer to an `EventSource` request for turn `query_id`: its
    /// frames after the request's `Last-Event-ID` as `text/event-stream`;
    /// `204 No Content` (which stops the browser's reconnects) once the
    /// reader has every frame of an ended turn; otherwise the
    /// [`RelayError`]'s status.
    pub fn respond(&self, query_id: &str, headers: &HeaderMap) -> Response {
        let after = match last_event_id(headers) {
            Ok(after) => after,
            Err(e) => return e.into_response(),
        };
        if let Some(entry) = lock(&self.inner.turns).get(query_id)
            && let Some(after) = after
        {
            let ring = entry.ring();
            if ring.ended() && after == ring.last_id() {
                return StatusCode::NO_CONTENT.into_response();
            }
        }
        match self.subscribe(query_id, after) {
            Ok(frames) => Sse::new(frames)
                .keep_alive(KeepAlive::new().interval(self.inner.config.keep_alive))
                .into_response(),
            Err(e) => e.into_response(),
        }
    }
}

/// The request's `Last-Event-ID` as a number (`None` when absent or empty).
///
/// # Errors
/// [`RelayError::BadEventId`] when it is there and not a number.
///
/// ```
/// use axum::http::HeaderMap;
/// let mut headers = HeaderMap::new();
/// headers.insert("last-event-id", "42".parse().unwrap());
/// assert_eq!(nexus_knowql::web::last_event_id(&headers).unwrap(), Some(42));
/// ```
pub fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, RelayError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("?").trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|_| RelayError::BadEventId(text.chars().take(32).collect()))
}

/// One connection reading a turn's frames.
struct Reader {
    entry: Arc<Entry>,
    after: u64,
    /// The `retry:` to send once, with the first frame.
    retry: Option<Duration>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut readers = lock(&self.entry.readers);
        *readers = readers.saturating_sub(1);
    }
}

impl Reader {
    async fn next(mut self) -> Option<(Event, Reader)> {
        let entry = Arc::clone(&self.entry);
        loop {
            // Registered before looking, so a frame pushed in between wakes us.
            let changed = entry.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let next = entry.ring().next_after(self.after);
            let event = match next {
                Next::Frame(frame) => {
                    self.after = frame.id;
                    Event::default()
                        .id(frame.id.to_string())
                        .event(frame.event)
                        .data(frame.data)
                }
                Next::Snapshot { id, text } => {
                    self.after = id;
                    Event::default()
                        .id(id.to_string())
                        .event(SNAPSHOT)
                        .data(serde_json::json!({ "text": text }).to_string())
                }
                Next::End => return None,
                Next::Wait => {
                    changed.await;
                    continue;
                }
            };
            let event = match self.retry.take() {
                Some(retry) => event.retry(retry),
                None => event,
            };
            return Some((event, self));
        }
    }
}

/// Reads the turn to its end into the entry's ring; reports the query id as
/// soon as it is known.
async fn pump(
    mut turn: QueryTurn,
    entry: Arc<Entry>,
    named: tokio::sync::oneshot::Sender<Result<String, Option<Error>>>,
) {
    let mut named = Some(named);
    let mut first_error = None;
    while let Some(item) = turn.next().await {
        match item {
            Ok(event) => {
                let (name, data, delta) = frame_of(&event);
                entry.push(&name, data, delta);
            }
            Err(Error::TurnFailed { message, .. }) => {
                let data = serde_json::json!({ "error": message }).to_string();
                entry.push(names::FAILED, data, None);
            }
            Err(Error::TurnCancelled { message, .. }) => {
                let data = serde_json::json!({ "error": message }).to_string();
                entry.push(names::CANCELLED, data, None);
            }
            Err(e) => {
                tracing::warn!(query_id = turn.query_id(), error = %e, "relayed turn broke");
                let data = serde_json::json!({ "message": e.to_string() }).to_string();
                entry.push(RELAY_ERROR, data, None);
                first_error.get_or_insert(e);
            }
        }
        if let Some(id) = turn.query_id()
            && let Some(tx) = named.take()
        {
            let _ = tx.send(Ok(id.to_owned()));
        }
    }
    entry.end();
    if let Some(tx) = named.take() {
        let _ = tx.send(Err(first_error));
    }
}

/// The `event:` name, JSON `data:` and answer text of one delivered event.
fn frame_of(event: &QueryEvent) -> (String, String, Option<&str>) {
    let json = |v: serde_json::Value| v.to_string();
    let to_json = |v: Result<String, serde_json::Error>| v.unwrap_or_else(|_| "{}".into());
    match event {
        QueryEvent::Created {
            query_id,
            session_id,
        } => (
            names::CREATED.into(),
            json(serde_json::json!({ "query_id": query_id, "session_id": session_id })),
            None,
        ),
        QueryEvent::Step(step) => (
            names::STEP.into(),
            to_json(serde_json::to_string(step)),
            None,
        ),
        QueryEvent::TextDelta { delta } => (
            names::TEXT_DELTA.into(),
            json(serde_json::json!({ "delta": delta })),
            Some(delta.as_str()),
        ),
        QueryEvent::TurnRollup(r) => (
            names::TURN_ROLLUP.into(),
            to_json(serde_json::to_string(r)),
            None,
        ),
        QueryEvent::Synthesis(s) => (
            names::SYNTHESIS.into(),
            to_json(serde_json::to_string(s)),
            None,
        ),
        QueryEvent::Trace { trace_ref } => (
            names::TRACE.into(),
            json(serde_json::json!({ "trace_ref": trace_ref })),
            None,
        ),
        QueryEvent::Completed => (names::COMPLETED.into(), "{}".into(), None),
        QueryEvent::Failed { error } => (
            names::FAILED.into(),
            json(serde_json::json!({ "error": error })),
            None,
        ),
        QueryEvent::Cancelled { error } => (
            names::CANCELLED.into(),
            json(serde_json::json!({ "error": error })),
            None,
        ),
        QueryEvent::Query(q) => (names::QUERY.into(), to_json(serde_json::to_string(q)), None),
        QueryEvent::Unknown { event, data } => {
            // Field values cannot hold line breaks; the parser never makes
            // such a name, but the relay must not panic on one.
            let name = if event.is_empty() || event.contains(['\r', '\n']) {
                "unknown".to_owned()
            } else {
                event.clone()
            };
            (name, data.replace('\r', ""), None)
        }
    }
}
