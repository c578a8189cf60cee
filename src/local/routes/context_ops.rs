//! Operations on a whole context: fork, its manifest and curation ledger,
//! and the explore, profile and optimize workflows.

use std::collections::BTreeMap;
use std::path::Path as FsPath;

use chrono::Utc;

use super::tree_request::{At, On, OptionalJson, Posted};
use crate::local::durable;
use crate::local::error::{LocalError, LocalResult};
use crate::local::faults::{failpoint, point};
use crate::local::import::StagingRoot;
use crate::local::ledger;
use crate::local::paths::safe_join;
use crate::local::state::AppState;
use crate::local::store::{SourceMeta, Ticket};
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
    abandoned: &std::sync::atomic::AtomicBool,
) -> std::io::Result<Vec<(String, u64)>> {
    let mut copied = Vec::with_capacity(sources.len());
    let mut dirs = std::collections::BTreeSet::new();
    for path in sources.keys() {
        if abandoned.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("the fork's request went away"));
        }
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

/// Moves a context's directory built aside to its place (`to` must not
/// exist: an id is new) and makes the move durable.
fn move_aside_dir(aside: &FsPath, to: &FsPath, sync: bool) -> std::io::Result<()> {
    let parent = to
        .parent()
        .ok_or_else(|| std::io::Error::other("no parent directory"))?;
    durable::create_dir_all(parent)?;
    if !aside.exists() {
        // No sources: nothing was copied.
        return Ok(());
    }
    if to.exists() {
        // Never over something the server did not make.
        return Err(std::io::Error::other("the fork's directory exists"));
    }
    std::fs::rename(aside, to)?;
    if sync {
        durable::sync_dir(parent)?;
    }
    failpoint(point::FORK_PUBLISH)
}

/// Ends a hold on a context's source tree when dropped (also when the
/// request goes away mid-copy).
struct SourcesHold {
    state: std::sync::Arc<crate::local::state::AppState>,
    context_id: String,
}

impl Drop for SourcesHold {
    fn drop(&mut self) {
        self.state.store.change().release_sources(&self.context_id);
    }
}

/// A fork being built aside: holds its slug while its sources are copied
/// into a directory no record names yet. Dropped unpublished (the request
/// failed or went away), it frees the slug, tells the copy to stop and
/// remove what it copied, and removes the directory if it was already
/// moved into place. A crash before the move leaves only the staged copy
/// (cleared at start); after it, the directory is marked (`begin_fork`)
/// and the next start removes it.
struct ForkAside {
    state: std::sync::Arc<crate::local::state::AppState>,
    slug: String,
    abandoned: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Where the directory is moved to, once the move may have started.
    placed: Option<std::path::PathBuf>,
    published: bool,
}

