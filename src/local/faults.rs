//! Fault injection for tests: cut event streams, slow turns down, answer
//! with 503. Everything is off by default.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Environment variable: cut every event stream after this many frames.
pub const ENV_FAULT_CUT_AFTER: &str = "NEXUS_LOCAL_FAULT_CUT_AFTER";
/// Environment variable: milliseconds between the events of a running turn.
pub const ENV_FAULT_FRAME_DELAY_MS: &str = "NEXUS_LOCAL_FAULT_FRAME_DELAY_MS";
/// Environment variable: answer the next N requests with 503 and `Retry-After`.
pub const ENV_FAULT_503: &str = "NEXUS_LOCAL_FAULT_503";

/// The faults a server injects. Shared by every request.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// Close the connection of every event stream after this many frames.
    cut_after_frames: Option<usize>,
    /// Pause between the events a running turn emits.
    frame_delay: Duration,
    /// Requests still to answer with 503.
    fail_next: AtomicUsize,
    /// The `Retry-After` seconds sent with an injected 503.
    retry_after_secs: AtomicU64,
}

impl Faults {
    pub(crate) fn new(
        cut_after_frames: Option<usize>,
        frame_delay: Duration,
        fail_next: usize,
        retry_after_secs: u64,
    ) -> Self {
        Faults {
            cut_after_frames,
            frame_delay,
            fail_next: AtomicUsize::new(fail_next),
            retry_after_secs: AtomicU64::new(retry_after_secs),
        }
    }

    pub(crate) fn cut_after_frames(&self) -> Option<usize> {
        self.cut_after_frames
    }

    pub(crate) fn frame_delay(&self) -> Duration {
        self.frame_delay
    }

    /// Arms `n` more 503 answers.
    pub(crate) fn fail_next(&self, n: usize) {
        self.fail_next.fetch_add(n, Ordering::SeqCst);
    }

    /// Whether this request gets an injected 503; returns its `Retry-After`.
    pub(crate) fn take_503(&self) -> Option<u64> {
        self.fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .ok()
            .map(|_| self.retry_after_secs.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_next_counts_down_to_zero() {
        let f = Faults::new(None, Duration::ZERO, 2, 1);
        assert_eq!(f.take_503(), Some(1));
        assert_eq!(f.take_503(), Some(1));
        assert_eq!(f.take_503(), None);
        f.fail_next(1);
        assert_eq!(f.take_503(), Some(1));
        assert_eq!(f.take_503(), None);
    }
}
