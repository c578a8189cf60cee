//! The resumable event connection behind [`QueryTurn`](crate::QueryTurn):
//! reads SSE frames, drops replayed ones, and reconnects with
//! `Last-Event-ID` when the connection breaks.
//!
//! Exactly-once delivery rests on two facts of the API: every progress frame
//! carries its sequence number as `id:`, and `GET /queries/{id}/events` with
//! `Last-Event-ID: N` replays from N inclusively (or, as SSE servers usually
//! do, from the event after N). So after a break the stream reconnects with
//! the last sequence number it delivered and skips every frame whose id is
//! not greater. The `POST /query` that started the turn is never sent again:
//! that would start a second turn.
//!
//! Both facts are checked, not trusted, and so is the turn's identity: a
//! frame that names another turn or session ends the stream with
//! [`Error::TurnMismatch`], never retried. Ids are checked on every frame:
//! one not above the last delivered is a replay (dropped, so a replay that
//! starts early is deduplicated), one beyond the next is a jump (the
//! connection resumes at once from the last delivered event), and one that
//! is not a decimal number cannot be ordered. A resumed connection must
//! reach the id it sent or start right after it: a replay that starts later
//! or at a non-numeric id, a second jump at the same place, a non-numeric
//! id anywhere, and an event log that is gone (404/410) end the reading; the
//! connection then waits for the stored turn (`GET /queries/{id}`) and hands
//! it over as [`Delivery::Recovered`], never the events across the gap. After the terminal event the `query` frame is
//! awaited for [`StreamConfig::final_query_wait`], then the stored turn
//! stands in for it; the client's turn timeout bounds it all.

use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use tokio::time::{Instant, Sleep};

pub(crate) use super::config::{MAX_QUERY_BODY_BYTES, StreamConfig};
use super::event::QueryEvent;
pub(crate) use super::fetch::{expect_event_stream, open_events, stored_terminal};
pub(crate) use super::identity::TurnBinding;
use super::sse::SseParser;
pub(crate) use crate::error::millis;
use crate::error::{Error, Result};
use crate::transport::retry::Backoff;
use crate::{Client, types};

type BodyStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;
type Connect = Pin<Box<dyn Future<Output = Result<reqwest::Response>> + Send>>;
type Fetch = Pin<Box<dyn Future<Output = Result<types::Query>> + Send>>;

enum State {
    /// Reading a response body.
    Open(BodyStream),
    /// Waiting out the backoff before reconnecting.
    Waiting(Pin<Box<Sleep>>),
    /// `GET /queries/{id}/events` sent, waiting for the answer.
    Connecting(Connect),
    /// Waiting for the stored turn: the event log could not be trusted (with
    /// the gap), or the final `query` frame did not come (without).
    Recovering(Fetch, Option<ReplayGap>),
    /// The stream is over (the error in `failed`, if any, is reported once).
    Done,
}

/// What the connection hands to its owner, in order.
#[derive(Debug)]
pub(crate) enum Delivery {
    /// A new event and its sequence number (when the frame had one).
    Event(Option<u64>, QueryEvent),
    /// The replay could not be trusted (it did not start at the id that was
    /// sent, or the event log is gone). Nothing after the gap was delivered;
    /// here is the stored turn, terminal, to finish from. The owner decides
    /// whether it makes up for the gap (see [`ReplayGap::into_error`]).
    Recovered(Box<types::Query>, ReplayGap),
}

/// Why a resumed event stream could not be trusted past `last_event_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplayGap {
    /// The turn.
    pub(crate) query_id: String,
    /// The last event delivered before the gap (the `Last-Event-ID` sent).
    pub(crate) last_event_id: Option<u64>,
    /// What the server did instead of replaying from it.
    pub(crate) cause: String,
}

impl ReplayGap {
    /// The error for a gap the stored turn does not make up for.
    pub(crate) fn into_error(self, detail: &str) -> Error {
        Error::ReplayGap {
            query_id: self.query_id,
            last_event_id: self.last_event_id,
            message: format!("{}; {detail}", self.cause),
        }
    }
}

