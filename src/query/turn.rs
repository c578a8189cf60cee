//! One turn: [`TurnBuilder`] (per-turn controls, three ways to run) and
//! [`QueryTurn`] (a live streaming turn that accumulates as it goes).

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;

use super::background::QueryHandle;
use super::event::QueryEvent;
use super::session::{Session, TurnSlot};
use super::stream::{
    Delivery, EventConnection, MAX_QUERY_BODY_BYTES, ReplayGap, StreamConfig, expect_event_stream,
    stored_terminal,
};
use crate::error::{Error, Result};
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
}

impl fmt::Debug for TurnBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnBuilder")
            .field("session", &self.session)
            .field("stream_config", &self.stream_config)
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
        TurnBuilder {
            session,
            request: empty_request(ask),
            stream_config: StreamConfig::default(),
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

    /// How [`TurnBuilder::stream`] reads and resumes (idle timeout, frame limit, resume budget).
    pub fn stream_config(mut self, config: StreamConfig) -> Self {
        self.stream_config = config;
        self
    }

    /// The request this turn sends, with the session's part filled in.
    fn prepare(&mut self) -> Result<TurnSlot> {
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
        let slot = TurnSlot::acquire(&self.session.shared)?;
        let start = self.session.shared.lock().clone();
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

    /// Runs the turn synchronously and returns the stored Query.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a request rejected before sending (or a
    /// turn already in flight on the session); [`Error::TurnFailed`] /
    /// [`Error::TurnCancelled`] when the turn ended so; any error of the call.
    pub async fn send(mut self) -> Result<types::Query> {
        let slot = self.prepare()?;
        // The one call that may take as long as a turn: its own deadline
        // (`None` becomes a deadline no turn reaches).
        let limit = self
            .session
            .client
            .transport()
            .turn_timeout()
            .unwrap_or(Duration::MAX);
        let resp = self
            .session
            .client
            .send("create_query", self.post(false).timeout(limit))
            .await?;
        let query = decode_query("create_query", resp).await?;
        slot.learn(Some(&query.session_id), Some(&query.id));
        drop(slot);
        into_outcome(query)
    }

    /// Runs the turn as a stream of events.
    ///
    /// Returns once the server accepted the turn (the response headers
    /// arrived); the events follow through the [`QueryTurn`].
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] as for [`TurnBuilder::send`]; any error
    /// answer to `POST /query` (409 when the server still runs another turn
    /// of the session); [`Error::Timeout`] when the response headers do not
    /// come within the client's header timeout (the request is not sent
    /// again: the server may already run the turn).
    pub async fn stream(mut self) -> Result<QueryTurn> {
        let slot = self.prepare()?;
        self.request.stream = Some(true);
        let client = self.session.client.clone();
        let resp = client.send_stream("create_query", self.post(true)).await?;
        let resp = expect_event_stream("create_query", None, resp)?;
        let conn = EventConnection::new(client, self.stream_config, resp, None);
        Ok(QueryTurn::new(conn, Some(slot)))
    }

    /// Starts the turn in the background (HTTP 202) and returns a handle to
    /// poll, wait for, stream or cancel it.
    ///
    /// # Errors
    /// As for [`TurnBuilder::send`].
    pub async fn background(mut self) -> Result<QueryHandle> {
        let slot = self.prepare()?;
        self.request.background = Some(true);
        let resp = self
            .session
            .client
            .send("create_query", self.post(false))
            .await?;
        let query = decode_query("create_query", resp).await?;
        slot.learn(Some(&query.session_id), Some(&query.id));
        Ok(QueryHandle::new(
            self.session.client.clone(),
            query,
            slot,
            self.stream_config,
        ))
    }
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
/// Dropping a `QueryTurn` closes the connection (the turn goes on on the
/// server); [`QueryTurn::cancel`] also stops it there. No task is spawned.
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
    pub(crate) fn new(conn: EventConnection, slot: Option<TurnSlot>) -> Self {
        QueryTurn {
            conn,
            slot,
            acc: Accumulated::default(),
            pending: VecDeque::new(),
            gap: None,
            ended: false,
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

    /// The sequence number of the last event delivered.
    pub fn last_event_id(&self) -> Option<u64> {
        self.conn.last_seq()
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
    pub async fn finish(mut self) -> Result<types::Query> {
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
        if let Some(q) = self.acc.query.take() {
            return into_outcome(q);
        }
        match self.conn.query_id() {
            Some(id) if self.conn.terminal_seen() => {
                let limit = self.conn.config().recovery_wait_limit();
                let query = stored_terminal(self.conn.client(), id, limit).await?;
                if let Some(slot) = &self.slot {
                    slot.learn(Some(&query.session_id), Some(&query.id));
                }
                into_outcome(query)
            }
            id => Err(Error::Stream {
                query_id: id.map(str::to_owned),
                message: "the stream ended without the turn's result".into(),
            }),
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
        let client = self.conn.client().clone();
        let id = self.conn.query_id().unwrap_or_default().to_owned();
        let result = client.queries().cancel(&id).await;
        drop(self);
        result
    }

    /// Turns the stored turn that stands in for a broken replay into the
    /// events still owed, or the error when it does not continue the text
    /// already delivered.
    fn recovered(&mut self, query: types::Query, gap: ReplayGap) -> Option<Error> {
        let answer = query.answer_text();
        let Some(rest) = answer.strip_prefix(self.acc.text.as_str()) else {
            let detail = format!(
                "the stored answer ({} bytes) does not continue the {} bytes already delivered",
                answer.len(),
                self.acc.text.len()
            );
            self.gap = Some((gap.clone(), detail.clone()));
            return Some(gap.into_error(&detail));
        };
        tracing::debug!(
            query_id = query.id,
            rest = rest.len(),
            "finishing the turn from its stored state"
        );
        if !rest.is_empty() {
            self.pending.push_back(QueryEvent::TextDelta {
                delta: rest.to_owned(),
            });
        }
        let error = query.error.clone().unwrap_or_default();
        match query.status.as_str() {
            "failed" => self.pending.push_back(QueryEvent::Failed { error }),
            "cancelled" => self.pending.push_back(QueryEvent::Cancelled { error }),
            _ => self.pending.push_back(QueryEvent::Completed),
        }
        self.pending.push_back(QueryEvent::Query(Box::new(query)));
        None
    }

    fn end(&mut self) {
        self.ended = true;
        if let Some(slot) = self.slot.take() {
            slot.learn(self.acc.session_id.as_deref(), self.conn.query_id());
            slot.release();
        }
    }
}

impl Stream for QueryTurn {
    type Item = Result<QueryEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
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
                    match this.pending.pop_front() {
                        Some(event) => event,
                        None => return Poll::Ready(None),
                    }
                }
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
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
