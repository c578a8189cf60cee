//! [`TurnBuilder`]: one turn of a [`Session`] before it runs, with the
//! per-turn controls and three ways to run it.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;
use tracing::Instrument;

use super::background::QueryHandle;
use super::fetch::content_encoding;
use super::session::{Session, Start, WhenBusy};
use super::slot::TurnSlot;
use super::span::TurnSpan;
use super::stream::{
    EventConnection, MAX_QUERY_BODY_BYTES, StreamConfig, TurnBinding, expect_event_stream,
};
use super::turn::QueryTurn;
use crate::client::Poller;
use crate::error::{Error, Result};
use crate::status::{ThinkingLevel, Workflow};
use crate::types;

/// The most seconds a turn may run (the service's cap); `timeout_seconds` may only lower it.
pub const MAX_TURN_SECONDS: i64 = 900;

/// One turn of a [`Session`], before it runs. Get one from [`Session::ask`].
///
/// Setters never fail; the terminal methods check the request before
/// sending. Streaming and background are separate terminal methods, so a
/// request that asks for both cannot be written.
#[must_use]
pub struct TurnBuilder {
    session: Session,
    request: types::QueryRequest,
    stream_config: StreamConfig,
    when_busy: WhenBusy,
    /// What the turn must be, fixed when its request is prepared.
    binding: TurnBinding,
}

impl fmt::Debug for TurnBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnBuilder")
            .field("session", &self.session)
            .field("stream_config", &self.stream_config)
            .field("when_busy", &self.when_busy)
            .finish_non_exhaustive()
    }
}

fn empty_request(ask: String) -> types::QueryRequest {
    types::QueryRequest {
        artifacts_only: None,
        ask,
        background: None,
        chunks_only: None,
        comparison_group: None,
        compose: None,
        guardrails: None,
        max_retrieved: None,
        max_retrieved_chars: None,
        max_steps: None,
        model: None,
        models: Vec::new(),
        pointers_only: None,
        previous_query_id: None,
        retrieval_only: None,
        scope: Vec::new(),
        session_id: None,
        shape: serde_json::Map::new(),
        stream: None,
        system_prompt: None,
        thinking_level: None,
        timeout_seconds: None,
        tools: Vec::new(),
        workflow: None,
    }
}

/// Fills in the part of `request` that a new session's first turn takes
/// from its session: scope and configuration.
fn fill_new_session(request: &mut types::QueryRequest, start: Start) {
    request.scope = start.scope;
    request.system_prompt = start.config.system_prompt;
    request.guardrails = start.config.guardrails;
    request.model = start.config.model;
    request.models = start.config.models;
    request.tools = start.config.tools;
}

impl TurnBuilder {
    pub(crate) fn new(session: Session, ask: String) -> Self {
        let when_busy = session.when_busy.clone();
        TurnBuilder {
            session,
            request: empty_request(ask),
            stream_config: StreamConfig::default(),
            when_busy,
            binding: TurnBinding::default(),
        }
    }

    /// The workflow to run (the request's `workflow`: [`Workflow::Search`],
    /// [`Workflow::SearchCc`] or [`Workflow::SearchRag`] in 2026-07; a name
    /// as `&str` works too); left out, the server picks.
    ///
    /// ```no_run
    /// # async fn run(session: nexus_knowql::Session) -> nexus_knowql::Result<()> {
    /// use nexus_knowql::{ThinkingLevel, Workflow};
    /// let query = session
    ///     .ask("Who approves travel?")
    ///     .workflow(Workflow::SearchRag)
    ///     .thinking_level(ThinkingLevel::Low)
    ///     .send()
    ///     .await?;
    /// # drop(query); Ok(()) }
    /// ```
    pub fn workflow(mut self, workflow: impl Into<Workflow>) -> Self {
        self.request.workflow = Some(workflow.into());
        self
    }

    /// A JSON shape for the answer: the turn then fills `output_json`
    /// (read it with [`types::Query::json`], or decode it with a
    /// `typed::TypedTurn` when feature `schema` is on).
    pub fn shape(mut self, shape: serde_json::Map<String, serde_json::Value>) -> Self {
        self.request.shape = shape;
        self
    }

    /// The most reasoning steps.
    pub fn max_steps(mut self, n: i64) -> Self {
        self.request.max_steps = Some(n);
        self
    }

    /// How much the model thinks ([`ThinkingLevel`], or its name as `&str`).
    pub fn thinking_level(mut self, level: impl Into<ThinkingLevel>) -> Self {
        self.request.thinking_level = Some(level.into());
        self
    }

