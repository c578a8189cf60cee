//! The curated knowledge of a context, as Markdown files.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::response::Response;
use chrono::Utc;

use super::{FileList, PageParams, Shared, listing, octets};
use crate::local::error::{ApiQuery, LocalError, LocalResult};
use crate::local::state::AppState;
use crate::types;

/// The curated knowledge of a context: one Markdown file per source under
/// `chunks/` (`.md` added when the source has another extension), listing
/// its chunks under their heading paths.
pub(super) fn knowledge_files(
    state: &AppState,
    slug: &str,
) -> LocalResult<BTreeMap<String, String>> {
    let (index, curated_at) = {
        let inner = state.store.lock();
        let ctx = inner.context(slug)?;
        (inner.indexes.get(&ctx.id).cloned(), ctx.last_curated_at)
    };
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    if let (Some(index), Some(_)) = (index, curated_at) {
        for c in index.chunks() {
            let name = if c.source.ends_with(".md") {
                format!("chunks/{}", c.source)
            } else {
                format!("chunks/{}.md", c.source)
            };
            let body = files.entry(name).or_default();
            let heading = if c.section_path.is_empty() {
                c.source.clone()
            } else {
                c.section_path.join(" > ")
            };
            body.push_str(&format!("## {heading}\n\n{}\n\n", c.text));
        }
    }
    Ok(files)
}

pub(super) fn knowledge_list(state: &AppState, slug: &str) -> LocalResult<FileList> {
    let curated_at = state
        .store
        .lock()
        .context(slug)?
        .last_curated_at
        .unwrap_or_else(Utc::now);
    Ok(knowledge_files(state, slug)?
        .into_iter()
        .map(|(p, body)| (p, body.len() as u64, curated_at))
        .collect())
}

pub(super) async fn list_knowledge(
    State(state): Shared,
    Path(slug): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> LocalResult<axum::Json<types::DirListing>> {
    let files = knowledge_list(&state, &slug)?;
    Ok(axum::Json(listing(&files, "", &page)?))
}

pub(super) async fn list_knowledge_at(
    State(state): Shared,
    Path((slug, path)): Path<(String, String)>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> LocalResult<axum::Json<types::DirListing>> {
    let files = knowledge_list(&state, &slug)?;
    Ok(axum::Json(listing(&files, &path, &page)?))
}

pub(super) async fn read_knowledge(
    State(state): Shared,
    Path((slug, path)): Path<(String, String)>,
) -> LocalResult<Response> {
    let body = knowledge_files(&state, &slug)?
        .remove(path.trim_matches('/'))
        .ok_or_else(|| LocalError::not_found(format!("no knowledge file {path:?}")))?;
    Ok(octets(body.into()))
}
