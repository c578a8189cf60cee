//! The crate's one public error type.
//!
//! Every fallible call of the SDK returns [`Error`]. Callers usually ask it
//! questions ([`Error::is_retryable`], [`Error::is_not_found`],
//! [`Error::status`], [`Error::code`], [`Error::request_id`]) rather than
//! match on it; the variants are public for when they need the details
//! (each struct variant is `#[non_exhaustive]`: match with `..`). The
//! errors of the generated calls of [`Client::api`](crate::Client::api)
//! convert into it with `?`.
//!
//! An error's text names what failed; its cause, when it has one, is its
//! [`source`](std::error::Error::source) and is not repeated in the text,
//! so a report that prints the chain (anyhow, eyre) shows each part once.

use std::fmt;

mod checkpoint;
mod rate_limit;
pub use checkpoint::CheckpointError;
pub use rate_limit::{MAX_RATE_LIMIT_HEADERS, RateLimits};

/// A `Result` whose error defaults to [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The boxed source of a transport failure.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How many bytes of an unexpected body an error keeps.
pub(crate) const SNIPPET_LIMIT: usize = 512;

/// Everything that can go wrong when talking to Nexus.
///
/// No variant ever holds an API key or a bearer token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server answered with an error status and (usually) the API's `Error` envelope.
    #[error("{}{}: server answered {}{}: {}{}", .0.operation, query_suffix(&.0.query_id), .0.status, code_suffix(&.0.code), .0.message, started_note(api_may_have_started(.0)))]
    Api(Box<ApiError>),

    /// The server does not serve the API version this client sent.
    #[error("{}: the server does not support API version `{}`: {}", .0.operation, .0.sent, .0.message)]
    UnsupportedApiVersion(Box<UnsupportedVersion>),

    /// The credentials were missing, wrong or expired (HTTP 401, after any re-login).
    #[error("{operation}: unauthorized: {message}")]
    #[non_exhaustive]
    Unauthorized {
        /// The operation that was refused.
        operation: &'static str,
        /// The server's message (never the credentials).
        message: String,
        /// The server's request id, when it sent one.
        request_id: Option<String>,
    },

    /// The request or the response did not make it across the network.
    /// Its text says where it failed; the cause is its
    /// [`source`](std::error::Error::source) (without URLs), so an error
    /// report that prints the chain shows each part once.
    #[error("{operation}: {}{}", transport_what(*.connect), started_note(!*.connect && starts_turn(operation)))]
    #[non_exhaustive]
    Transport {
        /// The operation under way.
        operation: &'static str,
        /// Whether the failure happened while connecting (nothing was sent).
        connect: bool,
        /// The underlying failure.
        #[source]
        source: BoxError,
    },

    /// A deadline passed: a request timeout, an idle stream, a turn's
    /// deadline, or a `wait()` limit.
    #[error("{operation}{}: timed out after {elapsed_ms} ms{}", query_suffix(.query_id), started_note(starts_turn(operation)))]
    #[non_exhaustive]
    Timeout {
        /// The operation under way.
        operation: &'static str,
        /// How long was waited, in milliseconds.
        elapsed_ms: u64,
        /// The query turn the wait was about, when the server had named
        /// one: it may still run; attach to it rather than ask again.
        query_id: Option<String>,
    },

    /// A response body could not be decoded.
    #[error("{}{}: could not decode the response: {} (body starts: {:?}){}", .0.operation, query_suffix(&.0.query_id), .0.message, .0.snippet, started_note(starts_turn(.0.operation)))]
    Decode(Box<DecodeFailure>),

    /// The request was rejected before anything was sent.
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    /// A local file or directory to upload could not be read; nothing was
    /// sent for it.
    /// The cause is its [`source`](std::error::Error::source), not part of
    /// its text.
    #[error("{operation}: cannot {action} {}", path.display())]
    #[non_exhaustive]
    Io {
        /// The operation under way, e.g. `import_dir`.
        operation: &'static str,
        /// What failed: `open`, `read` or `archive`.
        action: &'static str,
        /// The file or directory.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },

    /// A query turn ended with `response.failed` or status `failed`.
    #[error("query {query_id} failed: {message}")]
    #[non_exhaustive]
    TurnFailed {
        /// The failed turn.
        query_id: String,
        /// The server's error text.
        message: String,
    },

    /// A query turn was cancelled.
    #[error("query {query_id} was cancelled{}", message_suffix(.message))]
    #[non_exhaustive]
    TurnCancelled {
        /// The cancelled turn.
        query_id: String,
        /// The server's text, if any.
        message: String,
    },

    /// A task (curation, import, ...) ended `failed` or `cancelled`.
    #[error("task {} ended {}{}", .0.task_id, .0.state, message_suffix(&.0.message))]
    TaskFailed(Box<TaskFailure>),

    /// A redirect to another origin (scheme, host or port, including `https`
    /// to `http`) was refused, there were too many redirects, or a 307/308
    /// would have sent `POST /query` again. Nothing was sent to `location`;
    /// credentials go only to the configured origin.
    #[error("{operation}: {reason}: redirect to {location} not followed")]
    #[non_exhaustive]
    Redirect {
        /// The operation under way.
        operation: &'static str,
        /// The redirect target, without user info, query or fragment.
        location: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// A listing's pages did not add up (the server repeated a page or
    /// pointed back to one), or the listing holds more items than its bound.
    #[error("{operation}: paging: {message}")]
    #[non_exhaustive]
    Paging {
        /// The list operation.
        operation: &'static str,
        /// What was wrong.
        message: String,
    },

    /// A turn of the session is still running (dropped, detached or started
    /// elsewhere), so the session cannot start another one yet. Nothing was
    /// started. Attach to the running turn with
    /// [`Queries::attach`](crate::resources::Queries::attach), cancel it with
    /// [`Queries::cancel`](crate::resources::Queries::cancel), or let the
    /// session wait for it ([`WhenBusy::Wait`](crate::WhenBusy::Wait)).
    #[error(
        "the session still runs {}: attach to it or cancel it before asking again",
        busy_turn(.query_id)
    )]
    #[non_exhaustive]
    SessionBusy {
        /// The turn still running; empty when it was started in this process
        /// and the server has not named it yet.
        query_id: String,
    },

    /// An event stream broke in a way that cannot be resumed.
    #[error("event stream{}: {message}", query_suffix(.query_id))]
    #[non_exhaustive]
    Stream {
        /// The turn, when its id was known.
        query_id: Option<String>,
        /// What happened.
        message: String,
    },

    /// A resumed event stream did not replay from the `Last-Event-ID` that
    /// was sent (or its event log was gone), and the stored turn could not
    /// make up for the gap. Nothing after `last_event_id` was delivered.
    #[error("event stream of query {query_id}: the events after {} could not be replayed: {message}", after_event(.last_event_id))]
    #[non_exhaustive]
    ReplayGap {
        /// The turn.
        query_id: String,
        /// The last event delivered before the gap (`None`: none had an id).
        last_event_id: Option<u64>,
        /// What the server did, and why the stored turn did not help.
        message: String,
    },
    /// The server answered about another turn (or another session) than
    /// the one asked about: an event, the final `query` frame, the stored
    /// turn or a poll named another id than the turn's (see
    /// [`TurnMismatch`]). Nothing of it was taken as this turn's; it is
    /// never retried into success (a misrouting proxy or cache would
    /// otherwise hand one caller's answer to another).
    #[error("query {}: {} names {} {}, not {}", .0.query_id, .0.place, .0.kind, .0.got, .0.expected)]
    TurnMismatch(Box<TurnMismatch>),

    /// A turn's final `query` frame or stored state carries a status word
    /// this client does not know (not `in_progress`, `completed`, `failed`
    /// or `cancelled`): whether the turn ended cannot be told, so it is not
    /// polled on. Read it with `client.queries().get(query_id)`.
    #[error("query {query_id}: unknown status {status:?}")]
    #[non_exhaustive]
    UnknownTurnStatus {
        /// The turn.
        query_id: String,
        /// The status word as sent.
        status: String,
    },

    /// A response body was larger than the client's limit
    /// ([`ClientBuilder::max_response_bytes`](crate::ClientBuilder::max_response_bytes));
    /// it was not read to its end.
    #[error("{operation}: the answer is larger than the limit of {limit} bytes")]
    #[non_exhaustive]
    ResponseTooLarge {
        /// The operation whose answer was too large.
        operation: &'static str,
        /// The limit, in bytes.
        limit: u64,
    },

    /// A streamed turn delivered more than its configured bound: answer
    /// text beyond [`StreamConfig::max_text_bytes`](crate::StreamConfig::max_text_bytes)
    /// or steps beyond [`StreamConfig::max_step_bytes`](crate::StreamConfig::max_step_bytes).
    /// Reading stopped there; the turn was not cancelled and may still run.
    #[error(
        "{}the turn's {part} passed the limit of {limit} bytes; reading stopped (the turn may still run)",
        query_prefix(.query_id)
    )]
    #[non_exhaustive]
    TurnTooLarge {
        /// The turn, when the server had named it.
        query_id: Option<String>,
        /// What passed its bound: `text` or `steps`.
        part: &'static str,
        /// The bound, in bytes.
        limit: u64,
    },

    /// The text a streamed turn delivered is not the turn's final answer,
    /// and the final answer does not continue it: the deltas cannot be
    /// trusted. Read the stored turn (`client.queries().get(query_id)`) for
    /// the answer.
    #[error(
        "query {query_id}: the {delivered_len} bytes delivered do not match the first \
         {delivered_len} bytes of the final answer (of {final_len} bytes); they first differ at \
         byte {first_difference}"
    )]
    #[non_exhaustive]
    AnswerMismatch {
        /// The turn.
        query_id: String,
        /// The bytes of text the stream delivered.
        delivered_len: u64,
        /// The bytes of the final answer.
        final_len: u64,
        /// The first byte offset (in the final answer) where they differ.
        first_difference: u64,
    },

    /// A job's stored checkpoint record cannot be used; the
    /// [`CheckpointError`] says why and
    /// names the way out.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// What [`Error::UnsupportedApiVersion`] says: the server does not serve
