//! [`Entry`]: one relayed turn (its ring and its readers' wake-up), and the
//! task that reads the turn into it, then ends and drops it after its time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::error::Error;
use crate::query::{QueryEvent, QueryTurn, names};

use super::ring::Ring;
use super::{EXPIRED, RELAY_ERROR};

/// The relayed turns by relay id.
pub(crate) type Turns = Mutex<HashMap<String, Arc<Entry>>>;

/// One relayed turn: its ring, the readers' wake-up and the task reading it.
pub(crate) struct Entry {
    ring: Mutex<Ring>,
    pub(crate) changed: Notify,
    pub(crate) started: Instant,
    ended_at: Mutex<Option<Instant>>,
    pump: Mutex<Option<AbortHandle>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Entry {
    pub(crate) fn new(ring: Ring) -> Self {
        Entry {
            ring: Mutex::new(ring),
            changed: Notify::new(),
            started: Instant::now(),
            ended_at: Mutex::new(None),
            pump: Mutex::new(None),
        }
    }

    pub(crate) fn ring(&self) -> MutexGuard<'_, Ring> {
        lock(&self.ring)
    }

    /// When the turn ended, if it has.
    pub(crate) fn ended_at(&self) -> Option<Instant> {
        *lock(&self.ended_at)
    }

    pub(crate) fn set_pump(&self, pump: AbortHandle) {
        *lock(&self.pump) = Some(pump);
    }

    fn push(&self, event: &str, data: String, delta: Option<&str>) {
        self.ring().push(event.to_owned(), data, delta);
        self.changed.notify_waiters();
    }

    fn end(&self) {
        self.ring().end();
        lock(&self.ended_at).get_or_insert_with(Instant::now);
        self.changed.notify_waiters();
    }

    /// Stops reading the turn and ends its readers: those of a turn that
    /// had not ended get an [`EXPIRED`] frame first. Idempotent.
    pub(crate) fn stop(&self) {
        if let Some(pump) = lock(&self.pump).take() {
            pump.abort();
        }
        let mut ring = self.ring();
        if !ring.ended() {
            let data = serde_json::json!({ "message": "the relay stopped relaying this turn" });
            ring.push(EXPIRED.to_owned(), data.to_string(), None);
            ring.end();
        }
        drop(ring);
        lock(&self.ended_at).get_or_insert_with(Instant::now);
        self.changed.notify_waiters();
    }
}

/// What the relay's task for one turn needs.
pub(crate) struct Lifetime {
    pub(crate) relay_id: String,
    pub(crate) turns: Weak<Turns>,
    pub(crate) max_age: Duration,
    pub(crate) keep_ended: Duration,
}

/// Reads the turn into the entry until its end or `max_age`, keeps an
/// ended turn for `keep_ended` (within `max_age`), then ends its readers
/// and drops it from the relay.
pub(crate) async fn relay_turn(
    turn: QueryTurn,
    entry: Arc<Entry>,
    named: tokio::sync::oneshot::Sender<Result<String, Option<Error>>>,
    life: Lifetime,
) {
    let deadline = entry.started + life.max_age;
    if tokio::time::timeout_at(deadline, pump(turn, &entry, named))
        .await
        .is_ok()
    {
        let keep_until = Instant::now() + life.keep_ended;
        tokio::time::sleep_until(keep_until.min(deadline)).await;
    }
    if let Some(turns) = life.turns.upgrade() {
        let mut turns = lock(&turns);
        if turns
            .get(&life.relay_id)
            .is_some_and(|held| Arc::ptr_eq(held, &entry))
        {
            turns.remove(&life.relay_id);
        }
    }
    // Last: `stop` aborts this very task.
    lock(&entry.pump).take();
    entry.stop();
}

/// Reads the turn to its end into the entry's ring; reports the query id as
/// soon as it is known.
async fn pump(
    mut turn: QueryTurn,
    entry: &Entry,
    named: tokio::sync::oneshot::Sender<Result<String, Option<Error>>>,
) {
    let mut named = Some(named);
    let mut first_error = None;
    while let Some(item) = turn.next().await {
        match item {
            Ok(event) => {
                let (name, data, delta) = frame_of(&event);
                entry.push(&name, data, delta);
            }
            Err(Error::TurnFailed { message, .. }) => {
                let data = serde_json::json!({ "error": message }).to_string();
                entry.push(names::FAILED, data, None);
            }
            Err(Error::TurnCancelled { message, .. }) => {
                let data = serde_json::json!({ "error": message }).to_string();
                entry.push(names::CANCELLED, data, None);
            }
            Err(e) => {
                tracing::warn!(query_id = turn.query_id(), error = %e, "relayed turn broke");
                let data = serde_json::json!({ "message": e.to_string() }).to_string();
                entry.push(RELAY_ERROR, data, None);
                first_error.get_or_insert(e);
            }
        }
        if let Some(id) = turn.query_id()
            && let Some(tx) = named.take()
        {
            let _ = tx.send(Ok(id.to_owned()));
        }
    }
    entry.end();
    if let Some(tx) = named.take() {
        let _ = tx.send(Err(first_error));
    }
}

/// The `event:` name, JSON `data:` and answer text of one delivered event.
fn frame_of(event: &QueryEvent) -> (String, String, Option<&str>) {
    use serde_json::json;
    let typed = |v: Result<String, serde_json::Error>| v.unwrap_or_else(|_| "{}".into());
    let (name, data, text) = match event {
        QueryEvent::Created {
            query_id,
            session_id,
        } => (
            names::CREATED,
            json!({ "query_id": query_id, "session_id": session_id }).to_string(),
            None,
        ),
        QueryEvent::Step(step) => (names::STEP, typed(serde_json::to_string(step)), None),
        QueryEvent::TextDelta { delta } => (
            names::TEXT_DELTA,
            json!({ "delta": delta }).to_string(),
            Some(delta.as_str()),
        ),
        QueryEvent::TurnRollup(r) => (names::TURN_ROLLUP, typed(serde_json::to_string(r)), None),
        QueryEvent::Synthesis(s) => (names::SYNTHESIS, typed(serde_json::to_string(s)), None),
        QueryEvent::Trace { trace_ref } => (
            names::TRACE,
            json!({ "trace_ref": trace_ref }).to_string(),
            None,
        ),
        QueryEvent::Completed => (names::COMPLETED, "{}".to_owned(), None),
        QueryEvent::Failed { error } => {
            (names::FAILED, json!({ "error": error }).to_string(), None)
        }
        QueryEvent::Cancelled { error } => (
            names::CANCELLED,
            json!({ "error": error }).to_string(),
            None,
        ),
        QueryEvent::Query(q) => (names::QUERY, typed(serde_json::to_string(q)), None),
        QueryEvent::Unknown { event, data } => {
            // Field values cannot hold line breaks; the parser never makes
            // such a name, but the relay must not panic on one.
            let name = if event.is_empty() || event.contains(['\r', '\n']) {
                "unknown".to_owned()
            } else {
                event.clone()
            };
            return (name, data.replace('\r', ""), None);
        }
    };
    (name.to_owned(), data, text)
}