/// The resumable connection. Owned by a `QueryTurn`; no task, no channel.
pub(crate) struct EventConnection {
    client: Client,
    config: StreamConfig,
    state: State,
    parser: SseParser,
    /// What the turn must be: every frame and document is checked against
    /// it, and it learns the turn's id and session as they are named.
    binding: TurnBinding,
    /// The sequence number of the last event read as new (where a
    /// reconnect resumes).
    last_seq: Option<u64>,
    /// The sequence number of the last event the turn delivered (events
    /// read may wait in [`align`] or the ready queue).
    delivered_seq: Option<u64>,
    /// Whether any event was delivered (with or without an id).
    delivered_any: bool,
    /// How many times the stream reconnected.
    resumes: u32,
    /// On a resumed connection: the id its first id-carrying frame must have
    /// (the `Last-Event-ID` sent). Cleared once it checked out.
    verify: Option<u64>,
    /// A terminal event was delivered: a later break needs no resume.
    terminal_seen: bool,
    /// The `retry:` the server asked for, kept across connections.
    retry: Option<Duration>,
    /// Resume bookkeeping since the last break; `None` while healthy.
    resume: Option<ResumeCycle>,
    /// When the last byte arrived (or the last request was sent).
    last_activity: Instant,
    /// The idle timer, armed while open or connecting.
    idle: Option<Pin<Box<Sleep>>>,
    failed: Option<Error>,
    /// The last id seen on the current connection (delivered or skipped).
    conn_last: Option<u64>,
    /// The last frame with an id parsed for delivery: its id and the hash
    /// of its data (a replay that resends it as it was shows its ids true).
    last_frame: Option<(u64, super::checkpoint::RollingText)>,
    /// Id-less frames other than text delivered since the last delivered id.
    idless_after_last: u32,
    /// Id-less frames after the last delivered id still to drop on this
    /// (resumed) connection.
    skip_idless: u32,
    /// `last_seq` when the stream last jumped: a second jump without
    /// progress reads the stored turn instead of resuming again.
    jump_at: Option<Option<u64>>,
    /// When the turn's reading started (its turn timeout counts from here).
    started: Instant,
    /// The one bound on the turn, the client's
    /// [`turn_timeout`](crate::ClientBuilder::turn_timeout).
    turn_timeout: Option<Duration>,
    /// The overall deadline, armed on the first poll.
    deadline: Option<Pin<Box<Sleep>>>,
    /// The wait for the `query` frame, armed at the terminal event.
    final_wait: Option<Pin<Box<Sleep>>>,
    /// The operation whose body is being read: `create_query` for the
    /// answer to `POST /query`, `stream_query_events` after a resume.
    body_operation: &'static str,
    /// The text delivered, and where a resumed replay's text stands
    /// against it (see [`align`]).
    align: align::Aligner,
    /// Events settled to deliver, in order, before anything else is read.
    ready: std::collections::VecDeque<Delivery>,
}

struct ResumeCycle {
    attempts: u32,
    started: Instant,
    backoff: Backoff,
}

impl std::fmt::Debug for EventConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Open(_) => "open",
            State::Waiting(_) => "waiting",
            State::Connecting(_) => "connecting",
            State::Recovering(..) => "recovering",
            State::Done => "done",
        };
        f.debug_struct("EventConnection")
            .field("state", &state)
            .field("query_id", &self.binding.query_id())
            .field("last_seq", &self.last_seq)
            .field("terminal_seen", &self.terminal_seen)
            .finish_non_exhaustive()
    }
}

/// What one parsed frame means for the connection.
enum Parsed {
    Deliver(Option<u64>, QueryEvent),
    /// Already delivered (a replayed event).
    Skip,
    /// The resumed connection did not replay from the id sent.
    Broken(String),
    /// An id beyond the next one: events are missing.
    Jump(String),
    /// The frame names another turn or session.
    Foreign(Error),
}

impl EventConnection {
    fn with_state(
        client: Client,
        config: StreamConfig,
        state: State,
        binding: TurnBinding,
    ) -> Self {
        let parser = new_parser(&config);
        let turn_timeout = client.transport().turn_timeout();
        EventConnection {
            client,
            config,
            state,
            parser,
            binding,
            last_seq: None,
            delivered_seq: None,
            delivered_any: false,
            verify: None,
            resumes: 0,
            terminal_seen: false,
            retry: None,
            resume: None,
            last_activity: Instant::now(),
            idle: None,
            failed: None,
            conn_last: None,
            last_frame: None,
            idless_after_last: 0,
            skip_idless: 0,
            jump_at: None,
            started: Instant::now(),
            turn_timeout,
            deadline: None,
            final_wait: None,
            body_operation: "stream_query_events",
            align: align::Aligner::default(),
            ready: std::collections::VecDeque::new(),
        }
    }

    /// Reads `resp`, an event stream of the turn `binding` describes.
    pub(crate) fn new(
        client: Client,
        config: StreamConfig,
        resp: reqwest::Response,
        binding: TurnBinding,
    ) -> Self {
        let body = State::Open(Box::pin(resp.bytes_stream()));
        let mut conn = EventConnection::with_state(client, config, body, binding);
        conn.body_operation = "create_query";
        conn
    }

    /// The same connection with the turn's deadline counted from `at` (the
    /// `POST /query` that started it) rather than from now.
    pub(crate) fn started_at(mut self, at: Instant) -> Self {
        self.started = at;
        self.deadline = None;
        self
    }

