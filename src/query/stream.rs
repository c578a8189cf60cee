//! The resumable event connection behind [`QueryTurn`](crate::QueryTurn):
//! reads SSE frames, drops replayed ones, and reconnects with
//! `Last-Event-ID` when the connection breaks.
//!
//! Exactly-once delivery rests on two facts of the API: every progress frame
//! carries its sequence number as `id:`, and `GET /queries/{id}/events` with
//! `Last-Event-ID: N` replays from N inclusively. So after a break the
//! stream reconnects with the last sequence number it delivered and skips
//! every frame whose id is not greater. The `POST /query` that started the
//! turn is never sent again: that would start a second turn.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use backoff::backoff::Backoff;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::time::{Instant, Sleep};

use super::event::QueryEvent;
use super::sse::{DEFAULT_MAX_FRAME_BYTES, SseParser};
use crate::Client;
use crate::error::{Error, Result};

/// How a turn's event stream reads, limits and resumes.
///
/// ```
/// use std::time::Duration;
/// use nexus_knowql::StreamConfig;
/// let config = StreamConfig::default()
///     .idle_timeout(Some(Duration::from_secs(30)))
///     .max_frame_bytes(1 << 20)
///     .resume_attempts(5);
/// # let _ = config;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct StreamConfig {
    idle_timeout: Option<Duration>,
    max_frame_bytes: usize,
    resume_attempts: u32,
    resume_max_elapsed: Duration,
    resume_delay: Duration,
    resume_max_delay: Duration,
    cancel_on_drop: bool,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            idle_timeout: Some(Duration::from_secs(60)),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            resume_attempts: 8,
            resume_max_elapsed: Duration::from_secs(120),
            resume_delay: Duration::from_millis(250),
            resume_max_delay: Duration::from_secs(10),
            cancel_on_drop: false,
        }
    }
}

impl StreamConfig {
    /// Reconnect when no byte (SSE comments included) arrives for this long
    /// (default 60 s); `None` waits forever.
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// The most bytes one SSE frame may have (default 4 MiB); a larger frame
    /// ends the stream with [`Error::Stream`].
    pub fn max_frame_bytes(mut self, limit: usize) -> Self {
        self.max_frame_bytes = limit.max(1);
        self
    }

    /// Reconnections tried after one break before giving up (default 8).
    /// The count starts again once a reconnection delivers a new event.
    pub fn resume_attempts(mut self, attempts: u32) -> Self {
        self.resume_attempts = attempts;
        self
    }

    /// Total time spent reconnecting after one break before giving up (default 120 s).
    pub fn resume_max_elapsed(mut self, limit: Duration) -> Self {
        self.resume_max_elapsed = limit;
        self
    }

    /// Whether dropping the [`QueryTurn`](crate::QueryTurn) before the turn
    /// ended cancels it on the server (default `false`: the turn goes on and
    /// its session remembers it). The cancel (`POST /queries/{id}/cancel`)
    /// runs as a task on the current Tokio runtime, since a drop cannot
    /// wait; a turn dropped before the server named it cannot be cancelled.
    /// [`QueryTurn::detach`](crate::QueryTurn::detach) never cancels.
    pub fn cancel_on_drop(mut self, on: bool) -> Self {
        self.cancel_on_drop = on;
        self
    }

    pub(crate) fn cancel_on_drop_enabled(&self) -> bool {
        self.cancel_on_drop
    }

    /// The first delay before reconnecting (default 250 ms) when the stream
    /// sent no `retry:` field, and the cap delays grow to (default 10 s).
    pub fn resume_delay(mut self, first: Duration, max: Duration) -> Self {
        self.resume_delay = first;
        self.resume_max_delay = max.max(first);
        self
    }
}

type BodyStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;
type Connect = Pin<Box<dyn Future<Output = Result<reqwest::Response>> + Send>>;

enum State {
    /// Reading a response body.
    Open(BodyStream),
    /// Waiting out the backoff before reconnecting.
    Waiting(Pin<Box<Sleep>>),
    /// `GET /queries/{id}/events` sent, waiting for the answer.
    Connecting(Connect),
    /// The stream is over (the error in `failed`, if any, is reported once).
    Done,
}

/// One delivered frame: its sequence number (when it had one) and its event.
pub(crate) type Delivered = (Option<u64>, QueryEvent);

