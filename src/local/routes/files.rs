//! Statistics and manifests of a context's files, and removing sources.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::Arc;

use chrono::Utc;

use super::FileList;
use super::tree_request::{At, On, Posted, TreeAt};
use crate::local::error::{LocalError, LocalResult};
use crate::local::faults::{failpoint, point};
use crate::local::paths::safe_join;
use crate::local::state::AppState;
use crate::local::store::Ticket;
use crate::types;

/// Counts of files, directories (every directory above a file) and bytes.
fn file_stats(files: &FileList) -> types::FileStats {
    let mut dirs = BTreeSet::new();
    let mut total = 0u64;
    for (path, size, _) in files {
        total = total.saturating_add(*size);
        let mut rest = path.as_str();
        while let Some((parent, _)) = rest.rsplit_once('/') {
            if !dirs.insert(parent.to_owned()) {
                break;
            }
            rest = parent;
        }
    }
    types::FileStats {
        dir_count: i64::try_from(dirs.len()).unwrap_or(i64::MAX),
        file_count: i64::try_from(files.len()).unwrap_or(i64::MAX),
        total_size: i64::try_from(total).unwrap_or(i64::MAX),
    }
}

pub(super) async fn source_stats(
    At(state, slug, _): On,
) -> LocalResult<axum::Json<types::SourceStats>> {
    let files = super::sources::source_files(&state, &slug)?;
    let s = file_stats(&files);
    let limit = i64::try_from(state.config.context_bytes_limit).unwrap_or(i64::MAX);
    Ok(axum::Json(types::SourceStats {
        dir_count: s.dir_count,
        file_count: s.file_count,
        max_bytes_per_context: Some(limit),
        max_files_per_context: None,
        total_size: s.total_size,
        used_bytes: Some(s.total_size),
        used_files: Some(s.file_count),
    }))
}

pub(super) async fn source_manifest(
    At(state, slug, _): On,
) -> LocalResult<axum::Json<types::GetSourceManifestResponse>> {
    let files = super::sources::source_files(&state, &slug)?;
    Ok(axum::Json(types::GetSourceManifestResponse {
        files: files
            .into_iter()
            .map(
                |(path, size, mtime)| types::GetSourceManifestResponseFilesItem {
                    last_modified: Some(mtime),
                    path,
                    size: i64::try_from(size).unwrap_or(i64::MAX),
                },
            )
            .collect(),
    }))
}

pub(super) async fn knowledge_stats(
    At(state, slug, _): On,
) -> LocalResult<axum::Json<types::FileStats>> {
    let files = super::knowledge::knowledge_list(&state, &slug).await?;
    Ok(axum::Json(file_stats(&files)))
}

/// Removes sources of a context: the named files, and every file below a
/// named directory. The removal is saved before the files go, and no
/// import starts on the context until they are gone, so a file an upload
/// puts back is never removed after it was acknowledged. The curated index
/// keeps them until the next curation. Returns what was removed.
pub(super) async fn remove_sources(
    state: &Arc<AppState>,
    slug: &str,
    paths: &[String],
) -> LocalResult<Vec<String>> {
    let (removed, id, dir, ticket) = {
        let mut inner = state.store.change();
        let ctx = inner.context_mut(slug)?;
        super::refuse_while_importing(ctx, "remove sources after it ends")?;
        let mut removed = Vec::new();
        for p in paths {
            let p = p.trim_matches('/');
            if p.is_empty() {
                continue;
            }
            let below = format!("{p}/");
            // Keys starting with `p` are contiguous in the sorted map.
            let hit: Vec<String> = ctx
                .sources
                .range::<str, _>((Bound::Included(p), Bound::Unbounded))
                .map(|(k, _)| k)
                .take_while(|k| k.starts_with(p))
                .filter(|k| k.as_str() == p || k.starts_with(&below))
                .cloned()
                .collect();
            for k in hit {
                ctx.sources.remove(&k);
                removed.push(k);
            }
        }
        let id = ctx.id.clone();
        if !removed.is_empty() {
            ctx.updated_at = Utc::now();
            ctx.sources_held = ctx.sources_held.saturating_add(1);
            inner.mark_all_sources(&id);
        }
        (
            removed,
            id.clone(),
            state.store.context_dir(&id).join("sources"),
            inner.commit(),
        )
    };
    if removed.is_empty() {
        return Ok(removed);
    }
    // On a task of its own, so the files go (and the hold ends) even when
    // this request goes away.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let job_state = state.clone();
    let gone = removed.clone();
    state.spawn(async move {
        let result = remove_files(&job_state, ticket, dir, gone).await;
        job_state.store.change().release_sources(&id);
        let _ = done_tx.send(result);
    });
    match done_rx.await {
        Ok(result) => result.map(|()| removed),
        Err(_) => Err(LocalError::outcome_unknown()),
    }
}

/// Saves the removal, then deletes the files (a removal that was not saved
/// leaves them: the rows still name them).
async fn remove_files(
    state: &AppState,
    removal: Ticket,
    dir: PathBuf,
    gone: Vec<String>,
) -> LocalResult<()> {
    state.store.saved(removal).await?;
    let result = tokio::task::spawn_blocking(move || {
        failpoint(point::SOURCE_REMOVE)?;
        for p in &gone {
            if let Some(file) = safe_join(&dir, p)
                && let Err(e) = std::fs::remove_file(file)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(e);
            }
        }
        Ok(())
    })
    .await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "a removed source file could not be deleted"),
        Err(e) => tracing::warn!(error = %e, "deleting removed source files stopped"),
    }
    Ok(())
}

pub(super) async fn delete_source_file(
    at: TreeAt,
) -> LocalResult<axum::Json<types::DeleteSourceFileResponse>> {
    let (state, slug, path) = at.into_parts();
    let path = path.trim_matches('/').to_owned();
    let known = state
        .store
        .read()
        .context(&slug)?
        .sources
        .contains_key(&path);
    if !known {
        return Err(LocalError::not_found(format!("no source file {path:?}")));
    }
    let removed = remove_sources(&state, &slug, std::slice::from_ref(&path)).await?;
    Ok(axum::Json(types::DeleteSourceFileResponse {
        deleted: !removed.is_empty(),
        path,
    }))
}

/// Removes sources from the curated knowledge: they leave the source tree
/// now and the index at the next curation (the ledger then records them
/// removed). Unknown paths are ignored.
pub(super) async fn delete_curated_sources(
    Posted(state, slug, body): Posted<types::DeleteCuratedSourcesBody>,
) -> LocalResult<axum::Json<serde_json::Value>> {
    let removed = remove_sources(&state, &slug, &body.sources).await?;
    Ok(axum::Json(serde_json::json!({
        "removed": removed,
        "pending_curation": !removed.is_empty(),
    })))
}