    /// When the turn's reading started (its deadline counts from here).
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// When the turn timeout passes, if it is bounded.
    pub(crate) fn deadline_at(&self) -> Option<Instant> {
        self.turn_timeout
            .and_then(|limit| self.started.checked_add(limit))
    }

    /// What is left of the turn timeout (`Duration::MAX` when unbounded):
    /// the limit of every wait for the stored turn.
    pub(crate) fn time_left(&self) -> Duration {
        self.deadline_at().map_or(Duration::MAX, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }

    /// A verified event stream of `query_id` after `last_seen`.
    ///
    /// Sends `GET /queries/{id}/events` with `Last-Event-ID: last_seen` (no
    /// header for `None`: from the start) and checks the contract on this and
    /// every later connection: the first frame with an id must carry exactly
    /// the id that was sent (it is not delivered again). Anything else (a
    /// later id, an earlier one, a non-numeric one), or a 404/410 for the
    /// event log, yields [`Delivery::Recovered`] with the stored turn once it
    /// is terminal, instead of events across the gap.
    pub(crate) fn resume(
        client: Client,
        config: StreamConfig,
        binding: TurnBinding,
        last_seen: Option<u64>,
    ) -> Self {
        let mut conn = EventConnection::with_state(client, config, State::Done, binding);
        conn.last_seq = last_seen;
        conn.delivered_seq = last_seen;
        conn.delivered_any = last_seen.is_some();
        conn.connect();
        conn
    }

    /// The final Query of `query_id` only (`GET /queries/{id}` once it is
    /// terminal): every event was delivered already.
    pub(crate) fn final_only(client: Client, config: StreamConfig, binding: TurnBinding) -> Self {
        let mut conn = EventConnection::with_state(client, config, State::Done, binding);
        conn.terminal_seen = true;
        conn.delivered_any = true;
        conn.fetch_final();
        conn
    }

    /// A connection of the ended turn `query_id` with nothing left to read.
    pub(crate) fn named_closed(client: Client, config: StreamConfig, binding: TurnBinding) -> Self {
        let mut conn = EventConnection::with_state(client, config, State::Done, binding);
        conn.terminal_seen = true;
        conn
    }

    pub(crate) fn query_id(&self) -> Option<&str> {
        self.binding.query_id()
    }

    /// What the turn must be (its id and session once known).
    pub(crate) fn binding(&self) -> &TurnBinding {
        &self.binding
    }

    /// The session every frame of this turn must name (a session that
    /// exists already, or the one the turn's first frame named).
    pub(crate) fn expect_session(&mut self, session_id: &str) {
        self.binding.expect_session(session_id);
    }

    /// The turn delivered `event` (its id `id`), wherever it came from:
    /// what a resumed replay is aligned on.
    pub(crate) fn note_delivered(&mut self, id: Option<u64>, event: &QueryEvent) {
        self.align.delivered(id, event);
        if id.is_some() {
            self.delivered_seq = id;
        }
    }

    /// The turn continues the text before a checkpoint: a replay is
    /// aligned on it too.
    pub(crate) fn continue_after(&mut self, delivered: align::Delivered) {
        self.align.after_checkpoint(delivered);
        self.align.resumed(self.last_seq);
    }

    /// The text delivered, as a checkpoint keeps it.
    pub(crate) fn delivered(&self) -> &align::Delivered {
        self.align.text()
    }

    /// Takes up the `retry:` the server sent, whenever it came.
    fn note_retry(&mut self) {
        if let Some(retry) = self.parser.retry() {
            // A server number: never beyond the policy's cap.
            self.retry = Some(retry.min(self.config.reconnect_max_delay));
        }
    }

    /// The sequence number of the last event the turn delivered.
    pub(crate) fn delivered_seq(&self) -> Option<u64> {
        self.delivered_seq
    }

    pub(crate) fn terminal_seen(&self) -> bool {
        self.terminal_seen
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// A connection that is over, to stand in for one moved elsewhere.
    pub(crate) fn closed(client: Client) -> Self {
        let binding = TurnBinding::default();
        EventConnection::with_state(client, StreamConfig::default(), State::Done, binding)
    }

    /// How many times the stream reconnected.
    pub(crate) fn resumes(&self) -> u32 {
        self.resumes
    }

    /// Closes the connection; the stream ends.
    pub(crate) fn close(&mut self) {
        self.state = State::Done;
    }

    /// Applies the parser's next frame, if a whole one is buffered.
    ///
    /// Ids are checked on every frame of every connection: an id not above
    /// the last delivered one is a replay (dropped), the next one is
    /// delivered, and a later one is a jump (events are missing). Frames
    /// without an id are delivered once: on a resumed connection those
    /// before the replay reached the last delivered event, and as many after
    /// it as were delivered before the break, are dropped.
    fn next_parsed(&mut self) -> Option<Result<Parsed, super::sse::SseError>> {
        let frame = match self.parser.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        let (event, data, bad_id) = (frame.event, frame.data, frame.bad_id);
        if let Err(e) = self.binding.check_frame(event, data) {
            return Some(Ok(Parsed::Foreign(e)));
        }
        if let Some(expected) = self.verify {
            if frame.bad_id {
                return Some(Ok(Parsed::Broken(format!(
                    "the replay started at a non-numeric event id instead of event {expected}"
                ))));
            }
            match frame.id {
                Some(id) if id == expected => {
                    tracing::trace!(seq = id, "the replay reached the last delivered event");
                    let resent = super::checkpoint::RollingText::of(data.as_bytes());
                    if self.last_frame == Some((id, resent)) {
                        self.align.ids_shown_true();
                    }
                    self.verify = None;
                    self.conn_last = Some(id);
                    return Some(Ok(Parsed::Skip));
                }
                Some(id) if Some(id) == expected.checked_add(1) => {
                    // The replay starts right after the id sent (SSE's
                    // usual meaning of `Last-Event-ID`): nothing is
                    // missing. The id-less frames before it were skipped.
                    tracing::trace!(seq = id, "the replay starts after the last delivered event");
                    self.verify = None;
                    self.skip_idless = 0;
                }
                Some(id) if id > expected => {
                    return Some(Ok(Parsed::Broken(format!(
                        "the replay started at event {id} instead of event {expected} \
                         (events {} to {id} are missing)",
                        expected.saturating_add(1)
                    ))));
                }
                Some(id) => {
                    // An early start: these were delivered already.
                    tracing::trace!(seq = id, expected, "skipping an early replayed event");
                    self.conn_last = Some(id);
                    return Some(Ok(Parsed::Skip));
                }
                None if frame.event == super::event::names::QUERY => {
                    return Some(Ok(Parsed::Broken(format!(
                        "the replay sent the final Query without event {expected}"
                    ))));
                }
                // Part of the replayed prefix, delivered already.
                None => return Some(Ok(Parsed::Skip)),
            }
        }
        if bad_id {
            // Without an order, the frame cannot be told new from replayed.
            return Some(Ok(Parsed::Broken(UNORDERED.to_owned())));
        }
        let event = QueryEvent::decode(frame.event, frame.data);
        match (frame.id, self.last_seq) {
            (Some(id), Some(last)) if id <= last => {
                tracing::trace!(seq = id, "skipping a replayed event");
                self.conn_last = Some(id);
                return Some(Ok(Parsed::Skip));
            }
            (Some(id), Some(last)) if id > last.saturating_add(1) => {
                return Some(Ok(Parsed::Jump(format!(
                    "the stream jumped from event {last} to event {id} (events {} to {} are missing)",
                    last.saturating_add(1),
                    id - 1
                ))));
            }
            (None, _) if frame.event != super::event::names::QUERY => {
                if self.conn_last != self.last_seq {
                    // Between replayed events: delivered already.
                    return Some(Ok(Parsed::Skip));
                }
                // Id-less text is aligned on its content (see [`align`]).
                if self.skip_idless > 0 && !matches!(event, QueryEvent::TextDelta { .. }) {
                    self.skip_idless -= 1;
                    return Some(Ok(Parsed::Skip));
                }
            }
            _ => {}
        }
        let id = frame.id;
        if let Some(id) = id {
            self.last_frame = Some((id, super::checkpoint::RollingText::of(data.as_bytes())));
        }
        if let QueryEvent::Query(query) = &event
            && let Err(e) = self.binding.check_query(query, "the final query frame")
        {
            return Some(Ok(Parsed::Foreign(e)));
        }
        Some(Ok(Parsed::Deliver(id, event)))
    }

    /// Whether the overall deadline passed; registers the timer otherwise.
    fn deadline_passed(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(at) = self.deadline_at() else {
            return false;
        };
        let sleep = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        sleep.as_mut().poll(cx).is_ready()
    }
}

fn new_parser(config: &StreamConfig) -> SseParser {
    SseParser::new(config.max_frame_bytes).with_query_frame_limit(config.query_frame_limit())
}

/// Whether a failed events request is worth another try.
fn resumable(e: &Error) -> bool {
    match e {
        Error::Api(api) => crate::error::is_retryable_status(api.status),
        Error::Transport { .. } | Error::Timeout { .. } => true,
        Error::Stream { .. } => false,
        _ => false,
    }
}

pub(crate) mod align;
mod poll;
mod recovery;

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;

/// Why a frame whose id is not a decimal number breaks the stream.
const UNORDERED: &str = "an event id is not a decimal number, so the events cannot be ordered";