impl Drop for ForkAside {
    fn drop(&mut self) {
        if !self.published {
            self.abandoned
                .store(true, std::sync::atomic::Ordering::SeqCst);
            self.state.store.change().release_slug(&self.slug);
            if let Some(dir) = &self.placed {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// Copies `sources` below `aside/sources` on a blocking thread that owns
/// `aside`: on failure (or once `abandoned`) what it copied is removed
/// after the copy stopped, never while it writes.
async fn copy_aside(
    from: std::path::PathBuf,
    aside: StagingRoot,
    sources: BTreeMap<String, SourceMeta>,
    sync: bool,
    abandoned: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> LocalResult<(StagingRoot, Vec<(String, u64)>)> {
    let copied = tokio::task::spawn_blocking(move || {
        let to = aside.path().join("sources");
        copy_sources(&from, &to, &sources, sync, &abandoned).map(|files| (aside, files))
    })
    .await;
    copied
        .map_err(|e| LocalError::internal("copying the sources of a fork", e))
        .and_then(|r| r.map_err(|e| LocalError::internal("copying the sources of a fork", e)))
}

/// Reserves a fork of `slug` as `target_slug`: its record prepared, its
/// slug reserved and the sources it copies held against imports.
fn reserve_fork(
    state: &crate::local::state::AppState,
    slug: &str,
    target_slug: String,
) -> LocalResult<(
    String,
    crate::local::records::ContextRecord,
    BTreeMap<String, SourceMeta>,
)> {
    let mut inner = state.store.change();
    let src = inner.context(slug)?;
    super::refuse_while_importing(src, "fork it after the import ends")?;
    let from_id = src.id.clone();
    let sources = src.sources.clone();
    let req = types::CreateContextRequest {
        description: src.description.clone(),
        guide: src.guide.clone(),
        kind: Some(types::ContextKind(src.kind.clone())),
        manifest: src.manifest.clone(),
        name: src.name.clone(),
        slug: target_slug,
    };
    let rec = inner.prepare_context(req)?;
    inner.reserve_slug(&rec.slug);
    // No import runs on the context the sources are copied from.
    inner.hold_sources(&from_id)?;
    Ok((from_id, rec, sources))
}

/// Forks a context: a new context `target_slug` with the same name, kind,
/// description, guide, manifest and sources (not curated yet). The fork
/// is built aside and published, with its sources, in one change: it is
/// never seen (nor saved) half made.
pub(super) async fn fork(
    Posted(state, slug, body): Posted<types::ForkContextBody>,
) -> LocalResult<axum::Json<types::ForkContextResponse>> {
    let (from_id, rec, sources) = reserve_fork(&state, &slug, body.target_slug)?;
    let mut aside = ForkAside {
        state: state.clone(),
        slug: rec.slug.clone(),
        abandoned: std::sync::Arc::default(),
        placed: None,
        published: false,
    };
    let hold = SourcesHold {
        state: state.clone(),
        context_id: from_id.clone(),
    };
    // Built in the staging directory (cleared at every start), then moved
    // to where its record will say, just before the record is saved.
    let from = state.store.context_dir(&from_id).join("sources");
    let to_dir = state.store.context_dir(&rec.id);
    let sync = state.store.is_persistent();
    let staged = StagingRoot::new(state.store.staging_dir());
    let copied = copy_aside(from, staged, sources, sync, aside.abandoned.clone()).await;
    drop(hold);
    // The staged copy is removed on every way out from here on unless it
    // was moved into place.
    let (staged, files) = copied?;
    let placed = async {
        // Marked before the move: a stop between the move and the
        // record's commit has the next start remove it.
        state.store.begin_fork(&rec.id).await?;
        if aside.abandoned.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(LocalError::internal(
                "forking",
                "the fork's request went away",
            ));
        }
        aside.placed = Some(to_dir.clone());
        let abandoned = aside.abandoned.clone();
        let moved = tokio::task::spawn_blocking(move || {
            let moved = move_aside_dir(staged.path(), &to_dir, sync);
            // A request that went away during the move removed `to_dir`
            // before it existed, or sees it here.
            if moved.is_ok() && abandoned.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = std::fs::remove_dir_all(&to_dir);
            }
            moved
        });
        moved
            .await
            .map_err(|e| LocalError::internal("moving a fork into place", e))?
            .map_err(|e| LocalError::internal("moving a fork into place", e))
    };
    placed.await?;
    let published = {
        let mut inner = state.store.change();
        let mut rec = rec;
        let now = Utc::now();
        for (path, size) in files {
            rec.sources.insert(path, SourceMeta { size, mtime: now });
        }
        if !rec.sources.is_empty() {
            rec.last_source_import_at = Some(now);
        }
        inner.push(crate::local::db::Op::EndFork {
            context_id: rec.id.clone(),
        });
        aside.published = true;
        inner.publish_context(rec);
        inner.commit()
    };
    drop(aside);
    state.store.saved(published).await?;
    Ok(axum::Json(types::ForkContextResponse { success: true }))
}

/// The manifest curation runs with: the context's own, else the local
/// default.
pub(super) async fn manifest(At(state, slug, _): On) -> LocalResult<axum::Json<types::Manifest>> {
    let inner = state.store.read();
    let ctx = inner.context(&slug)?;
    Ok(axum::Json(ctx.manifest.clone().unwrap_or_else(|| {
        ledger::effective_manifest(state.config.chunk_chars)
    })))
}

/// What the latest curation recorded (empty before the first one).
pub(super) async fn curation_ledger(
    At(state, slug, _): On,
) -> LocalResult<axum::Json<types::CurationState>> {
    let (ledger, index) = {
        let inner = state.store.read();
        let ctx = inner.context(&slug)?;
        (
            ctx.ledger.clone().unwrap_or_default(),
            inner.indexes().get(&ctx.id).cloned(),
        )
    };
    let curation = tokio::task::spawn_blocking(move || {
        ledger.to_state(index.as_deref().map(|i| i.chunks()).unwrap_or_default())
    })
    .await
    .map_err(|e| LocalError::internal("reading the curation ledger", e))?;
    Ok(axum::Json(curation))
}

#[derive(Debug, serde::Deserialize)]
pub(super) struct ExploreBody {
    guide: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
pub(super) struct ProfileBody {
    manifest: Option<types::Manifest>,
}

/// Answers a workflow once its task is saved (a task acknowledged
/// survives a crash).
async fn triggered(
    state: &AppState,
    (trigger, registered): (types::WorkflowTriggerResponse, Ticket),
) -> LocalResult<axum::Json<types::WorkflowTriggerResponse>> {
    state.store.saved(registered).await?;
    Ok(axum::Json(trigger))
}

pub(super) async fn explore(
    At(state, slug, _): On,
    OptionalJson(body): OptionalJson<ExploreBody>,
) -> LocalResult<axum::Json<types::WorkflowTriggerResponse>> {
    triggered(&state, workflows::explore(&state, &slug, body.guide)?).await
}

pub(super) async fn profile(
    At(state, slug, _): On,
    OptionalJson(body): OptionalJson<ProfileBody>,
) -> LocalResult<axum::Json<types::WorkflowTriggerResponse>> {
    triggered(&state, workflows::profile(&state, &slug, body.manifest)?).await
}

pub(super) async fn optimize(
    At(state, slug, _): On,
    // The body's tuning knobs drive the hosted optimizer; locally the
    // optimization is a compaction, and the body is only checked.
    _: OptionalJson<serde_json::Map<String, serde_json::Value>>,
) -> LocalResult<axum::Json<types::WorkflowTriggerResponse>> {
    triggered(&state, workflows::optimize(&state, &slug)?).await
}
