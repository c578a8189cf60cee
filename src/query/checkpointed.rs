//! [`CheckpointedTurn`]: a job's turn that keeps its record in a
//! [`CheckpointStore`] as its events are handled, started at most once and
//! resumed only from verified progress.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};

use super::builder::TurnBuilder;
use super::checkpoint::Checkpoint;
use super::checkpoint_record::{CheckpointRecord, FailedTurn};
use super::checkpoint_start::{StartProtocol, find_started, intent, request_fingerprint};
use super::checkpoint_store::{CheckpointStore, KeyLock};
use super::event::QueryEvent;
use super::turn::QueryTurn;
use super::view::TurnView;
use crate::error::CheckpointError;
use crate::error::{Error, Result};
use crate::types;

/// A turn that keeps its job's record in a [`CheckpointStore`] under a
/// key: an adapter over any [`TurnView`] (a [`QueryTurn`] by default, or
/// another adapter), and a view again, so that it stacks with the others
/// (a typed, checkpointed turn is `typed::TypedTurn<T, CheckpointedTurn<S>>`).
///
/// An event counts as handled when the next one is asked for (or the
/// stream ends), and its [`Checkpoint`] is saved then, before anything more
/// is read. After a crash, [`CheckpointedTurn::resume`] continues from the
/// store with [`QueryHandle::resume_from`](crate::QueryHandle::resume_from):
/// the answer must begin with exactly the text the checkpoint proves, and
/// every event after the last handled one arrives once more at most (the
/// one in hand at the crash again).
///
/// A verification failure is never progress: on
/// [`Error::AnswerMismatch`], [`Error::ReplayGap`] or
/// [`Error::TurnTooLarge`] the key records the failure instead of a
/// position, and a later `resume` is [`CheckpointError::Failed`].
/// After [`CheckpointedTurn::finish`] the key keeps the final checkpoint,
/// so that resuming a finished job reads nothing more: clear it once the
/// job's result was handed on.
///
/// [`CheckpointedTurn::start_or_resume`] also makes a crash between
/// `POST /query` and the first checkpoint safe: it records its intent
/// before posting, and a restart finds the turn the job started instead of
/// starting a second one.
///
/// ```no_run
/// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
/// use futures::StreamExt;
/// use nexus_knowql::QueryEvent;
/// use nexus_knowql::CheckpointedTurn;
/// use nexus_knowql::query::FileCheckpointStore;
///
/// let store = FileCheckpointStore::new("/var/lib/app/checkpoints")?;
/// let session = client.session(["handbook"]).build()?;
/// let ask = session.ask("Summarize the travel policy");
/// let mut turn = CheckpointedTurn::start_or_resume(&client, store, "job-7", ask).await?;
/// while let Some(event) = turn.next().await {
///     if let QueryEvent::TextDelta { delta } = event? {
///         print!("{delta}");
///     }
/// }
/// let query = turn.finish().await?;
/// # drop(query);
/// # Ok(()) }
/// ```
pub struct CheckpointedTurn<S, V = QueryTurn> {
    inner: V,
    store: S,
    key: String,
    /// The checkpoint of the last event handed out, saved when the next
    /// one is asked for.
    unsaved: Option<Checkpoint>,
    saved: Option<Checkpoint>,
    /// The checkpoint this turn continues (none for a turn started here).
    resumed_from: Option<Checkpoint>,
    /// The last item handed out was the store's error.
    store_failed: bool,
    /// The turn failed verification: nothing more is saved as progress.
    failed: bool,
    /// The key, held by this process while the job runs (none for a turn
    /// made with [`CheckpointedTurn::new`]).
    lock: Option<KeyLock>,
}

impl<S, V: TurnView> fmt::Debug for CheckpointedTurn<S, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointedTurn")
            .field("key", &self.key)
            .field("saved", &self.saved)
            .field("failed", &self.failed)
            .field("turn", self.inner.turn())
            .finish_non_exhaustive()
    }
}

/// A resumed job, or the store and the key's lock back when there was
/// nothing to resume.
enum Resumed<S> {
    Turn(Box<CheckpointedTurn<S>>),
    Nothing(S, KeyLock),
}

