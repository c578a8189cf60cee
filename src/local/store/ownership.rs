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
    if foreign.is_empty() && only_started {
        return mark(dir).map(|()| true);
    }
    let layout = if foreign.is_empty() && has_state {
        earlier_layout(dir)
    } else {
        Err(String::new())
    };
    if layout.is_ok() {
        if !names.is_empty() {
            tracing::info!(dir = %dir.display(), "adopting a data directory written by an earlier version");
        }
        return mark(dir).map(|()| false);
    }
    let why = if foreign.is_empty() && has_state {
        format!(
            "it is not laid out as nexus-local lays out its data ({})",
            layout.err().unwrap_or_default()
        )
    } else if foreign.is_empty() {
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

/// Checks that a directory without the marker is laid out exactly as an
/// earlier version left it: its state is the server's (a SQLite database,
/// or a `state.json` that reads as the server's snapshot), `contexts/`
/// holds only context directories of the server's making, and `staging/`
/// and `quarantine/` are directories. `Err` says what differs.
fn earlier_layout(dir: &Path) -> Result<(), String> {
    let db = dir.join("state.db");
    if db.exists() {
        let mut head = [0u8; 16];
        let len = std::fs::metadata(&db).map_err(|e| e.to_string())?.len();
        let read =
            std::fs::File::open(&db).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head));
        if len != 0 && (read.is_err() || &head != b"SQLite format 3\0") {
            return Err("state.db is not a SQLite database".to_owned());
        }
    } else if !["state.json", "state.json.prev"]
        .iter()
        .any(|name| is_snapshot(&dir.join(name)))
    {
        return Err("state.json is not a nexus-local state".to_owned());
    }
    for name in ["staging", QUARANTINE_DIR, "contexts"] {
        let path = dir.join(name);
        if path.exists() && !path.is_dir() {
            return Err(format!("{name} is not a directory"));
        }
    }
    for entry in std::fs::read_dir(dir.join("contexts"))
        .into_iter()
        .flatten()
    {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_context_dir_name(&name) || !entry.path().is_dir() {
            return Err(format!("contexts/{name} is not a context's directory"));
        }
        for inner in std::fs::read_dir(entry.path()).map_err(|e| e.to_string())? {
            let inner = inner.map_err(|e| e.to_string())?;
            let file = inner.file_name().to_string_lossy().into_owned();
            if !is_context_entry(&file) {
                return Err(format!("contexts/{name}/{file} is not the server's"));
            }
        }
    }
    Ok(())
}

/// Whether the file at `path` reads as the snapshot of the oldest
/// versions: a JSON object whose `contexts` is a list.
fn is_snapshot(path: &Path) -> bool {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|v| v.get("contexts").is_some_and(serde_json::Value::is_array))
}

/// A context's id as the server makes them: `ctx_` and letters, digits,
/// `_` or `-`.
fn is_context_dir_name(name: &str) -> bool {
    name.strip_prefix("ctx_").is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// What the server keeps in a context's directory: `sources`, index
/// generations (`index-N`, `chunks-N.json`) and its crash-safe writes'
/// temporary files (`.NAME.tmp-…`).
fn is_context_entry(name: &str) -> bool {
    let generation = |g: &str| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit());
    name == "sources"
        || name.strip_prefix("index-").is_some_and(generation)
        || name
            .strip_prefix("chunks-")
            .and_then(|r| r.strip_suffix(".json"))
            .is_some_and(generation)
        || (name.starts_with('.') && name.contains(".tmp-"))
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

    use crate::local::scratch_dir::fresh as dir;

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
        std::fs::create_dir_all(d.join("contexts/ctx_x/sources")).unwrap();
        std::fs::create_dir_all(d.join("contexts/ctx_x/index-2")).unwrap();
        std::fs::write(d.join("contexts/ctx_x/chunks-2.json"), b"[]").unwrap();
        std::fs::write(d.join("state.db"), b"").unwrap();
        std::fs::write(d.join(".lock"), b"").unwrap();
        assert!(!claim(&d).unwrap(), "an adopted directory keeps its mode");
        assert!(d.join(MARKER_FILE).is_file());
        std::fs::remove_dir_all(d).unwrap();
    }

    /// Reproduction: any folder of known names holding a `state.json` was
    /// adopted as an earlier version's and rearranged.
    #[test]
    fn only_the_exact_layout_of_an_earlier_version_is_adopted() {
        // (what the refusal names, the files the folder holds)
        type Case = (&'static str, &'static [(&'static str, &'static [u8])]);
        let cases: [Case; 4] = [
            // Some other program's state.json.
            ("state.json", &[("state.json", br#"{"theme":"dark"}"#)]),
            // A state.db that is no SQLite database.
            ("state.db", &[("state.db", b"my notes")]),
            // A context folder that is not one the server makes.
            (
                "contexts/notes",
                &[
                    ("state.json", br#"{"contexts":[]}"#),
                    ("contexts/notes/todo.md", b"mine"),
                ],
            ),
            // A file of someone else's in a context's directory.
            (
                "contexts/ctx_a/todo.md",
                &[
                    ("state.json", br#"{"contexts":[]}"#),
                    ("contexts/ctx_a/todo.md", b"mine"),
                ],
            ),
        ];
        for (named, files) in cases {
            let d = dir("layout");
            for (path, data) in files {
                let path = d.join(path);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, data).unwrap();
            }
            let err = claim(&d).unwrap_err();
            assert!(
                matches!(&err, OpenError::Foreign { why, .. } if why.contains(named)),
                "{named}: {err:?}"
            );
            assert!(!d.join(MARKER_FILE).exists(), "{named}: marked");
            for (path, data) in files {
                assert_eq!(std::fs::read(d.join(path)).unwrap(), *data, "{named}");
            }
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}
