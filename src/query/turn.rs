//! [`QueryTurn`]: a live streaming turn that accumulates as it goes.

use std::collections::VecDeque;
use std::fmt;

use futures::StreamExt;
use tracing::Instrument;

use super::accumulated::{Accumulated, Mismatch};
use super::checkpoint::{Checkpoint, END_OF_TURN, RollingText, TextDigest};
use super::event::QueryEvent;
use super::slot::TurnSlot;
use super::span::TurnSpan;
use super::stream::align::Delivered;
use super::stream::{EventConnection, ReplayGap, StreamConfig, TurnBinding, stored_terminal};
use crate::error::{Error, Result};
use crate::status::QueryStatus;
use crate::types;

/// A live streaming turn: a [`Stream`](futures::Stream) of [`QueryEvent`]s that accumulates
/// the answer as it goes.
///
/// Every event is delivered exactly once and in order, whatever the network
/// does: a broken or idle connection reconnects with `Last-Event-ID` (see
/// [`StreamConfig`]), and each reconnected stream must replay from exactly
/// that id. When it does not (or the event log is gone), the rest of the
/// answer comes from the stored turn as one final text delta, or the stream
/// ends with [`Error::ReplayGap`]: the deltas never add up to a wrong text.
/// A failed or cancelled turn yields
/// [`Error::TurnFailed`] / [`Error::TurnCancelled`] after the events before
/// it; the stream then ends with the final [`QueryEvent::Query`].
///
/// Dropping a `QueryTurn` closes the connection; the turn goes on on the
/// server, and its session remembers it (see [`Session`](crate::Session)).
/// [`QueryTurn::cancel`] also stops it there, [`QueryTurn::detach`] keeps a
/// [`QueryHandle`](crate::QueryHandle) to it, and with [`StreamConfig::cancel_on_drop`] a drop
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
    /// Continues after a checkpoint (see [`QueryHandle::resume_from`](crate::QueryHandle::resume_from)).
    after_checkpoint: bool,
    /// The bytes of answer text delivered before the checkpoint.
    prefix_len: usize,
    /// The delivered text did not match the final answer: the turn's outcome
    /// even after the error was yielded.
    mismatch: Option<Mismatch>,
    /// The status the terminal event reported (`completed`, `failed`, `cancelled`).
    terminal_status: Option<QueryStatus>,
    /// Text came from the final Query rather than from events: every event
    /// of the turn counts as delivered.
    reconciled: bool,
}

/// A turn that stopped being read, for a [`QueryHandle`](crate::QueryHandle).
pub(crate) struct Detached {
    pub(crate) client: crate::Client,
    pub(crate) query: types::Query,
    pub(crate) slot: Option<TurnSlot>,
    pub(crate) config: StreamConfig,
    pub(crate) span: TurnSpan,
    /// What the turn must be, as far as the stream learnt it.
    pub(crate) binding: TurnBinding,
    /// The connection, when the server has not named the turn yet.
    pub(crate) unnamed: Option<EventConnection>,
}

