//! The analysis workflows, run locally as tasks over what the context
//! holds, each leaving its result as the task file `report.json`:
//!
//! - `explore`: the most frequent terms (normalized as search normalizes
//!   them) and the most frequent sections of the curated chunks, and the
//!   chunks per source;
//! - `profile`: size, type and chunk count of every source, totals per
//!   type, and the manifest in effect (a manifest sent along becomes the
//!   context's manifest);
//! - `optimize`: compacts the search index (merges its segments and
//!   removes unused files).
//!
//! No model is involved: the results are deterministic for the same
//! content. Reports list at most 2,000 sources one by one (their totals
//! count them all), so a report stays within a task file's size.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{Value, json};

use super::error::{LocalError, LocalResult};
use super::ledger;
use super::search::{ContextIndex, terms};
use super::state::AppState;
use super::store::{Change, SourceMeta, Ticket};
use crate::types;

/// Terms and sections an exploration lists.
const TOP: usize = 50;
/// Most sources a report lists one by one (its totals count them all).
const MAX_LISTED: usize = 2_000;

/// What a workflow computes, on a blocking thread.
type Job = Box<dyn FnOnce() -> Result<Value, String> + Send>;

/// The curated index of a context (409 before the first curation).
fn curated_index(state: &AppState, slug: &str) -> LocalResult<(String, Arc<ContextIndex>)> {
    let inner = state.store.read();
    let ctx = inner.context(slug)?;
    match inner.indexes().get(&ctx.id) {
        Some(index) if ctx.last_curated_at.is_some() => Ok((ctx.id.clone(), index.clone())),
        _ => Err(LocalError::conflict(format!(
            "context {:?} is not curated yet; curate it first",
            ctx.slug
        ))),
    }
}

/// Registers a task of `workflow` on a context and runs `job` for it; the
/// task ends once its report is stored. The task is registered with
/// `inner` (and whatever it changed before), as one change.
fn start(
    state: &Arc<AppState>,
    mut inner: Change<'_>,
    context_id: &str,
    workflow: &'static str,
    input: Value,
    job: Job,
) -> LocalResult<(types::TaskResponse, Ticket)> {
    let input: types::TaskInput =
        serde_json::from_value(input).map_err(|e| LocalError::internal("a task's input", e))?;
    let cancel = state.shutdown.child_token();
    let task = inner.new_task(workflow, Some(context_id), None, input, cancel.clone());
    let files_in_use = inner.context_job(context_id);
    let registered = inner.commit();
    let job_state = state.clone();
    let task_id = task.id.clone();
    let context_id = context_id.to_owned();
    state.spawn(async move {
        let result = tokio::task::spawn_blocking(job)
            .await
            .unwrap_or_else(|e| Err(format!("the {workflow} task stopped: {e}")));
        let (end, error) = match result {
            Ok(mut report) => {
                report["task_id"] = json!(task_id);
                report["workflow"] = json!(workflow);
                report["context_id"] = json!(context_id);
                report["local"] = json!(true);
                let data = serde_json::to_vec_pretty(&report).unwrap_or_default();
                match job_state
                    .store
                    .put_task_files(&task_id, vec![("report.json".to_owned(), data)])
                    .await
                {
                    Ok(()) => (crate::status::word::COMPLETED, None),
                    Err(e) => (crate::status::word::FAILED, Some(e.message)),
                }
            }
            Err(msg) => (crate::status::word::FAILED, Some(msg)),
        };
        let how = if cancel.is_cancelled() {
            crate::status::word::CANCELLED
        } else {
            end
        };
        job_state
            .store
            .change()
            .end_task(&task_id, how, None, error);
        drop(files_in_use);
    });
    Ok((task, registered))
}

/// The answer to a workflow's trigger, and the ticket of its task's
/// registration (to wait for before answering).
fn trigger(
    (task, registered): (types::TaskResponse, Ticket),
    state: &str,
) -> (types::WorkflowTriggerResponse, Ticket) {
    let response = types::WorkflowTriggerResponse {
        exploring: (state == "exploring").then_some(true),
        importing: None,
        profiling: (state == "profiling").then_some(true),
        state: state.to_owned(),
        task_id: task.id,
    };
    (response, registered)
}

/// Refuses a second running task of `workflow` on a context.
fn check_idle(state: &AppState, context_id: &str, workflow: &str) -> LocalResult<()> {
    let busy = state.store.read().tasks().values().any(|t| {
        t.task.context_id.as_deref() == Some(context_id)
            && t.task.workflow.as_str() == workflow
            && !t.task.state.is_terminal()
    });
    if busy {
        return Err(LocalError::conflict(format!(
            "a {workflow} task is already running on this context"
        )));
    }
    Ok(())
}

/// Starts an exploration of a curated context.
pub(crate) fn explore(
    state: &Arc<AppState>,
    slug: &str,
    guide: Option<String>,
) -> LocalResult<(types::WorkflowTriggerResponse, Ticket)> {
    let (context_id, index) = curated_index(state, slug)?;
    check_idle(state, &context_id, "explore")?;
    let input = json!({"guide": guide.clone().unwrap_or_default(), "trigger": "api"});
    let job: Job = Box::new(move || Ok(explore_report(&index, guide)));
    let task = start(
        state,
        state.store.change(),
        &context_id,
        "explore",
        input,
        job,
    )?;
    Ok(trigger(task, "exploring"))
}