    /// Whether to compose a prose answer.
    pub fn compose(mut self, compose: bool) -> Self {
        self.request.compose = Some(compose);
        self
    }

    /// Retrieve only, no answer: the hits go to `output_json`.
    pub fn retrieval_only(mut self, on: bool) -> Self {
        self.request.retrieval_only = Some(on);
        self
    }

    /// Return pointers to sources only.
    pub fn pointers_only(mut self, on: bool) -> Self {
        self.request.pointers_only = Some(on);
        self
    }

    /// Return chunks only.
    pub fn chunks_only(mut self, on: bool) -> Self {
        self.request.chunks_only = Some(on);
        self
    }

    /// Return artifacts only.
    pub fn artifacts_only(mut self, on: bool) -> Self {
        self.request.artifacts_only = Some(on);
        self
    }

    /// The most hits retrieved.
    pub fn max_retrieved(mut self, n: i64) -> Self {
        self.request.max_retrieved = Some(n);
        self
    }

    /// The most characters retrieved.
    pub fn max_retrieved_chars(mut self, n: i64) -> Self {
        self.request.max_retrieved_chars = Some(n);
        self
    }

    /// A time limit in seconds; it may only lower the service's 900 s cap.
    pub fn timeout_seconds(mut self, seconds: i64) -> Self {
        self.request.timeout_seconds = Some(seconds);
        self
    }

    /// Groups turns run as a comparison.
    pub fn comparison_group(mut self, group: impl Into<String>) -> Self {
        self.request.comparison_group = Some(group.into());
        self
    }