/// The resumable connection. Owned by a `QueryTurn`; no task, no channel.
pub(crate) struct EventConnection {
    client: Client,
    config: StreamConfig,
    state: State,
    parser: SseParser,
    query_id: Option<String>,
    /// The sequence number of the last delivered event.
    last_seq: Option<u64>,
    /// A terminal event was delivered: a later break needs no resume.
    terminal_seen: bool,
    /// The id the next id-carrying frame must have: a connection opened with
    /// `Last-Event-ID: N` replays from N inclusively, so its first frame
    /// with an id is N (already delivered) or the replay is broken.
    expect_replay_of: Option<u64>,
    /// Whether every resumed connection's replay is checked as well (a
    /// stream continued from a checkpoint).
    verify_replays: bool,
    /// How many times the stream reconnected.
    resumes: u32,
    /// The `retry:` the server asked for, kept across connections.
    retry: Option<Duration>,
    /// Resume bookkeeping since the last break; `None` while healthy.
    resume: Option<ResumeCycle>,
    /// When the last byte arrived (or the last request was sent).
    last_activity: Instant,
    /// The idle timer, armed while open or connecting.
    idle: Option<Pin<Box<Sleep>>>,
    failed: Option<Error>,
}

struct ResumeCycle {
    attempts: u32,
    started: Instant,
    backoff: backoff::ExponentialBackoff,
}

impl std::fmt::Debug for EventConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Open(_) => "open",
            State::Waiting(_) => "waiting",
            State::Connecting(_) => "connecting",
            State::Done => "done",
        };
        f.debug_struct("EventConnection")
            .field("state", &state)
            .field("query_id", &self.query_id)
            .field("last_seq", &self.last_seq)
            .field("terminal_seen", &self.terminal_seen)
            .finish_non_exhaustive()
    }
}

/// Percent-encodes one path segment.
pub(crate) fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `GET /queries/{id}/events`, with `Last-Event-ID` when given.
pub(crate) async fn open_events(
    client: &Client,
    query_id: &str,
    last_event_id: Option<u64>,
) -> Result<reqwest::Response> {
    let mut req = client
        .request(
            reqwest::Method::GET,
            &format!("/queries/{}/events", path_segment(query_id)),
        )
        .header(reqwest::header::ACCEPT, "text/event-stream");
    if let Some(n) = last_event_id {
        req = req.header("Last-Event-ID", n.to_string());
    }
    let resp = client.send("stream_query_events", req).await?;
    expect_event_stream("stream_query_events", Some(query_id), resp)
}

/// Checks that a 2xx answer is an event stream.
pub(crate) fn expect_event_stream(
    operation: &'static str,
    query_id: Option<&str>,
    resp: reqwest::Response,
) -> Result<reqwest::Response> {
    let content_type = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type.is_empty() || content_type.starts_with("text/event-stream") {
        Ok(resp)
    } else {
        Err(Error::Stream {
            query_id: query_id.map(str::to_owned),
            message: format!("{operation}: expected text/event-stream, got {content_type:?}"),
        })
    }
}

impl EventConnection {
    /// Reads `resp`, an event stream of the turn `query_id` (if known yet).
    pub(crate) fn new(
        client: Client,
        config: StreamConfig,
        resp: reqwest::Response,
        query_id: Option<String>,
    ) -> Self {
        let parser = SseParser::new(config.max_frame_bytes);
        EventConnection {
            client,
            config,
            state: State::Open(Box::pin(resp.bytes_stream())),
            parser,
            query_id,
            last_seq: None,
            expect_replay_of: None,
            verify_replays: false,
            resumes: 0,
            terminal_seen: false,
            retry: None,
            resume: None,
            last_activity: Instant::now(),
            idle: None,
            failed: None,
        }
    }

    /// A connection that is over, to stand in for one moved elsewhere.
    pub(crate) fn closed(client: Client) -> Self {
        let config = StreamConfig::default();
        EventConnection {
            client,
            parser: SseParser::new(config.max_frame_bytes),
            config,
            state: State::Done,
            query_id: None,
            last_seq: None,
            expect_replay_of: None,
            verify_replays: false,
            resumes: 0,
            terminal_seen: false,
            retry: None,
            resume: None,
            last_activity: Instant::now(),
            idle: None,
            failed: None,
        }
    }