/// the API version that was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnsupportedVersion {
    /// The operation that was refused.
    pub operation: &'static str,
    /// The `X-Pinecone-Api-Version` value that was sent.
    pub sent: String,
    /// The server's message.
    pub message: String,
    /// The server's request id, when it sent one.
    pub request_id: Option<String>,
}

/// What [`Error::Decode`] says: a response body that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DecodeFailure {
    /// The operation whose response failed to decode.
    pub operation: &'static str,
    /// The query turn the answer was about, when known (for an answer to
    /// `POST /query`, the id its body names, if it can be read).
    pub query_id: Option<String>,
    /// What was wrong.
    pub message: String,
    /// The first bytes of the body (at most 512), lossily decoded.
    pub snippet: String,
}

/// What [`Error::TaskFailed`] says: a task that ended `failed` or `cancelled`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskFailure {
    /// The task.
    pub task_id: String,
    /// Its final state.
    pub state: String,
    /// The task's error text, if any.
    pub message: String,
}

/// What [`Error::TurnMismatch`] found: where the server named which id in
/// place of the turn's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TurnMismatch {
    /// The turn that was asked about.
    pub query_id: String,
    /// What named the other id: `an event`, `the final query frame`, `the
    /// stored turn`, `a poll`, `the answer to cancel` or `the answer to POST
    /// /query`.
    pub place: &'static str,
    /// Which id differs: `query` or `session`.
    pub kind: &'static str,
    /// The id the turn has.
    pub expected: String,
    /// The id the server sent.
    pub got: String,
}

