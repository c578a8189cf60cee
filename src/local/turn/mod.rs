//! Query turns: request checks, session bookkeeping, and the runner that
//! retrieves, composes and logs events.
//!
//! A turn always runs as supervised background work writing to its event
//! log; the three modes only differ in how the HTTP answer reads that log
//! (wait for the end, stream it, or return at once).
//!
//! `admission` checks a request and does the session bookkeeping; `work`
//! is what a turn does (retrieval, composition, events); this module runs
//! it and writes its end.

mod admission;
mod work;

pub(crate) use admission::{accept, previous_session};
#[cfg(test)]
use work::deltas;
use work::produce;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::FutureExt;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::answer::{self, Hit, RetrievalMode};
use super::error::{LocalError, LocalResult};
use super::events::EventLog;
use super::search::{WeightedTerm, weigh};
use super::state::AppState;
use super::store::{
    LOCAL_MODEL, LOCAL_PRINCIPAL, LOCAL_PROJECT, QueryEntry, SessionEntry, Ticket, new_query_id,
    new_session_id,
};
use crate::types;

/// The service's cap on one turn.
const TURN_CAP: Duration = Duration::from_secs(900);
/// Passages retrieved for an answer.
const ANSWER_HITS: usize = 8;
/// Default and largest item count of a retrieval-only turn.
const DEFAULT_RETRIEVED: usize = 10;
const MAX_RETRIEVED: usize = 100;
/// Default per-item text length of a retrieval-only turn.
const DEFAULT_RETRIEVED_CHARS: usize = 2000;
/// Weight of an earlier turn's question terms.
const EARLIER_TURN_WEIGHT: f32 = 0.3;
/// Earlier turns that inform retrieval.
const EARLIER_TURNS: usize = 3;
/// Words per `response.output_text.delta`.
const WORDS_PER_DELTA: usize = 3;
/// Longest accepted question.
const MAX_ASK_CHARS: usize = 8_000;

/// Everything a runner needs, fixed when the turn is accepted.
#[derive(Debug, Clone)]
pub(crate) struct TurnPlan {
    pub(crate) query_id: String,
    pub(crate) session_id: String,
    pub(crate) ask: String,
    /// `(id, slug)` of the scoped contexts.
    pub(crate) contexts: Vec<(String, String)>,
    pub(crate) retrieval: Option<(RetrievalMode, usize, usize)>,
    pub(crate) shape: Option<Map<String, Value>>,
    pub(crate) timeout: Duration,
}

/// An accepted turn: its plan, first document, log and cancel token.
#[derive(Debug)]
pub(crate) struct Accepted {
    pub(crate) plan: TurnPlan,
    pub(crate) query: types::Query,
    pub(crate) log: Arc<EventLog>,
    pub(crate) cancel: CancellationToken,
    /// The turn's first rows, sent.
    pub(crate) accepted: Ticket,
}

fn zero_usage() -> types::QueryUsage {
    types::QueryUsage {
        input_tokens: 0,
        output_tokens: 0,
        total_tokens: 0,
    }
}

/// A `QueryEvent` of `kind` with only the ids set.
pub(crate) fn blank_event(kind: &str, plan: &TurnPlan) -> types::QueryEvent {
    types::QueryEvent {
        answer_preview: None,
        by_category: HashMap::new(),
        cache_read_tokens: None,
        cache_write_tokens: None,
        code: None,
        commentary: None,
        cum_input_tokens: None,
        cum_output_tokens: None,
        delta: None,
        duration_ms: None,
        error: None,
        fns: Vec::new(),
        ms: None,
        n_steps: None,
        n_tool_calls: None,
        query_id: plan.query_id.clone(),
        session_id: Some(plan.session_id.clone()),
        status: None,
        step_id: None,
        tokens_in: None,
        tokens_in_cache_write: None,
        tokens_in_cached: None,
        tokens_in_fresh: None,
        tokens_out: None,
        total_hits: None,
        trace_ref: None,
        type_: kind.to_owned(),
    }
}

/// What a turn has produced so far (kept when it is cancelled midway).
#[derive(Debug, Default)]
struct Progress {
    steps: Vec<types::QueryStep>,
    trace: Vec<types::TraceStep>,
    total_hits: i64,
    answer: String,
    citations: Vec<types::Citation>,
    output_json: Option<Map<String, Value>>,
    synthesis_ms: i64,
}

/// How a turn ended.
enum Outcome {
    Completed,
    Failed(String),
    Cancelled,
}

/// A started turn: its first document and its event log.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) query: types::Query,
    pub(crate) log: Arc<EventLog>,
    /// The turn's first rows, sent: acknowledged once saved.
    pub(crate) accepted: Ticket,
}

/// Accepts a turn and starts its runner on a task of its own, in one step
/// with no `.await` between: once accepted, a turn always runs to a
/// terminal state whatever happens to the request that asked for it.
///
/// `previous_session` is the session of the request's
/// `previous_query_id` ([`previous_session`]).
pub(crate) fn start(
    state: &Arc<AppState>,
    req: types::QueryRequest,
    previous_session: Option<String>,
) -> LocalResult<Started> {
    let accepted = accept(state, req, previous_session)?;
    let guard = TurnGuard::arm(state, &accepted);
    state.spawn(run(guard, accepted.plan, accepted.cancel));
    Ok(Started {
        query: accepted.query,
        log: accepted.log,
        accepted: accepted.accepted,
    })
}

