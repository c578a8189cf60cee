//! Accepting a turn: request checks, and the session it starts or continues.

use super::*;

/// The session of a request's `previous_query_id`, read on the blocking
/// pool (the turn may be only in the database).
///
/// # Errors
/// 404 when that turn is not kept.
pub(crate) async fn previous_session(
    state: &AppState,
    req: &types::QueryRequest,
) -> LocalResult<Option<String>> {
    let Some(p) = req.previous_query_id.clone() else {
        return Ok(None);
    };
    let not_found = LocalError::not_found(format!("query {p:?} not found"));
    let doc = state.store.blocking(move |s| s.query_doc(&p)).await?;
    Ok(Some(doc.ok_or(not_found)?.session_id))
}

/// Checks a request, creates or continues its session and registers the
/// turn as `in_progress`. `previous_session` is the session of its
/// `previous_query_id` ([`previous_session`]).
pub(crate) fn accept(
    state: &AppState,
    req: types::QueryRequest,
    previous_session: Option<String>,
) -> LocalResult<Accepted> {
    let Checked {
        ask,
        timeout,
        shape,
        retrieval,
    } = check_request(&req)?;

    let mut inner = state.store.change();
    let continued = continued_session(&inner, &req, previous_session)?;

    let now = Utc::now();
    let (session_id, contexts, previous_query_id) = match continued {
        Some(sid) => {
            let s = &inner.sessions()[&sid];
            if let Some(running) = &s.in_flight {
                return Err(LocalError::conflict(format!(
                    "session {sid:?} already has a turn in flight ({running})"
                )));
            }
            let mut contexts = Vec::new();
            for id in &s.context_ids {
                let ctx = inner.contexts().get(id).ok_or_else(|| {
                    LocalError::not_found(format!("a context of session {sid:?} has been deleted"))
                })?;
                contexts.push((ctx.id.clone(), ctx.slug.clone()));
            }
            let prev = s.session.last_query_id.clone();
            (sid, contexts, prev)
        }
        None => {
            let (sid, contexts) = start_session(&mut inner, &req, &ask, now)?;
            (sid, contexts, None)
        }
    };

    let query_id = new_query_id();
    let query = first_document(&query_id, &session_id, &ask, previous_query_id, now);
    let log = EventLog::counted_in(
        state.config.events_per_query,
        state.config.event_bytes_per_query,
        state.store.turn_bytes(),
    );
    let cancel = state.shutdown.child_token();
    inner.insert_query(QueryEntry {
        query: query.clone(),
        trace: None,
        log: log.clone(),
        cancel: cancel.clone(),
        saved_seq: 0,
        events_saved: false,
    });
    if let Some(s) = inner.session_mut(&session_id) {
        s.in_flight = Some(query_id.clone());
        s.session.last_query_id = Some(query_id.clone());
        s.session.updated_at = now;
    }
    if req.stream != Some(true) && req.background != Some(true) {
        // A plain turn is answered once, at its end: its session and its
        // row are saved with that end, so a turn whose end could not be
        // saved leaves nothing (a crash before it, nothing either).
        inner.save_with_end(&query_id, &session_id);
    }
    let accepted = inner.commit();
    Ok(Accepted {
        plan: TurnPlan {
            query_id,
            session_id,
            ask,
            contexts,
            retrieval,
            shape,
            timeout,
        },
        query,
        log,
        cancel,
        accepted,
    })
}

/// Which session a turn continues: one named by id or by a previous turn
/// (both must agree and exist), or none for a new one.
fn continued_session(
    inner: &crate::local::store::Inner,
    req: &types::QueryRequest,
    previous_session: Option<String>,
) -> LocalResult<Option<String>> {
    Ok(match (&req.session_id, previous_session) {
        (Some(sid), prev) => {
            if !inner.sessions().contains_key(sid) {
                return Err(LocalError::not_found(format!("session {sid:?} not found")));
            }
            if prev.is_some_and(|p| &p != sid) {
                return Err(LocalError::bad_request(
                    "`previous_query_id` belongs to another session than `session_id`",
                ));
            }
            Some(sid.clone())
        }
        (None, Some(sid)) => {
            if !inner.sessions().contains_key(&sid) {
                return Err(LocalError::not_found(format!(
                    "the session of query {:?} no longer exists",
                    req.previous_query_id.as_deref().unwrap_or_default()
                )));
            }
            Some(sid)
        }
        (None, None) => None,
    })
}

/// What [`accept`] takes from a request once it passed the checks that
/// need no lock.
struct Checked {
    ask: String,
    timeout: Duration,
    shape: Option<Map<String, Value>>,
    retrieval: Option<(RetrievalMode, usize, usize)>,
}

/// The checks of a request that need no lock: its ask, stream mode,
/// models, workflow, timeout, shape and retrieval.
fn check_request(req: &types::QueryRequest) -> LocalResult<Checked> {
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
    if let Some(w) = req.workflow.as_ref().map(|w| w.as_str())
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
    let retrieval = retrieval_mode(req)?;
    Ok(Checked {
        ask,
        timeout,
        shape,
        retrieval,
    })
}

/// Starts a session over the request's `scope` (1 to 10 curated contexts
/// of one kind); its id and `(id, slug)` contexts.
fn start_session(
    inner: &mut crate::local::store::Inner,
    req: &types::QueryRequest,
    ask: &str,
    now: chrono::DateTime<Utc>,
) -> LocalResult<(String, Vec<(String, String)>)> {
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
        workflow: req.workflow.as_ref().map(|w| w.as_str().to_owned()),
        workspace: None,
    };
    inner.insert_session(SessionEntry {
        session,
        context_ids: contexts.iter().map(|(id, _)| id.clone()).collect(),
        in_flight: None,
    });
    Ok((sid, contexts))
}

/// A new turn's first document: `in_progress`, no output yet.
fn first_document(
    query_id: &str,
    session_id: &str,
    ask: &str,
    previous_query_id: Option<String>,
    now: chrono::DateTime<Utc>,
) -> types::Query {
    types::Query {
        citations: Vec::new(),
        comparison: None,
        created: now.timestamp(),
        error: None,
        feedback: None,
        id: query_id.to_owned(),
        input: vec![types::QueryInputItem {
            content: ask.to_owned(),
            role: "user".to_owned(),
        }],
        model: Some(LOCAL_MODEL.to_owned()),
        object: "query".to_owned(),
        output: Vec::new(),
        output_json: None,
        previous_query_id,
        rollup: None,
        runtime_ms: 0,
        session_id: session_id.to_owned(),
        status: crate::status::word::IN_PROGRESS.into(),
        steps: Vec::new(),
        synthesis: None,
        trace_ref: Some(format!("local://traces/{query_id}")),
        usage: zero_usage(),
    }
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
