//! The event log of one query turn: numbered events, kept for replay, with
//! live followers.
//!
//! Every turn (synchronous, streaming or background) writes its events here.
//! A stream is a follower that starts at some sequence number (inclusive, as
//! `Last-Event-ID` asks), receives what is logged and what arrives next, and
//! ends with the id-less `query` frame once the turn is over.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::Stream;
use tokio::sync::watch;

use crate::types;

/// One SSE frame: a numbered event, or the closing `query` frame (no id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    /// The sequence number (`id:`); `None` for the closing `query` frame.
    pub(crate) seq: Option<u64>,
    /// The `event:` name.
    pub(crate) event: String,
    /// The JSON `data:`.
    pub(crate) data: String,
}

/// A turn's end could not be saved: its stream is cut without the terminal
/// event, so the client resumes (and finds the turn as the disk has it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EndNotSaved;

/// The log refused an event: it holds its maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogFull;

#[derive(Debug, Default)]
struct LogState {
    events: Vec<Arc<Frame>>,
    closing: Option<Arc<Frame>>,
    /// The last event is the terminal one, shown to followers only once
    /// the log is closed (after the turn's end is on disk).
    held: bool,
    /// Whether the turn's end was saved when the log was closed.
    saved: bool,
    /// The log was closed without saving the turn's end: the held terminal
    /// event is never shown, and followers are cut.
    cut: bool,
    /// Bytes of the events logged (names and data).
    bytes: usize,
    /// Bytes of this log counted in the shared `unsaved` total (until the
    /// turn's events are handed to the database writer).
    counted: u64,
}

/// A query turn's events. Cheap to share (`Arc`).
#[derive(Debug)]
pub(crate) struct EventLog {
    state: Mutex<LogState>,
    /// Bumped on every change so followers wake up.
    changed: watch::Sender<u64>,
    /// Most events kept; the terminal event is always accepted.
    limit: usize,
    /// Most bytes kept (event names and data); the terminal event is always
    /// accepted.
    max_bytes: usize,
    /// Bytes logged by running turns and not yet handed to the database
    /// writer, shared by every turn's log: counted in the write backlog.
    unsaved: Option<Arc<AtomicU64>>,
}

impl Drop for EventLog {
    fn drop(&mut self) {
        self.uncount();
    }
}

impl EventLog {
    /// A log that keeps at most `limit` events and `max_bytes` bytes of them
    /// (the terminal event is accepted past either).
    pub(crate) fn new(limit: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(Self::unshared(limit, max_bytes, None))
    }

    /// Like [`new`](Self::new), adding the bytes of each event to `unsaved`
    /// until [`uncount`](Self::uncount) (or drop).
    pub(crate) fn counted_in(limit: usize, max_bytes: usize, unsaved: Arc<AtomicU64>) -> Arc<Self> {
        Arc::new(Self::unshared(limit, max_bytes, Some(unsaved)))
    }

    fn unshared(limit: usize, max_bytes: usize, unsaved: Option<Arc<AtomicU64>>) -> Self {
        EventLog {
            state: Mutex::new(LogState::default()),
            changed: watch::Sender::new(0),
            limit: limit.max(2),
            max_bytes,
            unsaved,
        }
    }

    /// Takes this log's bytes out of the shared `unsaved` total: its events
    /// are being handed to the database writer, whose backlog counts them
    /// from now on.
    pub(crate) fn uncount(&self) {
        let counted = std::mem::take(&mut self.lock().counted);
        if let Some(unsaved) = &self.unsaved {
            unsaved.fetch_sub(counted, Ordering::SeqCst);
        }
    }

    /// A log for a turn read from the database: its stored events and its
    /// final document.
    pub(crate) fn restored(events: Vec<Frame>, query: &types::Query) -> Arc<Self> {
        let log = Self::new(events.len().saturating_add(2), usize::MAX);
        {
            let mut s = log.lock();
            s.bytes = events.iter().fold(0usize, |n, f| {
                n.saturating_add(f.event.len()).saturating_add(f.data.len())
            });
            s.events = events.into_iter().map(Arc::new).collect();
        }
        log.finish(query, true);
        log
    }