    /// The one bound on this turn, in place of the client's
    /// [`turn_timeout`](crate::ClientBuilder::turn_timeout) (default 930 s);
    /// `None` for no limit. `send()` and `stream()` end by it, counted from
    /// the call; so do `background()`'s start and the handle's
    /// [`QueryHandle::wait`] and streams, each counted from its own call.
    /// When it passes, the call fails with [`Error::Timeout`]; the turn is
    /// not cancelled.
    ///
    /// ```no_run
    /// # async fn run(session: nexus_knowql::Session) -> nexus_knowql::Result<()> {
    /// use std::time::Duration;
    /// let query = session
    ///     .ask("Who approves travel?")
    ///     .turn_timeout(Duration::from_secs(120))
    ///     .send()
    ///     .await?;
    /// # drop(query); Ok(()) }
    /// ```
    pub fn turn_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        let options = crate::CallOptions::new().turn_timeout(timeout);
        self.session.client = self.session.client.with_options(options);
        self
    }

    /// How the turn's events are read and reconnected (idle timeout, frame
    /// limit, reconnect budget, cancel on drop); used by
    /// [`TurnBuilder::stream`], [`TurnBuilder::send`] and the handle of
    /// [`TurnBuilder::background`].
    pub fn stream_config(mut self, config: StreamConfig) -> Self {
        self.stream_config = config;
        self
    }

    /// What this turn does while an earlier turn of the session still runs
    /// (default: the session's, see [`SessionBuilder::when_busy`](crate::SessionBuilder::when_busy)).
    pub fn when_busy(mut self, when_busy: WhenBusy) -> Self {
        self.when_busy = when_busy;
        self
    }

    /// When the turn timeout of a turn started at `started` passes, if it
    /// is bounded.
    fn deadline(&self, started: Instant) -> Option<Instant> {
        let limit = self.session.client.transport().turn_timeout()?;
        started.checked_add(limit)
    }

    /// How long a turn started at `started` may still wait for its busy
    /// session ([`WhenBusy::Wait`]): the wait counts against the turn
    /// timeout, and keeps a quarter of what is left (up to 5 s) for the
    /// last try, so that a wait that runs out ends as
    /// [`Error::SessionBusy`], not as a timeout in the middle of that try.
    fn busy_wait_limit(&self, started: Instant) -> Duration {
        let left = self.deadline(started).map_or(Duration::MAX, |at| {
            at.saturating_duration_since(Instant::now())
        });
        left.saturating_sub((left / 4).min(Duration::from_secs(5)))
    }

    /// Checks the request before anything is sent.
    fn check(&self) -> Result<()> {
        if self.request.ask.trim().is_empty() {
            return Err(Error::InvalidRequest("the question is empty".into()));
        }
        if let Some(t) = self.request.timeout_seconds
            && !(1..=MAX_TURN_SECONDS).contains(&t)
        {
            return Err(Error::InvalidRequest(format!(
                "timeout_seconds must be 1 to {MAX_TURN_SECONDS}, got {t}"
            )));
        }
        Ok(())
    }

    /// Whether this turn starts a new session (its session has no id, no
    /// earlier turn and continues none).
    pub(crate) fn starts_session(&self) -> bool {
        let start = self.session.shared.lock();
        start.session_id.is_none()
            && start.previous_query_id.is_none()
            && start.last_query_id.is_none()
    }

    /// The client the turn is sent with.
    pub(crate) fn client(&self) -> &crate::Client {
        &self.session.client
    }

    /// Takes the session's slot and fills in the session's part of the request.
    async fn prepare(&mut self, span: &TurnSpan, started: Instant) -> Result<TurnSlot> {
        let wait_limit = self.busy_wait_limit(started);
        let slot = TurnSlot::acquire(&self.session, &self.when_busy, wait_limit).await?;
        let start = self.session.shared.lock().clone();
        span.learn(None, start.session_id.as_deref());
        let r = &mut self.request;
        // The turn before this one: the session's last (when this process
        // knows it), the one it continues, or none for a new session.
        let previous = match (&start.session_id, &start.previous_query_id) {
            (Some(_), _) => start.last_query_id.as_deref().map(Some),
            (None, Some(prev)) => Some(Some(prev.as_str())),
            (None, None) => Some(None),
        };
        self.binding = TurnBinding::for_request(&r.ask, start.session_id.as_deref(), previous);
        if let Some(id) = start.session_id {
            r.session_id = Some(id);
        } else if let Some(prev) = start.previous_query_id {
            r.previous_query_id = Some(prev);
        } else {
            fill_new_session(r, start);
        }
        Ok(slot)
    }

    /// The request this turn sends when it starts a new session: what
    /// `POST /query` will carry, the session's part filled in.
    pub(crate) fn new_session_request(&self) -> types::QueryRequest {
        let mut request = self.request.clone();
        fill_new_session(&mut request, self.session.shared.lock().clone());
        request
    }

    fn post(&self, event_stream: bool) -> reqwest::RequestBuilder {
        let accept = if event_stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        self.session
            .client
            .request(reqwest::Method::POST, "/query")
            .header(reqwest::header::ACCEPT, accept)
            .json(&self.request)
    }

    /// Sends `POST /query` once the session is free. A 409 because a turn
    /// of the session still runs (started elsewhere) becomes
    /// [`Error::SessionBusy`], or a wait and one more try.
    async fn post_turn(
        &mut self,
        event_stream: bool,
        span: &TurnSpan,
        started: Instant,
    ) -> Result<(TurnSlot, reqwest::Response)> {
        self.check()?;
        let mut poller: Option<Poller> = None;
        loop {
            let slot = self.prepare(span, started).await?;
            let client = self.session.client.clone();
            let sent = if event_stream {
                client.send_stream("create_query", self.post(true)).await
            } else {
                client.send("create_query", self.post(false)).await
            };
            let err = match sent {
                Ok(resp) => return Ok((slot, resp)),
                Err(e) => e,
            };
            if err.may_have_started() || (err.status().is_none() && err.may_have_reached_server()) {
                // The request may have reached the server: keep the turn
                // remembered (dropping the slot) so the next one checks.
                drop(slot);
                return Err(err);
            }
            if !err.is_conflict() {
                slot.release();
                return Err(err);
            }
            let Some(query_id) = self.running_turn(&err).await else {
                // A 409 for another reason (a context not curated, a
                // preview cap): the server's answer as it is.
                slot.release();
                return Err(err);
            };
            tracing::debug!(query_id, "the session runs another turn (409)");
            slot.adopt(&query_id);
            drop(slot);
            let WhenBusy::Wait(wait) = &self.when_busy else {
                return Err(Error::SessionBusy { query_id });
            };
            let for_waiting = self.busy_wait_limit(started);
            if !poller
                .get_or_insert_with(|| Poller::with_timeout(wait, for_waiting))
                .pause()
                .await
            {
                return Err(Error::SessionBusy { query_id });
            }
        }
    }

    /// The running turn of the session this turn continues, when the 409
    /// `err` is about one: per the server's stored session, else (when the
    /// server's code or message says a turn is in flight) the unfinished
    /// turn this process knows of. `None`: the 409 is about something else.
    async fn running_turn(&self, err: &Error) -> Option<String> {
        if self.request.session_id.is_none() && self.request.previous_query_id.is_none() {
            // A new session: its 409 is about something else.
            return None;
        }
        let from_server = async {
            let queries = self.session.client.queries();
            let session_id = match (&self.request.session_id, &self.request.previous_query_id) {
                (Some(s), _) => s.clone(),
                (None, Some(prev)) => queries.get(prev).await.ok()?.session_id,
                (None, None) => return None,
            };
            let session = self.session.client.sessions().get(&session_id).await.ok()?;
            session
                .queries
                .iter()
                .rev()
                .find(|q| !q.is_terminal())
                .map(|q| q.id.clone())
        };
        match from_server.await {
            Some(id) => Some(id),
            None if says_in_flight(err) => self
                .session
                .unfinished_query_id()
                .or_else(|| self.session.last_query_id()),
            None => None,
        }
    }

    /// Runs the turn to its end and returns the stored Query.
    ///
    /// The turn runs on the streaming path (a synchronous request could be
    /// cut by a proxy during a long turn): a connection cut after the
    /// server named the turn reconnects with `Last-Event-ID`, and if the
    /// events cannot be had any more, the stored Query is polled with
    /// `GET /queries/{id}`. `POST /query` is never sent twice, so a cut
    /// neither loses the answer nor starts a second turn. The bounds and
    /// checks of [`TurnBuilder::stream`] hold here too: a text past
    /// [`StreamConfig::max_text_bytes`], a text that is not the answer, a
    /// replay that cannot be trusted or another turn's answer is the
    /// outcome, never hidden by a poll. A server that
    /// answers with the Query document instead of an event stream is
    /// accepted as well.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a request rejected before sending;
    /// [`Error::SessionBusy`] while an earlier turn of the session runs;
    /// [`Error::TurnFailed`] / [`Error::TurnCancelled`] when the turn ended
    /// so; [`Error::Stream`] when the connection broke before the server
    /// named the turn; [`Error::Timeout`] after the client's
    /// [`turn_timeout`](crate::ClientBuilder::turn_timeout) (the turn is not
    /// cancelled; the session remembers it); any error of the calls.
    pub async fn send(self) -> Result<types::Query> {
        let span = TurnSpan::new("send");
        let outer = span.span();
        let limit = self.session.client.transport().turn_timeout();
        let session = self.session.clone();
        let started = Instant::now();
        let run = async move {
            // The streaming path with its bounds and checks; only a
            // connection that broke beyond reconnecting falls back to polling.
            let turn = self.open(span, started).await?;
            finish_or_poll(turn).await
        }
        .instrument(outer);
        // The turn this send() started, once the server named it: the
        // session's unfinished turn, or (seen to end) its newest one.
        let before = session.last_query_id();
        let this_turn = || {
            session.unfinished_query_id().or_else(|| {
                session
                    .last_query_id()
                    .filter(|id| Some(id) != before.as_ref())
            })
        };
        let named = |e: Error| match this_turn() {
            Some(id) => e.about_query(&id),
            None => e,
        };
        match limit {
            None => run.await.map_err(named),
            // Dropped at the deadline, the turn stays remembered by the session.
            Some(limit) => match tokio::time::timeout(limit, run).await {
                Ok(result) => result.map_err(named),
                Err(_) => Err(Error::timeout(
                    "create_query",
                    limit,
                    this_turn().as_deref(),
                )),
            },
        }
    }

    /// Runs the turn as a stream of events.
    ///
    /// Returns once the server accepted the turn (the response headers
    /// arrived); the events follow through the [`QueryTurn`].
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] as for [`TurnBuilder::send`];
    /// [`Error::SessionBusy`] while an earlier turn of the session runs;
    /// any error answer to `POST /query`; [`Error::Timeout`] when the
    /// response headers do not come within the client's header timeout (the
    /// request is not sent again: the server may already run the turn), or
    /// when a JSON answer's body does not arrive within the client's
    /// [`turn_timeout`](crate::ClientBuilder::turn_timeout), which counts
    /// from here and bounds the whole turn, reconnects and the reading of
    /// the stored turn included, or stops
    /// moving for [`StreamConfig::idle_timeout`]; [`Error::TurnMismatch`]
    /// when the answer is about another session than the one this turn
    /// continues; [`Error::Decode`] (the turn may have started) for an
    /// answer that cannot be read.
    pub async fn stream(self) -> Result<QueryTurn> {
        let span = TurnSpan::new("stream");
        let outer = span.span();
        let started = Instant::now();
        self.open(span, started).instrument(outer).await
    }

    /// Sends `POST /query` for a streamed turn and wraps the answer (an
    /// event stream, or the Query document) in a [`QueryTurn`] whose
    /// deadline counts from `started`.
    async fn open(mut self, span: TurnSpan, started: Instant) -> Result<QueryTurn> {
        self.request.stream = Some(true);
        let (slot, resp) = self.post_turn(true, &span, started).await?;
        let client = self.session.client.clone();
        // What the turn must be: every answer about it is checked against it.
        let mut binding = self.binding.clone();
        if is_json(&resp) {
            // The Query document instead of an event stream: the turn is
            // named, so it is followed by its id.
            let deadline = self.deadline(started);
            let idle = self.stream_config.idle_timeout;
            let query = decode_query_until("create_query", resp, started, deadline, idle).await?;
            if let Err(e) = binding.check_query(&query, "the answer to POST /query") {
                // The answer is about another turn: this one may run,
                // unnamed; the session checks it next time.
                drop(slot);
                return Err(e);
            }
            slot.learn(Some(&query.session_id), Some(&query.id));
            return Ok(QueryTurn::from_query(
                client,
                query,
                binding,
                slot,
                span,
                &self.stream_config,
                started,
            ));
        }
        let resp = expect_event_stream("create_query", None, resp)?;
        let session_id = binding.session_id().map(str::to_owned);
        let conn = EventConnection::new(client, self.stream_config.clone(), resp, binding)
            .started_at(started);
        let mut turn = QueryTurn::new(conn, Some(slot), span, &self.stream_config);
        if let Some(session_id) = &session_id {
            turn.set_session_id(session_id);
        }
        Ok(turn)
    }

    /// Starts the turn in the background (HTTP 202) and returns a handle to
    /// poll, wait for, stream or cancel it. Starting counts against the
    /// client's [`turn_timeout`](crate::ClientBuilder::turn_timeout): an
    /// answer that drips past it is [`Error::Timeout`] with the time really
    /// waited. [`QueryHandle::wait`] and the streams the handle opens are
    /// bounded by the same timeout, counted from each call.
    ///
    /// # Errors
    /// As for [`TurnBuilder::stream`].
    pub async fn background(mut self) -> Result<QueryHandle> {
        let span = TurnSpan::new("background");
        let outer = span.span();
        let started = Instant::now();
        async move {
            self.request.background = Some(true);
            let (slot, resp) = self.post_turn(false, &span, started).await?;
            // Starting the turn counts against its deadline.
            let deadline = self.deadline(started);
            let idle = self.stream_config.idle_timeout;
            let query = decode_query_until("create_query", resp, started, deadline, idle).await?;
            let mut binding = self.binding.clone();
            if let Err(e) = binding.check_query(&query, "the answer to POST /query") {
                drop(slot);
                return Err(e);
            }
            slot.learn(Some(&query.session_id), Some(&query.id));
            Ok(QueryHandle::new(
                self.session.client.clone(),
                query,
                binding,
                Some(slot),
                self.stream_config,
                span,
            ))
        }
        .instrument(outer)
        .await
    }
}