/// Ends a turn that did not end by itself: when its runner is dropped
/// (aborted, or unwinding from a panic) the turn is marked failed, its
/// event log closed and its session's slot released.
#[derive(Debug)]
struct TurnGuard {
    state: Arc<AppState>,
    plan: TurnPlan,
    log: Arc<EventLog>,
    started: Instant,
    armed: bool,
}

impl TurnGuard {
    /// Guards the accepted turn from now until it finishes.
    fn arm(state: &Arc<AppState>, accepted: &Accepted) -> TurnGuard {
        TurnGuard {
            state: state.clone(),
            plan: accepted.plan.clone(),
            log: accepted.log.clone(),
            started: Instant::now(),
            armed: true,
        }
    }

    fn finish(mut self, outcome: Outcome, progress: &Progress) {
        self.armed = false;
        finalize(
            &self.state,
            &self.plan,
            &self.log,
            outcome,
            progress,
            self.started,
        );
    }
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        if self.armed {
            tracing::error!(query = %self.plan.query_id, "a turn stopped unexpectedly");
            finalize(
                &self.state,
                &self.plan,
                &self.log,
                Outcome::Failed("the turn stopped unexpectedly".to_owned()),
                &Progress::default(),
                self.started,
            );
        }
    }
}

/// Runs an accepted turn to its end. Never panics on input; every failure
/// ends the turn as `failed` with a message, a panic included.
async fn run(guard: TurnGuard, plan: TurnPlan, cancel: CancellationToken) {
    let mut progress = Progress::default();
    let outcome = {
        let body =
            std::panic::AssertUnwindSafe(produce(&guard.state, &plan, &guard.log, &mut progress))
                .catch_unwind();
        tokio::select! {
            r = tokio::time::timeout(plan.timeout, body) => match r {
                Ok(Ok(Ok(()))) => Outcome::Completed,
                Ok(Ok(Err(msg))) => Outcome::Failed(msg),
                Ok(Err(_panic)) => {
                    tracing::error!(query = %plan.query_id, "a turn panicked");
                    Outcome::Failed("the turn failed unexpectedly".to_owned())
                }
                Err(_) => Outcome::Failed(format!(
                    "the turn timed out after {} s", plan.timeout.as_secs()
                )),
            },
            _ = cancel.cancelled() => Outcome::Cancelled,
        }
    };
    guard.finish(outcome, &progress);
}

/// Writes a turn's end: the terminal event, the final query document and
/// trace, the session's slot released, the log closed.
fn finalize(
    state: &AppState,
    plan: &TurnPlan,
    log: &Arc<EventLog>,
    outcome: Outcome,
    progress: &Progress,
    started: Instant,
) {
    let runtime_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let (status, error, terminal) = match &outcome {
        Outcome::Completed => (crate::status::word::COMPLETED, None, "response.completed"),
        Outcome::Failed(m) => (
            crate::status::word::FAILED,
            Some(m.clone()),
            "response.failed",
        ),
        Outcome::Cancelled => (
            crate::status::word::CANCELLED,
            Some(if state.shutdown.is_cancelled() {
                "the server stopped".to_owned()
            } else {
                "cancelled on request".to_owned()
            }),
            "response.cancelled",
        ),
    };
    let mut event = blank_event(terminal, plan);
    event.error = error.clone();
    event.trace_ref = Some(format!("local://traces/{}", plan.query_id));
    let _ = log.push(&event, true);

    let rollup = rollup(progress, runtime_ms);
    let mut inner = state.store.change();
    let final_query = {
        let entry = inner.query_mut(&plan.query_id);
        let query = entry.map(|e| {
            let q = &mut e.query;
            q.status = status.into();
            q.error = error;
            q.runtime_ms = runtime_ms;
            q.steps = progress.steps.clone();
            q.citations = progress.citations.clone();
            q.output_json = progress.output_json.clone();
            if !progress.answer.is_empty() {
                q.output = vec![types::QueryOutputItem {
                    content: vec![types::QueryOutputItemContentItem {
                        text: progress.answer.clone(),
                        type_: "output_text".to_owned(),
                    }],
                    role: "assistant".to_owned(),
                }];
            }
            q.rollup = Some(rollup.clone());
            if matches!(outcome, Outcome::Completed) {
                q.synthesis = Some(synthesis(plan, progress));
            }
            e.trace = Some(types::Trace {
                rollup: Some(types::TraceRollup {
                    by_category: rollup.by_category.clone(),
                    cache_read_tokens: Some(0),
                    cache_write_tokens: Some(0),
                    duration_ms: runtime_ms,
                    n_steps: progress.trace.len() as i64,
                    n_tool_calls: progress.trace.iter().map(|s| s.calls.len() as i64).sum(),
                    total_hits: progress.total_hits,
                }),
                steps: progress.trace.clone(),
            });
            q.clone()
        });
        inner.release_session(&plan.session_id, &plan.query_id);
        query
    };
    let q = final_query.unwrap_or_else(|| {
        // The query was forgotten meanwhile; close followers anyway.
        let mut q = types::Query {
            status: status.into(),
            ..placeholder(plan)
        };
        q.runtime_ms = runtime_ms;
        q
    });
    // Followers see the terminal event and the final document once the
    // turn's end is committed: what a turn acknowledges survives a crash.
    let log = log.clone();
    let _ = inner.commit_then(move |saved| log.finish(&q, saved));
}