    /// Every event logged, the held terminal one included.
    pub(crate) fn frames(&self) -> Vec<Arc<Frame>> {
        self.lock().events.clone()
    }

    /// Whether the turn's end was saved before the log closed.
    pub(crate) fn saved(&self) -> bool {
        self.lock().saved
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends an event and returns its sequence number (from 1).
    /// `terminal` events are accepted even when the log is full.
    pub(crate) fn push(&self, event: &types::QueryEvent, terminal: bool) -> Result<u64, LogFull> {
        let seq = {
            let mut s = self.lock();
            if s.closing.is_some() || (!terminal && s.events.len() + 1 >= self.limit) {
                return Err(LogFull);
            }
            let seq = s.events.len() as u64 + 1;
            let data = serde_json::to_string(event).unwrap_or_else(|_| "{}".to_owned());
            let bytes = s
                .bytes
                .saturating_add(event.type_.len())
                .saturating_add(data.len());
            if !terminal && bytes > self.max_bytes {
                return Err(LogFull);
            }
            if let Some(unsaved) = &self.unsaved {
                let added = u64::try_from(bytes.saturating_sub(s.bytes)).unwrap_or(u64::MAX);
                unsaved.fetch_add(added, Ordering::SeqCst);
                s.counted = s.counted.saturating_add(added);
            }
            s.bytes = bytes;
            s.events.push(Arc::new(Frame {
                seq: Some(seq),
                event: event.type_.clone(),
                data,
            }));
            s.held = terminal;
            seq
        };
        self.changed.send_modify(|v| *v += 1);
        Ok(seq)
    }

    /// Closes the log with the turn's final document; `saved` tells
    /// whether the turn's end is on disk. When it is not, the terminal
    /// event stays hidden and followers are cut instead of told the end.
    pub(crate) fn finish(&self, query: &types::Query, saved: bool) {
        {
            let mut s = self.lock();
            s.saved = saved;
            if !saved {
                s.cut = true;
                drop(s);
                self.changed.send_modify(|v| *v += 1);
                return;
            }
            s.held = false;
            let data = serde_json::to_string(query).unwrap_or_else(|_| "{}".to_owned());
            s.closing = Some(Arc::new(Frame {
                seq: None,
                event: "query".to_owned(),
                data,
            }));
        }
        self.changed.send_modify(|v| *v += 1);
    }

    /// Whether the closing frame has been written.
    pub(crate) fn is_finished(&self) -> bool {
        let s = self.lock();
        s.closing.is_some() || s.cut
    }

    /// The number of events logged.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().events.len()
    }

