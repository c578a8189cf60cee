//! The local connector: a directory on this machine, below one of the
//! roots the server was started with (`--connector-root`), that a context
//! imports from. It stands in for the hosted service's cloud connectors;
//! its provider is `local`, and its "OAuth" flow completes at once without
//! the network.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub(crate) mod oauth;

use super::durable;
use super::error::{LocalError, LocalResult};
use super::paths::{safe_join, safe_path};
use crate::types;

/// The one provider served locally.
pub(crate) const LOCAL_PROVIDER: &str = "local";
/// Most connectors kept.
pub(crate) const MAX_CONNECTORS: usize = 256;
/// Most items one folder listing returns.
const MAX_ITEMS: usize = 1000;
/// Most files one connector import takes.
const MAX_IMPORT_FILES: usize = 10_000;

/// A connector as the server keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ConnectorRecord {
    pub(crate) id: String,
    pub(crate) provider: String,
    pub(crate) account_label: Option<String>,
    /// The directory it reads (canonical).
    pub(crate) root: PathBuf,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
    /// Whether it is enabled, by context id (absent: not enabled).
    #[serde(default)]
    pub(crate) contexts: BTreeMap<String, bool>,
}

impl ConnectorRecord {
    /// The API's view.
    pub(crate) fn to_view(&self) -> types::ConnectorView {
        types::ConnectorView {
            account_label: self.account_label.clone(),
            created_at: self.created_at,
            id: self.id.clone(),
            provider: self.provider.clone(),
            updated_at: self.updated_at,
        }
    }

    /// The API's view for one context.
    pub(crate) fn to_context_view(&self, context_id: &str) -> types::ContextConnectorView {
        types::ContextConnectorView {
            account_label: self.account_label.clone(),
            created_at: self.created_at,
            enabled: self.contexts.get(context_id).copied().unwrap_or(false),
            id: self.id.clone(),
            provider: self.provider.clone(),
            updated_at: self.updated_at,
        }
    }
}

/// The canonical directory named by `path` (absolute, or relative to the
/// first root), if it is a directory below one of `roots`.
pub(crate) fn resolve_root(path: &str, roots: &[PathBuf]) -> LocalResult<PathBuf> {
    let first = roots.first().ok_or_else(|| {
        LocalError::bad_request(
            "no connector roots are configured: start nexus-local with --connector-root DIR",
        )
    })?;
    let outside = || {
        LocalError::bad_request(format!(
            "{path:?} is not a directory below a connector root"
        ))
    };
    let asked = Path::new(path.trim());
    let asked = if asked.is_absolute() {
        asked.to_path_buf()
    } else {
        first.join(asked)
    };
    let real = asked.canonicalize().map_err(|_| outside())?;
    let inside = roots
        .iter()
        .filter_map(|r| r.canonicalize().ok())
        .any(|r| real.starts_with(&r));
    if !inside || !real.is_dir() {
        return Err(outside());
    }
    Ok(real)
}

/// The directory `folder` (relative, `""` for the root) below `root`,
/// refusing anything that leaves it.
pub(crate) fn folder_dir(root: &Path, folder: &str) -> Option<PathBuf> {
    let folder = folder.trim_matches('/');
    if folder.is_empty() {
        return Some(root.to_path_buf());
    }
    let rel = safe_path(folder)?;
    let dir = safe_join(root, &rel)?;
    let real = dir.canonicalize().ok()?;
    (real.starts_with(root) && real.is_dir()).then_some(real)
}

/// The direct children of a folder (hidden entries and links left out),
/// by name, at most `MAX_ITEMS`. Item ids are paths relative to the root.
pub(crate) fn list_items(root: &Path, folder: &str) -> std::io::Result<Vec<types::ConnectorItem>> {
    let Some(dir) = folder_dir(root, folder) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such folder",
        ));
    };
    let prefix = folder.trim_matches('/');
    // The first MAX_ITEMS by name, kept as the listing goes, so a huge
    // directory costs no more memory than a full page.
    let mut items = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(&dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let meta = entry.metadata()?;
        let kind = if meta.is_dir() {
            "folder"
        } else if meta.is_file() {
            "file"
        } else {
            continue;
        };
        let id = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let item = types::ConnectorItem {
            id,
            name: name.clone(),
            size: meta
                .is_file()
                .then(|| i64::try_from(meta.len()).unwrap_or(i64::MAX)),
            type_: kind.to_owned(),
        };
        items.insert(name, item);
        if items.len() > MAX_ITEMS {
            items.pop_last();
        }
    }
    Ok(items.into_values().collect())
}

/// What one connector import takes.
#[derive(Debug)]
pub(crate) struct ImportPlan {
    /// The folder read, relative to the connector's root.
    pub(crate) folder: String,
    /// Files to take, relative to `folder` (empty: all of them).
    pub(crate) files: Vec<String>,
    /// Where they land in the context's sources (`""`: at the top).
    pub(crate) dest: String,
    /// Most bytes in all.
    pub(crate) limit: u64,
    /// Whether staged files are flushed to disk.
    pub(crate) sync: bool,
}

