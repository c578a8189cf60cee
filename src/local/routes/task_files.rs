//! The files a task produced (its report, the list of what it imported):
//! listed, read, described and deleted.

use axum::response::Response;

use super::tree_request::{Listing, TreeAt};
use super::{FileList, PageParams, listing, octets};
use crate::local::error::{LocalError, LocalResult};
use crate::local::state::AppState;
use crate::types;

/// The files of a task (404 for an unknown task), read on the blocking
/// pool.
async fn files_of(state: &AppState, id: &str) -> LocalResult<FileList> {
    if !state.store.read().tasks().contains_key(id) {
        return Err(LocalError::not_found(format!("task {id:?} not found")));
    }
    let id = id.to_owned();
    state.store.blocking(move |s| s.task_files(&id)).await?
}

fn task_listing(
    files: &FileList,
    dir: &str,
    page: &PageParams,
) -> LocalResult<types::TaskFileListing> {
    let l = listing(files, dir, page)?;
    Ok(types::TaskFileListing {
        entries: l
            .entries
            .into_iter()
            .map(|e| types::TaskFileListingEntriesItem {
                mode: Some(if e.kind == "dir" { "0755" } else { "0644" }.to_owned()),
                kind: e.kind,
                mtime: e.mtime,
                name: e.name,
                size: e.size,
            })
            .collect(),
        limit: l.limit,
        next_offset: l.next_offset,
        offset: l.offset,
        total: l.total,
    })
}

pub(super) async fn list(req: Listing) -> LocalResult<axum::Json<types::TaskFileListing>> {
    let files = files_of(req.state(), req.owner()).await?;
    Ok(axum::Json(task_listing(&files, req.path(), req.page())?))
}

pub(super) async fn read(at: TreeAt) -> LocalResult<Response> {
    let (state, id, path) = at.into_parts();
    let path = path.trim_matches('/');
    if !state.store.read().tasks().contains_key(&id) {
        return Err(LocalError::not_found(format!("task {id:?} not found")));
    }
    let owned = path.to_owned();
    let data = state
        .store
        .blocking(move |s| s.task_file(&id, &owned))
        .await?
        .ok_or_else(|| LocalError::not_found(format!("no task file {path:?}")))?;
    Ok(octets(data.into()))
}

pub(super) async fn metadata(at: TreeAt) -> LocalResult<axum::Json<types::TaskFileMetadata>> {
    let (state, id, path) = at.into_parts();
    let files = files_of(&state, &id).await?;
    let path = path.trim_matches('/');
    let live = |kind: &str, mode: &str, size: u64, mtime: chrono::DateTime<chrono::Utc>| {
        types::TaskFileMetadata::Live {
            kind: kind.to_owned(),
            link_target: None,
            mode: mode.to_owned(),
            mtime: mtime.to_rfc3339(),
            size: i64::try_from(size).unwrap_or(i64::MAX),
        }
    };
    if let Some((_, size, mtime)) = files.iter().find(|(p, _, _)| p == path) {
        return Ok(axum::Json(live("file", "0644", *size, *mtime)));
    }
    let below = format!("{path}/");
    let inside: Vec<_> = files
        .iter()
        .filter(|(p, _, _)| p.starts_with(&below))
        .collect();
    match inside.iter().map(|(_, _, m)| *m).max() {
        Some(mtime) if !path.is_empty() => {
            let size = inside
                .iter()
                .fold(0u64, |a, (_, s, _)| a.saturating_add(*s));
            Ok(axum::Json(live("dir", "0755", size, mtime)))
        }
        _ => Err(LocalError::not_found(format!("no task file {path:?}"))),
    }
}

pub(super) async fn delete(at: TreeAt) -> LocalResult<axum::Json<types::DeleteTaskFileResponse>> {
    let (state, id, path) = at.into_parts();
    let files = files_of(&state, &id).await?;
    let path = path.trim_matches('/').to_owned();
    if !files.iter().any(|(p, _, _)| *p == path) {
        return Err(LocalError::not_found(format!("no task file {path:?}")));
    }
    state.store.delete_task_file(&id, &path).await?;
    Ok(axum::Json(types::DeleteTaskFileResponse {
        deleted: true,
        path: Some(path),
    }))
}
