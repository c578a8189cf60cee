//! Source uploads: one file, or an archive (`.zip`, `.tar`, `.tar.gz`,
//! `.tgz`) expanded into the source tree, run as an `import` task.
//!
//! An upload is streamed to a private staging directory, expanded there
//! (within the entry, byte and ratio caps) and checked against the
//! context's limit before anything under the context changes. Then, on its
//! own task, its files are moved into place and the state saved; only then
//! is the upload acknowledged, so an acknowledged upload survives a crash.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;

use super::durable;
use super::error::{LocalError, LocalResult};
pub(crate) use super::expand::{
    Caps, Staged, StagingRoot, check_file_name, check_fits, safe_path, stage,
};
use super::faults::{failpoint, point};
use super::paths::safe_join;
use super::state::AppState;
use super::store::{Inner, Ticket};
use crate::types;

/// Longest a staged upload waits for its turn on a context (the import
/// running there, a removal or fork of its sources) before it is refused
/// with 503 `busy`.
const QUEUE_WAIT: Duration = Duration::from_secs(30);
/// How often a queued upload looks again besides being woken by an
/// import's end (removals and forks end without waking it).
const QUEUE_RECHECK: Duration = Duration::from_millis(200);

/// Registers the import task of a staged upload, moves its files into
/// place on a task of its own and saves the state; answers once that is
/// done, so what it acknowledges is on disk. Imports on one context run
/// one at a time: an upload queues behind the one running (and behind a
/// removal or fork of the context's sources), up to [`QUEUE_WAIT`].
pub(crate) async fn start(
    state: &Arc<AppState>,
    context: &str,
    staged: Staged,
) -> LocalResult<types::WorkflowTriggerResponse> {
    let queued_until = tokio::time::Instant::now() + QUEUE_WAIT;
    let cancel = state.shutdown.child_token();
    let (task, context_id, job) = loop {
        let ended = state.imports_ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if let Some(registered) = register(state, context, &staged, &cancel)? {
            break registered;
        }
        let now = tokio::time::Instant::now();
        if now >= queued_until {
            return Err(LocalError::context_busy());
        }
        let _ = tokio::time::timeout_at(queued_until.min(now + QUEUE_RECHECK), ended).await;
    };
    let (applied_tx, applied_rx) = tokio::sync::oneshot::channel();
    let job_state = state.clone();
    let task_id = task.id.clone();
    state.spawn(async move {
        run(job_state, context_id, task_id, staged, cancel, applied_tx).await;
        drop(job);
    });
    match applied_rx.await {
        Ok(Ok(())) => Ok(types::WorkflowTriggerResponse {
            exploring: None,
            importing: Some(true),
            profiling: None,
            state: "importing".to_owned(),
            task_id: task.id,
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(LocalError::internal(
            "the import stopped",
            "the import task ended without an answer",
        )),
    }
}

/// Registers the import task of `staged` on `context` unless an import or
/// a removal or fork of its sources is under way there (`None`: its turn
/// has not come).
fn register(
    state: &AppState,
    context: &str,
    staged: &Staged,
    cancel: &CancellationToken,
) -> LocalResult<Option<(types::TaskResponse, String, TaskTrackerToken)>> {
    let mut inner = state.store.change();
    let ctx = inner.context(context)?;
    if ctx.importing || ctx.sources_held > 0 {
        return Ok(None);
    }
    check_fits(ctx, staged, state.config.context_bytes_limit)?;
    let context_id = ctx.id.clone();
    let input: types::TaskInput = serde_json::from_value(serde_json::json!({
        "raw_archive_key": format!("uploads/{}", staged.name),
        "path": staged.dir,
    }))
    .map_err(|e| LocalError::internal("import task input", e))?;
    let task = inner.new_task("import", Some(&context_id), None, input, cancel.clone());
    let ctx = inner.context_mut(&context_id)?;
    ctx.importing = true;
    ctx.import_task_id = Some(task.id.clone());
    let job = inner.context_job(&context_id);
    Ok(Some((task, context_id, job)))
}

async fn run(
    state: Arc<AppState>,
    context_id: String,
    task_id: String,
    mut staged: Staged,
    cancel: CancellationToken,
    applied: tokio::sync::oneshot::Sender<LocalResult<()>>,
) {
    if !commit_unless_cancelled(&state, &task_id, &cancel) {
        let cancelled = (crate::status::word::CANCELLED, None);
        let refused = LocalError::conflict("the import was cancelled");
        return end_unmoved(&state, &context_id, &task_id, cancelled, applied, refused);
    }
    // The files about to move are recorded first: a crash before their
    // sources are recorded is repaired at the next start.
    let (move_id, begun) = state
        .store
        .begin_move(&context_id, &move_record(&staged, &task_id));
    if let Err(e) = state.store.wait_saved(begun).await {
        let failed = (crate::status::word::FAILED, Some(e.message.clone()));
        return end_unmoved(&state, &context_id, &task_id, failed, applied, e);
    }
    let sources_dir = state.store.context_dir(&context_id).join("sources");
    let files_dir = Staged::files_dir(staged.root.path());
    let to_move: Vec<(String, u64)> = staged.files.clone();
    let sync = state.store.is_persistent();
    // From here until the move's end is saved, the staging directory is
    // what the next start finishes the import from: a stop that drops
    // this task (the move itself runs on) leaves it, as a crash would.
    staged.root.keep_for_next_start(sync);
    let (moved, error) = tokio::task::spawn_blocking(move || {
        move_into_place(&files_dir, &sources_dir, &to_move, sync)
    })
    .await
    .unwrap_or_else(|e| (Vec::new(), Some(e.to_string())));
    if let Some(e) = error.as_deref().filter(|_| sync) {
        // Some files moved, some did not: the import is neither applied
        // nor not. Writing stops (the server stops) and the next start
        // finishes the move from the staging directory, kept for it.
        tracing::error!(error = %e, "moving sources into place failed");
        staged.root.keep_for_next_start(true);
        state
            .store
            .stop_writing("an import's files could not all be moved into place");
        let _ = applied.send(Err(LocalError::outcome_unknown()));
        return;
    }
    // An injected frame delay (a test fault) keeps the task open here, its
    // files moved and not yet recorded, to test overlapping imports and
    // late cancels; the upload is answered after it, as always once its
    // end is saved.
    let delay = state.faults.frame_delay();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let (outcome, ended) = record_import(
        &state,
        &context_id,
        &task_id,
        &staged,
        &moved,
        error,
        move_id,
    );
    // Uploads queued on the context try again once the import ended.
    state.imports_ended.notify_waiters();
    let is_work = match outcome {
        Ok(is_work) => is_work,
        Err((msg, deleted)) => {
            if deleted {
                let dir = state.store.context_dir(&context_id);
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
            }
            // The failed end is what the next start reads; once it is
            // saved the staging directory is nobody's.
            let saved = state.store.saved(ended).await;
            staged.root.keep_for_next_start(saved.is_err());
            let _ = applied.send(Err(LocalError::new(
                axum::http::StatusCode::CONFLICT,
                format!("the import failed: {msg}"),
            )));
            return;
        }
    };
    let saved = state.store.saved(ended).await.map_err(unknown_if_not_saved);
    staged.root.keep_for_next_start(saved.is_err());
    let ok = saved.is_ok();
    let _ = applied.send(saved);
    if ok && is_work {
        index_work_context(&state, &context_id);
    }
}

/// Ends an import whose files never moved with `end` (its state word and
/// error message) and answers its upload with `error`.
fn end_unmoved(
    state: &AppState,
    context_id: &str,
    task_id: &str,
    end: (&str, Option<String>),
    applied: tokio::sync::oneshot::Sender<LocalResult<()>>,
    error: LocalError,
) {
    finish(state, context_id, task_id, end.0, None, end.1);
    let _ = applied.send(Err(error));
}

/// What the next start needs to finish moving `staged` into place.
fn move_record(staged: &Staged, task_id: &str) -> super::store::MoveRecord {
    super::store::MoveRecord {
        files: staged.files.clone(),
        staging: staged
            .root
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned()),
        task_id: Some(task_id.to_owned()),
    }
}

/// Records an import in one change: the sources, the move's end and the
/// task's end with its files, so an import is visible, and saved, all at
/// once, and only then answered. The outcome says whether the context is a
/// work context, or why the import failed and whether its context is gone.
fn record_import(
    state: &AppState,
    context_id: &str,
    task_id: &str,
    staged: &Staged,
    moved: &[(String, u64)],
    error: Option<String>,
    move_id: u64,
) -> (Result<bool, (String, bool)>, Ticket) {
    let mut change = state.store.change();
    let recorded = change
        .add_sources(context_id, moved, Utc::now())
        .map_err(|_| "the context was deleted".to_owned());
    change.push(super::db::Op::EndMove { id: move_id });
    let outcome = match (recorded, error) {
        (Ok(is_work), None) => Ok(is_work),
        (Ok(_), Some(e)) => {
            tracing::error!(error = %e, "moving sources into place failed");
            Err(("the sources could not be stored".to_owned(), false))
        }
        (Err(msg), _) => Err((msg, true)),
    };
    match &outcome {
        Err((msg, _)) => end_task(
            &mut change,
            context_id,
            task_id,
            crate::status::word::FAILED,
            None,
            Some(msg.clone()),
        ),
        Ok(_) => {
            let output = import_output(staged);
            change.put_task_files(task_id, task_files(task_id, staged, &output));
            end_task(
                &mut change,
                context_id,
                task_id,
                crate::status::word::COMPLETED,
                Some(output),
                None,
            );
        }
    }
    (outcome, change.commit())
}

/// Work contexts are queryable at once: indexes what was imported.
fn index_work_context(state: &Arc<AppState>, context_id: &str) {
    if let Err(e) = super::curate::start(state, context_id, false, None, true) {
        tracing::warn!(error = %e, "indexing a work context failed to start");
    }
}

/// The move's record is on disk: should the import's end not be saved,
/// the next start finishes the import, so its outcome is unknown, not "not
/// applied".
fn unknown_if_not_saved(e: LocalError) -> LocalError {
    if e.code == LocalError::not_saved().code {
        LocalError::outcome_unknown()
    } else {
        e
    }
}

/// The import's point of no return, decided under the lock, so a
/// cancellation either comes first (`false`: nothing applied) or finds the
/// task committed (`true`).
fn commit_unless_cancelled(state: &AppState, task_id: &str, cancel: &CancellationToken) -> bool {
    let mut inner = state.store.change();
    let running = inner
        .tasks()
        .get(task_id)
        .is_some_and(|t| !t.task.state.is_terminal());
    if cancel.is_cancelled() || !running {
        false
    } else {
        inner.commit_task(task_id);
        true
    }
}

/// Moves staged files below `sources`, checking that every final path
/// stays inside it; flushes each directory once. Returns what moved and
/// the first failure.
fn move_into_place(
    staged: &Path,
    sources: &Path,
    files: &[(String, u64)],
    sync: bool,
) -> (Vec<(String, u64)>, Option<String>) {
    let mut moved = Vec::new();
    let mut dirs = BTreeMap::new();
    if let Err(e) = durable::create_dir_all(sources) {
        return (moved, Some(e.to_string()));
    }
    let root = match sources.canonicalize() {
        Ok(r) => r,
        Err(e) => return (moved, Some(e.to_string())),
    };
    for (path, size) in files {
        let (Some(from), Some(to)) = (safe_join(staged, path), safe_join(sources, path)) else {
            return (moved, Some(format!("unsafe path {path:?}")));
        };
        let result = (|| {
            let parent = to
                .parent()
                .ok_or_else(|| std::io::Error::other("no parent directory"))?;
            durable::create_dir_all(parent)?;
            let real = parent.canonicalize()?;
            if !real.starts_with(&root) {
                return Err(std::io::Error::other(format!(
                    "{path:?} resolves outside the context"
                )));
            }
            failpoint(point::FILE_MOVE)?;
            std::fs::rename(&from, &to)?;
            dirs.insert(parent.to_path_buf(), ());
            Ok::<_, std::io::Error>(())
        })();
        match result {
            Ok(()) => moved.push((path.clone(), *size)),
            Err(e) => return (moved, Some(e.to_string())),
        }
    }
    for dir in dirs.keys().filter(|_| sync) {
        if let Err(e) = durable::sync_dir(dir) {
            return (moved, Some(e.to_string()));
        }
    }
    (moved, None)
}

fn finish(
    state: &AppState,
    context_id: &str,
    task_id: &str,
    end: &str,
    output: Option<types::TaskOutput>,
    error: Option<String>,
) {
    end_task(
        &mut state.store.change(),
        context_id,
        task_id,
        end,
        output,
        error,
    );
    // Uploads queued on the context try again.
    state.imports_ended.notify_waiters();
}

/// Ends an import's task with `change`; its context is no longer
/// importing.
fn end_task(
    inner: &mut Inner,
    context_id: &str,
    task_id: &str,
    end: &str,
    output: Option<types::TaskOutput>,
    error: Option<String>,
) {
    inner.end_task(task_id, end, output, error);
    inner.end_context_job(context_id, task_id);
}

/// The files an import task leaves: its report and the list of the files
/// it imported (one source path a line).
fn task_files(
    task_id: &str,
    staged: &Staged,
    output: &types::TaskOutput,
) -> Vec<(String, Vec<u8>)> {
    let report = serde_json::json!({
        "task_id": task_id,
        "workflow": "import",
        "upload": staged.name,
        "files": staged.files.len(),
        "bytes": staged.files.iter().fold(0u64, |a, (_, s)| a.saturating_add(*s)),
        "skipped": staged.skipped_count,
        "output": output,
    });
    vec![
        (
            "report.json".to_owned(),
            serde_json::to_vec_pretty(&report).unwrap_or_default(),
        ),
        (
            "imported.txt".to_owned(),
            super::store::lines_file(staged.files.iter().map(|(p, _)| p.as_str())),
        ),
    ]
}

/// The format of a file by its extension: the part of its last path
/// segment after the last dot, at most 16 bytes; empty when it has none.
fn file_format(path: &str) -> &str {
    let leaf = path.rsplit('/').next().unwrap_or(path);
    match leaf.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() && ext.len() <= 16 => ext,
        _ => "",
    }
}

