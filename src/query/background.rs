//! [`QueryHandle`]: a turn running in the background, detached, or attached
//! to by id.

use std::fmt;
use std::time::Duration;
use tracing::Instrument;

use super::checkpoint::{Checkpoint, END_OF_TURN, RollingText};
use super::slot::TurnSlot;
use super::span::TurnSpan;
use super::stream::{Delivery, EventConnection, StreamConfig, TurnBinding, open_events};
use super::turn::QueryTurn;
use crate::client::{Poller, WaitPolicy};
use crate::error::{Error, Result};
use crate::resources::Queries;
use crate::{Client, types};

/// A turn that runs on the server while nothing reads its events: started
/// with [`TurnBuilder::background`](crate::TurnBuilder::background), left
/// with [`QueryTurn::detach`], or found by id with
/// [`Queries::attach`](crate::resources::Queries::attach) (from any process).
///
/// It polls only when asked ([`QueryHandle::get`], [`QueryHandle::wait`]);
/// the SDK runs nothing behind the caller's back. While the handle of a
/// session's turn lives and has not seen the turn end, the session counts
/// the turn as in flight; dropped, the session still remembers it (see
/// [`Session`](crate::Session)).
///
/// To continue a turn from a checkpoint in another process, store
/// [`QueryTurn::checkpoint`] as you go; later,
/// `client.queries().attach(id).await?.resume_from(&checkpoint).await?`
/// delivers exactly the events after it, checked against the final answer.
pub struct QueryHandle {
    client: Client,
    query: types::Query,
    /// What the turn must be: every poll and cancel answer is checked
    /// against it.
    binding: TurnBinding,
    slot: Option<TurnSlot>,
    stream_config: StreamConfig,
    /// A detached stream that had not named its turn yet: read on (and
    /// dropped) as soon as the id is needed. In a mutex only so that the
    /// handle stays `Sync`; it is never locked while shared.
    unnamed: Option<std::sync::Mutex<EventConnection>>,
    span: TurnSpan,
}

impl fmt::Debug for QueryHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryHandle")
            .field("id", &self.query.id)
            .field("session_id", &self.query.session_id)
            .field("status", &self.query.status)
            .finish_non_exhaustive()
    }
}

impl QueryHandle {
    /// A handle on `query`, which `binding` has checked.
    pub(crate) fn new(
        client: Client,
        query: types::Query,
        binding: TurnBinding,
        slot: Option<TurnSlot>,
        stream_config: StreamConfig,
        span: TurnSpan,
    ) -> Self {
        span.learn(Some(&query.id), Some(&query.session_id));
        let mut handle = QueryHandle {
            client,
            query,
            binding,
            slot,
            stream_config,
            unnamed: None,
            span,
        };
        handle.observe_terminal();
        handle
    }

    /// A handle on a detached stream that has not named its turn yet.
    pub(crate) fn unnamed(
        conn: EventConnection,
        query: types::Query,
        slot: Option<TurnSlot>,
        stream_config: StreamConfig,
        span: TurnSpan,
    ) -> Self {
        QueryHandle {
            client: conn.client().clone(),
            query,
            binding: conn.binding().clone(),
            slot,
            stream_config,
            unnamed: Some(std::sync::Mutex::new(conn)),
            span,
        }
    }

    /// The turn's id. Empty only on a handle detached before the server
    /// named the turn; every async method learns it first.
    pub fn id(&self) -> &str {
        &self.query.id
    }

    /// The turn's session id (empty while unknown, as for [`QueryHandle::id`]).
    pub fn session_id(&self) -> &str {
        &self.query.session_id
    }

    /// The Query as last seen: the 202 answer, the last poll, or (for a
    /// detached turn, until the first poll) what its stream had shown: id,
    /// session, status, steps and usage, with no output yet.
    pub fn last_seen(&self) -> &types::Query {
        &self.query
    }

    /// Checks that `query` is this handle's turn, of its session.
    fn check_identity(&mut self, query: &types::Query, place: &'static str) -> Result<()> {
        self.binding.check_query(query, place)
    }