/// Saves under `key` that the turn (`e`'s, else `query_id`) failed
/// verification with `e`. A store that cannot is logged: the error itself
/// is what the caller gets.
fn save_failure<S: CheckpointStore>(store: &S, key: &str, e: &Error, query_id: Option<&str>) {
    let query_id = e.query_id().or(query_id).unwrap_or("unknown");
    let record = CheckpointRecord::Failed(FailedTurn::new(query_id, e));
    if let Err(store_error) = store.save(key, &record) {
        tracing::warn!(key, error = %store_error, "could not record the turn's failure");
    }
}

/// Whether `e` says the turn's answer cannot be trusted (rather than that
/// reading it stopped for now).
fn is_verification_failure(e: &Error) -> bool {
    matches!(
        e,
        Error::AnswerMismatch { .. }
            | Error::ReplayGap { .. }
            | Error::TurnTooLarge { .. }
            | Error::TurnMismatch(_)
    )
}

impl<S: CheckpointStore + Unpin, V: TurnView> CheckpointedTurn<S, V> {
    /// Keeps the checkpoint of the turn `inner` reads under `key` in
    /// `store` from now on.
    pub fn new(inner: V, store: S, key: impl Into<String>) -> Self {
        CheckpointedTurn {
            inner,
            store,
            key: key.into(),
            unsaved: None,
            saved: None,
            resumed_from: None,
            store_failed: false,
            failed: false,
            lock: None,
        }
    }
}

impl<S: CheckpointStore + Unpin> CheckpointedTurn<S> {
    /// Continues the job stored under `key`: attaches to its turn and reads
    /// the events after its checkpoint (verified as by
    /// [`QueryHandle::resume_from`](crate::QueryHandle::resume_from)).
    /// `Ok(None)` when nothing is stored. When the job recorded that it
    /// was starting a turn and no session shows it once the admission
    /// horizon has passed, the [`StartProtocol`] decides: an error by
    /// default (at most once), or `Ok(None)` under
    /// [`IfNotFound::AtLeastOnce`](super::IfNotFound), after which
    /// [`CheckpointedTurn::start_or_resume_with`] posts it again.
    ///
    /// The key is taken for this process first ([`CheckpointStore::lock`])
    /// and held while the returned turn lives.
    ///
    /// # Errors
    /// [`CheckpointError::Busy`] when another process runs the job now;
    /// [`CheckpointError::Failed`] when the job's turn failed verification;
    /// [`CheckpointError::Unreadable`] for a record that cannot be used;
    /// [`CheckpointError::AmbiguousStart`]; [`CheckpointError::NotStarted`]
    /// when the turn the job was starting was not found (at most once);
    /// the store's other errors; those of attaching to the turn and of
    /// `resume_from`.
    pub async fn resume(
        client: &crate::Client,
        store: S,
        key: impl Into<String>,
    ) -> Result<Option<Self>> {
        Self::resume_with(client, store, key, &StartProtocol::default()).await
    }

    /// [`CheckpointedTurn::resume`] with `protocol` deciding whether a turn
    /// the job was starting was started (its admission horizon and what to
    /// do when it was not found).
    ///
    /// # Errors
    /// Those of [`CheckpointedTurn::resume`].
    pub async fn resume_with(
        client: &crate::Client,
        store: S,
        key: impl Into<String>,
        protocol: &StartProtocol,
    ) -> Result<Option<Self>> {
        let key = key.into();
        let lock = store.lock(&key)?;
        Ok(
            match Self::resume_or_give_back(client, store, key, lock, protocol).await? {
                Resumed::Turn(turn) => Some(*turn),
                Resumed::Nothing(..) => None,
            },
        )
    }

    async fn resume_or_give_back(
        client: &crate::Client,
        store: S,
        key: String,
        lock: KeyLock,
        protocol: &StartProtocol,
    ) -> Result<Resumed<S>> {
        let checkpoint = match store.load(&key)? {
            None => return Ok(Resumed::Nothing(store, lock)),
            Some(CheckpointRecord::At(cp)) => cp,
            Some(CheckpointRecord::Failed(failed)) => {
                return Err(Error::Checkpoint(CheckpointError::Failed {
                    key,
                    query_id: failed.query_id,
                    reason: failed.reason,
                }));
            }
            Some(CheckpointRecord::Starting(intent)) => {
                match find_started(client, &key, &intent, protocol).await? {
                    None => return Ok(Resumed::Nothing(store, lock)),
                    Some(query_id) => {
                        tracing::info!(key, query_id, "found the turn this job started");
                        let cp = Checkpoint::at_start(query_id);
                        store.save(&key, &CheckpointRecord::At(cp.clone()))?;
                        cp
                    }
                }
            }
        };
        let handle = client.queries().attach(&checkpoint.query_id).await?;
        let turn = match handle.resume_from(&checkpoint).await {
            Ok(turn) => turn,
            Err(e) => {
                if is_verification_failure(&e) {
                    save_failure(&store, &key, &e, Some(&checkpoint.query_id));
                }
                return Err(e);
            }
        };
        let mut turn = CheckpointedTurn::new(turn, store, key);
        turn.saved = Some(checkpoint.clone());
        turn.resumed_from = Some(checkpoint);
        turn.lock = Some(lock);
        Ok(Resumed::Turn(Box::new(turn)))
    }

