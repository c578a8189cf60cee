//! Tasks: listing, reading and cancelling imports and curations.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;

use super::Shared;
use super::tree_request::{At, On};
use crate::local::error::{ApiQuery, LocalError, LocalResult};
use crate::types;

#[derive(Debug, Deserialize)]
pub(super) struct TaskParams {
    workflow: Option<String>,
    state: Option<String>,
    context: Option<String>,
    q: Option<String>,
    limit: Option<i64>,
    page: Option<i64>,
    offset: Option<i64>,
}

/// `GET /tasks`: one page of the tasks matching the workflow, state,
/// context and id text asked for.
pub(super) async fn list_tasks(
    State(state): Shared,
    ApiQuery(p): ApiQuery<TaskParams>,
) -> LocalResult<axum::Json<types::ListTasksResponse>> {
    let limit = super::page_limit(p.limit, 30, 1000)?;
    let page = p.page.unwrap_or(1);
    if page < 1 || p.offset.is_some_and(|o| o < 0) {
        return Err(LocalError::bad_request("page must be >= 1 and offset >= 0"));
    }
    let offset = match p.offset {
        Some(o) => o,
        None => (page - 1).checked_mul(limit).ok_or_else(|| {
            LocalError::bad_request(format!(
                "page {page} is too large for limit {limit}: (page - 1) * limit must fit in 64 bits"
            ))
        })?,
    };
    let inner = state.store.read();
    let context_id = p
        .context
        .as_ref()
        .map(|c| inner.context_id(c).unwrap_or_else(|| c.clone()));
    let matching: Vec<&types::TaskResponse> = inner
        .tasks()
        .values()
        .rev()
        .map(|t| &t.task)
        .filter(|t| {
            p.workflow
                .as_deref()
                .is_none_or(|w| t.workflow.as_str() == w)
        })
        .filter(|t| p.state.as_deref().is_none_or(|s| t.state.as_str() == s))
        .filter(|t| {
            context_id
                .as_deref()
                .is_none_or(|c| t.context_id.as_deref() == Some(c))
        })
        .filter(|t| p.q.as_deref().is_none_or(|q| t.id.contains(q)))
        .collect();
    let total = matching.len() as i64;
    let items = matching
        .into_iter()
        .skip(usize::try_from(offset).unwrap_or(usize::MAX))
        .take(limit as usize)
        .cloned()
        .collect();
    Ok(axum::Json(types::ListTasksResponse {
        items,
        limit,
        offset,
        page: (offset / limit).saturating_add(1),
        pages: (total + limit - 1) / limit,
        total,
    }))
}

pub(super) async fn get_task(At(state, id, _): On) -> LocalResult<axum::Json<types::TaskResponse>> {
    state
        .store
        .read()
        .tasks()
        .get(&id)
        .map(|t| axum::Json(t.task.clone()))
        .ok_or_else(|| LocalError::not_found(format!("task {id:?} not found")))
}

pub(super) async fn cancel_task(At(state, id, _): On) -> LocalResult<StatusCode> {
    let ticket = {
        let mut change = state.store.change();
        change.cancel_task(&id)?;
        change.commit()
    };
    // An acknowledged cancellation survives a crash.
    state.store.saved(ticket).await?;
    Ok(StatusCode::OK)
}
