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
