//! Curation as a task: read the sources, chunk them, build the BM25 index,
//! then swap it in and mark the context queryable.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::durable;
use super::error::{LocalError, LocalResult};
use super::faults::{failpoint, point};
use super::ledger::{self, Ledger, LedgerEntry};
use super::paths::safe_join;
use super::search::{Chunk, ContextIndex, chunk_document};
use super::state::AppState;
use super::store::{Inner, Ticket};
use crate::types;

/// Phases reported in a curate task's progress.
const PHASES: i64 = 3;

/// Registers a curate task for `context` and starts it.
///
/// `internal` curations index a work context after an import; user requests
/// for a work context are refused, as the API does.
pub(crate) fn start(
    state: &Arc<AppState>,
    context: &str,
    force: bool,
    scope: Option<String>,
    internal: bool,
) -> LocalResult<(types::TaskResponse, Ticket)> {
    let cancel = state.shutdown.child_token();
    let (task, context_id, job, registered) = {
        let mut inner = state.store.change();
        let ctx = inner.context(context)?;
        if ctx.kind == "work" && !internal {
            return Err(LocalError::bad_request(format!(
                "context {:?} is a work context; it is indexed on import",
                ctx.slug
            )));
        }
        if ctx.sources.is_empty() {
            return Err(LocalError::conflict(format!(
                "context {:?} has no sources to curate; upload some first",
                ctx.slug
            )));
        }
        if ctx.curating {
            return Err(LocalError::conflict(format!(
                "context {:?} is already being curated",
                ctx.slug
            )));
        }
        let context_id = ctx.id.clone();
        let input = types::TaskInput::from(types::CurateInput {
            artifacts_reset: None,
            batch_size: None,
            claimed_version: None,
            force,
            legs: vec!["chunks".to_owned()],
            models: Vec::new(),
            scope: scope.unwrap_or_else(|| "all".to_owned()),
            skip_corpus_aggregation: None,
            trigger: if internal { "import" } else { "api" }.to_owned(),
        });
        let task = inner.new_task("curate", Some(&context_id), None, input, cancel.clone());
        let ctx = inner.context_mut(&context_id)?;
        ctx.curating = true;
        ctx.curate_task_id = Some(task.id.clone());
        let job = inner.context_job(&context_id);
        (task, context_id, job, inner.commit())
    };
    let job_state = state.clone();
    let task_id = task.id.clone();
    state.spawn(async move {
        run(job_state, context_id, task_id, cancel).await;
        drop(job);
    });
    Ok((task, registered))
}

/// What curation produced before it is swapped in.
struct Built {
    index: ContextIndex,
    generation: u64,
    processed: usize,
    failed: Vec<String>,
    chunks: usize,
    samples: Vec<String>,
    /// `(path, hash, size)` of every source indexed.
    hashes: Vec<(String, String, u64)>,
}

async fn run(state: Arc<AppState>, context_id: String, task_id: String, cancel: CancellationToken) {
    let (paths, generation) = {
        let mut inner = state.store.change();
        inner.task_progress(&task_id, 0, PHASES, "reading sources");
        match inner.contexts().get(&context_id) {
            Some(c) => (
                c.sources.keys().cloned().collect::<Vec<_>>(),
                c.index_generation + 1,
            ),
            None => (Vec::new(), 1),
        }
    };
    let job_state = state.clone();
    let job_cancel = cancel.clone();
    let job_task = task_id.clone();
    let job_ctx = context_id.clone();
    let built = tokio::task::spawn_blocking(move || {
        build(
            &job_state,
            &job_ctx,
            &job_task,
            &paths,
            generation,
            &job_cancel,
        )
    })
    .await
    .unwrap_or_else(|e| Err(format!("curation stopped: {e}")));

    let delay = state.faults.frame_delay();
    if !delay.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = cancel.cancelled() => {}
        }
    }
    let ctx_dir = state.store.context_dir(&context_id);
    let built = match built {
        Ok(b) => b,
        Err(msg) => {
            let how = if cancel.is_cancelled() {
                crate::status::word::CANCELLED
            } else {
                crate::status::word::FAILED
            };
            end(&state, &context_id, &task_id, how, None, Some(msg));
            return;
        }
    };
    let output = curate_output(&built);
    let generation = built.generation;
    // The task's files are stored before it reports its end.
    if let Err(e) = state
        .store
        .put_task_files(&task_id, task_files(&task_id, &built, &output))
        .await
    {
        end(
            &state,
            &context_id,
            &task_id,
            crate::status::word::FAILED,
            None,
            Some(e.message),
        );
        return;
    }
    let (applied, swapped) = swap_in(&state, &context_id, &task_id, &cancel, built, output);
    match applied {
        Ok(()) => {
            if state.store.is_persistent() {
                // Old generations go once the new one is committed to the database.
                let _ = state.store.saved(swapped).await;
                let _ = tokio::task::spawn_blocking(move || {
                    crate::local::records::remove_index_generations_except(
                        &ctx_dir,
                        Some(generation),
                    )
                })
                .await;
            }
        }
        Err((how, msg)) => {
            end(&state, &context_id, &task_id, how, None, Some(msg));
            if state.store.is_persistent() {
                let _ =
                    tokio::task::spawn_blocking(move || remove_generation(&ctx_dir, generation))
                        .await;
            }
        }
    }
}