    /// Waits until the log is closed.
    pub(crate) async fn wait_finished(&self) {
        let mut rx = self.changed.subscribe();
        loop {
            rx.borrow_and_update();
            if self.is_finished() {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Frames from sequence number `from` (inclusive; 0 and 1 both mean the
    /// first event), then live ones, then the closing `query` frame; or,
    /// when the turn's end could not be saved, [`EndNotSaved`] instead of
    /// the terminal event and the closing frame.
    pub(crate) fn follow(
        self: Arc<Self>,
        from: u64,
    ) -> impl Stream<Item = Result<Arc<Frame>, EndNotSaved>> + Send {
        let rx = self.changed.subscribe();
        let next = from.saturating_sub(1) as usize;
        futures::stream::unfold(
            (self, rx, next, false),
            |(log, mut rx, next, done)| async move {
                if done {
                    return None;
                }
                loop {
                    rx.borrow_and_update();
                    let (event, closing, cut) = {
                        let s = log.lock();
                        let visible = s.events.len() - usize::from(s.held);
                        let event = s.events.get(next).filter(|_| next < visible).cloned();
                        (event, s.closing.clone(), s.cut)
                    };
                    if let Some(frame) = event {
                        return Some((Ok(frame), (log, rx, next + 1, false)));
                    }
                    if let Some(frame) = closing {
                        return Some((Ok(frame), (log, rx, next, true)));
                    }
                    if cut {
                        return Some((Err(EndNotSaved), (log, rx, next, true)));
                    }
                    if rx.changed().await.is_err() {
                        return None;
                    }
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn event(kind: &str) -> types::QueryEvent {
        serde_json::from_value(serde_json::json!({"type": kind, "query_id": "q"})).unwrap()
    }

    fn query() -> types::Query {
        serde_json::from_value(serde_json::json!({
            "id": "q", "object": "query", "session_id": "s", "created": 0, "status": crate::status::word::COMPLETED,
            "input": [], "output": [], "citations": [], "steps": [],
            "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}, "runtime_ms": 0
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn replay_is_inclusive_and_ends_with_the_query_frame() {
        let log = EventLog::new(100, usize::MAX);
        for k in ["response.created", "response.step", "response.completed"] {
            log.push(&event(k), false).unwrap();
        }
        log.finish(&query(), true);
        let frames: Vec<_> = log.clone().follow(2).map(Result::unwrap).collect().await;
        let ids: Vec<_> = frames.iter().map(|f| f.seq).collect();
        assert_eq!(ids, vec![Some(2), Some(3), None]);
        assert_eq!(frames[2].event, "query");
        let all: Vec<_> = log.follow(0).collect().await;
        assert_eq!(all.len(), 4);
    }

    #[tokio::test]
    async fn followers_receive_live_events() {
        let log = EventLog::new(100, usize::MAX);
        log.push(&event("response.created"), false).unwrap();
        let mut follower = Box::pin(log.clone().follow(1));
        assert_eq!(follower.next().await.unwrap().unwrap().seq, Some(1));
        let writer = {
            let log = log.clone();
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                log.push(&event("response.completed"), true).unwrap();
                log.finish(&query(), true);
            })
        };
        assert_eq!(follower.next().await.unwrap().unwrap().seq, Some(2));
        assert_eq!(follower.next().await.unwrap().unwrap().event, "query");
        assert!(follower.next().await.is_none());
        writer.await.unwrap();
    }

    /// Catches a turn whose end was not saved being streamed as ended
    /// (the guard on `saved` in `finish` removed): followers get the events
    /// before the terminal one, then a cut; never the terminal event or the
    /// closing frame.
    #[tokio::test]
    async fn an_end_not_saved_cuts_followers_before_the_terminal_event() {
        let log = EventLog::new(100, usize::MAX);
        log.push(&event("response.created"), false).unwrap();
        log.push(&event("response.completed"), true).unwrap();
        let live = tokio::spawn(log.clone().follow(1).collect::<Vec<_>>());
        tokio::task::yield_now().await;
        log.finish(&query(), false);
        assert!(log.is_finished() && !log.saved());
        for frames in [live.await.unwrap(), log.clone().follow(1).collect().await] {
            assert_eq!(frames.len(), 2, "{frames:?}");
            assert_eq!(frames[0].as_ref().unwrap().event, "response.created");
            assert_eq!(frames[1], Err(EndNotSaved));
        }
    }

    #[test]
    fn a_full_log_still_takes_the_terminal_event() {
        let log = EventLog::new(3, usize::MAX);
        log.push(&event("a"), false).unwrap();
        log.push(&event("b"), false).unwrap();
        assert_eq!(log.push(&event("c"), false), Err(LogFull));
        assert_eq!(log.push(&event("response.failed"), true), Ok(3));
        assert_eq!(log.len(), 3);
    }

    #[test]
    fn a_log_is_bounded_by_bytes_and_still_takes_the_terminal_event() {
        let one = serde_json::to_string(&event("response.step"))
            .unwrap()
            .len()
            + "response.step".len();
        let log = EventLog::new(100, one * 2);
        log.push(&event("response.step"), false).unwrap();
        log.push(&event("response.step"), false).unwrap();
        assert_eq!(log.push(&event("response.step"), false), Err(LogFull));
        assert_eq!(log.len(), 2);
        log.push(&event("response.completed"), true).unwrap();
        assert_eq!(log.len(), 3);
    }
}
