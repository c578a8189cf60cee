//! Source uploads: one file, or an archive (`.zip`, `.tar`, `.tar.gz`,
//! `.tgz`) expanded into the source tree, run as an `import` task.

use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;
use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::error::{LocalError, LocalResult};
use super::state::AppState;
use super::store::SourceMeta;
use crate::types;

/// Most files one archive may expand to.
const MAX_ARCHIVE_ENTRIES: usize = 100_000;

/// An upload accepted for import.
#[derive(Debug)]
pub(crate) struct Upload {
    /// The file name the client sent.
    pub(crate) name: String,
    /// The directory of the source tree it lands in.
    pub(crate) dir: String,
    pub(crate) data: Bytes,
}

/// What an upload expanded to.
#[derive(Debug, Default)]
pub(crate) struct Expanded {
    pub(crate) files: Vec<(String, Bytes)>,
    /// `(entry, reason)` of entries left out.
    pub(crate) skipped: Vec<(String, String)>,
}

/// Normalizes a relative path: `/` separators, no `.`/`..`/empty parts.
/// `None` for a path that would leave the tree.
pub(crate) fn safe_path(raw: &str) -> Option<String> {
    let mut parts = Vec::new();
    for part in raw.split(['/', '\\']) {
        match part {
            "" | "." => {}
            ".." => return None,
            p if p.contains('\0') => return None,
            p => parts.push(p),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// Whether a path is hidden or archive clutter (skipped on expansion).
fn is_clutter(path: &str) -> bool {
    path.split('/')
        .any(|p| p.starts_with('.') || p == "__MACOSX")
}

/// Checks an upload's file name.
pub(crate) fn check_file_name(name: &str) -> LocalResult<()> {
    if name.is_empty() || name.contains(['/', '\\', '\0']) || name == "." || name == ".." {
        return Err(LocalError::bad_request(format!(
            "missing or unsafe file name {name:?}"
        )));
    }
    Ok(())
}

/// Expands an upload. `limit` caps the total expanded bytes.
pub(crate) fn expand(upload: &Upload, limit: u64) -> Result<Expanded, String> {
    let lower = upload.name.to_ascii_lowercase();
    let mut out = Expanded::default();
    let mut total = 0u64;
    let add = |out: &mut Expanded, total: &mut u64, path: &str, data: Vec<u8>| {
        *total += data.len() as u64;
        if *total > limit {
            return Err(format!("the upload expands beyond the {limit} byte limit"));
        }
        if out.files.len() >= MAX_ARCHIVE_ENTRIES {
            return Err(format!(
                "the archive holds more than {MAX_ARCHIVE_ENTRIES} files"
            ));
        }
        out.files
            .push((format!("{}/{path}", upload.dir), data.into()));
        Ok(())
    };
    if lower.ends_with(".zip") {
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(upload.data.as_ref()))
            .map_err(|e| format!("not a readable zip archive: {e}"))?;
        for i in 0..zip.len() {
            let mut entry = zip.by_index(i).map_err(|e| format!("zip entry {i}: {e}"))?;
            if entry.is_dir() {
                continue;
            }
            let raw = entry.name().to_owned();
            let Some(path) = entry
                .enclosed_name()
                .and_then(|p| safe_path(&p.to_string_lossy()))
            else {
                out.skipped.push((raw, "unsafe path".into()));
                continue;
            };
            if is_clutter(&path) {
                out.skipped.push((raw, "hidden".into()));
                continue;
            }
            let mut data = Vec::new();
            (&mut entry)
                .take(limit.saturating_sub(total) + 1)
                .read_to_end(&mut data)
                .map_err(|e| format!("zip entry {raw}: {e}"))?;
            add(&mut out, &mut total, &path, data)?;
        }
    } else if lower.ends_with(".tar") || lower.ends_with(".tar.gz") || lower.ends_with(".tgz") {
        let reader: Box<dyn Read> = if lower.ends_with(".tar") {
            Box::new(upload.data.as_ref())
        } else {
            Box::new(flate2::read::GzDecoder::new(upload.data.as_ref()))
        };
        let mut tar = tar::Archive::new(reader);
        let entries = tar
            .entries()
            .map_err(|e| format!("not a readable tar archive: {e}"))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| format!("tar entry: {e}"))?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let raw = entry
                .path()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            let Some(path) = safe_path(&raw) else {
                out.skipped.push((raw, "unsafe path".into()));
                continue;
            };
            if is_clutter(&path) {
                out.skipped.push((raw, "hidden".into()));
                continue;
            }
            let mut data = Vec::new();
            (&mut entry)
                .take(limit.saturating_sub(total) + 1)
                .read_to_end(&mut data)
                .map_err(|e| format!("tar entry {raw}: {e}"))?;
            add(&mut out, &mut total, &path, data)?;
        }
    } else {
        add(&mut out, &mut total, &upload.name, upload.data.to_vec())?;
    }
    Ok(out)
}

