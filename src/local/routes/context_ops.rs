//! Operations on a whole context: fork, its manifest and curation ledger,
//! and the explore, profile and optimize workflows.

use std::collections::BTreeMap;
use std::path::Path as FsPath;

use axum::extract::{Path, State};
use chrono::Utc;

use super::Shared;
use crate::local::durable;
use crate::local::error::{ApiJson, LocalError, LocalResult};
use crate::local::ledger;
use crate::local::paths::safe_join;
use crate::local::store::SourceMeta;
use crate::local::workflows;
use crate::types;

/// Links (or, across file systems, copies) the sources of one context into
/// another's source tree. Source files are never changed in place (an
/// import replaces a file by renaming over it), so a link is a cheap
/// copy-on-write: the two contexts are independent afterwards. Returns
/// `(path, size)` of what was copied; files gone meanwhile are left out.
fn copy_sources(
    from: &FsPath,
    to: &FsPath,
    sources: &BTreeMap<String, SourceMeta>,
    sync: bool,
) -> std::io::Result<Vec<(String, u64)>> {
    let mut copied = Vec::with_capacity(sources.len());
    let mut dirs = std::collections::BTreeSet::new();
    for path in sources.keys() {
        let (Some(src), Some(dst)) = (safe_join(from, path), safe_join(to, path)) else {
            continue;
        };
        if !src.is_file() {
            continue;
        }
        let parent = dst
            .parent()
            .ok_or_else(|| std::io::Error::other("no parent directory"))?;
        durable::create_dir_all(parent)?;
        if std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst)?;
        }
        dirs.insert(parent.to_path_buf());
        // The size of what was copied, not of the record taken before.
        copied.push((path.clone(), std::fs::metadata(&dst)?.len()));
    }
    if sync {
        for d in &dirs {
            durable::sync_dir(d)?;
        }
    }
    Ok(copied)
}

/// Ends a hold on a context's source tree when dropped (also when the
/// request goes away mid-copy).
struct SourcesHold {
    state: std::sync::Arc<crate::local::state::AppState>,
    context_id: String,
}

impl Drop for SourcesHold {
    fn drop(&mut self) {
        if let Some(ctx) = self.state.store.lock().contexts.get_mut(&self.context_id) {
            ctx.sources_held = ctx.sources_held.saturating_sub(1);
        }
    }
}

/// Forks a context: a new context `target_slug` with the same name, kind,
/// description, guide, manifest and sources (not curated yet).
pub(super) async fn fork(
    State(state): Shared,
    Path(slug): Path<String>,
    ApiJson(body): ApiJson<types::ForkContextBody>,
) -> LocalResult<axum::Json<types::ForkContextResponse>> {
    let (from_id, to_id, sources) = {
        let mut inner = state.store.lock();
        let src = inner.context(&slug)?;
        if src.importing {
            return Err(LocalError::conflict(format!(
                "an import is running on context {:?}; fork it after the import ends",
                src.slug
            )));
        }
        let from_id = src.id.clone();
        let sources = src.sources.clone();
        let req = types::CreateContextRequest {
            description: src.description.clone(),
            guide: src.guide.clone(),
            kind: Some(types::ContextKind(src.kind.clone())),
            manifest: src.manifest.clone(),
            name: src.name.clone(),
            slug: body.target_slug,
        };
        let rec = inner.create_context(req)?;
        // No import runs on the fork while its sources are copied, nor on
        // the context they are copied from.
        inner.context_mut(&rec.id)?.importing = true;
        let src = inner.context_mut(&from_id)?;
        src.sources_held = src.sources_held.saturating_add(1);
        (from_id, rec.id, sources)
    };
    let hold = SourcesHold {
        state: state.clone(),
        context_id: from_id.clone(),
    };
    let from = state.store.context_dir(&from_id).join("sources");
    let to = state.store.context_dir(&to_id).join("sources");
    let sync = state.store.is_persistent();
    let copied = tokio::task::spawn_blocking(move || copy_sources(&from, &to, &sources, sync))
        .await
        .map_err(|e| LocalError::internal("copying the sources of a fork", e))
        .and_then(|r| r.map_err(|e| LocalError::internal("copying the sources of a fork", e)));
    let recorded = {
        drop(hold);
        let mut inner = state.store.lock();
        match copied {
            Ok(files) => {
                let r = inner.add_sources(&to_id, &files, Utc::now());
                if let Some(ctx) = inner.contexts.get_mut(&to_id) {
                    ctx.importing = false;
                }
                r.map(|_| ())
            }
            Err(e) => {
                let _ = inner
                    .delete_context(&to_id)
                    .map(|(_, _, jobs)| jobs.close());
                Err(e)
            }
        }
    };
    state.store.flush().await?;
    if recorded.is_err() {
        let dir = state.store.context_dir(&to_id);
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
    }
    recorded?;
    Ok(axum::Json(types::ForkContextResponse { success: true }))
}

