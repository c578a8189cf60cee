//! The one bounded wait of the tests: a test awaits what happened (a call
//! returning, a test double's signal) under [`within`], and never sleeps
//! for it. A test double signals each thing it records through a
//! `tokio::sync::watch` channel; [`signalled`] re-checks a condition over
//! what the double recorded each time the signal fires. [`until`] and
//! [`until_some`] (or [`until_blocking`] on a plain thread) poll a
//! condition only where nothing can signal (another process, a file
//! system, a server's HTTP answers); their interval is the only sleep of a
//! wait. [`retry_signal`] fires on each retry of the client under test.

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

/// [`until_some`] for a check made by a closure that returns a future
/// (one that must be `Send`, such as inside a spawned task, where an
/// async closure's borrow is not).
pub async fn until_found<T, F, Fut>(limit: Duration, what: &str, mut find: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
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

/// [`until_some`] for a test that goes on when the time is up: what
/// `find` found within `limit`, or `None`.
pub async fn found_within<T>(
    limit: Duration,
    mut find: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    let found = async {
        loop {
            if let Some(found) = find().await {
                return found;
            }
            tokio::time::sleep(POLL).await;
        }
    };
    tokio::time::timeout(limit, found).await.ok()
}

/// [`until`] for a test that goes on either way: whether `check` came to
/// hold within `limit`, looking again every 20 ms.
pub async fn holds_within_async(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    found_within(limit, async || check().await.then_some(()))
        .await
        .is_some()
}

/// [`until`] for a test without a runtime (one that drives a process from
/// a plain thread): waits until `check` holds, looking again every 20 ms;
/// panics naming `what` when it does not hold within `limit`.
pub fn until_blocking(limit: Duration, what: &str, check: impl FnMut() -> bool) {
    assert!(holds_within(limit, check), "{what}: not within {limit:?}");
}

/// [`until_blocking`] for a test that goes on when the time is up (and
/// kills what it waited for): whether `check` came to hold within `limit`.
pub fn holds_within(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}

/// Installs, for the current thread (a `current_thread` test runtime and
/// the tasks it spawns), a `tracing` subscriber that counts the client's
/// retries: the signal holds how many `retrying` events the transport has
/// logged, each just before its backoff starts. Keep the guard alive.
pub fn retry_signal() -> (tracing::subscriber::DefaultGuard, watch::Receiver<u32>) {
    let (tx, rx) = watch::channel(0);
    let writer = RetryWriter(std::sync::Arc::new(tx));
    let subscriber = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish();
    (tracing::subscriber::set_default(subscriber), rx)
}

/// Counts the log lines of [`retry_signal`] that report a retry.
#[derive(Clone)]
struct RetryWriter(std::sync::Arc<watch::Sender<u32>>);

impl std::io::Write for RetryWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if String::from_utf8_lossy(buf).contains("retrying") {
            self.0.send_modify(|n| *n += 1);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RetryWriter {
    type Writer = RetryWriter;
    fn make_writer(&'a self) -> RetryWriter {
        self.clone()
    }
}
