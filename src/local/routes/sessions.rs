//! Sessions: listing, reading and deleting them.

use axum::extract::{Path, State};
use serde::Deserialize;

use super::Shared;
use crate::local::error::{ApiQuery, LocalError, LocalResult};
use crate::types;

#[derive(Debug, Deserialize)]
pub(super) struct SessionParams {
    limit: Option<i64>,
}

pub(super) async fn list_sessions(
    State(state): Shared,
    ApiQuery(p): ApiQuery<SessionParams>,
) -> LocalResult<axum::Json<types::ListSessionsResponse>> {
    let limit = p.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(LocalError::bad_request("limit must be 1..=200"));
    }
    let inner = state.store.lock();
    let mut sessions: Vec<types::Session> =
        inner.sessions.values().map(|s| s.session.clone()).collect();
    sessions.sort_by(|a, b| b.updated_at.cmp(&a.updated_at).then(b.id.cmp(&a.id)));
    sessions.truncate(limit as usize);
    Ok(axum::Json(types::ListSessionsResponse { sessions }))
}

pub(super) async fn get_session(
    State(state): Shared,
    Path(id): Path<String>,
) -> LocalResult<axum::Json<types::GetSessionResponse>> {
    let (s, query_ids) = {
        let inner = state.store.lock();
        let s = inner
            .sessions
            .get(&id)
            .ok_or_else(|| LocalError::not_found(format!("session {id:?} not found")))?;
        (s.session.clone(), s.query_ids.clone())
    };
    // Ended turns may be only in the database: read them out of the lock.
    let queries = query_ids
        .iter()
        .filter_map(|q| state.store.query_doc(q))
        .collect();
    Ok(axum::Json(types::GetSessionResponse {
        created_at: s.created_at,
        created_by: s.created_by,
        guardrails: s.guardrails,
        id: s.id,
        last_query_id: s.last_query_id,
        models: s.models,
        project_id: s.project_id,
        queries,
        scope: s.scope,
        system_prompt: s.system_prompt,
        title: s.title,
        tools: s.tools,
        updated_at: s.updated_at,
        workflow: s.workflow,
        workspace: s.workspace,
    }))
}

pub(super) async fn delete_session(
    State(state): Shared,
    Path(id): Path<String>,
) -> LocalResult<axum::Json<types::DeleteSessionResponse>> {
    let deleted = state.store.lock().delete_session(&id);
    if deleted {
        state.store.flush().await?;
    }
    Ok(axum::Json(types::DeleteSessionResponse { deleted }))
}
