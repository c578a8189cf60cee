//! Relative paths inside a context's source tree: normalized, and refused
//! when they could leave the tree or mean something else on some platform.

use std::path::{Path, PathBuf};

/// Longest path part and whole path, in bytes.
pub(crate) const MAX_PART_BYTES: usize = 255;
pub(crate) const MAX_PATH_BYTES: usize = 1024;

/// Names that Windows reserves, whatever their extension.
fn is_reserved_name(part: &str) -> bool {
    let stem = part
        .split('.')
        .next()
        .unwrap_or("")
        .trim_end()
        .to_ascii_uppercase();
    matches!(
        stem.as_str(),
        "CON" | "PRN" | "AUX" | "NUL" | "CONIN$" | "CONOUT$"
    ) || ((stem.starts_with("COM") || stem.starts_with("LPT"))
        && stem.len() == 4
        && stem
            .as_bytes()
            .get(3)
            .is_some_and(|c| c.is_ascii_digit() || matches!(c, 0xb9 | 0xb2 | 0xb3)))
}

/// Normalizes a relative path: `/` separators, no `.`/`..`/empty parts.
/// `None` for a path that could leave the tree or name something else on
/// some platform: drive letters and other `:`, control characters, Windows
/// reserved names, parts ending in a dot or space, over-long names.
pub(crate) fn safe_path(raw: &str) -> Option<String> {
    let mut parts = Vec::new();
    for part in raw.split(['/', '\\']) {
        match part {
            "" | "." => {}
            ".." => return None,
            p if p.chars().any(|c| c.is_control() || c == ':')
                || p.ends_with('.')
                || p.ends_with(' ')
                || p.len() > MAX_PART_BYTES
                || is_reserved_name(p) =>
            {
                return None;
            }
            p => parts.push(p),
        }
    }
    let joined = parts.join("/");
    (!parts.is_empty() && joined.len() <= MAX_PATH_BYTES).then_some(joined)
}

/// `root/rel` for a relative path already normalized by [`safe_path`],
/// or `None` when it would not stay below `root`.
pub(crate) fn safe_join(root: &Path, rel: &str) -> Option<PathBuf> {
    let checked = safe_path(rel)?;
    if checked != rel {
        return None;
    }
    let path = root.join(checked);
    path.starts_with(root).then_some(path)
}
/// A file of a tree: `(relative path, path, size)`.
pub(crate) type TreeFile = (String, PathBuf, u64);
/// What could not be read, and why.
pub(crate) type TreeError = (PathBuf, std::io::Error);

/// Files below `dir` (hidden ones skipped, links not followed) as
/// `(relative path, path, size)`; blocking. A failure names the path that
/// could not be read; more than `limit` bytes in all is an error of kind
/// `FileTooLarge` naming `dir`.
pub(crate) fn read_tree(dir: &Path, limit: u64) -> Result<Vec<TreeFile>, TreeError> {
    let mut out = Vec::new();
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| (d.clone(), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| (d.clone(), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let meta = entry.metadata().map_err(|e| (path.clone(), e))?;
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
                if total > limit {
                    let e = std::io::Error::new(
                        std::io::ErrorKind::FileTooLarge,
                        format!("more than {limit} bytes"),
                    );
                    return Err((dir.to_path_buf(), e));
                }
                let Ok(rel) = path.strip_prefix(dir) else {
                    continue;
                };
                let rel = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                let Some(rel) = safe_path(&rel) else {
                    tracing::warn!(path = %path.display(), "skipping a file whose name is unsafe");
                    continue;
                };
                out.push((rel, path, meta.len()));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Regular files below `root`, as `/`-separated relative paths.
pub(crate) fn files_below(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(root) {
                out.push(
                    rel.components()
                        .map(|c| c.as_os_str().to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                        .join("/"),
                );
            }
        }
    }
    out
}