impl fmt::Debug for QueryTurn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryTurn")
            .field("connection", &self.conn)
            .field("session_id", &self.acc.session_id)
            .field("text_len", &self.acc.text.len())
            .field("step_bytes", &self.acc.step_bytes)
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
            acc: Accumulated::new(config.keep_text),
            pending: VecDeque::new(),
            gap: None,
            ended: false,
            span,
            cancel_on_drop: config.cancel_on_drop_enabled(),
            after_checkpoint: false,
            prefix_len: 0,
            mismatch: None,
            terminal_status: None,
            reconciled: false,
            stream_config: config.clone(),
        }
    }

    /// A turn the server answered with its Query document: a terminal one
    /// is replayed as its events; a running one is followed through
    /// `GET /queries/{id}/events` from the start.
    /// `binding` has checked `query` already.
    pub(crate) fn from_query(
        client: crate::Client,
        query: types::Query,
        binding: TurnBinding,
        slot: TurnSlot,
        span: TurnSpan,
        config: &StreamConfig,
        started: tokio::time::Instant,
    ) -> Self {
        if !query.is_terminal() {
            let conn =
                EventConnection::resume(client, config.clone(), binding, None).started_at(started);
            let mut turn = QueryTurn::new(conn, Some(slot), span, config);
            turn.set_session_id(&query.session_id);
            return turn;
        }
        let conn = EventConnection::named_closed(client, config.clone(), binding);
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
        turn.pending.push_back(match &query.status {
            QueryStatus::Failed => QueryEvent::Failed { error },
            QueryStatus::Cancelled => QueryEvent::Cancelled { error },
            _ => QueryEvent::Completed,
        });
        turn.pending.push_back(QueryEvent::Query(Box::new(query)));
        // The whole turn is in hand: a checkpoint taken from here on is at
        // its end, whatever of it was read yet.
        turn.reconciled = true;
        turn
    }

    /// This turn continues after a checkpoint stored elsewhere, after
    /// `prefix_len` bytes of answer text whose running hash is `before`.
    /// `head` is the hash of its first bytes (see [`Checkpoint::head`]);
    /// a replay is aligned on that text.
    pub(crate) fn mark_after_checkpoint(
        &mut self,
        prefix_len: usize,
        before: RollingText,
        head: Option<RollingText>,
    ) {
        self.after_checkpoint = true;
        self.prefix_len = prefix_len;
        self.acc.text.continue_after(before);
        self.conn
            .continue_after(Delivered::after_checkpoint(prefix_len, before, head));
    }

    /// Compares the delivered text with the final Query's answer: `Ok(None)`
    /// when they are equal (or the turn failed or was cancelled: its error
    /// is what counts), `Ok(Some(rest))` when the answer continues the text
    /// by `rest`, the mismatch otherwise. After a checkpoint, the text
    /// delivered here must continue the answer at the checkpoint's length.
    fn check_final(&self, query: &types::Query) -> Result<Option<String>, Mismatch> {
        if matches!(query.status, QueryStatus::Failed | QueryStatus::Cancelled) {
            return Ok(None);
        }
        let answer = query.answer_text();
        let offset = if self.after_checkpoint {
            self.prefix_len
        } else {
            0
        };
        let delivered = &self.acc.text;
        // The text before the checkpoint was delivered elsewhere: the
        // answer must begin with exactly the text the checkpoint proves.
        if !answer
            .as_bytes()
            .get(..offset)
            .is_some_and(|head| delivered.proves_before(head))
        {
            return Err(Mismatch {
                query_id: query.id.clone(),
                delivered_len: offset.saturating_add(delivered.len()),
                final_len: answer.len(),
                first_difference: 0,
            });
        }
        let base = answer.get(offset..);
        if let Some(base) = base
            && let Some(head) = base.get(..delivered.len())
            && delivered.is(head)
        {
            let rest = &base[delivered.len()..];
            return Ok((!rest.is_empty()).then(|| rest.to_owned()));
        }
        let first_difference = match base {
            Some(base) => offset.saturating_add(delivered.common_prefix(base)),
            None => offset.min(answer.len()),
        };
        // Like with like: all the text delivered (before the checkpoint
        // too) against as many bytes of the final answer.
        Err(Mismatch {
            query_id: query.id.clone(),
            delivered_len: offset.saturating_add(delivered.len()),
            final_len: answer.len(),
            first_difference,
        })
    }

    /// Sets the session id known from elsewhere (an attached turn).
    pub(crate) fn set_session_id(&mut self, session_id: &str) {
        self.conn.expect_session(session_id);
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

    /// Stops reading (see [`QueryTurn::detach`]): what a handle on the turn
    /// needs. Neither cancels nor frees the session: the handle owns it.
    pub(crate) fn detach_parts(mut self) -> Detached {
        self.cancel_on_drop = false;
        self.ended = true;
        let slot = self.slot.take();
        let status = if self.ended_on_server() {
            self.acc.query.as_ref().map_or_else(
                || {
                    self.terminal_status
                        .clone()
                        .unwrap_or(QueryStatus::Completed)
                },
                |q| q.status.clone(),
            )
        } else {
            QueryStatus::InProgress
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
        let client = self.conn.client().clone();
        let binding = self.conn.binding().clone();
        let unnamed = if self.conn.query_id().is_some() {
            self.conn.close();
            None
        } else {
            // Not named yet: the handle reads on until it is, when needed.
            Some(std::mem::replace(
                &mut self.conn,
                EventConnection::closed(client.clone()),
            ))
        };
        Detached {
            client,
            query,
            slot,
            config: self.stream_config.clone(),
            span: self.span.clone(),
            binding,
            unnamed,
        }
    }

    pub(crate) fn turn_span(&self) -> &TurnSpan {
        &self.span
    }

    /// The turn's id, once the server named it (any event carries it).
    pub fn query_id(&self) -> Option<&str> {
        self.conn.query_id()
    }

    /// The session's id, once the server reported it.
    pub fn session_id(&self) -> Option<&str> {
        self.acc.session_id.as_deref()
    }

    /// The sequence number of the last event delivered (see
    /// [`QueryTurn::checkpoint`]). Once the rest of the answer came from
    /// the final Query (a gap the events could not fill), it is
    /// [`END_OF_TURN`]: nothing after it repeats text.
    pub fn last_event_id(&self) -> Option<u64> {
        if self.reconciled {
            return Some(END_OF_TURN);
        }
        self.conn.delivered_seq()
    }

    /// A [`Checkpoint`] to persist: the turn, [`QueryTurn::last_event_id`]
    /// and the bytes of text delivered up to it (those before the
    /// checkpoint this turn continues, if any, included). `None` before the
    /// server named the turn. Continue from it with
    /// [`QueryHandle::resume_from`](crate::QueryHandle::resume_from), in
    /// this process or another.
    pub fn checkpoint(&self) -> Option<Checkpoint> {
        let query_id = self.conn.query_id()?.to_owned();
        let before = if self.after_checkpoint {
            self.prefix_len
        } else {
            0
        };
        let text_len = before.saturating_add(self.acc.text.len());
        let head = self.conn.delivered().head_hash();
        Some(Checkpoint {
            digest: TextDigest::seal(&query_id, self.acc.text.rolling()),
            head: head.map(|head| TextDigest::seal(&query_id, head)),
            query_id,
            event_id: self.last_event_id().unwrap_or(0),
            text_len: u64::try_from(text_len).unwrap_or(u64::MAX),
        })
    }

    /// The answer text delivered so far (empty when the turn does not keep
    /// it, see [`StreamConfig::keep_text`]).
    pub fn text(&self) -> &str {
        self.acc.text.as_str()
    }

    /// The bytes of answer text delivered so far, kept or not.
    pub fn text_len(&self) -> usize {
        self.acc.text.len()
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

    /// Reads the rest of the stream and returns the final Query.
    ///
    /// The Query comes from the stream's `query` frame; when the stream ended
    /// after the terminal event without a usable one (the connection broke,
    /// the frame was too large), from `GET /queries/{id}`, which must be
    /// terminal (it is polled, within the turn timeout). Once
    /// the terminal event was delivered, nothing the transport does makes
    /// the turn an error.
    ///
    /// # Errors
    /// [`Error::TurnFailed`] / [`Error::TurnCancelled`] for a turn that ended
    /// so; [`Error::Stream`] when the stream broke beyond reconnecting;
    /// [`Error::ReplayGap`] when a reconnect could not be trusted and the
    /// stored turn did not make up for it; a 4xx answer to a reconnect;
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
        if let Some(q) = self.acc.query.take()
            && q.is_terminal()
        {
            return q.into_result();
        }
        if self.conn.query_id().is_some() && self.conn.terminal_seen() {
            return self.read_stored().await;
        }
        Err(Error::Stream {
            query_id: self.conn.query_id().map(str::to_owned),
            message: "the stream ended without the turn's result".into(),
        })
    }

    /// The stored turn (`GET /queries/{id}`, polled until terminal within
    /// the turn's deadline), checked as the final `query` frame would be:
    /// its identity, the text delivered, and the text bound.
    pub(crate) async fn read_stored(mut self) -> Result<types::Query> {
        let Some(id) = self.conn.query_id().map(str::to_owned) else {
            return Err(Error::Stream {
                query_id: None,
                message: "the server never named the turn".into(),
            });
        };
        let id = id.as_str();
        let limit = self.conn.time_left();
        let binding = self.conn.binding().clone();
        let stored = stored_terminal(self.conn.client(), id, binding, limit);
        // The turn's deadline covers this read too.
        let query = match self.conn.deadline_at() {
            Some(at) => match tokio::time::timeout_at(at, stored).await {
                Ok(read) => read.map_err(|e| e.about_query(id))?,
                Err(_) => {
                    return Err(Error::timeout(
                        "query_turn",
                        self.conn.started().elapsed(),
                        Some(id),
                    ));
                }
            },
            None => stored.await.map_err(|e| e.about_query(id))?,
        };
        if let Err(m) = self.check_final(&query) {
            return Err(m.to_error());
        }
        let limit = self.stream_config.max_text_bytes;
        if query.answer_text().len() > limit {
            return Err(Error::TurnTooLarge {
                query_id: Some(query.id.clone()),
                part: "text",
                limit: u64::try_from(limit).unwrap_or(u64::MAX),
            });
        }
        if let Some(slot) = self.slot.take() {
            slot.learn(Some(&query.session_id), Some(&query.id));
            if query.is_terminal() {
                slot.release();
            }
        }
        query.into_result()
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
        let mut binding = self.conn.binding().clone();
        let result = client
            .queries()
            .cancel(&id)
            .instrument(self.span.span())
            .await
            .and_then(|q| {
                binding.check_query(&q, "the answer to cancel")?;
                Ok(q)
            });
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
        match &query.status {
            QueryStatus::Failed => self.pending.push_back(QueryEvent::Failed { error }),
            QueryStatus::Cancelled => self.pending.push_back(QueryEvent::Cancelled { error }),
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

mod poll;