    /// The job under `key`: resumed as by [`CheckpointedTurn::resume`], or
    /// started with `ask` in a new session. Before `POST /query` it records
    /// its intent (the fingerprints of the request, the time and the
    /// server's newest session), so that a process that dies before the
    /// first checkpoint is followed by one that finds the turn already
    /// started (the first turn of a session created since whose ask, scope,
    /// system prompt and workflow are the request's) instead of starting
    /// another. The default [`StartProtocol`] looks for it until 10 s after
    /// the intent and, when it is not found, posts nothing (at most once).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when `ask` continues an existing session
    /// (its turn could not be told from the session's others) or the key
    /// was started with another request; those of
    /// [`CheckpointedTurn::resume`] and [`TurnBuilder::stream`]; the store's.
    pub async fn start_or_resume(
        client: &crate::Client,
        store: S,
        key: impl Into<String>,
        ask: TurnBuilder,
    ) -> Result<Self> {
        Self::start_or_resume_with(client, store, key, ask, &StartProtocol::default()).await
    }

    /// [`CheckpointedTurn::start_or_resume`] with `protocol` deciding
    /// whether a turn the job was starting was started: how long after the
    /// intent to look for it, and, when it is not found, whether to fail
    /// ([`IfNotFound::AtMostOnce`](super::IfNotFound)) or post it again
    /// ([`IfNotFound::AtLeastOnce`](super::IfNotFound)).
    ///
    /// # Errors
    /// Those of [`CheckpointedTurn::start_or_resume`].
    pub async fn start_or_resume_with(
        client: &crate::Client,
        store: S,
        key: impl Into<String>,
        ask: TurnBuilder,
        protocol: &StartProtocol,
    ) -> Result<Self> {
        let key = key.into();
        if !ask.starts_session() {
            return Err(Error::InvalidRequest(
                "a checkpointed job starts its turn in a new session".to_owned(),
            ));
        }
        let lock = store.lock(&key)?;
        let request = ask.new_session_request();
        if let Some(CheckpointRecord::Starting(recorded)) = store.load(&key)?
            && recorded.request != request_fingerprint(&request)?
        {
            return Err(Error::InvalidRequest(format!(
                "the job under key {key:?} was started with another request; clear the key first"
            )));
        }
        let resumed = Self::resume_or_give_back(client, store, key.clone(), lock, protocol);
        let (store, lock) = match resumed.await? {
            Resumed::Turn(turn) => return Ok(*turn),
            Resumed::Nothing(store, lock) => (store, lock),
        };
        let intent = intent(ask.client(), &request).await?;
        store.save(&key, &CheckpointRecord::Starting(intent))?;
        let turn = ask.stream().await?;
        let mut turn = CheckpointedTurn::new(turn, store, key);
        turn.lock = Some(lock);
        Ok(turn)
    }
}

impl<S: CheckpointStore + Unpin, V: TurnView> CheckpointedTurn<S, V> {
    /// The turn, with what it accumulated (after the checkpoint, for a
    /// resumed one).
    pub fn turn(&self) -> &QueryTurn {
        self.inner.turn()
    }

    /// The view this adapter reads, to go on reading without saving
    /// checkpoints (one handed out but not saved yet stays unsaved).
    pub fn into_inner(self) -> V {
        self.inner
    }

    /// The checkpoint last saved: the last verified progress (none before
    /// the first).
    pub fn saved(&self) -> Option<&Checkpoint> {
        self.saved.as_ref()
    }

    /// The checkpoint this turn continues: what a positioned sink must be
    /// cut back to before writing (`text_len` bytes; `None`: nothing was
    /// delivered, write from the start).
    pub fn resumed_from(&self) -> Option<&Checkpoint> {
        self.resumed_from.as_ref()
    }

