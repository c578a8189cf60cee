//! Turns served to browsers: a [`TurnRelay`] re-emits verified
//! [`QueryTurn`]s as Server-Sent Events with stable ids, keeps the newest
//! frames of each turn in a bounded ring, and resumes a reconnecting
//! `EventSource` from its `Last-Event-ID`, so the page sees every piece of
//! the answer exactly once, as the SDK does.
//!
//! Made for the open web:
//!
//! - A turn is served under a **relay id** of 128 bits from the operating
//!   system's random source, not under its query id: only who was handed
//!   the relay id can read the turn; a guess gets `404`.
//! - **One upstream reader per turn**, broadcast: a task reads the turn
//!   into its ring (it goes on while no browser listens) and every
//!   connection reads the same frames. Connections are bounded by the
//!   bytes they hold ([`RelayConfig::reader_memory`]), not by a count; one
//!   that never reads holds a fixed charge and costs the others nothing.
//! - **Heartbeats the page sees**: a [`HEARTBEAT`] frame opens every
//!   connection and follows each interval without other frames, so a page
//!   can tell a stalled connection and reconnect
//!   (`examples/web/index.html` does).
//! - A turn stays for [`RelayConfig::keep_ended`] after its end, and at
//!   most [`RelayConfig::max_age`]; then its connections get an
//!   [`EXPIRED`] frame (when the turn had not ended) and end cleanly.
//!
//! A browser that comes back after its frames left the ring gets a
//! [`SNAPSHOT`] frame with the text up to the oldest frame kept, which
//! replaces what it had, then the frames from there on; every other frame
//! is the API's own event name and JSON data (`response.output_text.delta`,
//! `response.step`, ..., `query`), with [`RELAY_ERROR`] for a stream that
//! broke beyond the SDK's resume.
//!
//! ```no_run
//! use axum::extract::{Path, State};
//! use axum::http::{HeaderMap, Uri};
//! use axum::response::{IntoResponse, Response};
//! use nexus_knowql::web::{RelayConfig, TurnRelay, last_event_id};
//!
//! async fn events(
//!     State(relay): State<TurnRelay>,
//!     Path(id): Path<String>,
//!     headers: HeaderMap,
//!     uri: Uri,
//! ) -> Response {
//!     match last_event_id(&headers, &uri) {
//!         Ok(after) => relay.respond(&id, after),
//!         Err(e) => e.into_response(),
//!     }
//! }
//!
//! # async fn run(client: nexus_knowql::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let relay = TurnRelay::new(RelayConfig::default());
//! let session = client.session(["handbook"]).build()?;
//! let published = relay.publish(session.ask("Who approves travel?").stream().await?).await?;
//! let app: axum::Router = axum::Router::new()
//!     .route("/turns/{id}/events", axum::routing::get(events))
//!     .with_state(relay);
//! let id = published.relay_id;
//! println!("the page opens EventSource(\"/turns/{id}/events\")");
//! # drop(app);
//! # Ok(()) }
//! ```

mod config;
mod entry;
mod reader;
mod ring;

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};

use crate::query::QueryTurn;
pub use config::{RelayConfig, RelayError};
use entry::{Entry, Lifetime, Turns, lock};
use reader::{Budget, Reader};
use ring::Ring;

/// The `event:` name of a frame that replaces the page's text (`{"text": ...}`).
pub const SNAPSHOT: &str = "relay.snapshot";
/// The `event:` name of a frame that reports a stream the SDK could not
/// finish (`{"message": ...}`).
pub const RELAY_ERROR: &str = "relay.error";
/// The `event:` name of the frame that opens every connection and follows
/// each [`RelayConfig::heartbeat`] interval without other frames
/// (`{"interval_ms": ...}`, no `id:`).
pub const HEARTBEAT: &str = "relay.heartbeat";
/// The `event:` name of the last frame of a turn the relay stopped after
/// [`RelayConfig::max_age`] (`{"message": ...}`).
pub const EXPIRED: &str = "relay.expired";
/// The bytes each open connection is charged against
/// [`RelayConfig::reader_memory`], beside the frame it holds: an estimate
/// of what a connection pins (its state, its share of the socket's and the
/// HTTP server's buffers).
pub const READER_COST: usize = 16 * 1024;

