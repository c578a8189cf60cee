//! Contexts seeded from directories at start: the tree read, copied into
//! the context's sources and curated before the server reports ready.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use super::StartError;
use super::paths::read_tree;
use super::state::AppState;
use super::store::SourceMeta;
use super::{curate, durable};

/// A seeded directory as a context's description names it: relative to the
/// working directory when it lies below it, otherwise by its last component,
/// so no absolute path of the machine reaches a client.
fn shown_dir(dir: &Path) -> String {
    let below_cwd = std::env::current_dir()
        .ok()
        .and_then(|cwd| dir.strip_prefix(cwd).ok().map(Path::to_path_buf));
    let shown = match below_cwd {
        Some(rel) if !rel.as_os_str().is_empty() => rel,
        _ if dir.is_absolute() => dir.file_name().map(PathBuf::from).unwrap_or_default(),
        _ => dir.to_path_buf(),
    };
    shown.display().to_string()
}

/// Copies the files of a tree into a context's source directory (durably),
/// replacing what it held.
fn copy_tree(files: &[(String, PathBuf, u64)], ctx_dir: &Path, sync: bool) -> std::io::Result<()> {
    let src = ctx_dir.join("sources");
    if src.exists() {
        std::fs::remove_dir_all(&src)?;
    }
    for (rel, path, _) in files {
        let target = src.join(rel);
        if sync {
            durable::write_file(&target, &std::fs::read(path)?)?;
        } else {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::copy(path, &target)?;
        }
    }
    Ok(())
}

/// How long seeding a context at start waits for its curation.
const SEED_CURATION_LIMIT: Duration = Duration::from_secs(600);

pub(super) async fn seed_context(
    state: &Arc<AppState>,
    slug: &str,
    dir: &Path,
) -> Result<(), StartError> {
    let fail = |message: String| StartError::Context {
        slug: slug.to_owned(),
        message,
    };
    let limit = state.config.context_bytes_limit;
    let dir_owned = dir.to_path_buf();
    let files = tokio::task::spawn_blocking(move || read_tree(&dir_owned, limit))
        .await
        .map_err(|e| fail(e.to_string()))?
        .map_err(|(path, source)| StartError::ContextFiles {
            slug: slug.to_owned(),
            action: "read",
            path,
            source,
        })?;
    if files.is_empty() {
        return Err(fail(format!("{} holds no files", dir.display())));
    }
    let context_id = {
        let mut inner = state.store.change();
        match inner.context_id(slug) {
            Some(id) => id,
            None => {
                let req = crate::types::CreateContextRequest {
                    description: Some(format!("Files of {}", shown_dir(dir))),
                    guide: None,
                    kind: None,
                    manifest: None,
                    name: slug.to_owned(),
                    slug: slug.to_owned(),
                };
                inner.create_context(req).map_err(|e| fail(e.message))?.id
            }
        }
    };
    let ctx_dir = state.store.context_dir(&context_id);
    let copied = files.clone();
    let sync = state.store.is_persistent();
    let target = ctx_dir.join("sources");
    tokio::task::spawn_blocking(move || copy_tree(&copied, &ctx_dir, sync))
        .await
        .map_err(|e| fail(e.to_string()))?
        .map_err(|source| StartError::ContextFiles {
            slug: slug.to_owned(),
            action: "store the sources in",
            path: target,
            source,
        })?;
    {
        let now = Utc::now();
        let mut inner = state.store.change();
        let sources = files
            .iter()
            .map(|(rel, _, size)| {
                (
                    rel.clone(),
                    SourceMeta {
                        size: *size,
                        mtime: now,
                    },
                )
            })
            .collect();
        inner
            .replace_sources(&context_id, sources, now)
            .map_err(|e| fail(e.message))?;
    }
    let is_work = state
        .store
        .read()
        .contexts()
        .get(&context_id)
        .is_some_and(|c| c.kind == "work");
    let (task, _registered) =
        curate::start(state, &context_id, true, None, is_work).map_err(|e| fail(e.message))?;
    wait_curated(state, slug, &task.id).await?;
    // Seeding runs before the server serves: everything sent is its own.
    state.store.settled().await.map_err(|e| fail(e.message))?;
    Ok(())
}

/// Waits (at most `SEED_CURATION_LIMIT`) for a seeded context's curation
/// task to complete.
async fn wait_curated(state: &Arc<AppState>, slug: &str, task_id: &str) -> Result<(), StartError> {
    let fail = |message: String| StartError::Context {
        slug: slug.to_owned(),
        message,
    };
    let deadline = tokio::time::Instant::now() + SEED_CURATION_LIMIT;
    loop {
        let (st, err) = {
            let inner = state.store.read();
            match inner.tasks().get(task_id) {
                Some(t) => (t.task.state.as_str().to_owned(), t.task.error.clone()),
                None => return Err(fail("the curate task vanished".to_owned())),
            }
        };
        match st.as_str() {
            crate::status::word::COMPLETED => break,
            crate::status::word::FAILED | crate::status::word::CANCELLED => {
                return Err(fail(format!("curation {st}: {}", err.unwrap_or_default())));
            }
            _ if tokio::time::Instant::now() >= deadline => {
                return Err(fail(format!(
                    "curation did not finish within {} s",
                    SEED_CURATION_LIMIT.as_secs()
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    Ok(())
}