    /// Saves the checkpoint of the last event handed out, if not saved yet.
    fn save_pending(&mut self) -> Result<()> {
        if let Some(cp) = self.unsaved.take() {
            let record = CheckpointRecord::At(cp);
            if let Err(e) = self.store.save(&self.key, &record) {
                tracing::warn!(key = self.key, error = %e, "could not save the turn's checkpoint");
                if let CheckpointRecord::At(cp) = record {
                    self.unsaved = Some(cp);
                }
                self.store_failed = true;
                return Err(e);
            }
            if let CheckpointRecord::At(cp) = record {
                self.saved = Some(cp);
            }
        }
        Ok(())
    }

    /// Records that the turn failed verification with `e`, in place of a
    /// resumable position.
    fn record_failure(&mut self, e: &Error) {
        self.failed = true;
        self.unsaved = None;
        let query_id = self.inner.turn().query_id().map(str::to_owned);
        save_failure(&self.store, &self.key, e, query_id.as_deref());
    }

    /// Stops the turn on the server, as [`QueryTurn::cancel`], and clears
    /// the key: a cancelled turn has nothing left to resume.
    ///
    /// # Errors
    /// Those of [`QueryTurn::cancel`] (the key stays then); the store's.
    pub async fn cancel(self) -> Result<types::Query> {
        let CheckpointedTurn {
            inner,
            store,
            key,
            lock,
            ..
        } = self;
        let query = inner.into_turn().cancel().await?;
        store.clear(&key)?;
        // The key is given back only once it was cleared; clearing it again
        // once free lets the store remove what held it (a lock file).
        drop(lock);
        store.clear(&key)?;
        Ok(query)
    }

    /// Reads (and checkpoints) the rest of the turn and returns the final
    /// Query, as [`QueryTurn::finish`] (through the views below this one).
    ///
    /// The key keeps the turn's last checkpoint: a process that dies after
    /// `finish` and resumes the job reads nothing more and gets the same
    /// outcome, instead of starting the job's turn again. Clear the key
    /// ([`CheckpointStore::clear`]) once the job's result was handed on.
    ///
    /// # Errors
    /// The store's errors (the checkpoint stays at the last one saved);
    /// those of [`QueryTurn::finish`] (after a verification failure, the
    /// key keeps the failure).
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
        let query_id = self.inner.turn().query_id().map(str::to_owned);
        let CheckpointedTurn {
            inner,
            store,
            key,
            failed,
            lock,
            ..
        } = self;
        let result = match first_error {
            Some(e) => Err(e),
            None => inner.finish().await,
        };
        match &result {
            Err(e) if is_verification_failure(e) && !failed => {
                save_failure(&store, &key, e, query_id.as_deref());
            }
            _ => {}
        }
        // The key is given back once its last record is written.
        drop(lock);
        result
    }
}

impl<S: CheckpointStore + Unpin + Send + Sync, V: TurnView> TurnView for CheckpointedTurn<S, V> {
    fn turn(&self) -> &QueryTurn {
        self.inner.turn()
    }

    fn into_turn(self) -> QueryTurn {
        self.inner.into_turn()
    }

    fn finish(self) -> impl std::future::Future<Output = Result<types::Query>> + Send {
        CheckpointedTurn::finish(self)
    }
}

impl<S: CheckpointStore + Unpin, V: TurnView> Stream for CheckpointedTurn<S, V> {
    type Item = Result<QueryEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Err(e) = this.save_pending() {
            return Poll::Ready(Some(Err(e)));
        }
        this.store_failed = false;
        match futures::ready!(this.inner.poll_next_unpin(cx)) {
            Some(Err(e)) => {
                if is_verification_failure(&e) && !this.failed {
                    this.record_failure(&e);
                }
                Poll::Ready(Some(Err(e)))
            }
            Some(Ok(event)) => {
                if !this.failed
                    && let Some(cp) = this.inner.turn().checkpoint()
                    && this.saved.as_ref() != Some(&cp)
                {
                    this.unsaved = Some(cp);
                }
                Poll::Ready(Some(Ok(event)))
            }
            None => match this.save_pending() {
                Err(e) => Poll::Ready(Some(Err(e))),
                Ok(()) => Poll::Ready(None),
            },
        }
    }
}