/// Whether a 409 says that a turn of the session is in flight.
fn says_in_flight(err: &Error) -> bool {
    let Some(api) = err.as_api() else {
        return false;
    };
    let code = api.code.as_deref().unwrap_or_default();
    let message = api.message.to_ascii_lowercase();
    matches!(
        code,
        "session_busy" | "query_in_flight" | "turn_in_flight" | "in_flight"
    ) || ["in flight", "in-flight", "already running", "still running"]
        .iter()
        .any(|m| message.contains(m))
}

/// Whether an answer is a JSON document (not an event stream).
fn is_json(resp: &reqwest::Response) -> bool {
    crate::transport::media::content_type_is(resp.headers(), "application/json")
}

/// [`decode_query`] that gives up at `deadline` (when there is one) with
/// [`Error::Timeout`], naming the time since `started`: a body that
/// stalls never holds the turn past it.
pub(crate) async fn decode_query_until(
    operation: &'static str,
    resp: reqwest::Response,
    started: Instant,
    deadline: Option<Instant>,
    idle: Option<std::time::Duration>,
) -> Result<types::Query> {
    let Some(at) = deadline else {
        return decode_query(operation, resp, idle).await;
    };
    match tokio::time::timeout_at(at, decode_query(operation, resp, idle)).await {
        Ok(decoded) => decoded,
        Err(_) => Err(Error::timeout(operation, started.elapsed(), None)),
    }
}