/// An error answer from the Nexus API: the HTTP status plus the `Error` envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ApiError {
    /// The operation (the spec's operationId) that failed.
    pub operation: &'static str,
    /// HTTP status code.
    pub status: u16,
    /// The envelope's `code`, when the server sent one (for example `unsupported_api_version`).
    pub code: Option<String>,
    /// The envelope's `message`, or the raw body when it was not the envelope.
    pub message: String,
    /// The request id header, when the server sent one.
    pub request_id: Option<String>,
    /// The raw body (at most 512 bytes) when it was not a JSON `Error` envelope.
    pub raw_body: Option<String>,
    /// The query turn the call was about, when it was about one.
    pub query_id: Option<String>,
    /// The server's `Retry-After`, when it sent one (as sent: not clamped).
    pub retry_after: Option<std::time::Duration>,
    /// The answer's `x-ratelimit-*` headers.
    pub rate_limits: RateLimits,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

fn code_suffix(code: &Option<String>) -> String {
    code.as_ref().map(|c| format!(" ({c})")).unwrap_or_default()
}

fn message_suffix(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

fn busy_turn(query_id: &str) -> String {
    if query_id.is_empty() {
        "a turn the server has not named yet".to_owned()
    } else {
        format!("query {query_id}")
    }
}

fn after_event(last_event_id: &Option<u64>) -> String {
    last_event_id.map_or_else(|| "the start".to_owned(), |n| format!("event {n}"))
}

fn query_prefix(query_id: &Option<String>) -> String {
    query_id
        .as_ref()
        .map(|q| format!("query {q}: "))
        .unwrap_or_default()
}

fn transport_what(connect: bool) -> &'static str {
    if connect {
        "could not connect"
    } else {
        "the connection failed"
    }
}

