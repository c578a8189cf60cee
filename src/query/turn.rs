//! One turn: [`TurnBuilder`] (per-turn controls, three ways to run) and
//! [`QueryTurn`] (a live streaming turn that accumulates as it goes).

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use backoff::backoff::Backoff;
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::background::QueryHandle;
use super::checkpoint::{Checkpoint, END_OF_TURN};
use super::event::QueryEvent;
use super::session::{Session, TurnSlot, WhenBusy};
use super::stream::{
    Delivery, EventConnection, MAX_QUERY_BODY_BYTES, ReplayGap, StreamConfig, expect_event_stream,
    stored_terminal,
};
use crate::error::{Error, Result};
use crate::types;

/// The `tracing` span of one turn, `query_turn`, with the fields `mode`
/// (`send`, `stream`, `background` or `attach`), `query_id`, `session_id`
/// and `resumes` (recorded as they become known). Retries, resumes, replay
/// checks and version mismatches are events inside it.
#[derive(Debug, Clone)]
pub(crate) struct TurnSpan {
    span: tracing::Span,
    query_id_known: std::sync::Arc<std::sync::atomic::AtomicBool>,
    session_id_known: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl TurnSpan {
    pub(crate) fn new(mode: &'static str) -> Self {
        TurnSpan {
            span: tracing::info_span!(
                "query_turn",
                mode,
                query_id = tracing::field::Empty,
                session_id = tracing::field::Empty,
                resumes = tracing::field::Empty,
            ),
            query_id_known: Default::default(),
            session_id_known: Default::default(),
        }
    }

    /// Records the ids the first time they are known.
    pub(crate) fn learn(&self, query_id: Option<&str>, session_id: Option<&str>) {
        use std::sync::atomic::Ordering;
        if let Some(q) = query_id.filter(|q| !q.is_empty())
            && !self.query_id_known.swap(true, Ordering::Relaxed)
        {
            self.span.record("query_id", q);
        }
        if let Some(s) = session_id.filter(|s| !s.is_empty())
            && !self.session_id_known.swap(true, Ordering::Relaxed)
        {
            self.span.record("session_id", s);
        }
    }

    pub(crate) fn record_resumes(&self, resumes: u32) {
        self.span.record("resumes", resumes);
    }

    pub(crate) fn span(&self) -> tracing::Span {
        self.span.clone()
    }

    pub(crate) fn enter(&self) -> tracing::span::Entered<'_> {
        self.span.enter()
    }
}

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

impl TurnBuilder {
    pub(crate) fn new(session: Session, ask: String) -> Self {
        let when_busy = session.when_busy.clone();
        TurnBuilder {
            session,
            request: empty_request(ask),
            stream_config: StreamConfig::default(),
            when_busy,
        }
    }

    /// The workflow to run (for example `auto`).
    pub fn workflow(mut self, workflow: impl Into<String>) -> Self {
        self.request.workflow = Some(workflow.into());
        self
    }

    /// A JSON shape for the answer: the turn then fills `output_json`
    /// (read it with [`QueryTurn::json`] or [`types::Query::json`]).
    pub fn shape(mut self, shape: serde_json::Map<String, serde_json::Value>) -> Self {
        self.request.shape = shape;
        self
    }

    /// The most reasoning steps.
    pub fn max_steps(mut self, n: i64) -> Self {
        self.request.max_steps = Some(n);
        self
    }