fn import_output(e: &Staged) -> types::TaskOutput {
    let name = &e.name;
    let entry = |src: &str, action: &str, out: Vec<String>, reason: &str, bytes: i64| {
        types::ImportManifestEntry {
            action: action.to_owned(),
            bytes,
            fmt: file_format(src).to_owned(),
            out,
            reason: reason.to_owned(),
            src: src.to_owned(),
        }
    };
    let sample: Vec<_> = e
        .files
        .iter()
        .take(20)
        .map(|(p, size)| {
            entry(
                p,
                "copied",
                vec![p.clone()],
                "",
                i64::try_from(*size).unwrap_or(i64::MAX),
            )
        })
        .collect();
    let skipped: Vec<_> = e
        .skipped
        .iter()
        .take(100)
        .map(|(p, r)| entry(p, "skipped", Vec::new(), r, 0))
        .collect();
    let out = types::ImportOutput {
        failed: 0,
        imported_items: e.files.len() as i64,
        manifest_file: String::new(),
        manifest_object: None,
        manifest_sample: sample,
        manifest_truncated: e.files.len() > 20,
        output_files: e.files.len() as i64,
        skipped: i64::try_from(e.skipped_count).unwrap_or(i64::MAX),
        skipped_items: skipped,
        status: format!("imported {name}"),
    };
    types::TaskOutput::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a format taken from a whole name without a dot, or from a
    /// dot in a directory name.
    #[test]
    fn a_format_is_a_short_extension_or_nothing() {
        assert_eq!(file_format("docs/a.md"), "md");
        assert_eq!(file_format("docs.v2/README"), "");
        assert_eq!(file_format(&"x".repeat(5000)), "");
        assert_eq!(file_format(".bashrc"), "");
        assert_eq!(file_format(&format!("a.{}", "y".repeat(40))), "");
    }
}
