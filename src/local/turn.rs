//! Query turns: request checks, session bookkeeping, and the runner that
//! retrieves, composes and logs events.
//!
//! A turn always runs as supervised background work writing to its event
//! log; the three modes only differ in how the HTTP answer reads that log
//! (wait for the end, stream it, or return at once).

use std::collections::HashMap;
use std::sync::Arc;
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
    LOCAL_MODEL, LOCAL_PRINCIPAL, LOCAL_PROJECT, QueryEntry, SessionEntry, new_query_id,
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
    pub(crate) earlier_asks: Vec<String>,
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
}

/// Checks a request, creates or continues its session and registers the
/// turn as `in_progress`.
pub(crate) fn accept(state: &AppState, req: types::QueryRequest) -> LocalResult<Accepted> {
    let ask = req.ask.trim().to_owned();
    if ask.is_empty() {
        return Err(LocalError::bad_request("`ask` must not be empty"));
    }
    if ask.chars().count() > MAX_ASK_CHARS {
        return Err(LocalError::bad_request(format!(
            "`ask` is longer than {MAX_ASK_CHARS} characters"
        )));
    }
    if req.stream == Some(true) && req.background == Some(true) {
        return Err(LocalError::bad_request(
            "`stream` and `background` cannot both be true",
        ));
    }
    for model in req.model.iter().chain(req.models.iter()) {
        if model != LOCAL_MODEL {
            return Err(LocalError::bad_request(format!(
                "model {model:?} is not available locally; the only model is {LOCAL_MODEL:?}"
            )));
        }
    }
    if let Some(w) = req.workflow.as_deref()
        && !matches!(
            w,
            "search"
                | "search_cc"
                | "search_rag"
                | "query_search"
                | "query_sac"
                | "query_cc"
                | "query_rag"
        )
    {
        return Err(LocalError::bad_request(format!("unknown workflow {w:?}")));
    }
    let timeout = match req.timeout_seconds {
        Some(s) if s <= 0 => {
            return Err(LocalError::bad_request(
                "`timeout_seconds` must be positive",
            ));
        }
        Some(s) => Duration::from_secs(s as u64).min(TURN_CAP),
        None => TURN_CAP,
    };
    let shape = if req.shape.is_empty() {
        None
    } else {
        answer::validate_shape(&req.shape).map_err(LocalError::bad_request)?;
        Some(req.shape.clone())
    };
    let retrieval = retrieval_mode(&req)?;

    let mut inner = state.store.lock();
    // Which session: continued by id or by a previous turn, or a new one.
    let continued = match (&req.session_id, &req.previous_query_id) {
        (Some(sid), prev) => {
            if !inner.sessions.contains_key(sid) {
                return Err(LocalError::not_found(format!("session {sid:?} not found")));
            }
            if let Some(p) = prev {
                let q = inner
                    .queries
                    .get(p)
                    .ok_or_else(|| LocalError::not_found(format!("query {p:?} not found")))?;
                if &q.query.session_id != sid {
                    return Err(LocalError::bad_request(
                        "`previous_query_id` belongs to another session than `session_id`",
                    ));
                }
            }
            Some(sid.clone())
        }
        (None, Some(p)) => {
            let q = inner
                .queries
                .get(p)
                .ok_or_else(|| LocalError::not_found(format!("query {p:?} not found")))?;
            let sid = q.query.session_id.clone();
            if !inner.sessions.contains_key(&sid) {
                return Err(LocalError::not_found(format!(
                    "the session of query {p:?} no longer exists"
                )));
            }
            Some(sid)
        }
        (None, None) => None,
    };

    let now = Utc::now();
    let (session_id, contexts, earlier_asks, previous_query_id) = match continued {
        Some(sid) => {
            let s = &inner.sessions[&sid];
            if let Some(running) = &s.in_flight {
                return Err(LocalError::conflict(format!(
                    "session {sid:?} already has a turn in flight ({running})"
                )));
            }
            let mut contexts = Vec::new();
            for id in &s.context_ids {
                let ctx = inner.contexts.get(id).ok_or_else(|| {
                    LocalError::not_found(format!("a context of session {sid:?} has been deleted"))
                })?;
                contexts.push((ctx.id.clone(), ctx.slug.clone()));
            }
            let earlier: Vec<String> = s
                .query_ids
                .iter()
                .rev()
                .take(EARLIER_TURNS)
                .filter_map(|q| inner.queries.get(q))
                .filter_map(|q| q.query.input.first().map(|i| i.content.clone()))
                .collect();
            let prev = s.session.last_query_id.clone();
            (sid, contexts, earlier, prev)
        }
        None => {
            if req.scope.is_empty() || req.scope.len() > 10 {
                return Err(LocalError::bad_request(format!(
                    "`scope` must name 1 to 10 contexts to start a session (got {})",
                    req.scope.len()
                )));
            }
            let mut contexts: Vec<(String, String)> = Vec::new();
            let mut kinds = Vec::new();
            for key in &req.scope {
                let ctx = inner.context(key)?;
                if !ctx.is_queryable() {
                    return Err(LocalError::conflict(format!(
                        "context {:?} is not curated yet; POST /contexts/{}/curate first",
                        ctx.slug, ctx.slug
                    )));
                }
                if !contexts.iter().any(|(id, _)| id == &ctx.id) {
                    contexts.push((ctx.id.clone(), ctx.slug.clone()));
                    kinds.push(ctx.kind.clone());
                }
            }
            if kinds.iter().any(|k| k != &kinds[0]) {
                return Err(LocalError::bad_request(
                    "a scope may not mix work and search contexts",
                ));
            }
            let sid = new_session_id();
            let session = types::Session {
                created_at: now,
                created_by: LOCAL_PRINCIPAL.to_owned(),
                guardrails: req.guardrails.clone(),
                id: sid.clone(),
                last_query_id: None,
                models: vec![LOCAL_MODEL.to_owned()],
                project_id: LOCAL_PROJECT.to_owned(),
                scope: contexts.iter().map(|(_, slug)| slug.clone()).collect(),
                system_prompt: req.system_prompt.clone(),
                title: Some(ask.chars().take(80).collect()),
                tools: req.tools.clone(),
                updated_at: now,
                workflow: req.workflow.clone(),
                workspace: None,
            };
            inner.insert_session(SessionEntry {
                session,
                context_ids: contexts.iter().map(|(id, _)| id.clone()).collect(),
                query_ids: Vec::new(),
                in_flight: None,
            });
            (sid, contexts, Vec::new(), None)
        }
    };

    let query_id = new_query_id();
    let query = types::Query {
        citations: Vec::new(),
        comparison: None,
        created: now.timestamp(),
        error: None,
        feedback: None,
        id: query_id.clone(),
        input: vec![types::QueryInputItem {
            content: ask.clone(),
            role: "user".to_owned(),
        }],
        model: Some(LOCAL_MODEL.to_owned()),
        object: "query".to_owned(),
        output: Vec::new(),
        output_json: None,
        previous_query_id,
        rollup: None,
        runtime_ms: 0,
        session_id: session_id.clone(),
        status: "in_progress".to_owned(),
        steps: Vec::new(),
        synthesis: None,
        trace_ref: Some(format!("local://traces/{query_id}")),
        usage: zero_usage(),
    };
    let log = EventLog::new(state.config.events_per_query);
    let cancel = state.shutdown.child_token();
    inner.insert_query(QueryEntry {
        query: query.clone(),
        trace: None,
        log: log.clone(),
        cancel: cancel.clone(),
    });
    if let Some(s) = inner.sessions.get_mut(&session_id) {
        s.in_flight = Some(query_id.clone());
        s.query_ids.push(query_id.clone());
        s.session.last_query_id = Some(query_id.clone());
        s.session.updated_at = now;
    }
    Ok(Accepted {
        plan: TurnPlan {
            query_id,
            session_id,
            ask,
            earlier_asks,
            contexts,
            retrieval,
            shape,
            timeout,
        },
        query,
        log,
        cancel,
    })
}