/// An error and its sources, joined by `: `, each part once (a source whose
/// text its parent already shows is left out).
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = s.source();
    }
    out.replace('\n', " ")
}

fn query_suffix(query_id: &Option<String>) -> String {
    query_id
        .as_ref()
        .map(|q| format!(" of query {q}"))
        .unwrap_or_default()
}

impl Error {
    /// The HTTP status of an error answer, if the server answered.
    ///
    /// ```
    /// # fn check(e: &nexus_knowql::Error) {
    /// use nexus_knowql::http::StatusCode;
    /// if e.status() == Some(StatusCode::NOT_FOUND) {
    ///     eprintln!("no such thing");
    /// }
    /// # }
    /// ```
    pub fn status(&self) -> Option<http::StatusCode> {
        let status = match self {
            Error::Api(e) => e.status,
            Error::UnsupportedApiVersion(_) => 400,
            Error::Unauthorized { .. } => 401,
            _ => return None,
        };
        http::StatusCode::from_u16(status).ok()
    }

    /// The server's error `code`, if it sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api(e) => e.code.as_deref(),
            Error::UnsupportedApiVersion(_) => Some("unsupported_api_version"),
            _ => None,
        }
    }

    /// The server's request id, if it sent one.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Error::Api(e) => e.request_id.as_deref(),
            Error::UnsupportedApiVersion(v) => v.request_id.as_deref(),
            Error::Unauthorized { request_id, .. } => request_id.as_deref(),
            _ => None,
        }
    }

    /// The API error answer, if this is one.
    pub fn as_api(&self) -> Option<&ApiError> {
        match self {
            Error::Api(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the resource was not found (HTTP 404).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(http::StatusCode::NOT_FOUND)
    }

    /// Whether the server refused because of a conflict (HTTP 409), such as a
    /// turn already in flight on a session or an import in progress.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::SessionBusy { .. })
            || self.status() == Some(http::StatusCode::CONFLICT)
    }

    /// Whether a deadline passed ([`Error::Timeout`]).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// Whether trying the same call again later may succeed without harm.
    ///
    /// This is the classification the client's retry loop uses for
    /// idempotent requests (408, 429 and 5xx answers, connection failures
    /// and timeouts), with one rule above it: nothing that could start a
    /// second turn is retryable. For `create_query` only answers taken to
    /// show the turn was not started count: 429, a connection that could not
    /// be opened, and a 503 with `Retry-After`. The last is an assumption
    /// (a server that sheds load answers so before it starts anything), not
    /// something the answer proves: a proxy in front of the API could send
    /// it after the turn started. A 500, 502 or 504 there (the API
    /// answers 504 when the turn timed out; a gateway may fail after the
    /// turn started), a `create_query` that may have reached the server (a
    /// timeout, a connection lost after sending), an event stream that
    /// broke ([`Error::Stream`]), a broken replay ([`Error::ReplayGap`]) and
    /// a mismatched answer ([`Error::AnswerMismatch`]) are not; see
    /// [`Error::may_have_started`].
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Api(e) if starts_turn(e.operation) => {
                e.status == 429 || (e.status == 503 && e.retry_after.is_some())
            }
            Error::Api(e) => is_retryable_status(e.status),
            Error::Transport { operation, .. } => {
                !self.may_have_reached_server() || !starts_turn(operation)
            }
            Error::Timeout {
                operation,
                query_id,
                ..
            } => !starts_turn(operation) && query_id.is_none(),
            _ => false,
        }
    }

    /// Whether a query turn may have been started (or may still run)
    /// although the call failed: a `create_query` answered 408 or 5xx (but
    /// not a 503 with `Retry-After`), cut after sending or timed out, and a
    /// streamed turn that broke, timed out, or whose events could not be
    /// trusted (another turn's events, an unknown status), or whose accepted
    /// `POST /query` answered a body that could not be decoded. Asking
    /// again may start a second (billed) turn: attach to the
    /// turn by [`Error::query_id`] when known, or look at the session's
    /// turns (`Session::get`), instead.
    pub fn may_have_started(&self) -> bool {
        match self {
            Error::Api(e) => api_may_have_started(e),
            Error::Transport { operation, .. } => {
                self.may_have_reached_server() && starts_turn(operation)
            }
            Error::Timeout {
                operation,
                query_id,
                ..
            } => starts_turn(operation) || query_id.is_some(),
            Error::Decode(d) => starts_turn(d.operation),
            Error::Stream { .. }
            | Error::ReplayGap { .. }
            | Error::AnswerMismatch { .. }
            | Error::TurnMismatch(_)
            | Error::UnknownTurnStatus { .. }
            | Error::TurnTooLarge { .. } => true,
            _ => false,
        }
    }

    /// The server's `Retry-After` on an error answer, when it sent one (as
    /// sent; the client's own retries clamp it to their `max_delay`).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Api(e) => e.retry_after,
            _ => None,
        }
    }

    /// Whether the server refused the call for its rate limit (429).
    ///
    /// The client has already retried it as its
    /// [`RetryPolicy`](crate::RetryPolicy) allows; [`Error::retry_after`]
    /// and [`Error::rate_limits`] say when to try again.
    pub fn is_rate_limited(&self) -> bool {
        matches!(self, Error::Api(e) if e.status == 429)
    }

    /// The `x-ratelimit-*` headers of the error answer (empty when the
    /// server sent none, or did not answer).
    pub fn rate_limits(&self) -> &RateLimits {
        static NONE: RateLimits = RateLimits(Vec::new());
        match self {
            Error::Api(e) => &e.rate_limits,
            _ => &NONE,
        }
    }

    /// The query turn this error is about, when it is known: a failed or
    /// cancelled turn, a broken stream or replay, or an error answer to a
    /// call about one turn (its events, its stored state). Attach to it or
    /// read it (`client.queries().get(id)`) rather than ask again.
    pub fn query_id(&self) -> Option<&str> {
        match self {
            Error::Api(e) => e.query_id.as_deref(),
            Error::TurnFailed { query_id, .. }
            | Error::TurnCancelled { query_id, .. }
            | Error::ReplayGap { query_id, .. }
            | Error::UnknownTurnStatus { query_id, .. }
            | Error::AnswerMismatch { query_id, .. } => Some(query_id),
            Error::TurnMismatch(m) => Some(&m.query_id),
            Error::SessionBusy { query_id } => Some(query_id.as_str()).filter(|q| !q.is_empty()),
            Error::Stream { query_id, .. }
            | Error::Timeout { query_id, .. }
            | Error::TurnTooLarge { query_id, .. } => query_id.as_deref(),
            Error::Decode(d) => d.query_id.as_deref(),
            _ => None,
        }
    }

    /// Whether the failed request may have reached the server: anything but
    /// a transport failure the transport judged to be before sending (see
    /// `transport::may_have_reached_server`).
    pub(crate) fn may_have_reached_server(&self) -> bool {
        !matches!(self, Error::Transport { connect: true, .. })
    }

    /// Names the query turn an error was about (an error answer, a
    /// timeout, a broken stream, a bound passed); no-op for other errors
    /// and for one that names a turn already.
    pub(crate) fn for_query(mut self, id: &str) -> Self {
        if id.is_empty() {
            return self;
        }
        let slot = match &mut self {
            Error::Api(e) => &mut e.query_id,
            Error::Timeout { query_id, .. }
            | Error::Stream { query_id, .. }
            | Error::TurnTooLarge { query_id, .. } => query_id,
            Error::Decode(d) => &mut d.query_id,
            _ => return self,
        };
        if slot.is_none() {
            *slot = Some(id.to_owned());
        }
        self
    }

    /// [`Error::for_query`], and for an error that cannot name a turn (a
    /// transport failure, an undecodable answer) while reading the turn
    /// `id`: an [`Error::Stream`] that names it and says why. An error
    /// about a turn always carries its id.
    pub(crate) fn about_query(self, id: &str) -> Self {
        let e = self.for_query(id);
        if id.is_empty() || e.query_id().is_some() {
            return e;
        }
        match e {
            e @ (Error::InvalidRequest(_)
            | Error::SessionBusy { .. }
            | Error::UnsupportedApiVersion(_)
            | Error::Unauthorized { .. }
            | Error::Redirect { .. }) => e,
            e => Error::Stream {
                query_id: Some(id.to_owned()),
                message: chain(&e),
            },
        }
    }

    /// A deadline that passed after `elapsed`, about `query_id` when known.
    pub(crate) fn timeout(
        operation: &'static str,
        elapsed: std::time::Duration,
        query_id: Option<&str>,
    ) -> Self {
        Error::Timeout {
            operation,
            elapsed_ms: millis(elapsed),
            query_id: query_id.filter(|q| !q.is_empty()).map(str::to_owned),
        }
    }

    pub(crate) fn api(
        operation: &'static str,
        status: u16,
        code: Option<String>,
        message: String,
        request_id: Option<String>,
        raw_body: Option<String>,
    ) -> Self {
        Error::Api(Box::new(ApiError {
            operation,
            status,
            code,
            message,
            request_id,
            raw_body,
            query_id: None,
            retry_after: None,
            rate_limits: RateLimits::default(),
        }))
    }

    pub(crate) fn transport(
        operation: &'static str,
        source: impl Into<BoxError>,
        connect: bool,
    ) -> Self {
        Error::Transport {
            operation,
            connect,
            source: source.into(),
        }
    }

    pub(crate) fn decode(operation: &'static str, message: impl fmt::Display, body: &[u8]) -> Self {
        Error::Decode(Box::new(DecodeFailure {
            operation,
            query_id: None,
            message: message.to_string(),
            snippet: snippet(body),
        }))
    }
}

