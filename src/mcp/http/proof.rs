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
//!
//! Strangers cannot starve the probes: each key has at most one probe
//! waiting or running, and keys wait for a probe slot in the line of
//! `proof_line`, round robin across client networks (an IPv4 address, an
//! IPv6 /64) and in arrival order within one. A never-seen key from
//! another network is probed after at most one probe of each network
//! ahead of it, and one behind the same address (everyone behind one
//! proxy) after the keys ahead of it, each probed once, however many
//! made-up keys a flood sends. A request whose key is being probed waits
//! for that probe's verdict. A key used inside a session opened while it was
//! unproven is probed again on its next request.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::proof_line::{MAX_WAITING, ProofLine};

use crate::mcp::caller::CallerKey;
use crate::mcp::nexus::KeyProof;
use crate::mcp::recent::Recent;
use crate::mcp::server::NexusMcp;

/// Accepted keys remembered (by digest, about 140 bytes each): as many
/// tenants as the default Pinecone state holds (about 40,000), so that a
/// tenant whose lists are still cached is never checked again, at an
/// upstream call its key pays for, only because others came since.
const PROVEN_CAPACITY: usize = 40_960;
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
/// How long a request waits in line for a probe slot.
const PROBE_WAIT: Duration = Duration::from_secs(4);
/// Keys with a probe waiting or running, at most: the line's places and
/// the probes running.
const MAX_PROBING_KEYS: usize = MAX_WAITING + MAX_PROBES;

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
    /// Probe slots, and the line for them.
    probes: Arc<ProofLine>,
    /// Keys with a probe waiting or running (one each).
    probing: Mutex<Probing>,
    /// Woken whenever a probe ends.
    probe_ended: Notify,
}

/// The probes waiting or running: their keys' digests.
#[derive(Default)]
struct Probing {
    keys: HashSet<[u8; 32]>,
}

/// Why a request does not probe its key itself.
enum NoTurn {
    /// Its key is being probed: the verdict is coming.
    KeyInFlight,
    /// As many keys as may be are waiting or being probed.
    Full,
}

/// The peer a probe is charged to: an IPv4 address, or the /64 of an IPv6
/// address (what one host usually holds); unknown peers are one peer.
fn peer_group(peer: Option<IpAddr>) -> IpAddr {
    peer.map_or(
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        crate::serving::client_network,
    )
}

/// A key's turn to be probed, given back on drop (and the requests
/// waiting for the key's verdict woken).
struct Turn<'a> {
    proofs: &'a Proofs,
    digest: [u8; 32],
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut probing = locked(&self.proofs.probing);
        probing.keys.remove(&self.digest);
        drop(probing);
        self.proofs.probe_ended.notify_waiters();
    }
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
            probes: Arc::new(ProofLine::new(MAX_PROBES)),
            probing: Mutex::new(Probing::default()),
            probe_ended: Notify::new(),
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

    /// The turn to probe the key with `digest`, unless that key is being
    /// probed or the line is full.
    fn turn(&self, digest: &[u8; 32]) -> Result<Turn<'_>, NoTurn> {
        let mut probing = locked(&self.probing);
        if probing.keys.contains(digest) {
            return Err(NoTurn::KeyInFlight);
        }
        if probing.keys.len() >= MAX_PROBING_KEYS {
            return Err(NoTurn::Full);
        }
        probing.keys.insert(*digest);
        Ok(Turn {
            proofs: self,
            digest: *digest,
        })
    }

    /// The verdict of the probe of `digest` in flight, once it ends (or
    /// unproven, when it takes longer than a probe may).
    async fn verdict_in_flight(&self, digest: &[u8; 32]) -> Standing {
        let until =
            crate::mcp::instant_after(Instant::now(), PROBE_WAIT.saturating_add(PROBE_TIMEOUT));
        loop {
            let ended = self.probe_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if !locked(&self.probing).keys.contains(digest) {
                return self.cached(digest);
            }
            if tokio::time::timeout_at(until, ended).await.is_err() {
                return Standing::Unproven;
            }
        }
    }

    /// Where `key` (with `digest`, sent by `peer`) stands, probing the
    /// upstream once when nothing is known: it waits in line for a probe
    /// slot (for [`PROBE_WAIT`] at most), behind one key of each network
    /// ahead of `peer`'s. A key being probed waits for that verdict.
    pub(super) async fn standing(
        &self,
        key: &CallerKey,
        digest: &[u8; 32],
        peer: Option<IpAddr>,
    ) -> Standing {
        match self.cached(digest) {
            Standing::Unproven => {}
            known => return known,
        }
        let _turn = match self.turn(digest) {
            Ok(turn) => turn,
            Err(NoTurn::KeyInFlight) => return self.verdict_in_flight(digest).await,
            Err(NoTurn::Full) => return Standing::Unproven,
        };
        let Some(_slot) = self.probes.slot(peer_group(peer), PROBE_WAIT).await else {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_an_ipv4_address_or_an_ipv6_64() {
        let v4 = IpAddr::from([10, 0, 0, 7]);
        assert_eq!(peer_group(Some(v4)), v4);
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(peer_group(Some(a)), peer_group(Some(b)));
        assert_ne!(peer_group(Some(a)), peer_group(Some(c)));
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert_eq!(peer_group(Some(mapped)), v4);
    }
}