/// A turn the relay took: the id browsers read it by, and the upstream
/// query id (for the server's own use; the relay does not serve by it).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// 32 hexadecimal digits, 128 random bits: the `{id}` of the page's
    /// event URL.
    pub relay_id: String,
    /// The turn's query id on the Nexus.
    pub query_id: String,
}

struct Inner {
    config: RelayConfig,
    turns: Arc<Turns>,
    budget: Arc<Budget>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for entry in lock(&self.turns).values() {
            entry.stop();
        }
    }
}

/// Serves verified turns to browsers as Server-Sent Events under
/// unguessable ids, each turn read once and broadcast from a bounded
/// replay ring; cheap to clone (one registry inside), bounded in turns,
/// bytes per turn and bytes held by connections. See the
/// [module docs](self).
#[derive(Clone)]
pub struct TurnRelay {
    inner: Arc<Inner>,
}

impl fmt::Debug for TurnRelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnRelay")
            .field("config", &self.inner.config)
            .field("turns", &lock(&self.inner.turns).len())
            .field("reader_bytes", &self.inner.budget.used())
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
                budget: Arc::new(Budget::new(config.reader_memory)),
                config,
                turns: Arc::default(),
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

    /// The bytes the open connections are charged now (see
    /// [`RelayConfig::reader_memory`]).
    pub fn reader_bytes(&self) -> usize {
        self.inner.budget.used()
    }

    /// Starts relaying `turn` under a new relay id, once the server named
    /// it. A task of the current Tokio runtime reads the turn to its end,
    /// whether or not a browser listens, and drops it after its time
    /// ([`RelayConfig::keep_ended`], [`RelayConfig::max_age`]).
    ///
    /// # Errors
    /// [`RelayError::Full`] when the relay holds its limit of running
    /// turns (the turn is dropped, and goes on on the server);
    /// [`RelayError::Unnamed`] when the turn ended before it was named;
    /// [`RelayError::Random`] when the system gave no random bytes.
    pub async fn publish(&self, turn: QueryTurn) -> Result<Published, RelayError> {
        let relay_id = new_relay_id()?;
        let config = &self.inner.config;
        let entry = Arc::new(Entry::new(Ring::new(config.ring_frames, config.ring_bytes)));
        self.make_room()?;
        lock(&self.inner.turns).insert(relay_id.clone(), Arc::clone(&entry));
        let (named, name) = tokio::sync::oneshot::channel();
        let life = Lifetime {
            relay_id: relay_id.clone(),
            turns: Arc::downgrade(&self.inner.turns),
            max_age: config.max_age,
            keep_ended: config.keep_ended,
        };
        let task = tokio::spawn(entry::relay_turn(turn, Arc::clone(&entry), named, life));
        entry.set_pump(task.abort_handle());
        let unnamed = match name.await {
            Ok(Ok(query_id)) => return Ok(Published { relay_id, query_id }),
            Ok(Err(e)) => RelayError::Unnamed(e),
            Err(_) => RelayError::Unnamed(None),
        };
        if let Some(entry) = lock(&self.inner.turns).remove(&relay_id) {
            entry.stop();
        }
        Err(unnamed)
    }

    /// Drops the oldest ended turns while the relay is full.
    fn make_room(&self) -> Result<(), RelayError> {
        let mut turns = lock(&self.inner.turns);
        while turns.len() >= self.inner.config.max_turns {
            let oldest = turns
                .iter()
                .filter_map(|(id, e)| e.ended_at().map(|t| (t, id.clone())))
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

    /// The frames of the turn `relay_id` after `last_event_id` (`None`:
    /// from the start), as axum SSE events: a [`HEARTBEAT`], the rest of
    /// the ring, then each new frame as it comes (and heartbeats between),
    /// until the turn's end.
    ///
    /// # Errors
    /// [`RelayError::UnknownTurn`], [`RelayError::BadEventId`] for an id this
    /// turn has not handed out, [`RelayError::Busy`] when the relay's
    /// connections hold [`RelayConfig::reader_memory`].
    pub fn subscribe(
        &self,
        relay_id: &str,
        last_event_id: Option<u64>,
    ) -> Result<impl Stream<Item = Result<Event, Infallible>> + Send + 'static, RelayError> {
        let entry = lock(&self.inner.turns)
            .get(relay_id)
            .cloned()
            .ok_or(RelayError::UnknownTurn)?;
        let after = last_event_id.unwrap_or(0);
        if after > entry.ring().last_id() {
            return Err(RelayError::BadEventId(after.to_string()));
        }
        let budget = &self.inner.budget;
        if !budget.take(READER_COST) {
            return Err(RelayError::Busy(budget.used()));
        }
        let config = &self.inner.config;
        let reader = Reader::new(
            entry,
            Arc::clone(budget),
            after,
            config.heartbeat,
            config.retry,
        );
        Ok(futures::stream::unfold(reader, Reader::next).map(Ok))
    }

    /// The HTTP answer to an `EventSource` request for the turn
    /// `relay_id`: its frames after `last_event_id` (see [`last_event_id`])
    /// as `text/event-stream`; `204 No Content` (which stops the browser's
    /// reconnects) once the reader has every frame of an ended turn;
    /// otherwise the [`RelayError`]'s status.
    pub fn respond(&self, relay_id: &str, last_event_id: Option<u64>) -> Response {
        if let Some(entry) = lock(&self.inner.turns).get(relay_id)
            && let Some(after) = last_event_id
        {
            let ring = entry.ring();
            if ring.ended() && after == ring.last_id() {
                return StatusCode::NO_CONTENT.into_response();
            }
        }
        match self.subscribe(relay_id, last_event_id) {
            Ok(frames) => Sse::new(frames).into_response(),
            Err(e) => e.into_response(),
        }
    }
}