    pub(crate) fn query_id(&self) -> Option<&str> {
        self.query_id.as_deref()
    }

    pub(crate) fn last_seq(&self) -> Option<u64> {
        self.last_seq
    }

    /// Treats events up to `seq` as delivered, and checks that the
    /// connection (opened with `Last-Event-ID: seq`) replays from exactly
    /// `seq`.
    pub(crate) fn resume_from(&mut self, seq: u64) {
        self.last_seq = Some(seq);
        self.expect_replay_of = Some(seq);
        self.verify_replays = true;
    }

    /// How many times the stream reconnected.
    pub(crate) fn resumes(&self) -> u32 {
        self.resumes
    }

    pub(crate) fn terminal_seen(&self) -> bool {
        self.terminal_seen
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Closes the connection; the stream ends.
    pub(crate) fn close(&mut self) {
        self.state = State::Done;
    }

    /// The next new event, in order, exactly once.
    pub(crate) fn poll_next_event(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Delivered>>> {
        loop {
            if let State::Open(_) = self.state {
                match self.parser.next_frame() {
                    Ok(Some(frame)) => {
                        if let (Some(id), Some(expected)) = (frame.id, self.expect_replay_of) {
                            self.expect_replay_of = None;
                            if id != expected {
                                tracing::warn!(
                                    query_id = self.query_id.as_deref(),
                                    expected,
                                    got = id,
                                    "broken replay"
                                );
                                self.fail(Error::Stream {
                                    query_id: self.query_id.clone(),
                                    message: format!(
                                        "broken replay: asked to replay from event {expected}, \
                                         the first event replayed was {id}"
                                    ),
                                });
                                continue;
                            }
                        }
                        if let (Some(id), Some(last)) = (frame.id, self.last_seq)
                            && id <= last
                        {
                            tracing::trace!(seq = id, "skipping a replayed event");
                            continue;
                        }
                        let id = frame.id;
                        let event = QueryEvent::decode(frame.event, frame.data);
                        tracing::trace!(seq = id, event = event.name(), "event");
                        if id.is_some() {
                            self.last_seq = id;
                            // New progress: a later break starts a fresh resume budget.
                            self.resume = None;
                        }
                        match &event {
                            QueryEvent::Created { query_id, .. } if self.query_id.is_none() => {
                                self.query_id = Some(query_id.clone());
                            }
                            QueryEvent::Query(q) => {
                                if self.query_id.is_none() {
                                    self.query_id = Some(q.id.clone());
                                }
                                // The document is the last frame: close now.
                                self.state = State::Done;
                            }
                            e if e.is_terminal() => self.terminal_seen = true,
                            _ => {}
                        }
                        return Poll::Ready(Some(Ok((id, event))));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.fail(Error::Stream {
                            query_id: self.query_id.clone(),
                            message: e.to_string(),
                        });
                        continue;
                    }
                }
            }
            match &mut self.state {
                State::Open(body) => match body.poll_next_unpin(cx) {
                    Poll::Ready(Some(Ok(bytes))) => {
                        self.last_activity = Instant::now();
                        self.parser.feed(&bytes);
                        if let Some(retry) = self.parser.retry() {
                            self.retry = Some(retry);
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        let e = self
                            .client
                            .transport()
                            .map_reqwest("stream_query_events", e);
                        self.reconnect(&format!("the connection failed: {e}"));
                    }
                    Poll::Ready(None) => {
                        if self.terminal_seen {
                            self.state = State::Done;
                        } else {
                            self.reconnect("the stream ended before the turn did");
                        }
                    }
                    Poll::Pending => {
                        if self.idle_expired(cx) {
                            let idle = self.config.idle_timeout.unwrap_or_default();
                            self.reconnect(&format!("no bytes for {} ms", idle.as_millis()));
                        } else {
                            return Poll::Pending;
                        }
                    }
                },
                State::Waiting(sleep) => {
                    ready!(sleep.as_mut().poll(cx));
                    self.connect();
                }
                State::Connecting(fut) => match fut.as_mut().poll(cx) {
                    Poll::Ready(Ok(resp)) => {
                        tracing::debug!(query_id = self.query_id.as_deref(), "resumed");
                        self.parser = SseParser::new(self.config.max_frame_bytes);
                        self.last_activity = Instant::now();
                        self.state = State::Open(Box::pin(resp.bytes_stream()));
                    }
                    Poll::Ready(Err(e)) => {
                        if resumable(&e) {
                            self.reconnect(&e.to_string());
                        } else {
                            // A 4xx (the turn is gone, access was revoked...): final.
                            self.fail(e);
                        }
                    }
                    Poll::Pending => {
                        if self.idle_expired(cx) {
                            self.reconnect("the events request got no answer in time");
                        } else {
                            return Poll::Pending;
                        }
                    }
                },
                State::Done => return Poll::Ready(self.failed.take().map(Err)),
            }
        }
    }

    fn fail(&mut self, e: Error) {
        self.state = State::Done;
        self.failed = Some(e);
    }

    /// Whether the idle limit passed; registers the timer otherwise.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(limit) = self.config.idle_timeout else {
            return false;
        };
        // The timer is re-armed lazily: bytes only move `last_activity`, so
        // the hot path never touches the timer wheel. The armed deadline is
        // never later than the real one, because activity only moves it on.
        let deadline = self.last_activity + limit;
        let sleep = self
            .idle
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_pending() {
            return false;
        }
        if Instant::now() < deadline {
            sleep.as_mut().reset(deadline);
            return sleep.as_mut().poll(cx).is_ready();
        }
        true
    }

    /// Schedules a reconnection after a break, or ends the stream.
    fn reconnect(&mut self, cause: &str) {
        self.state = State::Done;
        let Some(query_id) = self.query_id.clone() else {
            self.failed = Some(Error::Stream {
                query_id: None,
                message: format!(
                    "{cause} before the server named the turn; it cannot be resumed and is not \
                     sent again (that would start a second turn)"
                ),
            });
            return;
        };
        let now = Instant::now();
        let base = self.retry.unwrap_or(self.config.resume_delay);
        let cycle = self.resume.get_or_insert_with(|| ResumeCycle {
            attempts: 0,
            started: now,
            backoff: backoff::ExponentialBackoff {
                current_interval: base,
                initial_interval: base,
                randomization_factor: 0.2,
                multiplier: 2.0,
                max_interval: self.config.resume_max_delay.max(base),
                max_elapsed_time: None,
                ..backoff::ExponentialBackoff::default()
            },
        });
        let delay = cycle
            .backoff
            .next_backoff()
            .unwrap_or(self.config.resume_max_delay);
        let spent = now.duration_since(cycle.started);
        if cycle.attempts >= self.config.resume_attempts
            || spent + delay > self.config.resume_max_elapsed
        {
            tracing::warn!(
                query_id,
                attempts = cycle.attempts,
                "giving up resuming the event stream"
            );
            self.failed = Some(Error::Stream {
                query_id: Some(query_id),
                message: format!("gave up after {} reconnections: {cause}", cycle.attempts),
            });
            return;
        }
        cycle.attempts += 1;
        tracing::debug!(
            query_id,
            attempt = cycle.attempts,
            delay_ms = delay.as_millis() as u64,
            last_seq = self.last_seq,
            cause,
            "resuming the event stream"
        );
        self.state = State::Waiting(Box::pin(tokio::time::sleep(delay)));
    }

    fn connect(&mut self) {
        let Some(query_id) = self.query_id.clone() else {
            self.state = State::Done;
            return;
        };
        let client = self.client.clone();
        let last = self.last_seq;
        if self.verify_replays {
            self.expect_replay_of = last;
        }
        self.resumes = self.resumes.saturating_add(1);
        self.last_activity = Instant::now();
        self.state = State::Connecting(Box::pin(async move {
            open_events(&client, &query_id, last).await
        }));
    }
}

/// Whether a failed events request is worth another try.
fn resumable(e: &Error) -> bool {
    match e {
        Error::Api(api) => crate::client::retry::is_retryable_status(api.status),
        Error::Transport { .. } | Error::Timeout { .. } => true,
        Error::Stream { .. } => false,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(path_segment("q_1-a.b~"), "q_1-a.b~");
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn only_server_trouble_is_resumable() {
        let api = |s| Error::api("op", s, None, String::new(), None, None);
        assert!(resumable(&api(503)));
        assert!(resumable(&api(429)));
        assert!(!resumable(&api(404)));
        assert!(!resumable(&api(403)));
        assert!(resumable(&Error::Timeout {
            operation: "op",
            elapsed_ms: 1
        }));
    }
}
