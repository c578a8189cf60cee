//! Crash-safe file writes: every file that matters is written to a temporary
//! file beside it, flushed to disk, renamed into place, and its directory
//! flushed, so a crash leaves either the old file or the new one, never a
//! torn one.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::faults::{failpoint, point};

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The suffix of the previous version of a file (`state.json.prev` of
/// earlier versions).
pub(crate) const PREVIOUS_SUFFIX: &str = ".prev";

/// A fresh temporary path beside `path` (same directory, so the rename is atomic).
pub(crate) fn temp_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()))
}

/// Flushes a directory's entries (creations, renames) to disk. A no-op
/// where directories cannot be opened (Windows).
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Creates `dir` and its missing parents, flushing each new entry.
pub(crate) fn create_dir_all(dir: &Path) -> io::Result<()> {
    // The empty parent of a relative `name` is the current directory.
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dir_all(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => return Ok(()),
        Err(e) => return Err(e),
    }
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => Ok(()),
    }
}

/// Writes `data` to `path` durably: temp file, fsync, rename, fsync of the
/// directory. Missing parent directories are created.
pub(crate) fn write_file(path: &Path, data: &[u8]) -> io::Result<()> {
    let dir = parent(path)?;
    create_dir_all(dir)?;
    let tmp = temp_beside(path);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        failpoint(point::FILE_WRITE)?;
        std::fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The path of the previous version of `path`.
pub(crate) fn previous(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(PREVIOUS_SUFFIX);
    PathBuf::from(name)
}

fn parent(path: &Path) -> io::Result<&Path> {
    path.parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a file path has no directory"))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::local::scratch_dir::fresh as scratch;

    #[test]
    fn writes_replace_whole_files_and_leave_no_temp_behind() {
        let dir = scratch("write");
        let file = dir.join("a/b/state.json");
        write_file(&file, b"one").unwrap();
        write_file(&file, b"two").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.join("a/b"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Catches an error of `create_dir` taken for success: a file where the
    /// directory should be is an error, not a directory.
    #[test]
    fn a_file_in_the_way_is_an_error() {
        let dir = scratch("file");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("taken");
        std::fs::write(&file, b"").unwrap();
        assert!(create_dir_all(&file).is_err());
        assert!(create_dir_all(&file.join("below")).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Catches syncing the empty parent of a one-component relative path
    /// (`--data-dir data`), which cannot be opened. Tests run in the crate
    /// root; the directory is removed again.
    #[test]
    fn a_relative_directory_is_created() {
        let name = format!(
            ".nexus-durable-relative-{}-{}",
            std::process::id(),
            TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let dir = Path::new(&name);
        let created = create_dir_all(dir);
        let exists = dir.is_dir();
        let _ = std::fs::remove_dir(dir);
        created.unwrap();
        assert!(exists);
    }

    /// Catches a creator that loses a race taking `AlreadyExists` for an
    /// error (the guard replaced by `false`, or `==` by `!=`): threads
    /// released together all create the same new directories, and each
    /// must succeed.
    #[test]
    fn creators_racing_for_the_same_directory_all_succeed() {
        let dir = scratch("race");
        for round in 0..20 {
            let target = dir.join(format!("{round}/a/b"));
            let start = std::sync::Arc::new(std::sync::Barrier::new(6));
            let creators: Vec<_> = (0..6)
                .map(|_| {
                    let (target, start) = (target.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        create_dir_all(&target)
                    })
                })
                .collect();
            for creator in creators {
                creator.join().unwrap().unwrap();
            }
            assert!(target.is_dir());
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