/// Registers an import task for `context` (409 while one runs) and starts it.
pub(crate) fn start(
    state: &Arc<AppState>,
    context: &str,
    upload: Upload,
) -> LocalResult<types::WorkflowTriggerResponse> {
    let cancel = state.shutdown.child_token();
    let (task, context_id) = {
        let mut inner = state.store.lock();
        let ctx = inner.context(context)?;
        if ctx.importing {
            return Err(LocalError::conflict(format!(
                "an import is already running on context {:?}",
                ctx.slug
            )));
        }
        let context_id = ctx.id.clone();
        let input: types::TaskInput = serde_json::from_value(serde_json::json!({
            "raw_archive_key": format!("uploads/{}", upload.name),
            "path": upload.dir,
        }))
        .map_err(|e| LocalError::internal("import task input", e))?;
        let task = inner.new_task("import", Some(&context_id), None, input, cancel.clone());
        let ctx = inner.context_mut(&context_id)?;
        ctx.importing = true;
        ctx.import_task_id = Some(task.id.clone());
        (task, context_id)
    };
    let job_state = state.clone();
    let task_id = task.id.clone();
    state.spawn(async move { run(job_state, context_id, task_id, upload, cancel).await });
    Ok(types::WorkflowTriggerResponse {
        exploring: None,
        importing: Some(true),
        profiling: None,
        state: "importing".to_owned(),
        task_id: task.id,
    })
}

async fn run(
    state: Arc<AppState>,
    context_id: String,
    task_id: String,
    upload: Upload,
    cancel: CancellationToken,
) {
    let limit = state.config.context_bytes_limit;
    let name = upload.name.clone();
    let expanded = tokio::task::spawn_blocking(move || expand(&upload, limit)).await;
    let delay = state.faults.frame_delay();
    if !delay.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = cancel.cancelled() => {}
        }
    }
    let outcome = match expanded {
        Ok(Ok(e)) => Ok(e),
        Ok(Err(msg)) => Err(msg),
        Err(e) => Err(format!("import stopped: {e}")),
    };
    if cancel.is_cancelled() {
        finish(&state, &context_id, &task_id, "cancelled", None, None);
        state.store.persist().await;
        return;
    }
    let expanded = match outcome {
        Ok(e) => e,
        Err(msg) => {
            finish(&state, &context_id, &task_id, "failed", None, Some(msg));
            state.store.persist().await;
            return;
        }
    };
    if let Err(msg) = write_sources(&state, &context_id, &expanded.files).await {
        finish(&state, &context_id, &task_id, "failed", None, Some(msg));
        state.store.persist().await;
        return;
    }
    let now = Utc::now();
    let stored = store_files(&state, &context_id, &expanded, now);
    let is_work = match stored {
        Ok(is_work) => is_work,
        Err(msg) => {
            finish(&state, &context_id, &task_id, "failed", None, Some(msg));
            state.store.persist().await;
            return;
        }
    };
    let output = import_output(&name, &expanded);
    finish(
        &state,
        &context_id,
        &task_id,
        "completed",
        Some(output),
        None,
    );
    state.store.persist().await;
    if is_work {
        // Work contexts are queryable at once: index what was imported.
        if let Err(e) = super::curate::start(&state, &context_id, false, None, true) {
            tracing::warn!(error = %e, "indexing a work context failed to start");
        }
    }
}

/// Adds imported files to the context (within its byte limit); returns
/// whether it is a work context.
fn store_files(
    state: &AppState,
    context_id: &str,
    expanded: &Expanded,
    now: chrono::DateTime<Utc>,
) -> Result<bool, String> {
    let mut inner = state.store.lock();
    let Some(ctx) = inner.contexts.get_mut(context_id) else {
        return Err("the context was deleted".to_owned());
    };
    let existing: u64 = ctx
        .sources
        .iter()
        .filter(|(p, _)| !expanded.files.iter().any(|(n, _)| n == *p))
        .map(|(_, m)| m.size)
        .sum();
    let added: u64 = expanded.files.iter().map(|(_, d)| d.len() as u64).sum();
    if existing + added > state.config.context_bytes_limit {
        return Err(format!(
            "the context would exceed its {} byte limit",
            state.config.context_bytes_limit
        ));
    }
    for (path, data) in &expanded.files {
        ctx.sources.insert(
            path.clone(),
            SourceMeta {
                size: data.len() as u64,
                mtime: now,
            },
        );
    }
    ctx.last_source_import_at = Some(now);
    ctx.updated_at = now;
    let is_work = ctx.kind == "work";
    let sources = inner.sources.entry(context_id.to_owned()).or_default();
    for (path, data) in &expanded.files {
        sources.insert(path.clone(), data.clone());
    }
    Ok(is_work)
}

