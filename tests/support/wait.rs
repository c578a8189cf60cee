//! The one bounded wait of the tests: a test awaits what happened (a call
//! returning, a test double's signal) under [`within`], and never sleeps
//! for it. A test double signals each thing it records through a
//! `tokio::sync::watch` channel; [`signalled`] re-checks a condition over
//! what the double recorded each time the signal fires. [`until`] and
//! [`until_some`] (or [`until_blocking`] on a plain thread) poll a
//! condition only where nothing can signal (another process, a file
//! system, a server's HTTP answers); their interval is the only sleep of a
//! wait.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

/// How long a test waits for what it expects before it fails.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// How often [`until`] looks again.
const POLL: Duration = Duration::from_millis(20);

/// Awaits `happened`; panics naming `what` when it does not complete within
/// `limit`.
pub async fn within<T>(limit: Duration, what: &str, happened: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, happened).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: not within {limit:?}"),
    }
}

/// Waits until `check` holds, checking it now and again each time `signal`
/// fires; panics naming `what` when it does not hold within [`PATIENCE`]
/// (or the signal's sender is gone first).
pub async fn signalled<T>(
    signal: &mut watch::Receiver<T>,
    what: &str,
    mut check: impl FnMut() -> bool,
) {
    signal.mark_unchanged();
    within(PATIENCE, what, async {
        while !check() {
            if signal.changed().await.is_err() {
                assert!(check(), "{what}: the signal's source is gone");
                return;
            }
        }
    })
    .await;
}

/// Waits until `check` holds, looking again every 20 ms; panics naming
/// `what` when it does not hold within `limit`. Only for conditions nothing
/// signals (another process's state, a server's HTTP answers).
pub async fn until(limit: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    until_some(limit, what, async || check().await.then_some(())).await;
}

/// [`until`] for a check that finds something: waits until `find` returns
/// a value, and returns it.
pub async fn until_some<T>(
    limit: Duration,
    what: &str,
    mut find: impl AsyncFnMut() -> Option<T>,
) -> T {
    within(limit, what, async {
        loop {
            if let Some(found) = find().await {
                return found;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await
}

/// [`until`] for a test without a runtime (one that drives a process from
/// a plain thread): waits until `check` holds, looking again every 20 ms;
/// panics naming `what` when it does not hold within `limit`.
pub fn until_blocking(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {limit:?}"
        );
        std::thread::sleep(POLL);
    }
}