/// The manifest curation runs with: the context's own, else the local
/// default.
pub(super) async fn manifest(
    State(state): Shared,
    Path(slug): Path<String>,
) -> LocalResult<axum::Json<types::Manifest>> {
    let inner = state.store.lock();
    let ctx = inner.context(&slug)?;
    Ok(axum::Json(ctx.manifest.clone().unwrap_or_else(|| {
        ledger::effective_manifest(state.config.chunk_chars)
    })))
}

/// What the latest curation recorded (empty before the first one).
pub(super) async fn curation_ledger(
    State(state): Shared,
    Path(slug): Path<String>,
) -> LocalResult<axum::Json<types::CurationState>> {
    let (ledger, index) = {
        let inner = state.store.lock();
        let ctx = inner.context(&slug)?;
        (
            ctx.ledger.clone().unwrap_or_default(),
            inner.indexes.get(&ctx.id).cloned(),
        )
    };
    let curation = tokio::task::spawn_blocking(move || {
        ledger.to_state(index.as_deref().map(|i| i.chunks()).unwrap_or_default())
    })
    .await
    .map_err(|e| LocalError::internal("reading the curation ledger", e))?;
    Ok(axum::Json(curation))
}

/// Parses an optional JSON body (empty means the defaults).
fn optional_body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> LocalResult<T> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| LocalError::bad_request(format!("invalid JSON body: {e}")))
}

#[derive(Debug, Default, serde::Deserialize)]
struct ExploreBody {
    guide: Option<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ProfileBody {
    manifest: Option<types::Manifest>,
}

pub(super) async fn explore(
    State(state): Shared,
    Path(slug): Path<String>,
    body: axum::body::Bytes,
) -> LocalResult<axum::Json<types::WorkflowTriggerResponse>> {
    let body: ExploreBody = optional_body(&body)?;
    let trigger = workflows::explore(&state, &slug, body.guide)?;
    state.store.flush().await?;
    Ok(axum::Json(trigger))
}

pub(super) async fn profile(
    State(state): Shared,
    Path(slug): Path<String>,
    body: axum::body::Bytes,
) -> LocalResult<axum::Json<types::WorkflowTriggerResponse>> {
    let body: ProfileBody = optional_body(&body)?;
    let trigger = workflows::profile(&state, &slug, body.manifest).await?;
    state.store.flush().await?;
    Ok(axum::Json(trigger))
}

pub(super) async fn optimize(
    State(state): Shared,
    Path(slug): Path<String>,
    body: axum::body::Bytes,
) -> LocalResult<axum::Json<types::WorkflowTriggerResponse>> {
    // The body's tuning knobs drive the hosted optimizer; locally the
    // optimization is a compaction, and the body is only checked.
    let _: serde_json::Map<String, serde_json::Value> = optional_body(&body)?;
    let trigger = workflows::optimize(&state, &slug)?;
    state.store.flush().await?;
    Ok(axum::Json(trigger))
}
