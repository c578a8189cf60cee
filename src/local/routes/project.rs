//! The project and its statistics, counted from the local state, the
//! built-in manifest templates, and the storage figures an operator
//! watches (`GET /local/storage`, outside the API).

use std::collections::HashMap;

use axum::extract::State;
use chrono::Utc;

use super::Shared;
use super::tree_request::{At, On};
use crate::local::error::{LocalError, LocalResult};
use crate::local::ledger;
use crate::local::store::{LOCAL_PROJECT, LOCAL_PROJECT_NAME, TaskEntry};
use crate::types;

/// The one local project: created when its oldest context or task was.
pub(super) async fn get_project(State(state): Shared) -> axum::Json<types::ProjectWithWorkspaces> {
    let inner = state.store.read();
    let now = Utc::now();
    let created = inner
        .contexts()
        .values()
        .map(|c| c.created_at)
        .chain(inner.tasks().values().map(|t| t.task.created_at))
        .min()
        .unwrap_or(now);
    let updated = inner
        .contexts()
        .values()
        .map(|c| c.updated_at)
        .max()
        .unwrap_or(created)
        .max(created);
    axum::Json(types::ProjectWithWorkspaces {
        created_at: created,
        id: LOCAL_PROJECT.to_owned(),
        name: LOCAL_PROJECT_NAME.to_owned(),
        updated_at: updated,
        workspaces_required: false,
    })
}

/// Counts of tasks by how they stand.
#[derive(Debug, Default)]
struct Counts {
    total: i64,
    active: i64,
    completed: i64,
    failed: i64,
    cancelled: i64,
    tokens: i64,
    runtime: i64,
}

fn count<'a>(tasks: impl Iterator<Item = &'a TaskEntry>) -> Counts {
    let mut c = Counts::default();
    for t in tasks {
        let t = &t.task;
        c.total = c.total.saturating_add(1);
        match t.state.as_str() {
            crate::status::word::COMPLETED => c.completed = c.completed.saturating_add(1),
            crate::status::word::FAILED => c.failed = c.failed.saturating_add(1),
            crate::status::word::CANCELLED => c.cancelled = c.cancelled.saturating_add(1),
            _ => c.active = c.active.saturating_add(1),
        }
        c.tokens = c
            .tokens
            .saturating_add(t.tokens_prompt.max(0))
            .saturating_add(t.tokens_completion.max(0));
        c.runtime = c.runtime.saturating_add(t.runtime_seconds.max(0));
    }
    c
}

pub(super) async fn project_task_stats(
    State(state): Shared,
) -> axum::Json<types::GetProjectTaskStatsResponse> {
    let inner = state.store.read();
    let c = count(inner.tasks().values());
    let mut by_state: HashMap<String, i64> = HashMap::new();
    let mut by_workflow: HashMap<String, i64> = HashMap::new();
    for t in inner.tasks().values() {
        let n = by_state
            .entry(t.task.state.as_str().to_owned())
            .or_default();
        *n = n.saturating_add(1);
        let n = by_workflow
            .entry(t.task.workflow.as_str().to_owned())
            .or_default();
        *n = n.saturating_add(1);
    }
    axum::Json(types::GetProjectTaskStatsResponse {
        captured_at: Utc::now(),
        tasks_active: c.active,
        tasks_by_state: by_state,
        tasks_by_workflow: by_workflow,
        tasks_cancelled: c.cancelled,
        tasks_completed: c.completed,
        tasks_total: c.total,
    })
}

pub(super) async fn context_task_stats(
    At(state, slug, _): On,
) -> LocalResult<axum::Json<types::ContextStats>> {
    let inner = state.store.read();
    let id = inner.context(&slug)?.id.clone();
    let c = count(
        inner
            .tasks()
            .values()
            .filter(|t| t.task.context_id.as_deref() == Some(id.as_str())),
    );
    Ok(axum::Json(types::ContextStats {
        runtime_seconds: c.runtime,
        tasks_active: c.active,
        tasks_cancelled: c.cancelled,
        tasks_completed: c.completed,
        tasks_failed: c.failed,
        tasks_total: c.total,
        tokens_total: c.tokens,
    }))
}

pub(super) async fn task_stats(At(state, id, _): On) -> LocalResult<axum::Json<types::TaskStats>> {
    let inner = state.store.read();
    let t = &inner
        .tasks()
        .get(&id)
        .ok_or_else(|| LocalError::not_found(format!("task {id:?} not found")))?
        .task;
    let now = Utc::now();
    // A running task's runtime counts until now.
    let runtime = if t.state.is_terminal() {
        t.runtime_seconds
    } else {
        (now - t.created_at).num_seconds()
    };
    Ok(axum::Json(types::TaskStats {
        captured_at: now,
        runtime_seconds: runtime.max(0),
        task_id: t.id.clone(),
        tokens_completion: t.tokens_completion,
        tokens_prompt: t.tokens_prompt,
        tokens_total: t.tokens_prompt.saturating_add(t.tokens_completion),
    }))
}

pub(super) async fn manifest_templates(
    State(state): Shared,
) -> axum::Json<types::ManifestTemplateCatalog> {
    axum::Json(ledger::templates(state.config.chunk_chars))
}

/// `GET /local/storage` (local only, not an API operation): the sizes an
/// operator watches. The write-ahead log stays under its 4 MiB cap unless
/// another program keeps a read open on `state.db`.
#[derive(Debug, serde::Serialize)]
pub(super) struct StorageStatus {
    /// Whether state persists (`--data`).
    persistent: bool,
    /// Bytes of `state.db`.
    database_bytes: u64,
    /// Bytes of `state.db-wal`, the write-ahead log.
    wal_bytes: u64,
    /// The size the log is cut back to once checkpointed.
    wal_limit_bytes: u64,
    /// Bytes of writes sent to the database and not yet committed.
    write_backlog_bytes: u64,
    /// The backlog past which writes get 503 `busy`.
    write_backlog_limit_bytes: u64,
}

pub(super) async fn storage(State(state): Shared) -> LocalResult<axum::Json<StorageStatus>> {
    let (database_bytes, wal_bytes) = state.store.blocking(|s| s.database_sizes()).await?;
    Ok(axum::Json(StorageStatus {
        persistent: state.store.is_persistent(),
        database_bytes,
        wal_bytes,
        wal_limit_bytes: crate::local::db::WAL_SIZE_LIMIT as u64,
        write_backlog_bytes: state.store.write_backlog(),
        write_backlog_limit_bytes: state.config.write_backlog_limit,
    }))
}