/// Copies the files a connector import takes into `files_dir` (the files
/// directory of a staged upload); blocking. Returns `(source path, size)`
/// of each.
pub(crate) fn stage(
    root: &Path,
    plan: &ImportPlan,
    files_dir: &Path,
) -> LocalResult<Vec<(String, u64)>> {
    let dir = folder_dir(root, &plan.folder).ok_or_else(|| {
        LocalError::not_found(format!("no folder {:?} in the connector", plan.folder))
    })?;
    let mut files = super::paths::read_tree(&dir, plan.limit).map_err(|(path, e)| {
        if e.kind() == std::io::ErrorKind::FileTooLarge {
            LocalError::bad_request(format!(
                "the folder {:?} holds more than {} bytes",
                plan.folder, plan.limit
            ))
        } else {
            tracing::warn!(path = %path.display(), error = %e, "reading a connector's folder failed");
            LocalError::bad_request(format!("the folder {:?} cannot be read", plan.folder))
        }
    })?;
    let io = |e: std::io::Error| LocalError::internal("staging the connector's files", e);
    if !plan.files.is_empty() {
        let wanted: std::collections::BTreeSet<String> = plan
            .files
            .iter()
            .filter_map(|f| safe_path(f.trim_matches('/')))
            .collect();
        files.retain(|(rel, _, _)| wanted.contains(rel));
    }
    if files.is_empty() {
        return Err(LocalError::bad_request(
            "the connector has no files to import there",
        ));
    }
    if files.len() > MAX_IMPORT_FILES {
        return Err(LocalError::bad_request(format!(
            "the import would take {} files; at most {MAX_IMPORT_FILES} at once",
            files.len()
        )));
    }
    durable::create_dir_all(files_dir).map_err(io)?;
    let mut staged = Vec::with_capacity(files.len());
    let mut dirs = std::collections::BTreeSet::new();
    for (rel, path, size) in files {
        let target_rel = if plan.dest.is_empty() {
            rel
        } else {
            format!("{}/{rel}", plan.dest)
        };
        let target = safe_join(files_dir, &target_rel)
            .ok_or_else(|| LocalError::bad_request(format!("unsafe path {target_rel:?}")))?;
        // Copied, not read into memory: one file may be large.
        let parent = target
            .parent()
            .ok_or_else(|| LocalError::bad_request(format!("unsafe path {target_rel:?}")))?;
        if plan.sync {
            durable::create_dir_all(parent).map_err(io)?;
        } else {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        copy_exactly(&path, &target, size, plan.sync).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                LocalError::conflict(format!(
                    "{target_rel:?} changed while it was imported; try again"
                ))
            } else {
                io(e)
            }
        })?;
        if plan.sync {
            dirs.insert(parent.to_path_buf());
        }
        staged.push((target_rel, size));
    }
    for dir in &dirs {
        durable::sync_dir(dir).map_err(io)?;
    }
    Ok(staged)
}

/// Copies the `size` bytes the folder's scan counted, and fails with
/// `InvalidData` when the file now holds another number: a file that grows
/// between the scan and the copy cannot take the import past its byte limit.
fn copy_exactly(from: &Path, to: &Path, size: u64, sync: bool) -> std::io::Result<()> {
    use std::io::Read;
    let source = std::fs::File::open(from)?;
    let mut out = std::fs::File::create(to)?;
    // One byte more than expected shows a file that grew.
    let copied = std::io::copy(&mut source.take(size.saturating_add(1)), &mut out)?;
    if copied != size {
        drop(out);
        let _ = std::fs::remove_file(to);
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the file changed size while it was copied",
        ));
    }
    if sync {
        out.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_keeps_the_first_names_of_a_directory_larger_than_a_page() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..MAX_ITEMS + 5 {
            std::fs::write(dir.path().join(format!("f{i:05}.md")), b"x").unwrap();
        }
        let root = dir.path().canonicalize().unwrap();
        let items = list_items(&root, "").unwrap();
        assert_eq!(items.len(), MAX_ITEMS);
        assert_eq!(items[0].name, "f00000.md");
        assert_eq!(
            items[MAX_ITEMS - 1].name,
            format!("f{:05}.md", MAX_ITEMS - 1)
        );
    }

    #[test]
    fn a_file_that_changed_size_since_the_scan_is_not_copied() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("a.md"), dir.path().join("b.md"));
        std::fs::write(&from, b"hello world").unwrap();
        copy_exactly(&from, &to, 11, false).unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), b"hello world");
        for scanned in [5, 20] {
            let err = copy_exactly(&from, &to, scanned, true).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
            assert!(!to.exists(), "a partial copy is removed");
        }
    }
}
