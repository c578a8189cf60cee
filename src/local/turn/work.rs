//! The work of a turn: retrieval, composition and its events.

use super::*;

/// Logs an event, then waits the configured pause between frames.
async fn emit(state: &AppState, log: &EventLog, event: &types::QueryEvent) -> Result<(), String> {
    // The turn's events count in the write backlog: past its limit, while
    // writes wait ahead of them, the turn waits for the writer first (a
    // turn alone goes on whatever its size, like a write alone).
    let limit = state.config.write_backlog_limit;
    if state.store.database_backlog() > 0
        && state.store.write_backlog() > limit
        && let Err(e) = state.store.settled().await
    {
        tracing::debug!(error = %e, "waiting for the write backlog ended");
    }
    log.push(event, false).map_err(|_| {
        "the turn produced more events, or more event bytes, than the server keeps for one turn"
            .to_owned()
    })?;
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
    state
        .store
        .change()
        .set_query_steps(&plan.query_id, progress.steps.clone());
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

/// The questions of the session's turns before this one, newest first
/// (read on the blocking pool: they may be only in the database).
async fn earlier_asks(state: &Arc<AppState>, plan: &TurnPlan) -> Vec<String> {
    let session_id = plan.session_id.clone();
    let query_id = plan.query_id.clone();
    let newest = state
        .store
        .blocking(move |s| s.newest_turns(&session_id, EARLIER_TURNS as u32, &query_id))
        .await;
    newest
        .ok()
        .flatten()
        .unwrap_or_default()
        .into_iter()
        .rev()
        .take(EARLIER_TURNS)
        .filter_map(|q| q.input.first().map(|i| i.content.clone()))
        .collect()
}

/// The question as a progress line shows it: one line, at most 80 characters.
fn shown_ask(ask: &str) -> String {
    let line: String = ask.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(79) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line,
    }
}

/// The turn's work: retrieval, composition, events.
pub(super) async fn produce(
    state: &Arc<AppState>,
    plan: &TurnPlan,
    log: &EventLog,
    progress: &mut Progress,
) -> Result<(), String> {
    emit(state, log, &blank_event("response.created", plan)).await?;

    let mut groups: Vec<(&str, f32)> = vec![(plan.ask.as_str(), 1.0)];
    let earlier_asks = earlier_asks(state, plan).await;
    for earlier in &earlier_asks {
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
            crate::status::word::IN_PROGRESS,
            format!(
                "Searching {} for \"{}\"",
                slugs.join(", "),
                shown_ask(&plan.ask)
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
    progress.trace.push(search_trace(
        &question, &slugs, limit, &hits, search_ms, &code, &found,
    ));
    step(
        state,
        plan,
        log,
        progress,
        query_step("step_1", crate::status::word::COMPLETED, found, Some(code)),
    )
    .await?;

    let synth_started = Instant::now();
    if let Some((mode, items, chars)) = plan.retrieval {
        let json =
            off_thread(move |_| Ok(answer::retrieval_json(&hits, mode, items, chars))).await?;
        progress.output_json = Some(json);
        progress.synthesis_ms = 0;
    } else {
        compose_answer(state, plan, log, progress, hits, question).await?;
        progress.synthesis_ms = synth_started.elapsed().as_millis() as i64;
    }

    emit_totals(state, plan, log, progress).await
}

/// The trace of the search step: its call, what it found and its cost.
fn search_trace(
    question: &[WeightedTerm],
    slugs: &[&str],
    limit: usize,
    hits: &[Hit],
    search_ms: i64,
    code: &str,
    found: &str,
) -> types::TraceStep {
    types::TraceStep {
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
        code: code.to_owned(),
        commentary: found.to_owned(),
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
    }
}

/// Composes the answer from `hits` (and fills the requested shape), as
/// step 2 and the answer's text deltas.
async fn compose_answer(
    state: &Arc<AppState>,
    plan: &TurnPlan,
    log: &EventLog,
    progress: &mut Progress,
    hits: Vec<Hit>,
    question: Vec<WeightedTerm>,
) -> Result<(), String> {
    step(
        state,
        plan,
        log,
        progress,
        query_step(
            "step_2",
            crate::status::word::IN_PROGRESS,
            "Selecting the sentences that answer the question".to_owned(),
            None,
        ),
    )
    .await?;
    let shape = plan.shape.clone();
    let (composed, json) = off_thread(move |stop| {
        let composed = answer::compose(&hits, &question);
        let json = match &shape {
            Some(shape) => Some(
                answer::fill_shape(shape, &hits, &question, stop)
                    .map_err(|e| format!("shape: {e}"))?,
            ),
            None => None,
        };
        Ok((composed, json))
    })
    .await?;
    if json.is_some() {
        progress.output_json = json;
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
        query_step("step_2", crate::status::word::COMPLETED, summary, None),
    )
    .await?;
    progress.citations = composed.citations;
    for delta in deltas(&composed.text) {
        let mut ev = blank_event("response.output_text.delta", plan);
        ev.delta = Some(delta.to_owned());
        emit(state, log, &ev).await?;
        progress.answer.push_str(delta);
    }
    Ok(())
}

/// The turn's closing totals: its rollup and synthesis events.
async fn emit_totals(
    state: &Arc<AppState>,
    plan: &TurnPlan,
    log: &EventLog,
    progress: &mut Progress,
) -> Result<(), String> {
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

/// Runs CPU work on the blocking pool. When the awaiting turn is dropped
/// (timed out or cancelled), `stop` is set and the work gives up.
async fn off_thread<T: Send + 'static>(
    work: impl FnOnce(&AtomicBool) -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let _guard = StopOnDrop(stop.clone());
    tokio::task::spawn_blocking(move || work(&stop))
        .await
        .map_err(|e| format!("composing the answer stopped: {e}"))?
}

/// Searches every scoped context (on a blocking thread) and merges the hits.
async fn retrieve(
    state: &Arc<AppState>,
    plan: &TurnPlan,
    question: Vec<WeightedTerm>,
    limit: usize,
) -> Result<Vec<Hit>, String> {
    let indexes: Vec<_> = {
        let inner = state.store.read();
        plan.contexts
            .iter()
            .filter_map(|(id, slug)| inner.indexes().get(id).map(|i| (slug.clone(), i.clone())))
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
pub(super) fn deltas(text: &str) -> Vec<&str> {
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