    fn observe(&mut self, query: types::Query) {
        self.span.learn(Some(&query.id), Some(&query.session_id));
        self.query = query;
        self.observe_terminal();
    }

    fn observe_terminal(&mut self) {
        if self.query.is_terminal()
            && let Some(slot) = self.slot.take()
        {
            slot.learn(Some(&self.query.session_id), Some(&self.query.id));
            slot.release();
        }
    }

    /// Reads a detached stream on until the server names the turn.
    async fn named(&mut self) -> Result<&str> {
        if let Some(conn) = self.unnamed.take() {
            let mut conn = conn.into_inner().unwrap_or_else(|p| p.into_inner());
            while conn.query_id().is_none() {
                let span = &self.span;
                let next = futures::future::poll_fn(|cx| {
                    let _enter = span.enter();
                    conn.poll_next_event(cx)
                })
                .await;
                match next {
                    Some(Ok(Delivery::Event(
                        _,
                        super::event::QueryEvent::Created { session_id, .. },
                    ))) => {
                        if let Some(s) = session_id {
                            self.query.session_id = s;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e),
                    None => {
                        return Err(Error::Stream {
                            query_id: None,
                            message: "the stream ended before the server named the turn".into(),
                        });
                    }
                }
            }
            self.query.id = conn.query_id().unwrap_or_default().to_owned();
            self.binding = conn.binding().clone();
            if let Some(slot) = &self.slot {
                slot.learn(Some(&self.query.session_id), Some(&self.query.id));
            }
            self.span
                .learn(Some(&self.query.id), Some(&self.query.session_id));
        }
        Ok(&self.query.id)
    }

    /// `GET /queries/{id}`: the turn now, whatever its status.
    ///
    /// # Errors
    /// [`Error::TurnMismatch`] when the answer is about another turn or
    /// session (the handle keeps what it knew); any error of the call.
    pub async fn get(&mut self) -> Result<types::Query> {
        self.ask_server(Ask::Poll).await
    }

    /// Polls `GET /queries/{id}` at `wait`'s intervals until the turn is
    /// `completed`, `failed` or `cancelled`, for at most the turn's
    /// timeout ([`TurnBuilder::turn_timeout`](crate::TurnBuilder::turn_timeout),
    /// else the client's [`turn_timeout`](crate::ClientBuilder::turn_timeout)),
    /// counted from this call: time spent before it does not count.
    ///
    /// ```no_run
    /// # async fn run(mut handle: nexus_knowql::QueryHandle) -> nexus_knowql::Result<()> {
    /// use nexus_knowql::WaitPolicy;
    /// let answer = handle.wait(WaitPolicy::default()).await?;
    /// println!("{}", answer.answer_text());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::TurnFailed`] / [`Error::TurnCancelled`] for a turn that ended
    /// so; [`Error::Timeout`] when the turn timeout passes first (the turn
    /// goes on); any error of the polls.
    ///
    /// # Cancel safety
    /// Dropping the future stops polling; the turn goes on on the server.
    pub async fn wait(&mut self, wait: WaitPolicy) -> Result<types::Query> {
        let span = self.span.span();
        let limit = self.client.transport().turn_timeout();
        let Some(limit) = limit else {
            return self.wait_inner(wait, Duration::MAX).instrument(span).await;
        };
        // The last pause ends on the bound; this ends a poll still running.
        let id = self.query.id.clone();
        match tokio::time::timeout(limit, self.wait_inner(wait, limit).instrument(span)).await {
            Ok(result) => result,
            Err(_) => Err(Error::timeout(
                "get_query",
                limit,
                Some(id.as_str()).filter(|id| !id.is_empty()),
            )),
        }
    }

    async fn wait_inner(&mut self, wait: WaitPolicy, limit: Duration) -> Result<types::Query> {
        let mut poller = Poller::with_timeout(&wait, limit);
        loop {
            let query = self.get().await?;
            if query.is_terminal() {
                return query.into_result();
            }
            super::fetch::check_known_status(&query)?;
            // The last poll lands on the bound: a turn that ends just
            // before it is still seen.
            if !poller.pause_until_timeout().await {
                return Err(poller.timed_out("get_query"));
            }
        }
    }

    /// Attaches to the turn's events (`GET /queries/{id}/events`) from the
    /// start, with the same exactly-once resume as a streamed turn.
    ///
    /// # Errors
    /// Any error answer to the events request.
    pub async fn events(self) -> Result<QueryTurn> {
        self.subscribe(None, 0, RollingText::default(), None).await
    }

    /// The same handle with another [`StreamConfig`] for the streams it
    /// opens ([`QueryHandle::events`], [`QueryHandle::resume_from`]).
    #[must_use]
    pub fn stream_config(mut self, config: StreamConfig) -> QueryHandle {
        self.stream_config = config;
        self
    }

    /// The turn's events after a [`Checkpoint`] persisted from
    /// [`QueryTurn::checkpoint`], each exactly once: the one way to continue
    /// a turn in another process.
    ///
    /// It asks `GET /queries/{id}/events` with `Last-Event-ID` set to the
    /// checkpoint's event and checks the replay: the server replays from it
    /// inclusively, so the first event with an id must be exactly that one
    /// (it is dropped as already seen), or the one right after it (a server
    /// that replays after the id, as SSE servers usually do). The checkpoint
    /// carries the length and the [`TextDigest`](crate::query::TextDigest) of
    /// the text delivered before it: the final answer must begin with exactly
    /// that text ([`Error::AnswerMismatch`] otherwise, already here when the
    /// stored turn has completed), the rest is checked against what follows
    /// like any streamed turn's, and a replay that cannot
    /// be trusted, or an event log that is gone (404/410), is made up for
    /// from the stored turn (the text after the checkpoint as one delta)
    /// instead of failing. A checkpoint at event 0 reads from the start.
    ///
    /// The events request is sent when the returned turn is first polled;
    /// its errors arrive through the stream. The returned turn accumulates
    /// only what follows the checkpoint: its [`QueryTurn::text`] is the rest
    /// of the answer, and [`QueryTurn::finish`] returns the whole stored
    /// Query.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when the checkpoint is about another turn;
    /// [`Error::Stream`] when the handle was detached before the server
    /// named the turn and the stream ended without naming it.
    pub async fn resume_from(mut self, checkpoint: &Checkpoint) -> Result<QueryTurn> {
        self.named().await?;
        if checkpoint.query_id != self.query.id {
            return Err(Error::InvalidRequest(format!(
                "the checkpoint is about query {}, not {}",
                checkpoint.query_id, self.query.id
            )));
        }
        if self.query.status == crate::status::QueryStatus::Completed
            && !checkpoint.proves_prefix_of(self.query.answer_text())
        {
            let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
            return Err(Error::AnswerMismatch {
                query_id: self.query.id.clone(),
                delivered_len: checkpoint.text_len,
                final_len: n(self.query.answer_text().len()),
                first_difference: 0,
            });
        }
        let prefix = usize::try_from(checkpoint.text_len).unwrap_or(usize::MAX);
        let after = Some(checkpoint.event_id).filter(|&s| s > 0);
        self.subscribe(
            after,
            prefix,
            checkpoint.rolling(),
            checkpoint.head_rolling(),
        )
        .await
    }

    async fn subscribe(
        mut self,
        after: Option<u64>,
        prefix_len: usize,
        before: RollingText,
        head: Option<RollingText>,
    ) -> Result<QueryTurn> {
        self.named().await?;
        let QueryHandle {
            client,
            query,
            binding,
            slot,
            stream_config,
            unnamed: _,
            span,
        } = self;
        let conn = match after {
            // Everything was delivered: only the final Query is owed.
            Some(END_OF_TURN) => {
                EventConnection::final_only(client, stream_config.clone(), binding)
            }
            // The engine's verified resume: `Last-Event-ID: seq`, and the
            // replay must start at exactly `seq`.
            Some(seq) => EventConnection::resume(client, stream_config.clone(), binding, Some(seq)),
            None => {
                let resp = open_events(&client, &query.id, None)
                    .instrument(span.span())
                    .await?;
                EventConnection::new(client, stream_config.clone(), resp, binding)
            }
        };
        let mut turn = QueryTurn::new(conn, slot, span, &stream_config);
        turn.set_session_id(&query.session_id);
        if after.is_some() || prefix_len > 0 {
            turn.mark_after_checkpoint(prefix_len, before, head);
        }
        Ok(turn)
    }

    /// `POST /queries/{id}/cancel`: stops the turn on the server.
    ///
    /// # Errors
    /// Any error of the call.
    pub async fn cancel(&mut self) -> Result<types::Query> {
        self.ask_server(Ask::Cancel).await
    }

    /// Polls or cancels the turn (learning its id first); the answer is
    /// checked to be this turn's before it is seen.
    async fn ask_server(&mut self, ask: Ask) -> Result<types::Query> {
        self.named().await?;
        let queries = self.client.queries();
        let (call, place) = match ask {
            Ask::Poll => (queries.get(&self.query.id), "a poll"),
            Ask::Cancel => (queries.cancel(&self.query.id), "the answer to cancel"),
        };
        let query = call.instrument(self.span.span()).await?;
        self.check_identity(&query, place)?;
        self.observe(query.clone());
        Ok(query)
    }
}

/// What [`QueryHandle::ask_server`] asks of the turn.
#[derive(Clone, Copy)]
enum Ask {
    Poll,
    Cancel,
}

impl QueryTurn {
    /// Stops reading and keeps the turn: the returned [`QueryHandle`] can
    /// poll, wait for, cancel or read the turn again later
    /// ([`QueryHandle::resume_from`] with [`QueryTurn::checkpoint`]
    /// continues exactly where this turn stopped). The connection is closed;
    /// the turn goes on on the server, and the session counts it as in
    /// flight while the handle lives. Never cancels, whatever
    /// [`StreamConfig::cancel_on_drop`] says. The handle's
    /// [`QueryHandle::last_seen`] has the status the stream showed
    /// (`completed`, `failed` or `cancelled` after the terminal event).
    pub fn detach(self) -> QueryHandle {
        let d = self.detach_parts();
        match d.unnamed {
            None => QueryHandle::new(d.client, d.query, d.binding, d.slot, d.config, d.span),
            Some(conn) => QueryHandle::unnamed(conn, d.query, d.slot, d.config, d.span),
        }
    }
}

impl Queries<'_> {
    /// A [`QueryHandle`](crate::QueryHandle) for a turn started anywhere
    /// (another process, another client), learnt from `GET /queries/{id}`:
    /// poll it, wait for it, cancel it, or read its events from the start
    /// ([`QueryHandle::events`](crate::QueryHandle::events)) or after a
    /// stored checkpoint
    /// ([`QueryHandle::resume_from`](crate::QueryHandle::resume_from)).
    ///
    /// The handle belongs to no [`Session`](crate::Session) of this
    /// process: to ask a follow-up, use
    /// [`Client::continue_session`] with its session id.
    ///
    /// ```no_run
    /// # async fn run(client: nexus_knowql::Client, saved: &str) -> nexus_knowql::Result<()> {
    /// use futures::StreamExt;
    /// use nexus_knowql::Checkpoint;
    /// let checkpoint: Checkpoint = saved.parse()?;
    /// let handle = client.queries().attach(&checkpoint.query_id).await?;
    /// let mut rest = handle.resume_from(&checkpoint).await?;
    /// while let Some(event) = rest.next().await {
    ///     let _ = event?;
    /// }
    /// let query = rest.finish().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call (404 for an unknown turn).
    pub async fn attach(&self, id: &str) -> Result<QueryHandle> {
        let span = TurnSpan::new("attach");
        span.learn(Some(id), None);
        let query = {
            use tracing::Instrument;
            self.get(id).instrument(span.span()).await?
        };
        let mut binding = TurnBinding::for_turn(id);
        binding.check_query(&query, "the stored turn")?;
        Ok(QueryHandle::new(
            self.client.clone(),
            query,
            binding,
            None,
            StreamConfig::default(),
            span,
        ))
    }
}