/// Swaps a built index in, or reports why not, in one change: applying and
/// the cancellation check happen under one lock, so a task is either
/// cancelled before its result is applied or reports completed.
fn swap_in(
    state: &AppState,
    context_id: &str,
    task_id: &str,
    cancel: &CancellationToken,
    built: Built,
    output: types::TaskOutput,
) -> (Result<(), (&'static str, String)>, Ticket) {
    let now = Utc::now();
    let generation = built.generation;
    let mut inner = state.store.change();
    let still_running = inner
        .tasks()
        .get(task_id)
        .is_some_and(|t| !t.task.state.is_terminal());
    let applied = if cancel.is_cancelled() || !still_running {
        Err((
            crate::status::word::CANCELLED,
            "cancelled before the index was swapped in".to_owned(),
        ))
    } else if inner
        .apply_index(
            context_id,
            Arc::new(built.index),
            generation,
            built.samples,
            now,
        )
        .is_ok()
    {
        record_ledger(&mut inner, context_id, generation, now, built.hashes);
        inner.end_task(task_id, crate::status::word::COMPLETED, Some(output), None);
        inner.end_context_job(context_id, task_id);
        Ok(())
    } else {
        Err((
            crate::status::word::FAILED,
            "the context was deleted".to_owned(),
        ))
    };
    (applied, inner.commit())
}

/// Chunks and indexes, on a blocking thread, reading the sources from disk.
fn build(
    state: &AppState,
    context_id: &str,
    task_id: &str,
    paths: &[String],
    generation: u64,
    cancel: &CancellationToken,
) -> Result<Built, String> {
    state
        .store
        .change()
        .task_progress(task_id, 1, PHASES, "chunking");
    let sources_dir = state.store.context_dir(context_id).join("sources");
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut failed = Vec::new();
    let mut processed = 0;
    let mut samples = Vec::new();
    let mut hashes = Vec::new();
    for path in paths {
        if cancel.is_cancelled() {
            return Err(crate::status::word::CANCELLED.to_owned());
        }
        let data = match safe_join(&sources_dir, path).map(std::fs::read) {
            Some(Ok(d)) => d,
            Some(Err(e)) => {
                tracing::warn!(path, error = %e, "a source could not be read");
                failed.push(path.clone());
                continue;
            }
            None => {
                failed.push(path.clone());
                continue;
            }
        };
        let Some(text) = as_text(&data) else {
            failed.push(path.clone());
            continue;
        };
        processed += 1;
        hashes.push((path.clone(), ledger::hash(&data), data.len() as u64));
        let doc_chunks = chunk_document(path, text, state.config.chunk_chars);
        if samples.len() < 5
            && let Some(title) = doc_chunks
                .iter()
                .find_map(|c| c.section_path.last())
                .filter(|t| !t.is_empty())
            && !samples.contains(title)
        {
            samples.push(title.clone());
        }
        chunks.extend(doc_chunks);
    }
    if cancel.is_cancelled() {
        return Err(crate::status::word::CANCELLED.to_owned());
    }
    state
        .store
        .change()
        .task_progress(task_id, 2, PHASES, "indexing");
    let n_chunks = chunks.len();
    let index = if state.store.is_persistent() {
        let dir = state.store.context_dir(context_id);
        let index_dir = dir.join(format!("index-{generation}"));
        let _ = std::fs::remove_dir_all(&index_dir);
        durable::create_dir_all(&index_dir).map_err(|e| {
            tracing::error!(error = %e, "creating the index directory failed");
            "the index could not be stored".to_owned()
        })?;
        let json = serde_json::to_vec(&chunks).map_err(|e| e.to_string())?;
        durable::write_file(&dir.join(format!("chunks-{generation}.json")), &json).map_err(
            |e| {
                tracing::error!(error = %e, "writing the chunk table failed");
                "the index could not be stored".to_owned()
            },
        )?;
        ContextIndex::build(chunks, Some(&index_dir)).and_then(|index| {
            // Written; the swap to this generation comes next.
            failpoint(point::INDEX_SWAP)
                .map_err(|e| tantivy::TantivyError::InternalError(e.to_string()))?;
            Ok(index)
        })
    } else {
        ContextIndex::build(chunks, None)
    }
    .map_err(|e| {
        tracing::error!(error = %e, "indexing failed");
        "indexing failed".to_owned()
    })?;
    Ok(Built {
        index,
        generation,
        processed,
        failed,
        chunks: n_chunks,
        samples,
        hashes,
    })
}

/// Records what a curation indexed in the context's ledger.
fn record_ledger(
    inner: &mut Inner,
    context_id: &str,
    generation: u64,
    now: chrono::DateTime<Utc>,
    hashes: Vec<(String, String, u64)>,
) {
    let Ok(ctx) = inner.context_mut(context_id) else {
        return;
    };
    let entries = hashes
        .into_iter()
        .map(|(path, hash, size)| {
            let mtime = ctx.sources.get(&path).map_or(now, |m| m.mtime);
            let entry = LedgerEntry {
                hash,
                size,
                mtime,
                curated_at: now,
            };
            (path, entry)
        })
        .collect();
    ctx.ledger = Some(Ledger::next(ctx.ledger.as_ref(), generation, now, entries));
}

/// The files a curate task leaves: its report and the sources it indexed
/// with their chunk counts.
fn task_files(task_id: &str, built: &Built, output: &types::TaskOutput) -> Vec<(String, Vec<u8>)> {
    let mut per_source: HashMap<&str, usize> = HashMap::new();
    for c in built.index.chunks() {
        *per_source.entry(c.source.as_str()).or_default() += 1;
    }
    let rows: Vec<String> = built
        .hashes
        .iter()
        .map(|(path, _, _)| {
            let n = per_source.get(path.as_str()).copied().unwrap_or(0);
            format!("{path}\t{n}")
        })
        .collect();
    let report = serde_json::json!({
        "task_id": task_id,
        "workflow": "curate",
        "version": built.generation,
        "sources_indexed": built.processed,
        "sources_failed": built.failed,
        "chunks": built.chunks,
        "output": output,
    });
    vec![
        (
            "report.json".to_owned(),
            serde_json::to_vec_pretty(&report).unwrap_or_default(),
        ),
        (
            "curated.tsv".to_owned(),
            super::store::lines_file(rows.iter().map(String::as_str)),
        ),
    ]
}

/// The text of a source, or `None` for binary content.
fn as_text(data: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(data).ok()?;
    (!text.contains('\0')).then_some(text)
}

fn end(
    state: &AppState,
    context_id: &str,
    task_id: &str,
    how: &str,
    output: Option<types::TaskOutput>,
    error: Option<String>,
) {
    let mut inner = state.store.change();
    inner.end_task(task_id, how, output, error);
    inner.end_context_job(context_id, task_id);
}

/// Removes the files of one unused index generation.
fn remove_generation(dir: &std::path::Path, generation: u64) {
    let _ = std::fs::remove_dir_all(dir.join(format!("index-{generation}")));
    let _ = std::fs::remove_file(dir.join(format!("chunks-{generation}.json")));
}

fn curate_output(b: &Built) -> types::TaskOutput {
    let out = types::CurateRunOutput {
        delta: types::CurateRunOutputDelta {
            artifacts_created: 0,
            artifacts_errored: 0,
            artifacts_screened: 0,
            artifacts_updated: 0,
            changed: 0,
            chunks_created: b.chunks as i64,
            chunks_screened: 0,
            chunks_updated: 0,
            corpus_artifacts: 0,
            corpus_artifacts_screened: 0,
            corpus_edges: 0,
            deleted: 0,
            failed: b.failed.len() as i64,
            failed_sources: b.failed.iter().take(100).cloned().collect(),
            failed_sources_file: String::new(),
            failed_sources_truncated: b.failed.len() > 100,
            images_skipped_no_vision: 0,
            new: b.processed as i64,
            processed: b.processed as i64,
            screened: 0,
            sources_content_truncated: 0,
        },
        flipped: true,
        images_skipped_no_vision: 0,
        mode: "full".to_owned(),
        sample_queries: Vec::new(),
        scope: "all".to_owned(),
        status: crate::status::word::COMPLETED.to_owned(),
        usage: types::CurateUsage {
            by_model: HashMap::new(),
            completion_tokens: 0,
            embed_by_model: HashMap::new(),
            prompt_tokens: 0,
            total_tokens: 0,
        },
        versioned: true,
    };
    types::TaskOutput::from(out)
}