/// Whether an HTTP status is worth retrying (for a request that may be repeated).
pub(crate) fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 500..=599)
}

/// Whole milliseconds, saturating.
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether an error answer to `e.operation` may come after the turn
/// started: a turn start answered 408 or 5xx, but not a 503 with
/// `Retry-After` (taken to mean nothing started).
fn api_may_have_started(e: &ApiError) -> bool {
    starts_turn(e.operation)
        && (e.status == 408 || e.status >= 500)
        && !(e.status == 503 && e.retry_after.is_some())
}

/// What an error's text adds when the turn may have started, so that every
/// log line and CLI says it without matching on the error.
fn started_note(may_have_started: bool) -> &'static str {
    if may_have_started {
        " (the turn may have started: attach to it or look at the session before asking again)"
    } else {
        ""
    }
}

/// Whether the operation starts a query turn when the server receives it
/// (the one table, [`crate::api::operations`]).
pub(crate) fn starts_turn(operation: &str) -> bool {
    crate::operations::starts_turn(operation)
}

/// The first [`SNIPPET_LIMIT`] bytes of a body, lossily decoded, cut on a char boundary.
pub(crate) fn snippet(body: &[u8]) -> String {
    let cut = &body[..body.len().min(SNIPPET_LIMIT)];
    String::from_utf8_lossy(cut).into_owned()
}

#[cfg(test)]
mod tests;
