//! Key proof: a caller key holds shared capacity (sessions past the
//! quarantine, GET streams, the eviction of others' idle sessions) only
//! once the upstream has accepted it.
//!
//! A key is proven by one upstream call made with it (see
//! `NexusMcp::prove_key`), at most one per key digest: the verdict is
//! cached, accepted keys and refused keys in separate bounded tables, so
//! made-up keys push out only each other. A refused key is answered 403
//! until its verdict expires. Probes run a few at a time and each has a
//! deadline; a key whose probe cannot run or decide stays unproven and is
//! served from the quarantine (see `Sessions`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::mcp::caller::CallerKey;
use crate::mcp::nexus::KeyProof;
use crate::mcp::recent::Recent;
use crate::mcp::server::NexusMcp;

/// Accepted keys remembered (by digest).
const PROVEN_CAPACITY: usize = 4096;
/// Refused keys remembered (by digest): a separate table, so made-up keys
/// never push out accepted ones.
const REFUSED_CAPACITY: usize = 1024;
/// How long a refusal is remembered.
const REFUSED_FOR: Duration = Duration::from_secs(300);
/// How long an acceptance is remembered.
const PROVEN_FOR: Duration = Duration::from_secs(3600);
/// Probes in flight at once.
const MAX_PROBES: usize = 4;
/// A probe's deadline.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a key stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Standing {
    /// The upstream accepted it.
    Proven,
    /// The upstream refused it.
    Refused,
    /// Not known yet: quarantined.
    Unproven,
}

/// The verdicts on caller keys, and the probes that reach them.
pub(super) struct Proofs {
    server: NexusMcp,
    proven: Mutex<Recent<[u8; 32], Instant>>,
    refused: Mutex<Recent<[u8; 32], Instant>>,
    probes: Arc<Semaphore>,
}

impl std::fmt::Debug for Proofs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proofs").finish_non_exhaustive()
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain values; a poisoned table is still consistent.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Proofs {
    pub(super) fn new(server: NexusMcp) -> Self {
        Proofs {
            server,
            proven: Mutex::new(Recent::new(PROVEN_CAPACITY)),
            refused: Mutex::new(Recent::new(REFUSED_CAPACITY)),
            probes: Arc::new(Semaphore::new(MAX_PROBES)),
        }
    }

    /// The cached verdict on `digest`, without probing.
    pub(super) fn cached(&self, digest: &[u8; 32]) -> Standing {
        let now = Instant::now();
        if locked(&self.proven).get(digest).is_some_and(|t| *t > now) {
            return Standing::Proven;
        }
        if locked(&self.refused).get(digest).is_some_and(|t| *t > now) {
            return Standing::Refused;
        }
        Standing::Unproven
    }

    /// Where `key` (with `digest`) stands, probing the upstream once when
    /// nothing is known and a probe slot is free.
    pub(super) async fn standing(&self, key: &CallerKey, digest: &[u8; 32]) -> Standing {
        match self.cached(digest) {
            Standing::Unproven => {}
            known => return known,
        }
        let Ok(_permit) = Arc::clone(&self.probes).try_acquire_owned() else {
            return Standing::Unproven;
        };
        // Another request may have decided it while this one waited.
        match self.cached(digest) {
            Standing::Unproven => {}
            known => return known,
        }
        let verdict = tokio::time::timeout(PROBE_TIMEOUT, self.server.prove_key(key.clone()))
            .await
            .unwrap_or(KeyProof::Undecided);
        let now = Instant::now();
        match verdict {
            KeyProof::Accepted => {
                locked(&self.refused).remove(digest);
                locked(&self.proven).insert(*digest, crate::mcp::instant_after(now, PROVEN_FOR));
                Standing::Proven
            }
            KeyProof::Refused => {
                locked(&self.refused).insert(*digest, crate::mcp::instant_after(now, REFUSED_FOR));
                Standing::Refused
            }
            KeyProof::Undecided => Standing::Unproven,
        }
    }
}