/// Writes imported files under the data directory (no-op in memory).
async fn write_sources(
    state: &Arc<AppState>,
    context_id: &str,
    files: &[(String, Bytes)],
) -> Result<(), String> {
    let Some(dir) = state.store.context_dir(context_id) else {
        return Ok(());
    };
    let files = files.to_vec();
    tokio::task::spawn_blocking(move || {
        for (path, data) in files {
            let target = dir.join("sources").join(&path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&target, &data)?;
        }
        Ok::<_, std::io::Error>(())
    })
    .await
    .map_err(|e| format!("import stopped: {e}"))?
    .map_err(|e| {
        tracing::error!(error = %e, "writing sources failed");
        "the sources could not be stored".to_owned()
    })
}

fn finish(
    state: &AppState,
    context_id: &str,
    task_id: &str,
    end: &str,
    output: Option<types::TaskOutput>,
    error: Option<String>,
) {
    let mut inner = state.store.lock();
    inner.end_task(task_id, end, output, error);
    if let Some(ctx) = inner.contexts.get_mut(context_id)
        && ctx.import_task_id.as_deref() == Some(task_id)
    {
        ctx.importing = false;
    }
}

fn import_output(name: &str, e: &Expanded) -> types::TaskOutput {
    let entry = |src: &str, action: &str, out: Vec<String>, reason: &str, bytes: i64| {
        types::ImportManifestEntry {
            action: action.to_owned(),
            bytes,
            fmt: src.rsplit('.').next().unwrap_or("").to_owned(),
            out,
            reason: reason.to_owned(),
            src: src.to_owned(),
        }
    };
    let sample: Vec<_> = e
        .files
        .iter()
        .take(20)
        .map(|(p, d)| entry(p, "copied", vec![p.clone()], "", d.len() as i64))
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
        skipped: e.skipped.len() as i64,
        skipped_items: skipped,
        status: format!("imported {name}"),
    };
    types::TaskOutput {
        subtype_14: Some(out),
        ..empty_output()
    }
}

/// A `TaskOutput` with no variant set.
pub(crate) fn empty_output() -> types::TaskOutput {
    types::TaskOutput {
        subtype_0: None,
        subtype_1: None,
        subtype_2: None,
        subtype_3: None,
        subtype_4: None,
        subtype_5: None,
        subtype_6: None,
        subtype_7: None,
        subtype_8: None,
        subtype_9: None,
        subtype_10: None,
        subtype_11: None,
        subtype_12: None,
        subtype_13: None,
        subtype_14: None,
        subtype_15: None,
        subtype_16: None,
        subtype_17: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upload(name: &str, data: Vec<u8>) -> Upload {
        Upload {
            name: name.into(),
            dir: "uploads".into(),
            data: data.into(),
        }
    }

    #[test]
    fn paths_never_leave_the_tree() {
        assert_eq!(safe_path("a/./b//c.md").as_deref(), Some("a/b/c.md"));
        assert_eq!(safe_path("../etc/passwd"), None);
        assert_eq!(safe_path("a\\..\\b"), None);
        assert_eq!(safe_path("/abs/x").as_deref(), Some("abs/x"));
        assert!(check_file_name("../x").is_err());
        assert!(check_file_name("").is_err());
        assert!(check_file_name("ok.md").is_ok());
    }

    #[test]
    fn tar_gz_is_expanded_and_hidden_files_skipped() {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (p, body) in [
            ("docs/a.md", "# A\n"),
            (".git/config", "x"),
            ("b.txt", "bee"),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_size(body.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, p, body.as_bytes()).unwrap();
        }
        let data = b.into_inner().unwrap().finish().unwrap();
        let e = expand(&upload("src.tar.gz", data), 1 << 20).unwrap();
        let paths: Vec<_> = e.files.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, vec!["uploads/docs/a.md", "uploads/b.txt"]);
        assert_eq!(e.skipped.len(), 1);
    }

    #[test]
    fn zip_is_expanded_within_the_limit() {
        let mut zw = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default();
        zw.start_file("notes/n.md", opts).unwrap();
        std::io::Write::write_all(&mut zw, &[b'x'; 100]).unwrap();
        let data = zw.finish().unwrap().into_inner();
        let e = expand(&upload("n.zip", data.clone()), 1 << 20).unwrap();
        assert_eq!(e.files[0].0, "uploads/notes/n.md");
        assert!(expand(&upload("n.zip", data), 50).is_err());
    }

    #[test]
    fn a_plain_file_lands_in_its_directory() {
        let e = expand(&upload("guide.md", b"# G".to_vec()), 100).unwrap();
        assert_eq!(e.files[0].0, "uploads/guide.md");
    }
}
