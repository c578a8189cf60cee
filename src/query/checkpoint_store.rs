//! [`CheckpointStore`] and [`FileCheckpointStore`]: where a turn's
//! [`Checkpoint`] lives between processes, and [`CheckpointedTurn`], a
//! turn that advances its stored checkpoint as its events are handled.

use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};

use super::checkpoint::Checkpoint;
use super::event::QueryEvent;
use super::turn::QueryTurn;
use crate::error::{Error, Result};
use crate::types;

/// Where checkpoints are kept, by key (one turn per key at a time).
///
/// `save` must be durable when it returns `Ok`, and must never leave half a
/// checkpoint behind: after a crash, `load` gives the last saved one or the
/// one before it.
pub trait CheckpointStore {
    /// The checkpoint saved under `key`, if any.
    ///
    /// # Errors
    /// The store could not be read, or holds something that is not a checkpoint.
    fn load(&self, key: &str) -> Result<Option<Checkpoint>>;
    /// Replaces the checkpoint under `key`.
    ///
    /// # Errors
    /// The checkpoint could not be made durable; the previous one stays.
    fn save(&self, key: &str, checkpoint: &Checkpoint) -> Result<()>;
    /// Removes the checkpoint under `key` (no error when there is none).
    ///
    /// # Errors
    /// The store could not remove it.
    fn clear(&self, key: &str) -> Result<()>;
}

impl<S: CheckpointStore + ?Sized> CheckpointStore for Arc<S> {
    fn load(&self, key: &str) -> Result<Option<Checkpoint>> {
        (**self).load(key)
    }
    fn save(&self, key: &str, checkpoint: &Checkpoint) -> Result<()> {
        (**self).save(key, checkpoint)
    }
    fn clear(&self, key: &str) -> Result<()> {
        (**self).clear(key)
    }
}

impl<S: CheckpointStore + ?Sized> CheckpointStore for &S {
    fn load(&self, key: &str) -> Result<Option<Checkpoint>> {
        (**self).load(key)
    }
    fn save(&self, key: &str, checkpoint: &Checkpoint) -> Result<()> {
        (**self).save(key, checkpoint)
    }
    fn clear(&self, key: &str) -> Result<()> {
        (**self).clear(key)
    }
}

/// The longest key a [`FileCheckpointStore`] accepts.
pub const MAX_KEY_LEN: usize = 128;
/// The largest checkpoint file a [`FileCheckpointStore`] reads.
pub const MAX_CHECKPOINT_BYTES: u64 = 4096;

/// A [`CheckpointStore`] of one small file per key in a directory,
/// `<key>.checkpoint`, holding the checkpoint's text form. A save writes a
/// temporary file, syncs it, renames it over the old one and syncs the
/// directory, so a crash leaves the old checkpoint or the new one.
///
/// Keys are 1 to [`MAX_KEY_LEN`] ASCII letters, digits, `-`, `_` and `.`,
/// not starting with `.`; a file over [`MAX_CHECKPOINT_BYTES`] is refused.
///
/// ```
/// use nexus_knowql::query::{Checkpoint, CheckpointStore, FileCheckpointStore};
/// let dir = std::env::temp_dir().join(format!("cp-doc-{}", std::process::id()));
/// let store = FileCheckpointStore::new(&dir)?;
/// let cp: Checkpoint = "q_123:42:1031".parse()?;
/// store.save("job-7", &cp)?;
/// assert_eq!(store.load("job-7")?, Some(cp));
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

    /// The file that holds `key`'s checkpoint.
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
}

impl CheckpointStore for FileCheckpointStore {
    fn load(&self, key: &str) -> Result<Option<Checkpoint>> {
        let path = self.path(key)?;
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("open", &path)(e)),
        };
        let mut text = String::new();
        file.take(MAX_CHECKPOINT_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(io("read", &path))?;
        if text.len() as u64 > MAX_CHECKPOINT_BYTES {
            return Err(io("read", &path)(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("larger than {MAX_CHECKPOINT_BYTES} bytes: not a checkpoint"),
            )));
        }
        text.trim_end().parse().map(Some).map_err(|e: Error| {
            io("read", &path)(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                e.to_string(),
            ))
        })
    }

    fn save(&self, key: &str, checkpoint: &Checkpoint) -> Result<()> {
        let path = self.path(key)?;
        let text = format!("{checkpoint}\n");
        if text.len() as u64 > MAX_CHECKPOINT_BYTES {
            return Err(Error::InvalidRequest(format!(
                "checkpoint of {} bytes is over the limit of {MAX_CHECKPOINT_BYTES}",
                text.len()
            )));
        }
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!(".{key}.{}.{n}.tmp", std::process::id()));
        let written = (|| {
            let mut file = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
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

    fn clear(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("remove", &path)(e)),
        }
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

/// A [`QueryTurn`] that keeps its [`Checkpoint`] in a [`CheckpointStore`]
/// under a key: an event counts as handled when the next one is asked for
/// (or the stream ends), and its checkpoint is saved then, before anything
/// more is read. After a crash, [`CheckpointedTurn::resume`] continues from
/// the store with [`QueryHandle::events_from`](crate::QueryHandle::events_from):
/// every event after the last handled one arrives exactly once, the one in
/// hand at the crash again. [`CheckpointedTurn::finish`] clears the key once
/// the turn has ended.
///
/// ```no_run
/// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
/// use futures::StreamExt;
/// use nexus_knowql::QueryEvent;
/// use nexus_knowql::query::{CheckpointedTurn, FileCheckpointStore};
///
/// let store = FileCheckpointStore::new("/var/lib/app/checkpoints")?;
/// let mut turn = match CheckpointedTurn::resume(&client, store.clone(), "job-7").await? {
///     Some(turn) => turn,
///     None => {
///         let session = client.session(["handbook"]).build()?;
///         let turn = session.ask("Summarize the travel policy").stream().await?;
///         CheckpointedTurn::new(turn, store, "job-7")
///     }
/// };
/// while let Some(event) = turn.next().await {
///     if let QueryEvent::TextDelta { delta } = event? {
///         print!("{delta}");
///     }
/// }
/// let query = turn.finish().await?;
/// # drop(query);
/// # Ok(()) }
/// ```
pub struct CheckpointedTurn<S> {
    turn: QueryTurn,
    store: S,
    key: String,
    /// The checkpoint of the last event handed out, saved when the next
    /// one is asked for.
    unsaved: Option<Checkpoint>,
    saved: Option<Checkpoint>,
    /// The last item handed out was the store's error.
    store_failed: bool,
}

impl<S> fmt::Debug for CheckpointedTurn<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointedTurn")
            .field("key", &self.key)
            .field("saved", &self.saved)
            .field("turn", &self.turn)
            .finish_non_exhaustive()
    }
}