/// The exploration of an index: top terms, top sections, chunks per source.
pub(crate) fn explore_report(index: &ContextIndex, guide: Option<String>) -> Value {
    let mut term_counts: HashMap<String, u64> = HashMap::new();
    let mut sections: HashMap<String, u64> = HashMap::new();
    let mut per_source: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for c in index.chunks() {
        for t in terms(&c.text) {
            *term_counts.entry(t).or_default() += 1;
        }
        if !c.section_path.is_empty() {
            *sections.entry(c.section_path.join(" > ")).or_default() += 1;
        }
        let e = per_source.entry(c.source.clone()).or_default();
        e.0 = e.0.saturating_add(1);
        e.1 = e.1.saturating_add(c.text.chars().count() as u64);
    }
    let top = |m: HashMap<String, u64>, key: &str| -> Vec<Value> {
        let mut v: Vec<(String, u64)> = m.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v.into_iter()
            .take(TOP)
            .map(|(k, n)| json!({key: k, "count": n}))
            .collect()
    };
    json!({
        "method": "term and section frequency over the curated chunks (no model)",
        "guide": guide,
        "chunks": index.chunks().len(),
        "top_terms": top(term_counts, "term"),
        "top_sections": top(sections, "section"),
        "sources_total": per_source.len(),
        "sources": per_source
            .into_iter()
            .take(MAX_LISTED)
            .map(|(s, (chunks, chars))| json!({"source": s, "chunks": chunks, "chars": chars}))
            .collect::<Vec<_>>(),
    })
}

/// Starts a profile of a context's sources; a manifest sent along becomes
/// the context's manifest first.
pub(crate) fn profile(
    state: &Arc<AppState>,
    slug: &str,
    manifest: Option<types::Manifest>,
) -> LocalResult<(types::WorkflowTriggerResponse, Ticket)> {
    if let Some(m) = &manifest {
        super::manifest_bounds::check(m)?;
    }
    let mut inner = state.store.change();
    let (context_id, sources, index, in_effect) = {
        let ctx = inner.context_mut(slug)?;
        if let Some(m) = manifest {
            ctx.manifest = Some(m);
            ctx.updated_at = chrono::Utc::now();
        }
        let id = ctx.id.clone();
        let in_effect = ctx
            .manifest
            .clone()
            .unwrap_or_else(|| ledger::effective_manifest(state.config.chunk_chars));
        let sources = ctx.sources.clone();
        let index = inner.indexes().get(&id).cloned();
        (id, sources, index, in_effect)
    };
    // The manifest and the task are saved together.
    let input = json!({"manifest": in_effect, "trigger": "api"});
    let job: Job = Box::new(move || Ok(profile_report(&sources, index.as_deref(), &in_effect)));
    let task = start(state, inner, &context_id, "profile", input, job)?;
    Ok(trigger(task, "profiling"))
}

/// The type of a source, from its name.
fn source_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("md" | "markdown" | "mdx") => "markdown",
        Some("txt" | "text" | "rst" | "log") => "text",
        Some("html" | "htm") => "html",
        Some("csv" | "tsv") => "csv",
        Some("json" | "yaml" | "yml" | "toml") => "data",
        Some("rs" | "py" | "js" | "ts" | "go" | "java" | "c" | "h" | "cpp" | "sh") => "code",
        _ => "other",
    }
}

/// The profile of a context's sources.
pub(crate) fn profile_report(
    sources: &BTreeMap<String, SourceMeta>,
    index: Option<&ContextIndex>,
    manifest: &types::Manifest,
) -> Value {
    let mut chunks: HashMap<&str, u64> = HashMap::new();
    for c in index.map(ContextIndex::chunks).unwrap_or_default() {
        *chunks.entry(c.source.as_str()).or_default() += 1;
    }
    let mut by_type: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut files: Vec<Value> = Vec::new();
    for (path, meta) in sources {
        let kind = source_type(path);
        let e = by_type.entry(kind).or_default();
        e.0 = e.0.saturating_add(1);
        e.1 = e.1.saturating_add(meta.size);
        if files.len() < MAX_LISTED {
            files.push(json!({
                "path": path,
                "size": meta.size,
                "type": kind,
                "modified": meta.mtime,
                "chunks": chunks.get(path.as_str()).copied().unwrap_or(0),
            }));
        }
    }
    json!({
        "method": "sizes and types from the source tree, chunk counts from the curated index (no model)",
        "files_total": sources.len(),
        "files": files,
        "types": by_type
            .into_iter()
            .map(|(t, (n, bytes))| json!({"type": t, "files": n, "bytes": bytes}))
            .collect::<Vec<_>>(),
        "manifest": manifest,
    })
}

/// Starts compacting a curated context's search index.
pub(crate) fn optimize(
    state: &Arc<AppState>,
    slug: &str,
) -> LocalResult<(types::WorkflowTriggerResponse, Ticket)> {
    let (context_id, index) = curated_index(state, slug)?;
    check_idle(state, &context_id, "optimize")?;
    let job: Job = Box::new(move || {
        let (before, after) = index.compact().map_err(|e| {
            tracing::error!(error = %e, "compacting an index failed");
            "compacting the index failed".to_owned()
        })?;
        Ok(json!({
            "method": "merged the search index's segments and removed unused files",
            "segments_before": before,
            "segments_after": after,
            "documents": index.num_docs(),
        }))
    });
    let task = start(
        state,
        state.store.change(),
        &context_id,
        "optimize",
        json!({}),
        job,
    )?;
    Ok(trigger(task, "optimizing"))
}
