//! Scratch directories: where a server without a data directory keeps its
//! state, private (0700) under the system's temporary directory.
//!
//! A scratch directory becomes visible under its final name
//! (`nexus-local-` and 16 hex digits) only once its lock is held: it is
//! made under a name of its own (`.nexus-local-new-…`), locked, then
//! renamed (the lock belongs to the open file and moves with it). So a
//! starting server, which removes final-named directories whose lock is
//! free (left by servers that crashed), can never take a live one for
//! stale.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::{Inner, Store, new_secret_name};
use crate::local::db::{self, Db, Durability, QueryLimits};

/// The name prefix of scratch directories under the temporary directory.
const SCRATCH_PREFIX: &str = "nexus-local-";
/// The name prefix of a scratch directory not yet locked and in place.
const NEW_PREFIX: &str = ".nexus-local-new-";
/// Age past which a directory that never got in place is removed (its
/// server died while making it).
const NEW_STALE_AFTER: Duration = Duration::from_secs(3600);

impl Store {
    /// A store in a fresh private scratch directory (mode 0700), for a
    /// server without a data directory. Scratch directories left by
    /// servers that crashed are removed first.
    pub(crate) fn scratch(limits: QueryLimits) -> std::io::Result<Self> {
        let tmp = std::env::temp_dir();
        remove_stale_scratch(&tmp);
        let name = new_secret_name();
        let making = tmp.join(format!("{NEW_PREFIX}{name}"));
        let files = tmp.join(format!("{SCRATCH_PREFIX}{name}"));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(&making)?;
        let in_place = (|| {
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(making.join(super::LOCK_FILE))?;
            #[cfg(test)]
            tests::pause_before_locking();
            lock.try_lock().map_err(|e| match e {
                std::fs::TryLockError::WouldBlock => {
                    std::io::Error::other("a new scratch directory is locked")
                }
                std::fs::TryLockError::Error(e) => e,
            })?;
            std::fs::rename(&making, &files)?;
            Ok::<_, std::io::Error>(lock)
        })();
        let lock = match in_place {
            Ok(lock) => lock,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&making);
                return Err(e);
            }
        };
        let (db, _) = match Db::open(&files.join(db::DB_FILE), Durability::Scratch, limits) {
            Ok(v) => v,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&files);
                return Err(e);
            }
        };
        Ok(Store {
            inner: Mutex::new(Inner::default()),
            db,
            files,
            private_files: true,
            saved_tokens: Mutex::default(),
            turn_bytes: std::sync::Arc::default(),
            _lock: lock,
        })
    }
}

/// Whether `rest` is 16 hex digits (a scratch directory's own name).
fn is_secret_name(rest: &str) -> bool {
    rest.len() == 16 && rest.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Removes scratch directories whose server is gone: in place with their
/// lock free, or never put in place and older than `NEW_STALE_AFTER`.
pub(super) fn remove_stale_scratch(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let dir: PathBuf = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        if !meta.is_dir() {
            continue;
        }
        let stale = if let Some(rest) = name.strip_prefix(SCRATCH_PREFIX) {
            // In place, so locked before it became visible: free means
            // its server is gone.
            is_secret_name(rest)
                && std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join(super::LOCK_FILE))
                    .is_ok_and(|lock| lock.try_lock().is_ok())
        } else if let Some(rest) = name.strip_prefix(NEW_PREFIX) {
            is_secret_name(rest)
                && meta
                    .modified()
                    .ok()
                    .and_then(|m| m.elapsed().ok())
                    .is_some_and(|age| age > NEW_STALE_AFTER)
        } else {
            false
        };
        if stale {
            tracing::info!(dir = %dir.display(), "removing the scratch directory of a server that stopped");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// When set, a scratch store being made pauses once its lock file
    /// exists, before it takes the lock.
    static PAUSE: AtomicBool = AtomicBool::new(false);

    pub(super) fn pause_before_locking() {
        if PAUSE.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Catches a scratch directory visible under its final name before
    /// it is locked (made in place): a server starting meanwhile finds its
    /// lock file free, removes it as stale, and the first server's
    /// database cannot be opened. Here another start sweeps while the
    /// first waits between making its lock file and locking it.
    #[test]
    fn a_start_never_removes_a_scratch_directory_being_made() {
        PAUSE.store(true, Ordering::SeqCst);
        let making = std::thread::spawn(|| {
            Store::scratch(QueryLimits {
                count: 10,
                bytes: 1 << 20,
            })
        });
        let tmp = std::env::temp_dir();
        let sweeper = std::thread::spawn(move || {
            for _ in 0..30 {
                remove_stale_scratch(&tmp);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        sweeper.join().unwrap();
        PAUSE.store(false, Ordering::SeqCst);
        let store = making.join().unwrap().expect("the scratch store opens");
        assert!(store.files.join(db::DB_FILE).exists());
        let req = serde_json::from_value(serde_json::json!({"slug": "s", "name": "S"})).unwrap();
        store.change().create_context(req).unwrap();
        let dir = store.files.clone();
        drop(store);
        assert!(!dir.exists(), "a scratch directory outlived its store");
    }
}