/// Reads and decodes a Query body, bounded by bytes and, when `idle` is
/// set, by the time between two chunks: a body that stops moving is a dead
/// connection, whatever its type. A body sent with a `Content-Encoding`
/// (gzip, deflate...) is refused by name: this client does not decode it.
pub(crate) async fn decode_query(
    operation: &'static str,
    resp: reqwest::Response,
    idle: Option<std::time::Duration>,
) -> Result<types::Query> {
    if let Some(encoding) = content_encoding(&resp) {
        let message = format!(
            "the body is sent with Content-Encoding {encoding:?}, which this client does not decode"
        );
        return Err(Error::decode(operation, message, &[]));
    }
    let mut body = Vec::new();
    let mut resp = resp;
    let started = Instant::now();
    loop {
        let next = match idle {
            Some(idle) => match tokio::time::timeout(idle, resp.chunk()).await {
                Ok(next) => next,
                Err(_) => {
                    tracing::warn!(
                        operation,
                        idle_ms = crate::error::millis(idle),
                        "the body stopped moving"
                    );
                    let query_id = id_of_partial(&body);
                    return Err(Error::timeout(
                        operation,
                        started.elapsed(),
                        query_id.as_deref(),
                    ));
                }
            },
            None => resp.chunk().await,
        };
        let Some(chunk) = next.map_err(|e| crate::transport::map_reqwest(operation, e, None))?
        else {
            break;
        };
        if body.len().saturating_add(chunk.len()) > MAX_QUERY_BODY_BYTES {
            return Err(Error::ResponseTooLarge {
                operation,
                limit: u64::try_from(MAX_QUERY_BODY_BYTES).unwrap_or(u64::MAX),
            });
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|e| {
        let mut err = Error::decode(operation, e, &body);
        if let Some(id) = id_of_partial(&body) {
            err = err.for_query(&id);
        }
        err
    })
}

/// The turn id a Query body names, read leniently (the body may be cut or
/// malformed): the string value of the top-level `"id"` key, searched in
/// the first [`SNIFF_BYTES`] bytes.
fn id_of_partial(body: &[u8]) -> Option<String> {
    let body = &body[..body.len().min(SNIFF_BYTES)];
    let mut depth = 0u32;
    let mut i = 0;
    // The last string read at the top level, when it may be a key.
    let mut key: Option<(usize, usize)> = None;
    while i < body.len() {
        match body[i] {
            b'{' | b'[' => {
                depth = depth.saturating_add(1);
                key = None;
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                key = None;
            }
            b'"' => {
                let end = string_end(body, i + 1)?;
                if depth == 1 {
                    if let Some((k0, k1)) = key.take()
                        && &body[k0..k1] == b"id"
                    {
                        let value = std::str::from_utf8(&body[i + 1..end]).ok()?;
                        let ok = !value.is_empty() && value.len() <= 256 && !value.contains('\\');
                        return ok.then(|| value.to_owned());
                    }
                    key = Some((i + 1, end));
                }
                i = end;
            }
            b':' => {}
            b',' => key = None,
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index of the quote that ends the JSON string starting at `from`.
fn string_end(body: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < body.len() {
        match body[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// How much of a malformed body is searched for its id.
const SNIFF_BYTES: usize = 64 * 1024;

impl Session {
    /// Starts a turn: set per-turn controls on the builder, then run it with
    /// `send()`, `stream()` or `background()`.
    pub fn ask(&self, text: impl Into<String>) -> TurnBuilder {
        TurnBuilder::new(self.clone(), text.into())
    }
}

/// [`QueryTurn::finish`], falling back to the stored Query only when the
/// connection broke beyond reconnecting after the server named the turn. A
/// bound passed, a text that is not the answer, a replay gap, another
/// turn's answer or the deadline are the outcome, never hidden by a poll;
/// the stored Query is checked like the stream's final frame.
async fn finish_or_poll(mut turn: QueryTurn) -> Result<types::Query> {
    let span = turn.turn_span().span();
    let mut first_error = None;
    while let Some(item) = turn.next().instrument(span.clone()).await {
        if let Err(e) = item {
            first_error.get_or_insert(e);
        }
    }
    match first_error {
        Some(Error::Stream { .. }) if turn.query_id().is_some() => {
            tracing::debug!(parent: &span, "the events broke off; reading the stored turn");
            turn.read_stored().instrument(span).await
        }
        Some(e) => Err(e),
        None => turn.finish().await,
    }
}