    /// How much the model thinks (for example `low`, `high`).
    pub fn thinking_level(mut self, level: impl Into<String>) -> Self {
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

    /// How the turn's events are read and resumed (idle timeout, frame
    /// limit, resume budget, cancel on drop); used by
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

    /// Takes the session's slot and fills in the session's part of the request.
    async fn prepare(&mut self, span: &TurnSpan) -> Result<TurnSlot> {
        let slot = TurnSlot::acquire(&self.session, &self.when_busy).await?;
        let start = self.session.shared.lock().clone();
        span.learn(None, start.session_id.as_deref());
        let r = &mut self.request;
        if let Some(id) = start.session_id {
            r.session_id = Some(id);
        } else if let Some(prev) = start.previous_query_id {
            r.previous_query_id = Some(prev);
        } else {
            r.scope = start.scope;
            r.system_prompt = start.config.system_prompt;
            r.guardrails = start.config.guardrails;
            r.model = start.config.model;
            r.models = start.config.models;
            r.tools = start.config.tools;
        }
        Ok(slot)
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
    ) -> Result<(TurnSlot, reqwest::Response)> {
        self.check()?;
        let started = tokio::time::Instant::now();
        let mut intervals: Option<backoff::ExponentialBackoff> = None;
        loop {
            let slot = self.prepare(span).await?;
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
            if err.may_have_started()
                || (err.status().is_none()
                    && !matches!(err, Error::Transport { connect: true, .. }))
            {
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
            let intervals = intervals.get_or_insert_with(|| wait.intervals());
            let delay = intervals.next_backoff().unwrap_or(wait.max_interval);
            if started.elapsed().saturating_add(delay) > wait.timeout {
                return Err(Error::SessionBusy { query_id });
            }
            tokio::time::sleep(delay).await;
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
    /// server named the turn is resumed with `Last-Event-ID`, and if the
    /// events cannot be had any more, the stored Query is polled with
    /// `GET /queries/{id}`. `POST /query` is never sent twice, so a cut
    /// neither loses the answer nor starts a second turn. A server that
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
    pub async fn send(mut self) -> Result<types::Query> {
        let span = TurnSpan::new("send");
        let outer = span.span();
        let limit = self.session.client.transport().turn_timeout();
        let run = async move {
            self.request.stream = Some(true);
            let (slot, resp) = self.post_turn(true, &span).await?;
            let client = self.session.client.clone();
            if is_json(&resp) {
                // A synchronous answer (or a 202) after all.
                let query = decode_query("create_query", resp).await?;
                slot.learn(Some(&query.session_id), Some(&query.id));
                let mut handle =
                    QueryHandle::new(client, query, Some(slot), self.stream_config, span);
                if handle.last_seen().is_terminal() {
                    return into_outcome(handle.last_seen().clone());
                }
                return handle.wait().await;
            }
            let resp = expect_event_stream("create_query", None, resp)?;
            let conn = EventConnection::new(client, self.stream_config.clone(), resp, None);
            QueryTurn::new(conn, Some(slot), span, &self.stream_config)
                .finish_or_poll()
                .await
        }
        .instrument(outer);
        match limit {
            None => run.await,
            // Dropped at the deadline, the turn stays remembered by the session.
            Some(limit) => tokio::time::timeout(limit, run)
                .await
                .unwrap_or(Err(Error::Timeout {
                    operation: "create_query",
                    elapsed_ms: super::millis(limit),
                })),
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
    /// request is not sent again: the server may already run the turn).
    pub async fn stream(mut self) -> Result<QueryTurn> {
        let span = TurnSpan::new("stream");
        let outer = span.span();
        async move {
            self.request.stream = Some(true);
            let (slot, resp) = self.post_turn(true, &span).await?;
            let client = self.session.client.clone();
            if is_json(&resp) {
                // The Query document instead of an event stream: the turn
                // is named, so it is followed by its id.
                let query = decode_query("create_query", resp).await?;
                slot.learn(Some(&query.session_id), Some(&query.id));
                return Ok(QueryTurn::from_query(
                    client,
                    query,
                    slot,
                    span,
                    &self.stream_config,
                ));
            }
            let resp = expect_event_stream("create_query", None, resp)?;
            let conn = EventConnection::new(client, self.stream_config.clone(), resp, None);
            Ok(QueryTurn::new(conn, Some(slot), span, &self.stream_config))
        }
        .instrument(outer)
        .await
    }

    /// Starts the turn in the background (HTTP 202) and returns a handle to
    /// poll, wait for, stream or cancel it.
    ///
    /// # Errors
    /// As for [`TurnBuilder::stream`].
    pub async fn background(mut self) -> Result<QueryHandle> {
        let span = TurnSpan::new("background");
        let outer = span.span();
        async move {
            self.request.background = Some(true);
            let (slot, resp) = self.post_turn(false, &span).await?;
            let query = decode_query("create_query", resp).await?;
            slot.learn(Some(&query.session_id), Some(&query.id));
            Ok(QueryHandle::new(
                self.session.client.clone(),
                query,
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
    resp.headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

pub(crate) async fn decode_query(
    operation: &'static str,
    resp: reqwest::Response,
) -> Result<types::Query> {
    let mut body = Vec::new();
    let mut resp = resp;
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| crate::client::map_reqwest(operation, e, None))?
    {
        if body.len().saturating_add(chunk.len()) > MAX_QUERY_BODY_BYTES {
            return Err(Error::decode(operation, "the answer is too large", &body));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|e| Error::decode(operation, e, &body))
}

/// A final Query as a turn outcome: failed and cancelled turns are errors.
pub(crate) fn into_outcome(query: types::Query) -> Result<types::Query> {
    match query.status.as_str() {
        "failed" => Err(Error::TurnFailed {
            query_id: query.id,
            message: query.error.unwrap_or_default(),
        }),
        "cancelled" => Err(Error::TurnCancelled {
            query_id: query.id,
            message: query.error.unwrap_or_default(),
        }),
        _ => Ok(query),
    }
}

/// A live streaming turn: a [`Stream`] of [`QueryEvent`]s that accumulates
/// the answer as it goes.
///
/// Every event is delivered exactly once and in order, whatever the network
/// does: a broken or idle connection is resumed with `Last-Event-ID` (see
/// [`StreamConfig`]), and each resumed connection must replay from exactly
/// that id. When it does not (or the event log is gone), the rest of the
/// answer comes from the stored turn as one final text delta, or the stream
/// ends with [`Error::ReplayGap`]: the deltas never add up to a wrong text.
/// A failed or cancelled turn yields
/// [`Error::TurnFailed`] / [`Error::TurnCancelled`] after the events before
/// it; the stream then ends with the final [`QueryEvent::Query`].
///
/// Dropping a `QueryTurn` closes the connection; the turn goes on on the
/// server, and its session remembers it (see [`Session`]).
/// [`QueryTurn::cancel`] also stops it there, [`QueryTurn::detach`] keeps a
/// [`QueryHandle`] to it, and with [`StreamConfig::cancel_on_drop`] a drop
/// before the end cancels it on the server.
///
/// ```no_run
/// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
/// use futures::StreamExt;
/// use nexus_knowql::QueryEvent;
/// let session = client.session(["handbook"]).build()?;
/// let mut turn = session.ask("Summarize the travel policy").stream().await?;
/// while let Some(event) = turn.next().await {
///     if let QueryEvent::TextDelta { delta } = event? {
///         print!("{delta}");
///     }
/// }
/// let query = turn.finish().await?;
/// println!("\n{} citations", query.citations.len());
/// # Ok(()) }
/// ```
///
/// # Cancel safety
/// Polling `next()` inside `select!` is cancel safe: an event is taken from
/// the connection only when it is returned.
pub struct QueryTurn {
    conn: EventConnection,
    slot: Option<TurnSlot>,
    acc: Accumulated,
    /// Events made up from the stored turn after a broken replay, to deliver
    /// before the stream ends.
    pending: VecDeque<QueryEvent>,
    /// A replay gap the stored turn did not make up for: the turn's outcome
    /// even after the error was yielded.
    gap: Option<(ReplayGap, String)>,
    ended: bool,
    span: TurnSpan,
    stream_config: StreamConfig,
    /// Whether a drop before the end cancels the turn on the server.
    cancel_on_drop: bool,
    /// Continues after a checkpoint (see [`QueryHandle::events_after`]).
    after_checkpoint: bool,
    /// The bytes of answer text delivered before the checkpoint, when known.
    prefix_len: Option<usize>,
    /// The delivered text did not match the final answer: the turn's outcome
    /// even after the error was yielded.
    mismatch: Option<Mismatch>,
    /// The status the terminal event reported (`completed`, `failed`, `cancelled`).
    terminal_status: Option<&'static str>,
    /// Text came from the final Query rather than from events: every event
    /// of the turn counts as delivered.
    reconciled: bool,
}

/// Where the delivered text and the final answer part.
#[derive(Debug, Clone)]
struct Mismatch {
    query_id: String,
    delivered_len: usize,
    final_len: usize,
    first_difference: usize,
}

impl Mismatch {
    fn to_error(&self) -> Error {
        let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
        Error::AnswerMismatch {
            query_id: self.query_id.clone(),
            delivered_len: n(self.delivered_len),
            final_len: n(self.final_len),
            first_difference: n(self.first_difference),
        }
    }

    fn detail(&self) -> String {
        format!(
            "the final answer ({} bytes) does not continue the {} bytes already delivered \
             (they first differ at byte {})",
            self.final_len, self.delivered_len, self.first_difference
        )
    }
}

/// The length of the common prefix of two strings, in bytes.
fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// What a turn has delivered so far.
#[derive(Debug, Default)]
struct Accumulated {
    session_id: Option<String>,
    text: String,
    steps: Vec<types::QueryStep>,
    rollup: Option<types::QueryRollup>,
    synthesis: Option<types::QuerySynthesis>,
    trace_ref: Option<String>,
    usage: Option<types::QueryUsage>,
    query: Option<types::Query>,
}

impl Accumulated {
    fn apply(&mut self, event: &QueryEvent) {
        match event {
            QueryEvent::TextDelta { delta } => self.text.push_str(delta),
            QueryEvent::Created {
                session_id: Some(session_id),
                ..
            } => self.session_id = Some(session_id.clone()),
            QueryEvent::Step(step) => {
                self.note_tokens(step.cum_input_tokens, step.cum_output_tokens);
                merge_step(&mut self.steps, step);
            }
            QueryEvent::TurnRollup(r) => self.rollup = Some(r.clone()),
            QueryEvent::Synthesis(s) => self.synthesis = Some(s.clone()),
            QueryEvent::Trace { trace_ref } => self.trace_ref = Some(trace_ref.clone()),
            QueryEvent::Query(q) => {
                self.session_id = Some(q.session_id.clone());
                self.usage = Some(q.usage.clone());
                if q.trace_ref.is_some() {
                    self.trace_ref.clone_from(&q.trace_ref);
                }
                self.query = Some((**q).clone());
            }
            _ => {}
        }
    }

    fn note_tokens(&mut self, input: Option<i64>, output: Option<i64>) {
        if input.is_none() && output.is_none() {
            return;
        }
        let u = self.usage.get_or_insert(types::QueryUsage {
            input_tokens: 0,
            output_tokens: 0,
            total_tokens: 0,
        });
        if let Some(i) = input {
            u.input_tokens = i;
        }
        if let Some(o) = output {
            u.output_tokens = o;
        }
        // Server numbers: each may fit while their sum does not.
        u.total_tokens = u.input_tokens.saturating_add(u.output_tokens);
    }
}

/// Merges a step event into the list by `step_id`: the later status wins,
/// and fields the later event leaves out keep their earlier value.
pub(crate) fn merge_step(steps: &mut Vec<types::QueryStep>, step: &types::QueryStep) {
    let Some(known) = steps.iter_mut().find(|s| s.step_id == step.step_id) else {
        steps.push(step.clone());
        return;
    };
    if !step.status.is_empty() {
        known.status.clone_from(&step.status);
    }
    if !step.commentary.is_empty() {
        known.commentary.clone_from(&step.commentary);
    }
    if !step.fns.is_empty() {
        known.fns.clone_from(&step.fns);
    }
    if step.code.is_some() {
        known.code.clone_from(&step.code);
    }
    if step.cum_input_tokens.is_some() {
        known.cum_input_tokens = step.cum_input_tokens;
    }
    if step.cum_output_tokens.is_some() {
        known.cum_output_tokens = step.cum_output_tokens;
    }
}

impl fmt::Debug for QueryTurn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryTurn")
            .field("connection", &self.conn)
            .field("session_id", &self.acc.session_id)
            .field("text_len", &self.acc.text.len())
            .field("steps", &self.acc.steps.len())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl QueryTurn {
    pub(crate) fn new(
        conn: EventConnection,
        slot: Option<TurnSlot>,
        span: TurnSpan,
        config: &StreamConfig,
    ) -> Self {
        span.learn(conn.query_id(), None);
        QueryTurn {
            conn,
            slot,
            acc: Accumulated::default(),
            pending: VecDeque::new(),
            gap: None,
            ended: false,
            span,
            cancel_on_drop: config.cancel_on_drop_enabled(),
            after_checkpoint: false,
            prefix_len: None,
            mismatch: None,
            terminal_status: None,
            reconciled: false,
            stream_config: config.clone(),
        }
    }

    /// A turn the server answered with its Query document: a terminal one
    /// is replayed as its events; a running one is followed through
    /// `GET /queries/{id}/events` from the start.
    pub(crate) fn from_query(
        client: crate::Client,
        query: types::Query,
        slot: TurnSlot,
        span: TurnSpan,
        config: &StreamConfig,
    ) -> Self {
        if !query.is_terminal() {
            let conn = EventConnection::resume(client, config.clone(), query.id.clone(), None);
            let mut turn = QueryTurn::new(conn, Some(slot), span, config);
            turn.set_session_id(&query.session_id);
            return turn;
        }
        let conn = EventConnection::named_closed(client, config.clone(), query.id.clone());
        let mut turn = QueryTurn::new(conn, Some(slot), span, config);
        turn.pending.push_back(QueryEvent::Created {
            query_id: query.id.clone(),
            session_id: Some(query.session_id.clone()),
        });
        let answer = query.answer_text();
        if !answer.is_empty() {
            turn.pending
                .push_back(QueryEvent::TextDelta { delta: answer });
        }
        let error = query.error.clone().unwrap_or_default();
        turn.pending.push_back(match query.status.as_str() {
            "failed" => QueryEvent::Failed { error },
            "cancelled" => QueryEvent::Cancelled { error },
            _ => QueryEvent::Completed,
        });
        turn.pending.push_back(QueryEvent::Query(Box::new(query)));
        turn
    }

    /// This turn continues after a checkpoint stored elsewhere, after
    /// `prefix_len` bytes of answer text when known: without it a replay
    /// gap cannot be made up for.
    pub(crate) fn mark_after_checkpoint(&mut self, prefix_len: Option<usize>) {
        self.after_checkpoint = true;
        self.prefix_len = prefix_len;
    }

    /// Compares the delivered text with the final Query's answer: `Ok(None)`
    /// when they are equal (or the turn failed or was cancelled: its error
    /// is what counts), `Ok(Some(rest))` when the answer continues the text
    /// by `rest`, the mismatch otherwise.
    fn check_final(&self, query: &types::Query) -> Result<Option<String>, Mismatch> {
        if matches!(query.status.as_str(), "failed" | "cancelled") {
            return Ok(None);
        }
        let answer = query.answer_text();
        let delivered = self.acc.text.as_str();
        let base = match (self.after_checkpoint, self.prefix_len) {
            (false, _) => Some((0, answer.as_str())),
            (true, Some(n)) => answer.get(n..).map(|rest| (n, rest)),
            // The text before the checkpoint is unknown here: what was
            // delivered must end the answer.
            (true, None) if answer.ends_with(delivered) => return Ok(None),
            (true, None) => None,
        };
        if let Some((_, base)) = base
            && let Some(rest) = base.strip_prefix(delivered)
        {
            return Ok((!rest.is_empty()).then(|| rest.to_owned()));
        }
        let first_difference = match base {
            Some((offset, base)) => offset.saturating_add(common_prefix(base, delivered)),
            None => self.prefix_len.unwrap_or(0).min(answer.len()),
        };
        Err(Mismatch {
            query_id: query.id.clone(),
            delivered_len: delivered.len(),
            final_len: answer.len(),
            first_difference,
        })
    }

    /// Sets the session id known from elsewhere (an attached turn).
    pub(crate) fn set_session_id(&mut self, session_id: &str) {
        if !session_id.is_empty() && self.acc.session_id.is_none() {
            self.acc.session_id = Some(session_id.to_owned());
            self.span.learn(None, Some(session_id));
        }
    }

    /// Whether the server reported the turn's end (a terminal event or a
    /// terminal Query).
    fn ended_on_server(&self) -> bool {
        self.conn.terminal_seen() || self.acc.query.as_ref().is_some_and(|q| q.is_terminal())
    }

    /// Stops reading and keeps the turn: the returned [`QueryHandle`] can
    /// poll, wait for, cancel or read the turn again later
    /// ([`QueryHandle::events_after`] with [`QueryTurn::last_event_id`]
    /// continues exactly where this turn stopped). The connection is closed;
    /// the turn goes on on the server, and the session counts it as in
    /// flight while the handle lives. Never cancels, whatever
    /// [`StreamConfig::cancel_on_drop`] says.
    pub fn detach(mut self) -> QueryHandle {
        // Drop must neither cancel nor free the session: the handle owns it.
        self.cancel_on_drop = false;
        self.ended = true;
        let slot = self.slot.take();
        let status = if self.ended_on_server() {
            self.acc.query.as_ref().map_or_else(
                || self.terminal_status.unwrap_or("completed").to_owned(),
                |q| q.status.clone(),
            )
        } else {
            "in_progress".to_owned()
        };
        let query = self.acc.query.clone().unwrap_or_else(|| types::Query {
            citations: Vec::new(),
            comparison: None,
            created: 0,
            error: None,
            feedback: None,
            id: self.conn.query_id().unwrap_or_default().to_owned(),
            input: Vec::new(),
            model: None,
            object: "query".to_owned(),
            output: Vec::new(),
            output_json: None,
            previous_query_id: None,
            rollup: self.acc.rollup.clone(),
            runtime_ms: 0,
            session_id: self.acc.session_id.clone().unwrap_or_default(),
            status,
            steps: self.acc.steps.clone(),
            synthesis: self.acc.synthesis.clone(),
            trace_ref: self.acc.trace_ref.clone(),
            usage: self.acc.usage.clone().unwrap_or(types::QueryUsage {
                input_tokens: 0,
                output_tokens: 0,
                total_tokens: 0,
            }),
        });
        let span = self.span.clone();
        let config = self.stream_config.clone();
        let client = self.conn.client().clone();
        if self.conn.query_id().is_some() {
            self.conn.close();
            QueryHandle::new(client, query, slot, config, span)
        } else {
            // Not named yet: the handle reads on until it is, when needed.
            let conn = std::mem::replace(&mut self.conn, EventConnection::closed(client));
            QueryHandle::unnamed(conn, query, slot, config, span)
        }
    }

    /// The turn's id, once the server named it (any event carries it).
    pub fn query_id(&self) -> Option<&str> {
        self.conn.query_id()
    }

    /// The session's id, once the server reported it.
    pub fn session_id(&self) -> Option<&str> {
        self.acc.session_id.as_deref()
    }

    /// The sequence number of the last event delivered: a checkpoint for
    /// [`QueryHandle::events_after`]. Once the rest of the answer came from
    /// the final Query (a gap the events could not fill), it is
    /// [`END_OF_TURN`]: nothing after it repeats text.
    pub fn last_event_id(&self) -> Option<u64> {
        if self.reconciled {
            return Some(END_OF_TURN);
        }
        self.conn.last_seq()
    }

    /// A [`Checkpoint`] to persist: the turn, [`QueryTurn::last_event_id`]
    /// and the bytes of text delivered up to it. `None` before the server
    /// named the turn, or on a turn continued with
    /// [`QueryHandle::events_after`] (the text before its start is unknown
    /// here; [`QueryHandle::events_from`] keeps it).
    pub fn checkpoint(&self) -> Option<Checkpoint> {
        let query_id = self.conn.query_id()?.to_owned();
        let before = if self.after_checkpoint {
            self.prefix_len?
        } else {
            0
        };
        let text_len = before.saturating_add(self.acc.text.len());
        Some(Checkpoint {
            query_id,
            event_id: self.last_event_id().unwrap_or(0),
            text_len: u64::try_from(text_len).unwrap_or(u64::MAX),
        })
    }

    /// The answer text delivered so far.
    pub fn text(&self) -> &str {
        &self.acc.text
    }

    /// The steps so far, merged by `step_id` (the latest status wins).
    pub fn steps(&self) -> &[types::QueryStep] {
        &self.acc.steps
    }

    /// The citations of the final Query (empty until it arrived).
    pub fn citations(&self) -> &[types::Citation] {
        self.acc.query.as_ref().map_or(&[], |q| &q.citations)
    }

    /// Token usage: the final Query's, or the latest cumulative step counts.
    pub fn usage(&self) -> Option<&types::QueryUsage> {
        self.acc.usage.as_ref()
    }

    /// The turn's rollup, once reported.
    pub fn rollup(&self) -> Option<&types::QueryRollup> {
        self.acc.rollup.as_ref()
    }

    /// The synthesis report, once reported.
    pub fn synthesis(&self) -> Option<&types::QuerySynthesis> {
        self.acc.synthesis.as_ref()
    }

    /// The trace reference, once reported.
    pub fn trace_ref(&self) -> Option<&str> {
        self.acc.trace_ref.as_deref()
    }

    /// The final Query, once its frame arrived.
    pub fn query(&self) -> Option<&types::Query> {
        self.acc.query.as_ref()
    }

    /// Just the answer text, one delta at a time. Turn it back with
    /// [`TextStream::into_turn`] to call [`QueryTurn::finish`].
    pub fn text_stream(self) -> TextStream {
        TextStream { turn: self }
    }

    /// Reads the rest of the stream and returns the final Query.
    ///
    /// The Query comes from the stream's `query` frame; when the stream ended
    /// after the terminal event without a usable one (the connection broke,
    /// the frame was too large), from `GET /queries/{id}`, which must be
    /// terminal (it is polled, up to [`StreamConfig::recovery_wait`]). Once
    /// the terminal event was delivered, nothing the transport does makes
    /// the turn an error.
    ///
    /// # Errors
    /// [`Error::TurnFailed`] / [`Error::TurnCancelled`] for a turn that ended
    /// so; [`Error::Stream`] when the stream broke beyond resuming;
    /// [`Error::ReplayGap`] when a resume could not be trusted and the
    /// stored turn did not make up for it; a 4xx answer to a resume request;
    /// any error of the final `GET`.
    ///
    /// # Cancel safety
    /// Dropping the future loses nothing already delivered: the accumulated
    /// text and steps stay in the (consumed) turn, so prefer not to.
    pub async fn finish(self) -> Result<types::Query> {
        let span = self.span.span();
        self.finish_inner().instrument(span).await
    }

    async fn finish_inner(mut self) -> Result<types::Query> {
        let mut first_error = None;
        while let Some(item) = self.next().await {
            if let Err(e) = item {
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        if let Some((gap, detail)) = self.gap.take() {
            return Err(gap.into_error(&detail));
        }
        if let Some(m) = self.mismatch.take() {
            return Err(m.to_error());
        }
        if let Some(q) = self.acc.query.take() {
            return into_outcome(q);
        }
        match self.conn.query_id() {
            Some(id) if self.conn.terminal_seen() => {
                let limit = self.conn.config().recovery_wait_limit();
                let query = stored_terminal(self.conn.client(), id, limit).await?;
                if let Err(m) = self.check_final(&query) {
                    return Err(m.to_error());
                }
                if let Some(slot) = self.slot.take() {
                    slot.learn(Some(&query.session_id), Some(&query.id));
                    if query.is_terminal() {
                        slot.release();
                    }
                }
                into_outcome(query)
            }
            id => Err(Error::Stream {
                query_id: id.map(str::to_owned),
                message: "the stream ended without the turn's result".into(),
            }),
        }
    }

    /// [`QueryTurn::finish`], falling back to polling the stored Query when
    /// the events cannot be read to the end (the turn is named but the
    /// stream broke beyond resuming).
    pub(crate) async fn finish_or_poll(mut self) -> Result<types::Query> {
        let span = self.span.span();
        let mut first_error = None;
        while let Some(item) = self.next().instrument(span.clone()).await {
            if let Err(e) = item {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e @ (Error::TurnFailed { .. } | Error::TurnCancelled { .. })) => Err(e),
            Some(_) if self.conn.query_id().is_some() => {
                tracing::debug!(parent: &span, "the events broke off; polling the stored turn");
                self.cancel_on_drop = false;
                let mut handle = self.detach();
                handle.wait().await
            }
            Some(e) => Err(e),
            None => self.finish_inner().instrument(span).await,
        }
    }

    /// Finishes the turn and deserializes its `output_json` (the answer to a
    /// `shape`, or retrieval hits) into `T`.
    ///
    /// # Errors
    /// The errors of [`QueryTurn::finish`]; [`Error::Decode`] when the turn
    /// has no `output_json` or it does not fit `T`.
    pub async fn json<T: DeserializeOwned>(self) -> Result<T> {
        self.finish().await?.json()
    }

    /// Stops the turn on the server (`POST /queries/{id}/cancel`) and closes
    /// the stream. Waits for the turn's id if the server has not sent it yet.
    ///
    /// # Errors
    /// [`Error::Stream`] when the stream ends before naming the turn; any
    /// error of the cancel call.
    pub async fn cancel(mut self) -> Result<types::Query> {
        while self.conn.query_id().is_none() {
            match self.next().await {
                Some(_) => {}
                None => {
                    return Err(Error::Stream {
                        query_id: None,
                        message: "the stream ended before the server named the turn".into(),
                    });
                }
            }
        }
        self.conn.close();
        self.cancel_on_drop = false;
        let client = self.conn.client().clone();
        let id = self.conn.query_id().unwrap_or_default().to_owned();
        let result = client
            .queries()
            .cancel(&id)
            .instrument(self.span.span())
            .await;
        if let (Ok(q), Some(slot)) = (&result, self.slot.take()) {
            slot.learn(Some(&q.session_id), Some(&q.id));
            if q.is_terminal() {
                slot.release();
            }
        }
        drop(self);
        result
    }

    /// Turns the stored turn that stands in for a broken replay into the
    /// events still owed, or the error when it does not continue the text
    /// already delivered. A failed or cancelled turn reports its own error,
    /// whatever the gap.
    fn recovered(&mut self, query: types::Query, gap: ReplayGap) -> Option<Error> {
        let error = query.error.clone().unwrap_or_default();
        match query.status.as_str() {
            "failed" => self.pending.push_back(QueryEvent::Failed { error }),
            "cancelled" => self.pending.push_back(QueryEvent::Cancelled { error }),
            _ if self.after_checkpoint && self.prefix_len.is_none() => {
                let detail = format!(
                    "the text before checkpoint {} was delivered elsewhere, so the stored answer \
                     ({} bytes) cannot be split at it; read the stored turn instead",
                    gap.last_event_id.unwrap_or_default(),
                    query.answer_text().len()
                );
                self.gap = Some((gap.clone(), detail.clone()));
                return Some(gap.into_error(&detail));
            }
            _ => match self.check_final(&query) {
                Ok(rest) => {
                    tracing::debug!(
                        query_id = query.id,
                        rest = rest.as_ref().map_or(0, String::len),
                        "finishing the turn from its stored state"
                    );
                    if let Some(delta) = rest {
                        self.pending.push_back(QueryEvent::TextDelta { delta });
                    }
                    self.pending.push_back(QueryEvent::Completed);
                }
                Err(m) => {
                    let detail = m.detail();
                    self.gap = Some((gap.clone(), detail.clone()));
                    return Some(gap.into_error(&detail));
                }
            },
        }
        self.pending.push_back(QueryEvent::Query(Box::new(query)));
        None
    }

    fn end(&mut self) {
        self.ended = true;
        self.span.record_resumes(self.conn.resumes());
        if let Some(slot) = &self.slot {
            slot.learn(self.acc.session_id.as_deref(), self.conn.query_id());
        }
        // A stream that broke off keeps the slot: the turn may still run,
        // and whoever goes on with it (a detached handle) owns it.
        if self.ended_on_server()
            && let Some(slot) = self.slot.take()
        {
            slot.release();
        }
    }
}

impl Drop for QueryTurn {
    fn drop(&mut self) {
        if !self.ended {
            self.span.record_resumes(self.conn.resumes());
        }
        // A stream that broke off has ended, but the turn may still run.
        if !self.cancel_on_drop || self.ended_on_server() {
            return;
        }
        let Some(query_id) = self.conn.query_id().map(str::to_owned) else {
            tracing::debug!(parent: &self.span.span(), "dropped before the server named the turn; nothing to cancel");
            return;
        };
        // Drop cannot wait, so the cancel runs as a task of the caller's
        // runtime (the one opt-in task of the SDK); the session remembers
        // the turn until the next turn sees it ended.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(parent: &self.span.span(), query_id, "dropped outside a Tokio runtime; cannot cancel the turn");
            return;
        };
        let client = self.conn.client().clone();
        let span = self.span.span();
        tracing::debug!(parent: &span, query_id, "dropped before its end; cancelling the turn");
        let owner = client.clone();
        owner.spawn_cancel(
            &runtime,
            async move {
                if let Err(e) = client.queries().cancel(&query_id).await {
                    tracing::warn!(query_id, error = %e, "could not cancel the dropped turn");
                }
            }
            .instrument(span),
        );
    }
}

impl Stream for QueryTurn {
    type Item = Result<QueryEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let span = this.span.span();
        let _enter = span.enter();
        let event = if let Some(event) = this.pending.pop_front() {
            event
        } else {
            let item = match this.conn.poll_next_event(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(item) => item,
            };
            let Some(item) = item else {
                this.end();
                return Poll::Ready(None);
            };
            match item {
                Ok(Delivery::Event(_, event)) => event,
                Ok(Delivery::Recovered(query, gap)) => {
                    if let Some(e) = this.recovered(*query, gap) {
                        return Poll::Ready(Some(Err(e)));
                    }
                    this.reconciled = true;
                    match this.pending.pop_front() {
                        Some(event) => event,
                        None => return Poll::Ready(None),
                    }
                }
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
        };
        let event = match event {
            QueryEvent::Query(query) => match this.check_final(&query) {
                Ok(None) => QueryEvent::Query(query),
                Ok(Some(rest)) => {
                    // The answer goes on past what was delivered: the rest
                    // first, as one delta.
                    tracing::debug!(rest = rest.len(), "delivering the rest of the final answer");
                    this.pending.push_front(QueryEvent::Query(query));
                    this.reconciled = true;
                    QueryEvent::TextDelta { delta: rest }
                }
                Err(m) => {
                    tracing::warn!(
                        query_id = m.query_id,
                        delivered = m.delivered_len,
                        final_len = m.final_len,
                        at = m.first_difference,
                        "the streamed text is not the final answer"
                    );
                    let e = m.to_error();
                    this.mismatch = Some(m);
                    return Poll::Ready(Some(Err(e)));
                }
            },
            QueryEvent::Completed if this.terminal_status.is_none() => {
                this.terminal_status = Some("completed");
                QueryEvent::Completed
            }
            e @ QueryEvent::Failed { .. } if this.terminal_status.is_none() => {
                this.terminal_status = Some("failed");
                e
            }
            e @ QueryEvent::Cancelled { .. } if this.terminal_status.is_none() => {
                this.terminal_status = Some("cancelled");
                e
            }
            e => e,
        };
        this.acc.apply(&event);
        if let (
            Some(slot),
            QueryEvent::Created {
                session_id,
                query_id,
            },
        ) = (&this.slot, &event)
        {
            slot.learn(session_id.as_deref(), Some(query_id));
        }
        this.span
            .learn(this.conn.query_id(), this.acc.session_id.as_deref());
        let query_id = || this.conn.query_id().unwrap_or_default().to_owned();
        let item = match event {
            QueryEvent::Failed { error } => Err(Error::TurnFailed {
                query_id: query_id(),
                message: error,
            }),
            QueryEvent::Cancelled { error } => Err(Error::TurnCancelled {
                query_id: query_id(),
                message: error,
            }),
            event => Ok(event),
        };
        Poll::Ready(Some(item))
    }
}

/// The answer text of a [`QueryTurn`], one delta at a time.
///
/// Ends with the turn; errors (a failed turn, a stream that could not be
/// resumed) are yielded as they are.
#[derive(Debug)]
pub struct TextStream {
    turn: QueryTurn,
}

impl TextStream {
    /// The turn, with everything accumulated so far.
    pub fn into_turn(self) -> QueryTurn {
        self.turn
    }
}

impl Stream for TextStream {
    type Item = Result<String>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            match futures::ready!(this.turn.poll_next_unpin(cx)) {
                None => return Poll::Ready(None),
                Some(Ok(QueryEvent::TextDelta { delta })) => return Poll::Ready(Some(Ok(delta))),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
            }
        }
    }
}

impl types::Query {
    /// Deserializes `output_json` (the answer to a `shape`, or retrieval
    /// hits) into `T`.
    ///
    /// ```
    /// # let json = serde_json::json!({"id":"q1","object":"query","session_id":"s1",
    /// #   "created":0,"status":"completed","input":[],"output":[],"citations":[],"steps":[],
    /// #   "runtime_ms":1,"usage":{"input_tokens":0,"output_tokens":0,"total_tokens":0},
    /// #   "output_json":{"answer":42}});
    /// let query: nexus_knowql::types::Query = serde_json::from_value(json).unwrap();
    /// #[derive(serde::Deserialize)]
    /// struct Answer { answer: u32 }
    /// assert_eq!(query.json::<Answer>().unwrap().answer, 42);
    /// ```
    ///
    /// # Errors
    /// [`Error::Decode`] when there is no `output_json` or it does not fit `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        let Some(map) = &self.output_json else {
            return Err(Error::decode(
                "query_output_json",
                format!("query {} has no output_json", self.id),
                b"",
            ));
        };
        let value = serde_json::Value::Object(map.clone());
        serde_json::from_value(value).map_err(|e| {
            let body = serde_json::to_vec(map).unwrap_or_default();
            Error::decode("query_output_json", e, &body)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(id: &str, status: &str, commentary: &str) -> types::QueryStep {
        types::QueryStep {
            step_id: id.into(),
            status: status.into(),
            commentary: commentary.into(),
            fns: Vec::new(),
            code: None,
            cum_input_tokens: None,
            cum_output_tokens: None,
        }
    }

    #[test]
    fn steps_merge_by_id_and_later_status_wins() {
        let mut steps = Vec::new();
        merge_step(&mut steps, &step("a", "running", "searching"));
        merge_step(&mut steps, &step("b", "running", "reading"));
        merge_step(&mut steps, &step("a", "done", ""));
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].status, "done");
        assert_eq!(steps[0].commentary, "searching");
        assert_eq!(steps[1].status, "running");
    }

    #[test]
    fn usage_follows_cumulative_step_counts() {
        let mut acc = Accumulated::default();
        let mut s = step("a", "done", "");
        s.cum_input_tokens = Some(10);
        s.cum_output_tokens = Some(3);
        acc.apply(&QueryEvent::Step(s));
        let u = acc.usage.unwrap();
        assert_eq!(
            (u.input_tokens, u.output_tokens, u.total_tokens),
            (10, 3, 13)
        );
    }
}
