//! [`WaitPolicy`]: how every wait of the SDK polls; [`Poller`], the one
//! loop helper that applies it and gives up at the wait's bound.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::Error;
use crate::transport::retry::Backoff;

/// How a wait polls: the first interval, which grows by half each time up
/// to a ceiling (each shortened by up to 10 % at random).
///
/// How long a wait may take is not part of it: a wait for a turn
/// ([`QueryHandle::wait`](crate::QueryHandle::wait),
/// [`WhenBusy::Wait`](crate::WhenBusy::Wait)) ends at the turn's one bound,
/// [`ClientBuilder::turn_timeout`](crate::ClientBuilder::turn_timeout); a
/// wait for a task at [`TaskWait::timeout`](crate::resources::TaskWait::timeout).
///
/// ```
/// use std::time::Duration;
/// use nexus_knowql::WaitPolicy;
/// let wait = WaitPolicy::default().interval(Duration::from_millis(100), Duration::from_secs(2));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct WaitPolicy {
    timeout: Duration,
    initial_interval: Duration,
    max_interval: Duration,
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy {
            // Above the service's 900 s cap on a turn.
            timeout: Duration::from_secs(930),
            initial_interval: Duration::from_millis(200),
            max_interval: Duration::from_secs(5),
        }
    }
}

impl WaitPolicy {
    /// Gives up after this long (default 930 s); `None` polls until the
    /// awaited state comes.
    pub(crate) fn timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.timeout = timeout.into().unwrap_or(Duration::MAX);
        self
    }

    /// The time limit set with [`WaitPolicy::timeout`] (`Duration::MAX`:
    /// none).
    pub(crate) fn time_limit(&self) -> Duration {
        self.timeout
    }

    /// The first polling interval (default 200 ms); it grows up to `max` (default 5 s).
    pub fn interval(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_interval = initial;
        self.max_interval = max.max(initial);
        self
    }
}

/// One wait in progress under a [`WaitPolicy`]: each loop of the SDK that
/// polls calls [`Poller::pause`] between its attempts.
#[derive(Debug)]
pub(crate) struct Poller {
    started: Instant,
    timeout: Duration,
    intervals: Backoff,
}

impl Poller {
    pub(crate) fn new(policy: &WaitPolicy) -> Self {
        Poller::with_timeout(policy, policy.timeout)
    }

    /// A wait with `policy`'s intervals that gives up after `timeout`.
    pub(crate) fn with_timeout(policy: &WaitPolicy, timeout: Duration) -> Self {
        Poller {
            started: Instant::now(),
            timeout,
            intervals: Backoff::new(policy.initial_interval, 1.5, policy.max_interval, 0.1),
        }
    }

    /// Sleeps until the next attempt; `false` (at once) when that attempt
    /// would come after the policy's timeout.
    pub(crate) async fn pause(&mut self) -> bool {
        let delay = self.intervals.next_delay();
        if self.started.elapsed().saturating_add(delay) > self.timeout {
            return false;
        }
        tokio::time::sleep(delay).await;
        true
    }

    /// Sleeps until the next attempt, cutting the last pause short so that
    /// a final attempt lands on the policy's timeout; `false` (at once) when
    /// the timeout has passed. For a wait that reports the latest state at
    /// its end rather than failing.
    pub(crate) async fn pause_until_timeout(&mut self) -> bool {
        let left = self.timeout.saturating_sub(self.started.elapsed());
        if left.is_zero() {
            return false;
        }
        let delay = self.intervals.next_delay();
        tokio::time::sleep(delay.min(left)).await;
        true
    }

    /// [`Error::Timeout`] for `operation`, with the time waited so far.
    pub(crate) fn timed_out(&self, operation: &'static str) -> Error {
        Error::timeout(operation, self.started.elapsed(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits 2 s at most, pausing 200 ms first and 1 s at most.
    fn two_second_poller() -> Poller {
        Poller::new(
            &WaitPolicy::default()
                .timeout(Duration::from_secs(2))
                .interval(Duration::from_millis(200), Duration::from_secs(1)),
        )
    }

    /// Pauses until the poller says the wait is over (with the last pause
    /// cut to end on the timeout when `until_timeout`); the pauses made.
    async fn count_pauses(poller: &mut Poller, until_timeout: bool) -> u32 {
        let mut pauses = 0;
        loop {
            let more = if until_timeout {
                poller.pause_until_timeout().await
            } else {
                poller.pause().await
            };
            if !more {
                return pauses;
            }
            pauses += 1;
            assert!(pauses < 100, "the wait never ends");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_grow_and_end_before_the_deadline() {
        let mut poller = two_second_poller();
        let pauses = count_pauses(&mut poller, false).await;
        // 200, 300, 450, 675 ms (up to 10 % less), then the next would pass 2 s.
        assert!((3..=5).contains(&pauses), "{pauses} pauses");
        assert!(poller.started.elapsed() <= Duration::from_secs(2));
        assert!(matches!(
            poller.timed_out("get_query"),
            Error::Timeout {
                operation: "get_query",
                ..
            }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_pause_until_the_timeout_ends_on_it() {
        let mut poller = two_second_poller();
        let pauses = count_pauses(&mut poller, true).await;
        // 200, 300, 450, 675 ms (up to 10 % less), then a pause cut to end at 2 s.
        assert!((4..=6).contains(&pauses), "{pauses} pauses");
        assert_eq!(poller.started.elapsed(), Duration::from_secs(2));
    }
}
