//! Sessions: listing, reading and deleting them.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::Shared;
use super::tree_request::{At, On};
use crate::local::error::{ApiQuery, LocalError, LocalResult};
use crate::local::store::SessionPage;
use crate::types;

#[derive(Debug, Deserialize)]
pub(super) struct SessionParams {
    /// Sessions in the page (1..=200, default 50).
    limit: Option<i64>,
}

/// `GET /sessions`: the `limit` most recently updated sessions, newest
/// first.
pub(super) async fn list_sessions(
    State(state): Shared,
    ApiQuery(p): ApiQuery<SessionParams>,
) -> LocalResult<axum::Json<types::ListSessionsResponse>> {
    let limit = super::page_limit(p.limit, 50, 200)?;
    let inner = state.store.read();
    let mut sessions: Vec<types::Session> = inner
        .sessions()
        .values()
        .map(|s| s.session.clone())
        .collect();
    sessions.sort_by(|a, b| b.updated_at.cmp(&a.updated_at).then(b.id.cmp(&a.id)));
    sessions.truncate(limit as usize);
    Ok(axum::Json(types::ListSessionsResponse { sessions }))
}

/// Turns in one page of `GET /sessions/{id}` unless `limit` says.
const DEFAULT_TURNS: u32 = 50;
/// Most turns in one page.
const MAX_TURNS: u32 = 200;

#[derive(Debug, Deserialize)]
pub(super) struct SessionTurnParams {
    /// Turns in the page (1..=200, default 50).
    limit: Option<i64>,
    /// Newest turns skipped (default 0: the page ends at the newest turn).
    offset: Option<i64>,
}

/// `GET /sessions/{id}`: the session with one page of its turns, oldest
/// first: the newest `limit` turns before the `offset` newest. The
/// turns are read and serialized on the blocking pool.
pub(super) async fn get_session(At(state, id, p): On<SessionTurnParams>) -> LocalResult<Response> {
    let limit = match p.limit {
        None => DEFAULT_TURNS,
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_TURNS).contains(n))
            .ok_or_else(|| LocalError::bad_request(format!("limit must be 1..={MAX_TURNS}")))?,
    };
    let skip = match p.offset {
        None => 0,
        Some(n) => {
            u32::try_from(n).map_err(|_| LocalError::bad_request("offset must be 0 or more"))?
        }
    };
    let not_found = LocalError::not_found(format!("session {id:?} not found"));
    let body = state
        .store
        .blocking(move |store| {
            let page = store.session_page_blocking(&id, limit, skip)?;
            Some(serde_json::to_vec(&response(page)))
        })
        .await?
        .ok_or(not_found)?
        .map_err(|e| LocalError::internal("a session could not be serialized", e))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

fn response(page: SessionPage) -> types::GetSessionResponse {
    let s = page.session;
    types::GetSessionResponse {
        created_at: s.created_at,
        created_by: s.created_by,
        guardrails: s.guardrails,
        id: s.id,
        last_query_id: s.last_query_id,
        models: s.models,
        project_id: s.project_id,
        queries: page.queries,
        scope: s.scope,
        system_prompt: s.system_prompt,
        title: s.title,
        tools: s.tools,
        updated_at: s.updated_at,
        workflow: s.workflow,
        workspace: s.workspace,
    }
}

pub(super) async fn delete_session(
    At(state, id, _): On,
) -> LocalResult<axum::Json<types::DeleteSessionResponse>> {
    let (deleted, ticket) = {
        let mut change = state.store.change();
        (change.delete_session(&id), change.commit())
    };
    if deleted {
        state.store.saved(ticket).await?;
    }
    Ok(axum::Json(types::DeleteSessionResponse { deleted }))
}
