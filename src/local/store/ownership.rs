//! Which directories the server may use as its data directory, and where
//! start-up repairs put what they will not delete.
//!
//! The server touches only what it made. A data directory is one it
//! created, an empty one, or one holding its marker file
//! ([`MARKER_FILE`]). A directory written by an earlier version (no
//! marker) is recognised when everything in it is something the server
//! makes and it holds a state file (`state.db`, or `state.json` of the
//! oldest versions); the marker is then added. Any other directory is
//! refused, left exactly as it was.
//!
//! Start-up repairs never delete user-visible files on a guess: source
//! files no row records and directories of contexts that do not exist are
//! moved below `quarantine/` in the data directory, and the move is logged.

use std::path::{Path, PathBuf};

use chrono::Utc;

use super::OpenError;
use crate::local::durable;

/// The marker file of a data directory the server made or adopted.
pub(crate) const MARKER_FILE: &str = ".nexus-local";
/// What the marker holds (read by people, not parsed).
const MARKER_TEXT: &[u8] = b"nexus-local data directory: written by nexus-local only\n";
/// Where start-up repairs set aside what they do not delete.
pub(crate) const QUARANTINE_DIR: &str = "quarantine";
/// How a marker's temporary file was named by builds that wrote it
/// through a rename.
const MARKER_TEMP_PREFIX: &str = "..nexus-local.tmp-";
/// Foreign entries named in a refusal.
const NAMED_ENTRIES: usize = 3;

/// Whether `name` is something a server of this or an earlier version
/// makes at the top of its data directory.
fn is_own_entry(name: &str) -> bool {
    matches!(
        name,
        MARKER_FILE
            | ".lock"
            | "state.db"
            | "state.db-wal"
            | "state.db-shm"
            | "staging"
            | "contexts"
            | QUARANTINE_DIR
            | "state.json"
            | "state.json.prev"
            | "state.json.migrated"
            | "state.json.prev.migrated"
    ) || name.starts_with("state.json.torn-")
        || name.starts_with(".state.db.tmp-")
        || name.starts_with(".state.json.tmp-")
        || name.starts_with(MARKER_TEMP_PREFIX)
}

/// Makes sure `dir` is the server's own: creates it (with its marker) when
/// missing, marks it when empty or written by an earlier version, and
/// refuses any other directory without changing anything in it. `true`
/// when the directory is made the server's here (created, or empty), so
/// its mode is the server's to set; a directory already marked or of an
/// earlier version keeps its own.
///
/// # Errors
/// [`OpenError::Foreign`] for a directory the server did not make;
/// [`OpenError::Io`] when it cannot be read or created.
pub(crate) fn claim(dir: &Path) -> Result<bool, OpenError> {
    if !dir.exists() {
        durable::create_dir_all(dir)?;
        return mark(dir).map(|()| true);
    }
    if !dir.is_dir() {
        return Err(OpenError::Foreign {
            path: dir.to_path_buf(),
            why: "it is not a directory".to_owned(),
        });
    }
    if dir.join(MARKER_FILE).is_file() {
        return Ok(false);
    }
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    let foreign: Vec<&String> = names.iter().filter(|n| !is_own_entry(n)).collect();
    let has_state = names
        .iter()
        .any(|n| matches!(n.as_str(), "state.db" | "state.json" | "state.json.prev"));
    // What a start that stopped before its first state leaves: the lock
    // and a marker being written.
    let only_started = names
        .iter()
        .all(|n| n == ".lock" || n.starts_with(MARKER_TEMP_PREFIX));
    if foreign.is_empty() && (has_state || only_started) {
        if !names.is_empty() {
            tracing::info!(dir = %dir.display(), "adopting a data directory written by an earlier version");
        }
        return mark(dir).map(|()| only_started);
    }
    let why = if foreign.is_empty() {
        "it holds no nexus-local state".to_owned()
    } else {
        let shown: Vec<&str> = foreign
            .iter()
            .take(NAMED_ENTRIES)
            .map(|s| s.as_str())
            .collect();
        let more = foreign.len().saturating_sub(NAMED_ENTRIES);
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!(
            "it holds files nexus-local did not make ({}{tail})",
            shown.join(", ")
        )
    };
    Err(OpenError::Foreign {
        path: dir.to_path_buf(),
        why,
    })
}

