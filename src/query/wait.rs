//! [`QueryWait`]: how waiting for a turn polls, and when it gives up.

use std::time::Duration;

/// How [`QueryHandle::wait_with`](crate::QueryHandle::wait_with) polls,
/// and how [`WhenBusy::Wait`](crate::WhenBusy::Wait) waits for a session.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct QueryWait {
    pub(crate) timeout: Duration,
    initial_interval: Duration,
    pub(crate) max_interval: Duration,
}

impl Default for QueryWait {
    fn default() -> Self {
        QueryWait {
            // Above the service's 900 s cap on a turn.
            timeout: Duration::from_secs(930),
            initial_interval: Duration::from_millis(200),
            max_interval: Duration::from_secs(5),
        }
    }
}

impl QueryWait {
    /// Gives up after this long (default 930 s) with [`Error::Timeout`](crate::Error::Timeout).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The first polling interval (default 200 ms); it grows up to `max` (default 5 s).
    pub fn interval(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_interval = initial;
        self.max_interval = max.max(initial);
        self
    }

    /// The growing polling intervals.
    pub(crate) fn intervals(&self) -> backoff::ExponentialBackoff {
        backoff::ExponentialBackoff {
            current_interval: self.initial_interval,
            initial_interval: self.initial_interval,
            randomization_factor: 0.1,
            multiplier: 1.5,
            max_interval: self.max_interval,
            max_elapsed_time: None,
            ..backoff::ExponentialBackoff::default()
        }
    }
}
