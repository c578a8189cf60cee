//! Sources: uploads (staged, checked, then moved into place) and reads.

use axum::extract::Multipart;
use axum::extract::multipart::MultipartRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::io::ReaderStream;

use super::tree_request::{At, Listing, On, TreeAt};
use super::{FileList, listing};
use crate::local::error::{LocalError, LocalResult};
use crate::local::faults::{failpoint, point};
use crate::local::paths::safe_join;
use crate::local::state::AppState;
use crate::local::{durable, import};
use crate::types;

#[derive(Debug, Deserialize)]
pub(super) struct UploadParams {
    path: Option<String>,
}

pub(super) async fn upload(
    At(state, slug, params): On<UploadParams>,
    headers: axum::http::HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> LocalResult<axum::Json<types::WorkflowTriggerResponse>> {
    let limit = state.config.upload_limit;
    // A body announced larger than the limit (plus room for the form's
    // own headers) is refused before any of it is read.
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > (limit as u64).saturating_add(FORM_OVERHEAD)) {
        return Err(LocalError::too_large(format!(
            "the upload exceeds the {limit} byte limit"
        )));
    }
    // An unknown context is refused before anything is read; an import
    // running there is waited for once this one is staged.
    state.store.read().context(&slug)?;
    let dir = match params.path.as_deref().map(str::trim) {
        None | Some("") => "uploads".to_owned(),
        Some(p) => import::safe_path(p)
            .ok_or_else(|| LocalError::bad_request(format!("unsafe upload path {p:?}")))?,
    };
    // Two uploads are staged (and queued for their import) at a time; more
    // wait their turn a moment, then are shed as busy. The wait is short of
    // the body's pace window, which runs meanwhile.
    let _slot = tokio::time::timeout(
        STAGING_SLOT_WAIT,
        state.staging_slots.clone().acquire_owned(),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .ok_or_else(LocalError::staging_full)?;
    let mut multipart = multipart.map_err(|e| LocalError::new(e.status(), e.body_text()))?;
    let multipart_error = |e: axum::extract::multipart::MultipartError| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            LocalError::too_large(format!("the upload exceeds the {limit} byte limit"))
        } else {
            LocalError::new(e.status(), e.body_text())
        }
    };
    while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
        if field.name() != Some("file") {
            continue;
        }
        let name = field.file_name().unwrap_or("").to_owned();
        import::check_file_name(&name)?;
        // Everything below happens in a private staging directory, owned
        // by this request (removed on every way out) until the import
        // takes it over.
        let root = import::StagingRoot::new(state.store.staging_dir());
        let upload = root.path().join("upload");
        let (root, file) = make_staging(root, upload.clone()).await?;
        {
            let mut file = tokio::fs::File::from_std(file);
            let mut written = 0usize;
            while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                failpoint(point::STAGING).map_err(|e| LocalError::io("staging the upload", &e))?;
                written = written.saturating_add(chunk.len());
                if written > limit {
                    return Err(LocalError::too_large(format!(
                        "the upload exceeds the {limit} byte limit"
                    )));
                }
                file.write_all(&chunk)
                    .await
                    .map_err(|e| LocalError::io("staging the upload", &e))?;
            }
            file.flush()
                .await
                .map_err(|e| LocalError::io("staging the upload", &e))?;
        }
        let caps = import::Caps::new(
            state.config.context_bytes_limit,
            state.store.is_persistent(),
        );
        // If this request goes away, the expansion stops.
        let _stop = StopOnDrop(caps.cancel.clone());
        let staged =
            tokio::task::spawn_blocking(move || import::stage(&upload, &name, &dir, root, caps))
                .await
                .map_err(|e| LocalError::internal("staging the upload", e))??;
        let trigger = import::start(&state, &slug, staged).await?;
        return Ok(axum::Json(trigger));
    }
    Err(LocalError::bad_request("the form has no `file` part"))
}

/// Makes the staging directory of `root` and its `upload` file on the task
/// that owns the root, so a request that goes away meanwhile removes them
/// after they are made, never before.
async fn make_staging(
    root: import::StagingRoot,
    upload: std::path::PathBuf,
) -> LocalResult<(import::StagingRoot, std::fs::File)> {
    tokio::task::spawn_blocking(move || {
        durable::create_dir_all(root.path())?;
        let file = std::fs::File::create(&upload)?;
        Ok::<_, std::io::Error>((root, file))
    })
    .await
    .map_err(|e| LocalError::internal("staging the upload", e))?
    .map_err(|e| LocalError::io("staging the upload", &e))
}

/// Longest an upload waits for a staging slot before it is shed as busy.
const STAGING_SLOT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Room for a multipart form's own headers beside its file.
const FORM_OVERHEAD: u64 = 64 * 1024;

/// Sets a flag when dropped (the request ended, answered or not).
struct StopOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

pub(super) fn source_files(state: &AppState, slug: &str) -> LocalResult<FileList> {
    let inner = state.store.read();
    let ctx = inner.context(slug)?;
    Ok(ctx
        .sources
        .iter()
        .map(|(p, m)| (p.clone(), m.size, m.mtime))
        .collect())
}

pub(super) async fn list_sources(req: Listing) -> LocalResult<axum::Json<types::DirListing>> {
    let files = source_files(req.state(), req.owner())?;
    Ok(axum::Json(listing(&files, req.path(), req.page())?))
}

pub(super) async fn read_source(at: TreeAt) -> LocalResult<Response> {
    let (state, slug, path) = at.into_parts();
    let path = path.trim_matches('/').to_owned();
    let (file, size) = {
        let inner = state.store.read();
        let ctx = inner.context(&slug)?;
        let meta = ctx
            .sources
            .get(&path)
            .ok_or_else(|| LocalError::not_found(format!("no source file {path:?}")))?;
        let file = safe_join(&state.store.context_dir(&ctx.id).join("sources"), &path)
            .ok_or_else(|| LocalError::not_found(format!("no source file {path:?}")))?;
        (file, meta.size)
    };
    let file = tokio::fs::File::open(&file).await.map_err(|e| {
        if let Some(cause) = crate::local::error::exhaustion(&e) {
            return LocalError::exhausted(cause);
        }
        tracing::warn!(error = %e, "a listed source file could not be opened");
        LocalError::not_found(format!("no source file {path:?}"))
    })?;
    // Streamed from disk, at most the size the context records.
    let body = axum::body::Body::from_stream(ReaderStream::new(file.take(size)));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, size.to_string()),
        ],
        body,
    )
        .into_response())
}
