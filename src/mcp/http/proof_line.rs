//! The line for key probes: a few run at once, and the keys waiting are
//! served round robin across client networks, each network's keys in
//! arrival order (one place per key, see `proof`). A flood of made-up keys
//! from one network then delays another network's key by at most one
//! probe each, and a never-seen key behind the same address (everyone
//! behind one proxy) by the keys ahead of it, each probed once: the line
//! is bounded ([`MAX_WAITING`] places, [`MAX_WAITING_PER_NETWORK`] of one
//! network), so it holds a few hundred kilobytes at most.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

/// Places waiting in line, in all.
pub(super) const MAX_WAITING: usize = 4096;
/// Places waiting in line of one client network.
pub(super) const MAX_WAITING_PER_NETWORK: usize = 1024;

/// A place in line: woken with the probe slot handed to it.
type Place = oneshot::Sender<()>;

#[derive(Debug, Default)]
struct Waiting {
    /// Probes running.
    running: usize,
    /// Networks with places waiting, in the order they are served.
    turns: VecDeque<IpAddr>,
    /// Each network's places, in arrival order.
    places: HashMap<IpAddr, VecDeque<Place>>,
    /// Places waiting in all.
    count: usize,
}

/// The probe slots and the line for them.
#[derive(Debug)]
pub(super) struct ProofLine {
    max_running: usize,
    waiting: Mutex<Waiting>,
}

/// A probe slot, handed to the next in line on drop.
#[derive(Debug)]
pub(super) struct ProbeSlot {
    line: Arc<ProofLine>,
}

impl Drop for ProbeSlot {
    fn drop(&mut self) {
        self.line.hand_on();
    }
}

impl ProofLine {
    pub(super) fn new(max_running: usize) -> Self {
        ProofLine {
            max_running: max_running.max(1),
            waiting: Mutex::new(Waiting::default()),
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        // Plain values; a poisoned line is still consistent.
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A probe slot for a key from `network`, after those ahead of it in
    /// line; `None` when the line is full or the slot does not come within
    /// `patience`.
    pub(super) async fn slot(
        self: &Arc<Self>,
        network: IpAddr,
        patience: Duration,
    ) -> Option<ProbeSlot> {
        let mut place = {
            let mut waiting = self.waiting();
            if waiting.count == 0 && waiting.running < self.max_running {
                waiting.running += 1;
                return Some(ProbeSlot {
                    line: Arc::clone(self),
                });
            }
            let (sender, receiver) = oneshot::channel();
            let waiting = &mut *waiting;
            let mine = waiting.places.entry(network).or_default();
            // Places whose requests gave up leave the line here.
            let before = mine.len();
            mine.retain(|place| !place.is_closed());
            let left = before - mine.len();
            if waiting.count.saturating_sub(left) >= MAX_WAITING
                || mine.len() >= MAX_WAITING_PER_NETWORK
            {
                waiting.count -= left;
                if mine.is_empty() {
                    waiting.places.remove(&network);
                    waiting.turns.retain(|n| *n != network);
                }
                return None;
            }
            if before == 0 {
                waiting.turns.push_back(network);
            }
            mine.push_back(sender);
            waiting.count = waiting.count - left + 1;
            receiver
        };
        let handed = match tokio::time::timeout(patience, &mut place).await {
            Ok(handed) => handed.is_ok(),
            Err(_) => {
                // The slot may have been handed on just as the wait ended.
                place.close();
                place.try_recv().is_ok()
            }
        };
        handed.then(|| ProbeSlot {
            line: Arc::clone(self),
        })
    }

    /// Hands a slot that was given back to the next network's first
    /// place still waiting, or frees it.
    fn hand_on(&self) {
        let mut waiting = self.waiting();
        while let Some(network) = waiting.turns.pop_front() {
            let waiting = &mut *waiting;
            let Some(places) = waiting.places.get_mut(&network) else {
                continue;
            };
            let place = places.pop_front();
            if places.is_empty() {
                waiting.places.remove(&network);
            } else {
                waiting.turns.push_back(network);
            }
            let Some(place) = place else {
                continue;
            };
            waiting.count = waiting.count.saturating_sub(1);
            if place.send(()).is_ok() {
                return;
            }
        }
        waiting.running = waiting.running.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[tokio::test]
    async fn networks_take_turns_and_a_network_s_keys_their_order() {
        let line = Arc::new(ProofLine::new(1));
        let first = line.slot(A, Duration::from_secs(1)).await.unwrap();
        let (order, mut served) = tokio::sync::mpsc::unbounded_channel();
        let mut waiting = Vec::new();
        for (name, network) in [("a1", A), ("a2", A), ("a3", A), ("b1", B)] {
            let line = Arc::clone(&line);
            let order = order.clone();
            waiting.push(tokio::spawn(async move {
                let slot = line.slot(network, Duration::from_secs(10)).await;
                order.send(name).unwrap();
                drop(slot);
            }));
            tokio::task::yield_now().await;
        }
        drop(first);
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(served.recv().await.unwrap());
        }
        assert_eq!(seen, ["a1", "b1", "a2", "a3"]);
    }

    #[tokio::test]
    async fn a_place_given_up_hands_its_slot_on() {
        let line = Arc::new(ProofLine::new(1));
        let first = line.slot(A, Duration::from_secs(1)).await.unwrap();
        assert!(line.slot(A, Duration::from_millis(10)).await.is_none());
        let next = {
            let line = Arc::clone(&line);
            tokio::spawn(async move { line.slot(B, Duration::from_secs(10)).await.is_some() })
        };
        tokio::task::yield_now().await;
        drop(first);
        assert!(next.await.unwrap());
        assert_eq!(line.waiting().running, 0);
    }
}