fn placeholder(plan: &TurnPlan) -> types::Query {
    types::Query {
        citations: Vec::new(),
        comparison: None,
        created: Utc::now().timestamp(),
        error: None,
        feedback: None,
        id: plan.query_id.clone(),
        input: Vec::new(),
        model: Some(LOCAL_MODEL.to_owned()),
        object: "query".to_owned(),
        output: Vec::new(),
        output_json: None,
        previous_query_id: None,
        rollup: None,
        runtime_ms: 0,
        session_id: plan.session_id.clone(),
        status: crate::status::word::IN_PROGRESS.into(),
        steps: Vec::new(),
        synthesis: None,
        trace_ref: None,
        usage: zero_usage(),
    }
}

fn rollup(p: &Progress, duration_ms: i64) -> types::QueryRollup {
    let calls: i64 = p.trace.iter().map(|s| s.calls.len() as i64).sum();
    let mut by_category = HashMap::new();
    if calls > 0 {
        by_category.insert("search".to_owned(), calls);
    }
    types::QueryRollup {
        by_category,
        cache_read_tokens: Some(0),
        cache_write_tokens: Some(0),
        duration_ms: Some(duration_ms),
        n_steps: Some(p.steps.len() as i64),
        n_tool_calls: Some(calls),
        query_id: None,
        total_hits: Some(p.total_hits),
        type_: Some("response.turn_rollup".to_owned()),
    }
}

fn synthesis(plan: &TurnPlan, p: &Progress) -> types::QuerySynthesis {
    types::QuerySynthesis {
        answer_preview: Some(p.answer.chars().take(200).collect()),
        ms: Some(p.synthesis_ms),
        query_id: Some(plan.query_id.clone()),
        status: Some(crate::status::word::COMPLETED.to_owned()),
        tokens_in: Some(0),
        tokens_in_cache_write: Some(0),
        tokens_in_cached: Some(0),
        tokens_in_fresh: Some(0),
        tokens_out: Some(0),
        type_: Some("response.synthesis".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Arc<AppState> {
        let state = AppState::for_tests(None, 1024, 0);
        let req: types::CreateContextRequest = serde_json::from_value(serde_json::json!({
            "slug": "w", "name": "W", "kind": "work"
        }))
        .unwrap();
        state.store.change().create_context(req).unwrap();
        state
    }

    /// A question on the context `state` makes.
    fn ask() -> types::QueryRequest {
        serde_json::from_value(serde_json::json!({"ask": "anything", "scope": ["w"]})).unwrap()
    }

    #[tokio::test]
    async fn a_dropped_runner_fails_its_turn_closes_its_log_and_frees_its_session() {
        let state = state();
        let accepted = accept(&state, ask(), None).unwrap();
        let sid = accepted.plan.session_id.clone();
        assert!(state.store.read().sessions()[&sid].in_flight.is_some());
        let guard = TurnGuard::arm(&state, &accepted);
        // A runner that panics unwinds through its guard.
        let runner = tokio::spawn(async move {
            let _guard = guard;
            panic!("boom");
        });
        assert!(runner.await.unwrap_err().is_panic());
        // The log closes once the turn's end is committed.
        tokio::time::timeout(Duration::from_secs(10), accepted.log.wait_finished())
            .await
            .unwrap();
        assert!(accepted.log.saved());
        let inner = state.store.read();
        assert!(inner.sessions()[&sid].in_flight.is_none());
        let q = &inner.queries()[&accepted.plan.query_id].query;
        assert_eq!(q.status, crate::status::word::FAILED);
        assert!(q.error.as_deref().unwrap().contains("unexpectedly"));
    }

    #[tokio::test]
    async fn a_started_turn_ends_even_if_nobody_waits_for_it() {
        let state = state();
        let started = start(&state, ask(), None).unwrap();
        drop(started.query);
        tokio::time::timeout(Duration::from_secs(10), started.log.wait_finished())
            .await
            .unwrap();
        let inner = state.store.read();
        assert!(inner.sessions().values().all(|s| s.in_flight.is_none()));
    }

    #[test]
    fn deltas_rebuild_the_text_exactly() {
        for text in [
            "",
            "one",
            "a b c d e f g",
            " lead  and\n\ntrail ",
            "x\n```\ncode\n```\n[1]",
        ] {
            let parts = deltas(text);
            assert_eq!(parts.concat(), text);
            assert!(parts.iter().all(|p| !p.is_empty()));
        }
        assert_eq!(deltas("a b c d e f g").len(), 3);
    }
}
