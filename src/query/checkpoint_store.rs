//! [`CheckpointStore`] and [`FileCheckpointStore`]: where a job's
//! [`CheckpointRecord`] lives between processes.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::checkpoint_record::CheckpointRecord;
use crate::error::CheckpointError;
use crate::error::{Error, Result};

/// Where jobs' records are kept, by key (one job, so one turn, per key at
/// a time).
///
/// `save` must be durable when it returns `Ok`, and must never leave half a
/// record behind: after a crash, `load` gives the last saved one or the
/// one before it.
pub trait CheckpointStore {
    /// The record saved under `key`, if any.
    ///
    /// # Errors
    /// The store could not be read; [`Error::Checkpoint`] when it holds
    /// something that is not a usable record.
    fn load(&self, key: &str) -> Result<Option<CheckpointRecord>>;
    /// Replaces the record under `key`.
    ///
    /// # Errors
    /// The record could not be made durable; the previous one stays.
    fn save(&self, key: &str, record: &CheckpointRecord) -> Result<()>;
    /// Removes the record under `key` (no error when there is none).
    ///
    /// # Errors
    /// The store could not remove it.
    fn clear(&self, key: &str) -> Result<()>;
    /// Takes `key` for this process until the returned [`KeyLock`] is
    /// dropped (or the process ends): one job per key at a time. The
    /// default enforces nothing; [`FileCheckpointStore`] locks a file.
    ///
    /// # Errors
    /// [`CheckpointError::Busy`] when another process holds the key; the
    /// store's errors.
    fn lock(&self, key: &str) -> Result<KeyLock> {
        let _ = key;
        Ok(KeyLock { _file: None })
    }
}

/// A key taken by this process (see [`CheckpointStore::lock`]); dropping it
/// gives the key back, and so does the process's end, even by `kill -9`.
#[derive(Debug)]
pub struct KeyLock {
    _file: Option<std::fs::File>,
}

/// A store behind a pointer is the store it points to.
macro_rules! forward_store {
    ($pointer:ty) => {
        impl<S: CheckpointStore + ?Sized> CheckpointStore for $pointer {
            fn load(&self, key: &str) -> Result<Option<CheckpointRecord>> {
                (**self).load(key)
            }
            fn save(&self, key: &str, record: &CheckpointRecord) -> Result<()> {
                (**self).save(key, record)
            }
            fn clear(&self, key: &str) -> Result<()> {
                (**self).clear(key)
            }
            fn lock(&self, key: &str) -> Result<KeyLock> {
                (**self).lock(key)
            }
        }
    };
}

forward_store!(Arc<S>);
forward_store!(&S);

/// The longest key a [`FileCheckpointStore`] accepts.
///
/// A job takes its key with [`CheckpointStore::lock`] before it reads or
/// writes anything under it, so the record and temporary files of a key
/// are only ever touched by the one process that holds it.
pub const MAX_KEY_LEN: usize = 128;
/// The largest checkpoint file a [`FileCheckpointStore`] reads.
pub const MAX_CHECKPOINT_BYTES: u64 = 4096;

/// What every file of a [`FileCheckpointStore`] begins with (then the key
/// and the record).
const FILE_TAG: &str = "nexus-checkpoint 1";

/// A [`CheckpointStore`] of one small file per key in a directory,
/// `<key>.checkpoint`, holding one line: a tag, the key and the record's
/// text form. A save writes a temporary file, syncs it, renames it over the
/// old one and syncs the directory, so a crash leaves the old record or the
/// new one; the temporary files a crash leaves are removed by the next
/// `load`, `save` or `clear` of their key.
///
/// Keys are 1 to [`MAX_KEY_LEN`] ASCII letters, digits, `-`, `_` and `.`,
/// not starting with `.`. A file that is over [`MAX_CHECKPOINT_BYTES`], not
/// a record, written for another key, or not a regular file (a symbolic
/// link is never followed) is [`CheckpointError::Unreadable`], which never
/// repeats the file's content: remove the file to start the job afresh.
///
/// ```
/// use nexus_knowql::query::{Checkpoint, CheckpointRecord, CheckpointStore, FileCheckpointStore};
/// let dir = std::env::temp_dir().join(format!("cp-doc-{}", std::process::id()));
/// let store = FileCheckpointStore::new(&dir)?;
/// let at = CheckpointRecord::At(Checkpoint::after_text("q_123", 42, "Travel"));
/// store.save("job-7", &at)?;
/// assert_eq!(store.load("job-7")?, Some(at));
/// store.clear("job-7")?;
/// assert_eq!(store.load("job-7")?, None);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct FileCheckpointStore {
    dir: PathBuf,
}