/// Writes the marker in place (its presence is what counts, not its
/// text, so a torn one still marks the directory).
fn mark(dir: &Path) -> Result<(), OpenError> {
    let mut file = std::fs::File::create(dir.join(MARKER_FILE))?;
    std::io::Write::write_all(&mut file, MARKER_TEXT)?;
    file.sync_all()?;
    durable::sync_dir(dir)?;
    Ok(())
}

/// A new folder below `data_dir/quarantine/` for what one start sets
/// aside (not created until something is moved there).
pub(crate) fn quarantine_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(QUARANTINE_DIR).join(format!(
        "{}-{}",
        Utc::now().format("%Y%m%dT%H%M%SZ"),
        super::new_secret_name()
    ))
}

/// Moves `from` (below `data_dir`) to the same relative place below
/// `quarantine`, and logs where; on failure leaves it and logs why.
pub(crate) fn set_aside(data_dir: &Path, quarantine: &Path, from: &Path, what: &str) {
    let Ok(rel) = from.strip_prefix(data_dir) else {
        return;
    };
    let to = quarantine.join(rel);
    let moved = (|| {
        if let Some(parent) = to.parent() {
            durable::create_dir_all(parent)?;
        }
        std::fs::rename(from, &to)?;
        match to.parent() {
            Some(parent) => durable::sync_dir(parent),
            None => Ok(()),
        }
    })();
    match moved {
        Ok(()) => {
            tracing::warn!(what, from = %from.display(), to = %to.display(), "set aside in quarantine; delete it once checked")
        }
        Err(e) => {
            tracing::error!(what, path = %from.display(), error = %e, "could not set it aside in quarantine; left in place")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(label: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "nexus-own-{label}-{}-{}",
            std::process::id(),
            super::super::new_secret_name()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_new_or_empty_directory_is_claimed_and_marked() {
        let new = dir("new");
        claim(&new).unwrap();
        assert!(new.join(MARKER_FILE).is_file());
        let empty = dir("empty");
        std::fs::create_dir_all(&empty).unwrap();
        claim(&empty).unwrap();
        assert!(empty.join(MARKER_FILE).is_file());
        std::fs::remove_dir_all(new).unwrap();
        std::fs::remove_dir_all(empty).unwrap();
    }

    #[test]
    fn a_folder_with_foreign_files_is_refused_and_left_alone() {
        let d = dir("foreign");
        std::fs::create_dir_all(d.join("contexts/x")).unwrap();
        std::fs::write(d.join("README.md"), b"mine").unwrap();
        std::fs::write(d.join("contexts/x/notes.md"), b"also mine").unwrap();
        let err = claim(&d).unwrap_err();
        assert!(
            matches!(&err, OpenError::Foreign { why, .. } if why.contains("README.md")),
            "{err:?}"
        );
        assert!(!d.join(MARKER_FILE).exists());
        // A folder of known names alone, without state, is not ours either.
        std::fs::remove_file(d.join("README.md")).unwrap();
        assert!(matches!(claim(&d), Err(OpenError::Foreign { .. })));
        assert_eq!(
            std::fs::read(d.join("contexts/x/notes.md")).unwrap(),
            b"also mine"
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_directory_of_an_earlier_version_is_adopted() {
        let d = dir("earlier");
        std::fs::create_dir_all(d.join("contexts/x/sources")).unwrap();
        std::fs::write(d.join("state.db"), b"").unwrap();
        std::fs::write(d.join(".lock"), b"").unwrap();
        claim(&d).unwrap();
        assert!(d.join(MARKER_FILE).is_file());
        std::fs::remove_dir_all(d).unwrap();
    }
}
