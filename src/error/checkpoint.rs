//! [`CheckpointError`]: why a job's stored checkpoint record cannot be
//! used, and the way out.

use std::path::PathBuf;

/// Why a job's stored record cannot be used. Each names the way out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The stored file is not a usable record: corrupt, truncated, of
    /// another format, written for another key, too large, or a symbolic
    /// link (never followed). Its content is never repeated. Way out:
    /// remove the file (or [`clear`](crate::query::CheckpointStore::clear) the
    /// key) and start the job afresh, after looking for the turn it may
    /// have started.
    #[error(
        "checkpoint {key:?} at {}: {problem}; remove it (or clear the key) to start the job afresh",
        path.display()
    )]
    Unreadable {
        /// The job's key.
        key: String,
        /// Where the record is kept.
        path: PathBuf,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The job's turn failed verification before: what it delivered cannot
    /// be trusted, so there is no position to resume from. Way out: discard
    /// the job's output, [`clear`](crate::query::CheckpointStore::clear) the key
    /// and start the job afresh.
    #[error(
        "checkpoint {key:?}: query {query_id} failed verification ({reason}); \
         discard its output and clear the key to start the job afresh"
    )]
    Failed {
        /// The job's key.
        key: String,
        /// The turn that failed.
        query_id: String,
        /// Why, as recorded.
        reason: String,
    },
    /// The job recorded that it was starting a turn, and more than one turn
    /// on the server could be that turn (another job asked the same in the
    /// same scope at the same time). Way out: cancel the ones that are not
    /// this job's, or clear the key to start afresh.
    #[error(
        "checkpoint {key:?}: {} turns could be the one this job started ({}); \
         cancel the others or clear the key",
        candidates.len(),
        candidates.join(", ")
    )]
    AmbiguousStart {
        /// The job's key.
        key: String,
        /// The turns that match.
        candidates: Vec<String>,
    },
    /// The job recorded that it was starting its turn, and once the
    /// admission horizon had passed no session created since showed it
    /// (under [`IfNotFound::AtMostOnce`](crate::query::IfNotFound)): nothing
    /// was posted. Way out: look for the turn yourself
    /// (`client.sessions().list()`), then clear the key to start again.
    #[error(
        "checkpoint {key:?}: the job's turn may not have started: no session created since its intent matched it ({examined} examined, looking for {horizon:?} after the intent); nothing was posted, clear the key to start again"
    )]
    NotStarted {
        /// The job's key.
        key: String,
        /// How many sessions created since the intent the last look examined.
        examined: usize,
        /// The admission horizon that passed.
        horizon: std::time::Duration,
    },
    /// Another process runs the job under this key now (it holds the
    /// key's lock). Nothing of that job's was read or touched. Way out:
    /// wait for it to end, or stop it, then run the job again.
    #[error("checkpoint {key:?}: another process runs this job now (its lock is {}); wait for it or stop it", lock.display())]
    Busy {
        /// The job's key.
        key: String,
        /// The lock file held.
        lock: PathBuf,
    },
}