fn retrieval_mode(req: &types::QueryRequest) -> LocalResult<Option<(RetrievalMode, usize, usize)>> {
    let mode = if req.artifacts_only == Some(true) {
        Some(RetrievalMode::Artifacts)
    } else if req.pointers_only == Some(true) {
        Some(RetrievalMode::Pointers)
    } else if req.retrieval_only == Some(true)
        || req.chunks_only == Some(true)
        || req.compose == Some(false)
    {
        Some(RetrievalMode::Chunks)
    } else {
        None
    };
    let positive = |v: Option<i64>, name: &str, default: usize, max: usize| match v {
        Some(n) if n <= 0 => Err(LocalError::bad_request(format!(
            "`{name}` must be positive"
        ))),
        Some(n) => Ok((n as usize).min(max)),
        None => Ok(default),
    };
    let items = positive(
        req.max_retrieved,
        "max_retrieved",
        DEFAULT_RETRIEVED,
        MAX_RETRIEVED,
    )?;
    let chars = positive(
        req.max_retrieved_chars,
        "max_retrieved_chars",
        DEFAULT_RETRIEVED_CHARS,
        100_000,
    )?;
    Ok(mode.map(|m| (m, items, chars)))
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
}

/// Accepts a turn and starts its runner on a task of its own, in one step
/// with no `.await` between: once accepted, a turn always runs to a
/// terminal state whatever happens to the request that asked for it.
pub(crate) fn start(state: &Arc<AppState>, req: types::QueryRequest) -> LocalResult<Started> {
    let accepted = accept(state, req)?;
    let guard = TurnGuard {
        state: state.clone(),
        plan: accepted.plan.clone(),
        log: accepted.log.clone(),
        started: Instant::now(),
        armed: true,
    };
    state.store.changed();
    state.spawn(run(guard, accepted.plan, accepted.cancel));
    Ok(Started {
        query: accepted.query,
        log: accepted.log,
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
    log: &EventLog,
    outcome: Outcome,
    progress: &Progress,
    started: Instant,
) {
    let runtime_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let (status, error, terminal) = match &outcome {
        Outcome::Completed => ("completed", None, "response.completed"),
        Outcome::Failed(m) => ("failed", Some(m.clone()), "response.failed"),
        Outcome::Cancelled => (
            "cancelled",
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
    let final_query = {
        let mut inner = state.store.lock();
        let entry = inner.queries.get_mut(&plan.query_id);
        let query = entry.map(|e| {
            let q = &mut e.query;
            q.status = status.to_owned();
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
    if let Some(q) = final_query {
        log.finish(&q);
    } else {
        // The session or query was deleted meanwhile; close followers anyway.
        let mut q = types::Query {
            status: status.to_owned(),
            ..placeholder(plan)
        };
        q.runtime_ms = runtime_ms;
        log.finish(&q);
    }
    state.store.changed();
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
        status: "in_progress".to_owned(),
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
        status: Some("completed".to_owned()),
        tokens_in: Some(0),
        tokens_in_cache_write: Some(0),
        tokens_in_cached: Some(0),
        tokens_in_fresh: Some(0),
        tokens_out: Some(0),
        type_: Some("response.synthesis".to_owned()),
    }
}

/// Logs an event, then waits the configured pause between frames.
async fn emit(state: &AppState, log: &EventLog, event: &types::QueryEvent) -> Result<(), String> {
    log.push(event, false)
        .map_err(|_| "the turn produced more events than the server keeps".to_owned())?;
    let delay = state.faults.frame_delay();
    if delay.is_zero() {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(delay).await;
    }
    Ok(())
}

/// Logs a step event and mirrors the step into the stored query.
async fn step(
    state: &AppState,
    plan: &TurnPlan,
    log: &EventLog,
    progress: &mut Progress,
    s: types::QueryStep,
) -> Result<(), String> {
    let mut ev = blank_event("response.step", plan);
    ev.step_id = Some(s.step_id.clone());
    ev.status = Some(s.status.clone());
    ev.commentary = Some(s.commentary.clone());
    ev.fns = s.fns.clone();
    ev.code = s.code.clone();
    ev.cum_input_tokens = Some(0);
    ev.cum_output_tokens = Some(0);
    match progress.steps.iter_mut().find(|x| x.step_id == s.step_id) {
        Some(slot) => *slot = s,
        None => progress.steps.push(s),
    }
    if let Some(e) = state.store.lock().queries.get_mut(&plan.query_id) {
        e.query.steps = progress.steps.clone();
    }
    emit(state, log, &ev).await
}

fn query_step(
    id: &str,
    status: &str,
    commentary: String,
    code: Option<String>,
) -> types::QueryStep {
    types::QueryStep {
        code,
        commentary,
        cum_input_tokens: Some(0),
        cum_output_tokens: Some(0),
        fns: vec!["search_chunks".to_owned()],
        status: status.to_owned(),
        step_id: id.to_owned(),
    }
}

/// The turn's work: retrieval, composition, events.
async fn produce(
    state: &Arc<AppState>,
    plan: &TurnPlan,
    log: &EventLog,
    progress: &mut Progress,
) -> Result<(), String> {
    emit(state, log, &blank_event("response.created", plan)).await?;

    let mut groups: Vec<(&str, f32)> = vec![(plan.ask.as_str(), 1.0)];
    for earlier in &plan.earlier_asks {
        groups.push((earlier.as_str(), EARLIER_TURN_WEIGHT));
    }
    let question = weigh(&groups);
    let slugs: Vec<&str> = plan.contexts.iter().map(|(_, s)| s.as_str()).collect();
    let key_terms: Vec<&str> = question
        .iter()
        .filter(|(_, w)| *w >= 1.0)
        .map(|(t, _)| t.as_str())
        .collect();
    let limit = plan.retrieval.map_or(ANSWER_HITS, |(_, n, _)| n.max(1));
    let code = format!("search_chunks(terms={key_terms:?}, scope={slugs:?}, k={limit})");
    step(
        state,
        plan,
        log,
        progress,
        query_step(
            "step_1",
            "in_progress",
            format!(
                "Searching {} for: {}",
                slugs.join(", "),
                key_terms.join(" ")
            ),
            Some(code.clone()),
        ),
    )
    .await?;

    let search_started = Instant::now();
    let hits = retrieve(state, plan, question.clone(), limit).await?;
    let search_ms = search_started.elapsed().as_millis() as i64;
    progress.total_hits = hits.len() as i64;
    let sources: Vec<&str> = {
        let mut s: Vec<&str> = Vec::new();
        for h in &hits {
            if !s.contains(&h.chunk.source.as_str()) && s.len() < 5 {
                s.push(h.chunk.source.as_str());
            }
        }
        s
    };
    let found = if hits.is_empty() {
        "Found no matching passage".to_owned()
    } else {
        format!(
            "Found {} passage(s), best in: {}",
            hits.len(),
            sources.join(", ")
        )
    };
    progress.trace.push(types::TraceStep {
        calls: vec![types::TraceCall {
            args: serde_json::from_value(serde_json::json!({
                "terms": question.iter().map(|(t, w)| serde_json::json!([t, w])).collect::<Vec<_>>(),
                "scope": slugs,
                "k": limit,
            }))
            .unwrap_or_default(),
            category: "search".to_owned(),
            duration_ms: search_ms,
            error: None,
            fn_: "search_chunks".to_owned(),
            ok: true,
            result: serde_json::json!(hits
                .iter()
                .map(|h| serde_json::json!({
                    "context": h.context,
                    "source": h.chunk.source,
                    "section_path": h.chunk.section_path,
                    "score": h.score,
                }))
                .collect::<Vec<_>>()),
            score_space: Some("bm25".to_owned()),
        }],
        code: code.clone(),
        commentary: found.clone(),
        cost: Some(types::TraceStepCost {
            decide_ms: 0,
            execute_ms: search_ms,
            tokens_in: 0,
            tokens_in_cache_write: None,
            tokens_in_cached: None,
            tokens_in_fresh: None,
            tokens_out: 0,
        }),
        step_id: "step_1".to_owned(),
        strategy: types::TraceStepStrategy {
            fns: vec!["search_chunks".to_owned()],
            kind: "bm25".to_owned(),
            label: "lexical retrieval".to_owned(),
            scope: slugs.iter().map(|s| s.to_string()).collect(),
        },
    });
    step(
        state,
        plan,
        log,
        progress,
        query_step("step_1", "completed", found, Some(code)),
    )
    .await?;

    let synth_started = Instant::now();
    if let Some((mode, items, chars)) = plan.retrieval {
        progress.output_json = Some(answer::retrieval_json(&hits, mode, items, chars));
        progress.synthesis_ms = 0;
    } else {
        step(
            state,
            plan,
            log,
            progress,
            query_step(
                "step_2",
                "in_progress",
                "Selecting the sentences that answer the question".to_owned(),
                None,
            ),
        )
        .await?;
        let composed = answer::compose(&hits, &question);
        if let Some(shape) = &plan.shape {
            let json =
                answer::fill_shape(shape, &hits, &question).map_err(|e| format!("shape: {e}"))?;
            progress.output_json = Some(json);
        }
        let summary = if composed.passages_used == 0 {
            "Nothing to quote".to_owned()
        } else {
            format!("Quoted {} passage(s)", composed.passages_used)
        };
        step(
            state,
            plan,
            log,
            progress,
            query_step("step_2", "completed", summary, None),
        )
        .await?;
        progress.citations = composed.citations;
        for delta in deltas(&composed.text) {
            let mut ev = blank_event("response.output_text.delta", plan);
            ev.delta = Some(delta.to_owned());
            emit(state, log, &ev).await?;
            progress.answer.push_str(delta);
        }
        progress.synthesis_ms = synth_started.elapsed().as_millis() as i64;
    }

    let r = rollup(progress, 0);
    let mut ev = blank_event("response.turn_rollup", plan);
    ev.by_category = r.by_category;
    ev.n_steps = r.n_steps;
    ev.n_tool_calls = r.n_tool_calls;
    ev.total_hits = r.total_hits;
    ev.cache_read_tokens = Some(0);
    ev.cache_write_tokens = Some(0);
    emit(state, log, &ev).await?;

    let s = synthesis(plan, progress);
    let mut ev = blank_event("response.synthesis", plan);
    ev.status = s.status;
    ev.tokens_in = s.tokens_in;
    ev.tokens_out = s.tokens_out;
    ev.ms = s.ms;
    ev.answer_preview = s.answer_preview;
    ev.tokens_in_cached = Some(0);
    ev.tokens_in_cache_write = Some(0);
    ev.tokens_in_fresh = Some(0);
    emit(state, log, &ev).await?;
    Ok(())
}

/// Searches every scoped context (on a blocking thread) and merges the hits.
async fn retrieve(
    state: &Arc<AppState>,
    plan: &TurnPlan,
    question: Vec<WeightedTerm>,
    limit: usize,
) -> Result<Vec<Hit>, String> {
    let indexes: Vec<_> = {
        let inner = state.store.lock();
        plan.contexts
            .iter()
            .filter_map(|(id, slug)| inner.indexes.get(id).map(|i| (slug.clone(), i.clone())))
            .collect()
    };
    tokio::task::spawn_blocking(move || {
        let mut hits = Vec::new();
        for (slug, index) in indexes {
            let found = index.search(&question, limit).map_err(|e| {
                tracing::error!(error = %e, "search failed");
                "search failed".to_owned()
            })?;
            for (score, i) in found {
                if let Some(chunk) = index.chunks().get(i) {
                    hits.push(Hit {
                        score,
                        context: slug.clone(),
                        chunk: chunk.clone(),
                    });
                }
            }
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
        hits.truncate(limit);
        Ok(hits)
    })
    .await
    .map_err(|e| format!("search stopped: {e}"))?
}

/// Cuts text into deltas of a few words; their concatenation is the text.
pub(crate) fn deltas(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut words = 0;
    let mut in_word = false;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            if in_word {
                words += 1;
                in_word = false;
                if words == WORDS_PER_DELTA {
                    out.push(&text[start..i]);
                    start = i;
                    words = 0;
                }
            }
        } else {
            in_word = true;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::faults::Faults;
    use crate::local::guard::HostPolicy;
    use crate::local::state::Config;
    use crate::local::store::Store;

    fn state() -> Arc<AppState> {
        let config = Config {
            api_key: None,
            data_dir: None,
            upload_limit: 1024,
            json_limit: 1024,
            context_bytes_limit: 1 << 20,
            events_per_query: 100,
            chunk_chars: 1200,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
        };
        let faults = Faults::new(None, Duration::ZERO, 0, 1);
        let policy = HostPolicy::new(([127, 0, 0, 1], 0).into(), &[], &[]);
        let state = AppState::new(config, Store::in_memory(), faults, policy);
        let req: types::CreateContextRequest = serde_json::from_value(serde_json::json!({
            "slug": "w", "name": "W", "kind": "work"
        }))
        .unwrap();
        state.store.lock().create_context(req).unwrap();
        state
    }

    #[tokio::test]
    async fn a_dropped_runner_fails_its_turn_closes_its_log_and_frees_its_session() {
        let state = state();
        let req: types::QueryRequest =
            serde_json::from_value(serde_json::json!({"ask": "anything", "scope": ["w"]})).unwrap();
        let accepted = accept(&state, req).unwrap();
        let sid = accepted.plan.session_id.clone();
        assert!(state.store.lock().sessions[&sid].in_flight.is_some());
        let guard = TurnGuard {
            state: state.clone(),
            plan: accepted.plan.clone(),
            log: accepted.log.clone(),
            started: Instant::now(),
            armed: true,
        };
        // A runner that panics unwinds through its guard.
        let runner = tokio::spawn(async move {
            let _guard = guard;
            panic!("boom");
        });
        assert!(runner.await.unwrap_err().is_panic());
        assert!(accepted.log.is_finished());
        let inner = state.store.lock();
        assert!(inner.sessions[&sid].in_flight.is_none());
        let q = &inner.queries[&accepted.plan.query_id].query;
        assert_eq!(q.status, "failed");
        assert!(q.error.as_deref().unwrap().contains("unexpectedly"));
    }

    #[tokio::test]
    async fn a_started_turn_ends_even_if_nobody_waits_for_it() {
        let state = state();
        let req: types::QueryRequest =
            serde_json::from_value(serde_json::json!({"ask": "anything", "scope": ["w"]})).unwrap();
        let started = start(&state, req).unwrap();
        drop(started.query);
        tokio::time::timeout(Duration::from_secs(10), started.log.wait_finished())
            .await
            .unwrap();
        let inner = state.store.lock();
        assert!(inner.sessions.values().all(|s| s.in_flight.is_none()));
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
