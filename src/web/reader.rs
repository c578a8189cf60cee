//! [`Reader`]: one connection reading a relayed turn's shared frames, with
//! heartbeats and a charge against the relay's reader memory ([`Budget`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::response::sse::Event;
use tokio::time::Instant;

use super::entry::Entry;
use super::ring::Next;
use super::{HEARTBEAT, READER_COST, SNAPSHOT};

/// The bytes the relay's connections may hold, and hold now.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Self {
        Budget {
            limit,
            used: AtomicUsize::new(0),
        }
    }

    /// Takes `bytes` when they fit under the limit.
    pub(crate) fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    pub(crate) fn give(&self, bytes: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }

    /// The bytes held now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// One connection reading a turn's frames.
pub(crate) struct Reader {
    entry: Arc<Entry>,
    budget: Arc<Budget>,
    after: u64,
    /// The bytes of the frame handed out last, charged until the next ask.
    in_flight: usize,
    heartbeat: Duration,
    /// When the next heartbeat is due (`None`: at once, the first frame).
    next_beat: Option<Instant>,
    /// The `retry:` to send once, with the first frame.
    retry: Option<Duration>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.budget.give(READER_COST.saturating_add(self.in_flight));
    }
}

impl Reader {
    /// A reader after frame `after`, once [`READER_COST`] was taken from
    /// `budget` for it (the reader gives it back when dropped).
    pub(crate) fn new(
        entry: Arc<Entry>,
        budget: Arc<Budget>,
        after: u64,
        heartbeat: Duration,
        retry: Duration,
    ) -> Self {
        Reader {
            entry,
            budget,
            after,
            in_flight: 0,
            heartbeat,
            next_beat: None,
            retry: Some(retry),
        }
    }

    fn beat(&self) -> Event {
        let interval = u64::try_from(self.heartbeat.as_millis()).unwrap_or(u64::MAX);
        Event::default()
            .event(HEARTBEAT)
            .data(serde_json::json!({ "interval_ms": interval }).to_string())
    }

    /// The next frame: the ring's next, or a heartbeat when nothing came
    /// for a heartbeat interval; `None` at the turn's end, or when the
    /// frame does not fit the relay's reader memory.
    pub(crate) async fn next(mut self) -> Option<(Event, Reader)> {
        self.budget.give(std::mem::take(&mut self.in_flight));
        let entry = Arc::clone(&self.entry);
        while let Some(due) = self.next_beat {
            // Registered before looking, so a frame pushed in between wakes us.
            let changed = entry.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let next = entry.ring().next_after(self.after);
            let (event, bytes, id) = match next {
                Next::Frame(frame) => {
                    let bytes = frame.bytes();
                    let event = Event::default()
                        .id(frame.id.to_string())
                        .event(frame.event.as_str())
                        .data(frame.data.as_str());
                    (event, bytes, frame.id)
                }
                Next::Snapshot { id, text } => {
                    let data = serde_json::json!({ "text": text }).to_string();
                    let bytes = data.len();
                    let event = Event::default()
                        .id(id.to_string())
                        .event(SNAPSHOT)
                        .data(data);
                    (event, bytes, id)
                }
                Next::End => return None,
                Next::Wait => {
                    tokio::select! {
                        () = &mut changed => continue,
                        () = tokio::time::sleep_until(due) => break,
                    }
                }
            };
            if !self.budget.take(bytes) {
                tracing::debug!(bytes, "a relayed frame does not fit the reader memory");
                return None;
            }
            self.in_flight = bytes;
            self.after = id;
            self.next_beat = Some(Instant::now() + self.heartbeat);
            return Some((self.with_retry(event), self));
        }
        // A heartbeat: the first frame of every connection, then one per
        // interval without other frames.
        self.next_beat = Some(Instant::now() + self.heartbeat);
        let event = self.beat();
        Some((self.with_retry(event), self))
    }

    fn with_retry(&mut self, event: Event) -> Event {
        match self.retry.take() {
            Some(retry) => event.retry(retry),
            None => event,
        }
    }
}
