//! What a start repairs after a crash: imports that were moving files are
//! finished from their staging directory (rolled forward, so an import is
//! all or nothing), and files no row names are swept: unused index
//! generations (derived data) are removed; context directories of contexts
//! that do not exist and source files no row records are user-visible, so
//! they are set aside in `quarantine/`, never deleted.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{STAGING_DIR, ownership};
use crate::local::paths::safe_join;

/// The record of a move, as the `moves` table keeps it (JSON).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct MoveRecord {
    /// `(path, size)` of every file the move carries.
    pub(crate) files: Vec<(String, u64)>,
    /// The name of the upload's staging directory (below `staging/`),
    /// kept across a crash until the move is finished.
    #[serde(default)]
    pub(crate) staging: Option<String>,
    /// The import task the move belongs to.
    #[serde(default)]
    pub(crate) task_id: Option<String>,
}

impl MoveRecord {
    /// Reads a record; earlier versions kept only the list of files.
    pub(crate) fn parse(json: &str) -> MoveRecord {
        serde_json::from_str(json).unwrap_or_else(|_| MoveRecord {
            files: serde_json::from_str(json).unwrap_or_default(),
            ..MoveRecord::default()
        })
    }
}

/// Moves the files of an unfinished move still in its staging directory
/// into `sources_dir`. Returns how many are in neither place (with their
/// recorded size in place), so the import cannot be reported whole.
pub(crate) fn roll_forward(data_dir: &Path, record: &MoveRecord, sources_dir: &Path) -> usize {
    let Some(staging) = record.staging.as_deref() else {
        return 0;
    };
    let Some(staged) = safe_join(&data_dir.join(STAGING_DIR), staging).map(|r| r.join("files"))
    else {
        return record.files.len();
    };
    let mut failed = 0;
    for (path, size) in &record.files {
        let (Some(from), Some(to)) = (safe_join(&staged, path), safe_join(sources_dir, path))
        else {
            failed += 1;
            continue;
        };
        if !from.is_file() {
            // Moved before the stop, or lost: only the first is whole.
            let in_place = std::fs::metadata(&to).is_ok_and(|m| m.is_file() && m.len() == *size);
            if !in_place {
                tracing::error!(path, "a file of an interrupted import is missing");
                failed += 1;
            }
            continue;
        }
        let moved = (|| {
            if let Some(parent) = to.parent() {
                crate::local::durable::create_dir_all(parent)?;
            }
            std::fs::rename(&from, &to)?;
            match to.parent() {
                Some(parent) => crate::local::durable::sync_dir(parent),
                None => Ok(()),
            }
        })();
        if let Err(e) = moved {
            tracing::error!(path, error = %e, "finishing an interrupted import failed");
            failed += 1;
        }
    }
    failed
}

/// Sweeps what no row names below `data_dir/contexts`: directories of
/// contexts that do not exist and source files that are not recorded are
/// set aside in `quarantine/` (logged); index generations not in use are
/// removed. `contexts` gives each context's id, its
/// index generation in use (if curated) and its recorded source paths.
pub(crate) fn sweep<'a>(
    data_dir: &Path,
    contexts: impl Iterator<Item = (&'a str, Option<u64>, Vec<&'a str>)>,
) {
    let root = data_dir.join("contexts");
    let quarantine = ownership::quarantine_dir(data_dir);
    let mut known = std::collections::HashMap::new();
    for (id, generation, sources) in contexts {
        known.insert(id.to_owned(), (generation, sources));
    }
    for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let dir = entry.path();
        let Some((generation, sources)) = known.get(&name) else {
            ownership::set_aside(
                data_dir,
                &quarantine,
                &dir,
                "the files of a context that does not exist",
            );
            continue;
        };
        crate::local::records::remove_index_generations_except(&dir, *generation);
        let recorded: std::collections::HashSet<&str> = sources.iter().copied().collect();
        let src = dir.join("sources");
        for path in crate::local::paths::files_below(&src) {
            if !recorded.contains(path.as_str())
                && let Some(p) = safe_join(&src, &path)
            {
                ownership::set_aside(data_dir, &quarantine, &p, "a source file no row records");
            }
        }
    }
}

/// Empties `staging/` of what the server staged there (directories named as
/// [`super::Store::staging_dir`] names them); anything else found there is
/// not the server's and stays, with a warning.
pub(crate) fn clear_staging(data_dir: &Path) {
    let staging = data_dir.join(STAGING_DIR);
    for entry in std::fs::read_dir(&staging).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && super::is_secret_name(&name) {
            if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!(dir = %entry.path().display(), error = %e, "a staged upload could not be removed");
            }
        } else {
            tracing::warn!(path = %entry.path().display(), "staging/ holds something nexus-local did not make; left as it is");
        }
    }
}

/// Why a start is refused: acknowledged data the state names is not there.
/// Nothing is repaired by forgetting it; the message says what is missing
/// and how to recover.
pub(crate) fn state_missing(data_dir: &Path) -> Option<String> {
    let db = data_dir.join(crate::local::db::DB_FILE);
    if !state_is_empty(&db) {
        return None;
    }
    let contexts: Vec<String> = std::fs::read_dir(data_dir.join("contexts"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if contexts.is_empty() {
        return None;
    }
    let what = if db.exists() {
        "is empty"
    } else {
        "is missing"
    };
    Some(format!(
        "{} {what}, but contexts/ holds the files of {} context(s) ({}): their records are in that \
         database. Restore state.db (with state.db-wal, if any) from a backup and start again, or \
         start on a new directory; nothing was changed",
        db.display(),
        contexts.len(),
        named(&contexts)
    ))
}

/// Whether the state database at `db` holds no state: missing, of no
/// bytes, or without the server's tables.
fn state_is_empty(db: &Path) -> bool {
    match std::fs::metadata(db) {
        Err(_) => true,
        Ok(m) if m.len() == 0 => true,
        Ok(_) => {
            let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
            // Unreadable is not empty: the database's own open reports it.
            rusqlite::Connection::open_with_flags(db, flags)
                .and_then(|c| {
                    c.query_row(
                        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'contexts'",
                        [],
                        |r| r.get::<_, i64>(0),
                    )
                })
                .is_ok_and(|n| n == 0)
        }
    }
}

/// Recorded source files that are not on disk, as `slug/path`: a start is
/// refused while any is missing (a folder not mounted yet, a file deleted
/// by hand), since dropping their rows would forget acknowledged uploads.
pub(crate) fn sources_missing(missing: &[String]) -> Option<String> {
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "{} recorded source file(s) are missing ({}): put them back (or mount the folder that \
         holds them) and start again; `nexus-local verify --data DIR` lists every one. To give a \
         file up for good, delete its row with the sqlite3 shell \
         (DELETE FROM sources WHERE context_id = '...' AND path = '...') while no server runs",
        missing.len(),
        named(missing)
    ))
}

/// Up to three names, and how many more.
fn named(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(3).map(String::as_str).collect();
    match names.len().saturating_sub(3) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}
