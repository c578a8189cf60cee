//! Contexts: create, read, update, delete, and starting a curation.

use axum::extract::State;
use axum::http::StatusCode;

use super::Shared;

/// Longest wait of a context's deletion for its jobs to stop.
const JOBS_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
use super::tree_request::{At, On, OptionalJson, Posted};
use crate::local::curate;
use crate::local::error::{ApiJson, LocalError, LocalResult};
use crate::local::store::LOCAL_MODEL;
use crate::types;

pub(super) async fn list_contexts(State(state): Shared) -> axum::Json<Vec<types::ContextResponse>> {
    let inner = state.store.read();
    axum::Json(inner.contexts().values().map(|c| c.to_response()).collect())
}

pub(super) async fn create_context(
    State(state): Shared,
    ApiJson(req): ApiJson<types::CreateContextRequest>,
) -> LocalResult<axum::Json<types::ContextResponse>> {
    let (rec, ticket) = {
        let mut change = state.store.change();
        let rec = change.create_context(req)?;
        (rec, change.commit())
    };
    state.store.saved(ticket).await?;
    Ok(axum::Json(rec.to_response()))
}

pub(super) async fn get_context(
    At(state, slug, _): On,
) -> LocalResult<axum::Json<types::ContextResponse>> {
    Ok(axum::Json(state.store.read().context(&slug)?.to_response()))
}

pub(super) async fn update_context(
    Posted(state, slug, req): Posted<types::UpdateContextRequest>,
) -> LocalResult<axum::Json<types::ContextResponse>> {
    let (resp, ticket) = {
        let mut change = state.store.change();
        let resp = change.update_context(&slug, req)?.to_response();
        (resp, change.commit())
    };
    state.store.saved(ticket).await?;
    Ok(axum::Json(resp))
}

/// Deletes a context: cancels its running tasks, waits (at most
/// `JOBS_WAIT`) for every job on its files to stop, then removes its
/// files, so none is written after they are gone.
pub(super) async fn delete_context(At(state, slug, _): On) -> LocalResult<StatusCode> {
    let (rec, tokens, jobs, deleted) = {
        let mut change = state.store.change();
        let (rec, tokens, jobs) = change.delete_context(&slug)?;
        (rec, tokens, jobs, change.commit())
    };
    for t in tokens {
        t.cancel();
    }
    state.store.saved(deleted).await?;
    if tokio::time::timeout(JOBS_WAIT, jobs.wait()).await.is_err() {
        tracing::warn!(context = %rec.slug, "the jobs of a deleted context did not stop in time; removing its files anyway (the next start sweeps what they leave)");
    }
    let dir = state.store.context_dir(&rec.id);
    if let Err(e) = tokio::fs::remove_dir_all(dir).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(error = %e, "the files of a deleted context could not be removed");
    }
    Ok(StatusCode::OK)
}

pub(super) async fn curate_context(
    At(state, slug, _): On,
    OptionalJson(opts): OptionalJson<types::CurateContextBody>,
) -> LocalResult<axum::Json<types::WorkflowTriggerResponse>> {
    if let Some(m) = opts.model.as_deref()
        && m != LOCAL_MODEL
    {
        return Err(LocalError::bad_request(format!(
            "model {m:?} is not available locally; the only model is {LOCAL_MODEL:?}"
        )));
    }
    let (task, registered) = curate::start(&state, &slug, opts.force, opts.scope, false)?;
    // An acknowledged curate task survives a crash (as failed, if it ran).
    state.store.saved(registered).await?;
    Ok(axum::Json(types::WorkflowTriggerResponse {
        exploring: None,
        importing: None,
        profiling: None,
        state: "importing".to_owned(),
        task_id: task.id,
    }))
}