/// 128 bits from the operating system's random source, as 32 hex digits.
fn new_relay_id() -> Result<String, RelayError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| RelayError::Random(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where a connection resumes: the request's `Last-Event-ID` header (set by
/// `EventSource` on its own reconnects), else its `last_event_id` query
/// parameter (for a page that opens a new `EventSource` after a stall);
/// `None` when neither is there or it is empty.
///
/// # Errors
/// [`RelayError::BadEventId`] when it is there and not a number.
///
/// ```
/// use axum::http::{HeaderMap, Uri};
/// let mut headers = HeaderMap::new();
/// let uri: Uri = "/turns/x/events?last_event_id=7".parse().unwrap();
/// assert_eq!(nexus_knowql::web::last_event_id(&headers, &uri).unwrap(), Some(7));
/// headers.insert("last-event-id", "42".parse().unwrap());
/// assert_eq!(nexus_knowql::web::last_event_id(&headers, &uri).unwrap(), Some(42));
/// ```
pub fn last_event_id(headers: &HeaderMap, uri: &Uri) -> Result<Option<u64>, RelayError> {
    let text = match headers.get("last-event-id") {
        Some(value) => value.to_str().unwrap_or("?").trim().to_owned(),
        None => uri
            .query()
            .and_then(|query| {
                url::form_urlencoded::parse(query.as_bytes())
                    .find(|(key, _)| key == "last_event_id")
                    .map(|(_, value)| value.trim().to_owned())
            })
            .unwrap_or_default(),
    };
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|_| RelayError::BadEventId(text.chars().take(32).collect()))
}
