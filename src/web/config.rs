//! [`RelayConfig`]: the limits of a relay; [`RelayError`]: why it could not
//! serve a request.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::Error;

/// The limits of a [`TurnRelay`](super::TurnRelay).
///
/// ```
/// use std::time::Duration;
/// use nexus_knowql::web::RelayConfig;
/// let config = RelayConfig::default()
///     .ring(256, 256 * 1024)
///     .max_turns(100)
///     .reader_memory(16 << 20)
///     .heartbeat(Duration::from_secs(10))
///     .keep_ended(Duration::from_secs(120));
/// # drop(config);
/// ```
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub(crate) ring_frames: usize,
    pub(crate) ring_bytes: usize,
    pub(crate) max_turns: usize,
    pub(crate) reader_memory: usize,
    pub(crate) keep_ended: Duration,
    pub(crate) max_age: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) retry: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            ring_frames: 1024,
            ring_bytes: 1024 * 1024,
            max_turns: 256,
            reader_memory: 64 << 20,
            keep_ended: Duration::from_secs(300),
            max_age: Duration::from_secs(3600),
            heartbeat: Duration::from_secs(15),
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

    /// The bytes all connections of the relay may hold at once (default
    /// 64 MiB). Each connection is charged a fixed
    /// [`READER_COST`](super::READER_COST) while it is open, plus the frame
    /// it has been handed and not yet asked past. All connections read the
    /// same frames of a turn (one upstream reader per turn), so a connection
    /// that never reads holds its charge and nothing else: it neither slows
    /// nor blocks the others. A new connection beyond the budget gets
    /// `503 Service Unavailable`; a connection whose next frame does not fit
    /// is ended (the browser comes back with its `Last-Event-ID`).
    pub fn reader_memory(mut self, bytes: usize) -> Self {
        self.reader_memory = bytes;
        self
    }

    /// How long an ended turn stays for reconnecting browsers (default 5 minutes).
    pub fn keep_ended(mut self, keep: Duration) -> Self {
        self.keep_ended = keep;
        self
    }

    /// How long a turn is relayed at most, ended or not (default 1 hour):
    /// after that its reading stops, its connections get a
    /// [`EXPIRED`](super::EXPIRED) frame and end, and it is dropped.
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = age;
        self
    }

    /// The interval of [`HEARTBEAT`](super::HEARTBEAT) frames on a
    /// connection with nothing else to send (default 15 s; at least 10 ms).
    /// The page sees them, and can tell a stalled connection by their
    /// absence; each carries the interval as `{"interval_ms": ...}`.
    pub fn heartbeat(mut self, interval: Duration) -> Self {
        self.heartbeat = interval.max(Duration::from_millis(10));
        self
    }

    /// The reconnect delay sent to browsers (`retry:`, default 1 s).
    pub fn retry(mut self, delay: Duration) -> Self {
        self.retry = delay;
        self
    }
}

/// Why the relay could not serve a request; its [`IntoResponse`] is the
/// HTTP answer (404, 400, 503, 502), without internal detail.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// No such turn (never published, dropped after its time, or a guess).
    #[error("no such turn is relayed here")]
    UnknownTurn,
    /// The `Last-Event-ID` is not a number this turn handed out.
    #[error("Last-Event-ID {0:?} is not an id of this turn")]
    BadEventId(String),
    /// The connections of the relay hold [`RelayConfig::reader_memory`]
    /// already.
    #[error("the relay's connections hold {0} bytes, its limit")]
    Busy(usize),
    /// The relay holds [`RelayConfig::max_turns`] running turns.
    #[error("the relay holds {0} running turns, its limit")]
    Full(usize),
    /// The turn ended before the server named it.
    #[error("the turn ended before the server named it")]
    Unnamed(#[source] Option<Error>),
    /// The operating system gave no random bytes for a relay id.
    #[error("no random bytes for a relay id: {0}")]
    Random(String),
}

impl IntoResponse for RelayError {
    fn into_response(self) -> Response {
        let status = match &self {
            RelayError::UnknownTurn => StatusCode::NOT_FOUND,
            RelayError::BadEventId(_) => StatusCode::BAD_REQUEST,
            RelayError::Busy(_) | RelayError::Full(_) | RelayError::Random(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            RelayError::Unnamed(_) => StatusCode::BAD_GATEWAY,
        };
        let mut response = (status, self.to_string()).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