impl<S: CheckpointStore + Unpin> CheckpointedTurn<S> {
    /// Keeps `turn`'s checkpoint under `key` in `store` from now on.
    pub fn new(turn: QueryTurn, store: S, key: impl Into<String>) -> Self {
        CheckpointedTurn {
            turn,
            store,
            key: key.into(),
            unsaved: None,
            saved: None,
            store_failed: false,
        }
    }

    /// Continues the turn whose checkpoint is stored under `key`: attaches
    /// to it and reads the events after the checkpoint (verified as by
    /// [`QueryHandle::events_from`](crate::QueryHandle::events_from)).
    /// `Ok(None)` when no checkpoint is stored.
    ///
    /// # Errors
    /// The store's errors; those of attaching to the turn and of
    /// `events_from`.
    pub async fn resume(
        client: &crate::Client,
        store: S,
        key: impl Into<String>,
    ) -> Result<Option<Self>> {
        let key = key.into();
        let Some(checkpoint) = store.load(&key)? else {
            return Ok(None);
        };
        let handle = client.queries().attach(&checkpoint.query_id).await?;
        let turn = handle.events_from(&checkpoint).await?;
        let mut turn = CheckpointedTurn::new(turn, store, key);
        turn.saved = Some(checkpoint);
        Ok(Some(turn))
    }

    /// The turn, with what it accumulated (after the checkpoint, for a
    /// resumed one).
    pub fn turn(&self) -> &QueryTurn {
        &self.turn
    }

    /// The checkpoint last saved.
    pub fn saved(&self) -> Option<&Checkpoint> {
        self.saved.as_ref()
    }

    /// Saves the checkpoint of the last event handed out, if not saved yet.
    fn save_pending(&mut self) -> Result<()> {
        if let Some(cp) = self.unsaved.take() {
            if let Err(e) = self.store.save(&self.key, &cp) {
                tracing::warn!(key = self.key, error = %e, "could not save the turn's checkpoint");
                self.unsaved = Some(cp);
                self.store_failed = true;
                return Err(e);
            }
            self.saved = Some(cp);
        }
        Ok(())
    }

    /// Stops the turn on the server, as [`QueryTurn::cancel`], and clears
    /// the key: a cancelled turn has nothing left to resume.
    ///
    /// # Errors
    /// Those of [`QueryTurn::cancel`] (the key stays then); the store's.
    pub async fn cancel(self) -> Result<types::Query> {
        let CheckpointedTurn {
            turn, store, key, ..
        } = self;
        let query = turn.cancel().await?;
        store.clear(&key)?;
        Ok(query)
    }

    /// Reads (and checkpoints) the rest of the turn and returns the final
    /// Query, as [`QueryTurn::finish`]; clears the key once the turn has
    /// ended, completed or not.
    ///
    /// # Errors
    /// The store's errors (the checkpoint stays at the last one saved);
    /// those of [`QueryTurn::finish`].
    pub async fn finish(mut self) -> Result<types::Query> {
        let mut first_error = None;
        while let Some(item) = self.next().await {
            match item {
                Err(e) if self.store_failed => return Err(e),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
                Ok(_) => {}
            }
        }
        let result = match first_error {
            Some(e) => Err(e),
            None => self.turn.finish().await,
        };
        if matches!(
            result,
            Ok(_) | Err(Error::TurnFailed { .. } | Error::TurnCancelled { .. })
        ) {
            self.store.clear(&self.key)?;
        }
        result
    }
}

impl<S: CheckpointStore + Unpin> Stream for CheckpointedTurn<S> {
    type Item = Result<QueryEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Err(e) = this.save_pending() {
            return Poll::Ready(Some(Err(e)));
        }
        this.store_failed = false;
        match futures::ready!(this.turn.poll_next_unpin(cx)) {
            Some(item) => {
                if let Some(cp) = this.turn.checkpoint()
                    && this.saved.as_ref() != Some(&cp)
                {
                    this.unsaved = Some(cp);
                }
                Poll::Ready(Some(item))
            }
            None => match this.save_pending() {
                Err(e) => Poll::Ready(Some(Err(e))),
                Ok(()) => Poll::Ready(None),
            },
        }
    }
}
