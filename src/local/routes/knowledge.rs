//! The curated knowledge of a context, as Markdown files.

use std::sync::Arc;

use axum::response::Response;
use chrono::{DateTime, Utc};

use super::tree_request::{Listing, TreeAt};
use super::{FileList, listing, octets};
use crate::local::error::{LocalError, LocalResult};
use crate::local::search::ContextIndex;
use crate::local::state::AppState;
use crate::types;

/// The curated index of a context and when it was curated (`None` before
/// its first curation).
fn curated(
    state: &AppState,
    slug: &str,
) -> LocalResult<Option<(Arc<ContextIndex>, DateTime<Utc>)>> {
    let inner = state.store.read();
    let ctx = inner.context(slug)?;
    Ok(match (inner.indexes().get(&ctx.id), ctx.last_curated_at) {
        (Some(index), Some(at)) => Some((index.clone(), at)),
        _ => None,
    })
}

/// The curated knowledge of a context: one Markdown file per source under
/// `chunks/` (`.md` added when the source has another extension), listing
/// its chunks under their heading paths. Built on the blocking pool once
/// per curation, then kept with the index.
pub(super) async fn knowledge_list(state: &AppState, slug: &str) -> LocalResult<FileList> {
    let Some((index, curated_at)) = curated(state, slug)? else {
        return Ok(FileList::new());
    };
    tokio::task::spawn_blocking(move || {
        index
            .knowledge_files()
            .iter()
            .map(|(p, size)| (p.clone(), *size, curated_at))
            .collect()
    })
    .await
    .map_err(|e| LocalError::internal("listing knowledge", e))
}

pub(super) async fn list_knowledge(req: Listing) -> LocalResult<axum::Json<types::DirListing>> {
    let files = knowledge_list(req.state(), req.owner()).await?;
    Ok(axum::Json(listing(&files, req.path(), req.page())?))
}

pub(super) async fn read_knowledge(at: TreeAt) -> LocalResult<Response> {
    let (state, slug, path) = at.into_parts();
    let name = path.trim_matches('/').to_owned();
    let body = match curated(&state, &slug)? {
        Some((index, _)) => tokio::task::spawn_blocking(move || index.knowledge_text(&name))
            .await
            .map_err(|e| LocalError::internal("reading knowledge", e))?,
        None => None,
    }
    .ok_or_else(|| LocalError::not_found(format!("no knowledge file {path:?}")))?;
    Ok(octets(body.into()))
}