/// Distinguishes the temporary files of saves in flight.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

const OPERATION: &str = "checkpoint_store";

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error + use<> {
    let path = path.to_owned();
    move |source| Error::Io {
        operation: OPERATION,
        action,
        path,
        source,
    }
}

impl FileCheckpointStore {
    /// A store in `dir`, created if missing.
    ///
    /// # Errors
    /// [`Error::Io`] when the directory cannot be created.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        Ok(FileCheckpointStore { dir })
    }

    /// The file that holds `key`'s record.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a key outside the allowed form.
    pub fn path(&self, key: &str) -> Result<PathBuf> {
        let ok = !key.is_empty()
            && key.len() <= MAX_KEY_LEN
            && !key.starts_with('.')
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !ok {
            return Err(Error::InvalidRequest(format!(
                "checkpoint key {:?}: use 1 to {MAX_KEY_LEN} letters, digits, '-', '_' or '.', not starting with '.'",
                key.chars().take(MAX_KEY_LEN + 1).collect::<String>()
            )));
        }
        Ok(self.dir.join(format!("{key}.checkpoint")))
    }

    /// Removes the temporary files that saves of `key` left behind (a
    /// process that died mid-save). One job per key at a time: none of them
    /// is in flight.
    fn remove_leftovers(&self, key: &str) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let prefix = format!(".{key}.");
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let is_ours = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix(".tmp"))
                .and_then(|rest| rest.split_once('.'))
                .is_some_and(|(pid, n)| {
                    [pid, n]
                        .iter()
                        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                });
            if is_ours {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// Reads the regular file at `path` (never through a symbolic link), up to
/// [`MAX_CHECKPOINT_BYTES`]; `Ok(None)` when there is none.
fn read_record_file(key: &str, path: &Path) -> Result<Option<String>> {
    let unreadable = |problem| {
        Error::Checkpoint(CheckpointError::Unreadable {
            key: key.to_owned(),
            path: path.to_owned(),
            problem,
        })
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("open", path)(e)),
    };
    if meta.file_type().is_symlink() {
        return Err(unreadable("a symbolic link, which is not followed"));
    }
    if !meta.is_file() {
        return Err(unreadable("not a regular file"));
    }
    if meta.len() > MAX_CHECKPOINT_BYTES {
        return Err(unreadable("larger than a checkpoint record can be"));
    }
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("open", path)(e)),
    };
    #[cfg(unix)]
    {
        // The file opened is the one looked at, not a link put in its place.
        use std::os::unix::fs::MetadataExt;
        let opened = file.metadata().map_err(io("read", path))?;
        if (opened.dev(), opened.ino()) != (meta.dev(), meta.ino()) {
            return Err(unreadable("replaced while being opened"));
        }
    }
    let mut bytes = Vec::new();
    file.take(MAX_CHECKPOINT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io("read", path))?;
    if bytes.len() as u64 > MAX_CHECKPOINT_BYTES {
        return Err(unreadable("larger than a checkpoint record can be"));
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| unreadable("not a checkpoint record"))
}

