//! A time-to-live cell with single-flight refresh.
//!
//! Concurrent callers that find the value stale wait for one refresh instead
//! of each calling Pinecone. Failures are never stored: the next caller
//! tries again.

use std::future::Future;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// A cached value and how it was obtained.
#[derive(Debug, Clone)]
pub(super) struct Cached<T> {
    /// The value.
    pub value: T,
    /// True when no refresh was needed.
    pub hit: bool,
    /// Time left before the value expires.
    pub remaining: Duration,
}

/// One cached value with a lifetime.
#[derive(Debug)]
pub(super) struct TtlCell<T> {
    ttl: Duration,
    // A tokio mutex: it is held across the refresh so that waiters reuse its result.
    slot: Mutex<Option<(T, Instant)>>,
}

impl<T: Clone> TtlCell<T> {
    /// An empty cell whose values live `ttl`.
    pub(super) fn new(ttl: Duration) -> Self {
        TtlCell {
            ttl,
            slot: Mutex::new(None),
        }
    }

    /// The value, refreshed with `fetch` when absent or expired.
    ///
    /// # Errors
    /// `fetch`'s error; nothing is cached then.
    ///
    /// # Cancel safety
    /// Dropping the future during a refresh leaves the cell as it was.
    pub(super) async fn get_or_refresh<E, F, Fut>(&self, fetch: F) -> Result<Cached<T>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut slot = self.slot.lock().await;
        let now = Instant::now();
        if let Some((value, expires)) = slot.as_ref()
            && now < *expires
        {
            return Ok(Cached {
                value: value.clone(),
                hit: true,
                remaining: *expires - now,
            });
        }
        let value = fetch().await?;
        let expires = crate::mcp::instant_after(Instant::now(), self.ttl);
        *slot = Some((value.clone(), expires));
        Ok(Cached {
            value,
            hit: false,
            remaining: self.ttl,
        })
    }

    /// `weigh` of the value held (expired or not; 0 when empty), or `None`
    /// while a refresh is running.
    pub(super) fn weigh(&self, weigh: impl FnOnce(&T) -> u64) -> Option<u64> {
        let slot = self.slot.try_lock().ok()?;
        Some(slot.as_ref().map_or(0, |(value, _)| weigh(value)))
    }

    /// Drops the cached value.
    pub(super) async fn clear(&self) {
        *self.slot.lock().await = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lifetime_past_the_clock_means_never_expiring() {
        let cell = TtlCell::new(Duration::MAX);
        let first = cell
            .get_or_refresh(|| async { Ok::<_, ()>(1) })
            .await
            .unwrap();
        assert!(!first.hit);
        let second = cell
            .get_or_refresh(|| async { Ok::<_, ()>(2) })
            .await
            .unwrap();
        assert!(second.hit);
        assert_eq!(second.value, 1);
    }
}