impl CheckpointStore for FileCheckpointStore {
    fn load(&self, key: &str) -> Result<Option<CheckpointRecord>> {
        let path = self.path(key)?;
        self.remove_leftovers(key);
        let Some(text) = read_record_file(key, &path)? else {
            return Ok(None);
        };
        let unreadable = |problem| {
            Error::Checkpoint(CheckpointError::Unreadable {
                key: key.to_owned(),
                path: path.clone(),
                problem,
            })
        };
        let line = text
            .strip_suffix('\n')
            .filter(|l| !l.contains('\n'))
            .ok_or_else(|| unreadable("not a checkpoint record"))?;
        let rest = line
            .strip_prefix(FILE_TAG)
            .and_then(|r| r.strip_prefix(' '))
            .ok_or_else(|| unreadable("not a checkpoint record"))?;
        let (owner, record) = rest
            .split_once(' ')
            .ok_or_else(|| unreadable("not a checkpoint record"))?;
        if owner != key {
            return Err(unreadable("written for another key"));
        }
        record
            .parse()
            .map(Some)
            .map_err(|_| unreadable("not a checkpoint record"))
    }

    fn save(&self, key: &str, record: &CheckpointRecord) -> Result<()> {
        let path = self.path(key)?;
        let text = format!("{FILE_TAG} {key} {record}\n");
        if text.len() as u64 > MAX_CHECKPOINT_BYTES || text.matches('\n').count() != 1 {
            return Err(Error::InvalidRequest(format!(
                "a checkpoint record of {} bytes is not one line under the limit of {MAX_CHECKPOINT_BYTES}",
                text.len()
            )));
        }
        self.remove_leftovers(key);
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!(".{key}.{}.{n}.tmp", std::process::id()));
        let written = (|| {
            let mut file = std::fs::File::create_new(&tmp).map_err(io("create", &tmp))?;
            file.write_all(text.as_bytes()).map_err(io("write", &tmp))?;
            file.sync_all().map_err(io("sync", &tmp))?;
            std::fs::rename(&tmp, &path).map_err(io("rename", &path))
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        sync_dir(&self.dir)
    }

    /// Locks `<key>.lock` in the store's directory (an exclusive lock of
    /// the operating system, released when the process ends however it
    /// ends).
    fn lock(&self, key: &str) -> Result<KeyLock> {
        self.path(key)?;
        let path = self.lock_path(key);
        let busy = || {
            Error::Checkpoint(CheckpointError::Busy {
                key: key.to_owned(),
                lock: path.clone(),
            })
        };
        // A lock taken on a file that `clear` removed meanwhile is no lock:
        // take it again on the file the path names now.
        for _ in 0..8 {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(io("open", &path))?;
            match file.try_lock() {
                Ok(()) if still_at(&file, &path) => return Ok(KeyLock { _file: Some(file) }),
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => return Err(busy()),
                Err(std::fs::TryLockError::Error(e)) => return Err(io("lock", &path)(e)),
            }
        }
        Err(busy())
    }

    fn clear(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        self.remove_leftovers(key);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("remove", &path)(e)),
        }
        self.remove_free_lock(key);
        sync_dir(&self.dir)
    }
}

impl FileCheckpointStore {
    fn lock_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.lock"))
    }

    /// Removes the key's lock file when no process holds it (taking it
    /// first, so that no one holds a lock on a file that is gone); a held
    /// one stays.
    fn remove_free_lock(&self, key: &str) {
        let path = self.lock_path(key);
        let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) else {
            return;
        };
        if file.try_lock().is_ok() && still_at(&file, &path) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Whether `path` still names the file `file` has open.
fn still_at(file: &std::fs::File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), std::fs::symlink_metadata(path)) {
            (Ok(open), Ok(named)) => (open.dev(), open.ino()) == (named.dev(), named.ino()),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (file, path);
        true
    }
}

/// Makes a rename or removal in `dir` durable (where the platform lets a
/// directory be opened; elsewhere the rename is as durable as it gets).
fn sync_dir(dir: &Path) -> Result<()> {
    match std::fs::File::open(dir) {
        Ok(d) => d.sync_all().map_err(io("sync", dir)),
        Err(_) => Ok(()),
    }
}
