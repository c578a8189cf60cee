//! The rule for a failed write, against the in-process server: a write
//! the database cannot take is answered 503 `not_saved`, is never saved
//! later, and stops the server; a writer that falls behind refuses new
//! writes with 503 `busy` and `Retry-After` before applying anything.

use std::time::Duration;

use crate::support::local::*;
use crate::support::wait::until;
use nexus_knowql::local::LocalNexus;
use serde_json::{Value, json};

/// The write lock of a `state.db` held from another connection.
struct HeldLock {
    release: std::sync::mpsc::Sender<()>,
    holder: std::thread::JoinHandle<()>,
}

impl HeldLock {
    /// Lets the lock go and returns once it has (the holder committed and
    /// closed its connection).
    fn release(self) {
        self.release.send(()).unwrap();
        self.holder.join().unwrap();
    }
}

/// Holds the write lock of `dir/state.db` from another connection (as a
/// `sqlite3` shell inside a transaction would) until released.
fn hold_write_lock(dir: &std::path::Path) -> HeldLock {
    let conn = rusqlite::Connection::open(dir.join("state.db")).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let _ = released.recv();
        let _ = conn.execute_batch("COMMIT");
    });
    HeldLock { release, holder }
}

/// Waits until at least `bytes` wait in the write backlog (the signal
/// that a write was admitted and is held up).
async fn backlog_reaches(base: &str, bytes: u64) {
    let what = format!("a write backlog of {bytes} bytes");
    until(Duration::from_secs(30), &what, async || {
        let (_, storage) = get_json(&format!("{base}/local/storage")).await;
        storage["write_backlog_bytes"].as_u64().unwrap_or(0) >= bytes
    })
    .await;
}

async fn create(base: &str, slug: &str) -> (u16, Value, Option<String>) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/contexts"))
        .json(&json!({"slug": slug, "name": slug}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, resp.json().await.unwrap_or(Value::Null), retry)
}

/// Catches a write reported not saved and written later anyway (retries
/// past the wait of the acknowledgement), and a server that keeps serving
/// memory ahead of its disk: the create gets 503 `not_saved`, the server
/// stops itself, and after the lock is gone and the server restarted the
/// context does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_refused_while_the_database_is_locked_is_never_saved() {
    let data = TempDir::new("locked-db");
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .unwrap();
    let base = server.base_url().to_owned();
    let release = hold_write_lock(data.path());
    let (status, body, _) = create(&base, "held").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "not_saved");
    tokio::time::timeout(Duration::from_secs(10), server.failed())
        .await
        .expect("the server did not stop after a lost write");
    // Reads are refused too: memory may be ahead of the disk.
    let read = reqwest::get(format!("{base}/contexts/held")).await;
    assert!(read.is_err() || read.unwrap().status() == 503);
    // The lock is gone before the restart (no sleep: the holder is joined).
    release.release();
    server.shutdown().await;
    let again = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .unwrap();
    let resp = reqwest::get(format!("{}/contexts/held", again.base_url()))
        .await
        .unwrap();
    assert_eq!(resp.status(), 404, "a write answered 503 was saved later");
    let (status, _, _) = create(again.base_url(), "held").await;
    assert_eq!(status, 200, "the refused create could not be retried");
    again.shutdown().await;
}

/// Catches admission ignoring the backlog: while the writer is held up
/// with more than the limit waiting, a second create is refused with 503
/// `busy` and `Retry-After` and is not applied; the first is saved once
/// the lock goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_past_the_backlog_limit_are_refused_before_they_apply() {
    let data = TempDir::new("backlog");
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .write_backlog_limit(1)
        .start()
        .await
        .unwrap();
    let base = server.base_url().to_owned();
    let release = hold_write_lock(data.path());
    let first = tokio::spawn({
        let base = base.clone();
        async move { create(&base, "first").await }
    });
    backlog_reaches(&base, 1).await;
    let (status, body, retry) = create(&base, "second").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "busy");
    assert_eq!(retry.as_deref(), Some("1"));
    release.release();
    let (status, body, _) = first.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let second = reqwest::get(format!("{base}/contexts/second"))
        .await
        .unwrap();
    assert_eq!(second.status(), 404, "a refused write was applied");
    server.shutdown().await;
}

/// Catches a backlog limit checked without the request's own bytes: while
/// the writer is held up with a 700 KB create waiting, a second 700 KB
/// create would take the backlog past the 1 MiB limit, so it is refused
/// with 503 `busy` and not applied (it was admitted, because the backlog
/// alone was under the limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_would_take_the_backlog_past_its_limit_is_refused() {
    let data = TempDir::new("backlog-own");
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .write_backlog_limit(1 << 20)
        .start()
        .await
        .unwrap();
    let base = server.base_url().to_owned();
    let big_create = |slug: &'static str| {
        let base = base.clone();
        async move {
            let resp = reqwest::Client::new()
                .post(format!("{base}/contexts"))
                .json(&json!({"slug": slug, "name": slug, "description": "d".repeat(700_000)}))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let release = hold_write_lock(data.path());
    let first = tokio::spawn(big_create("first"));
    // The signal: the first create's bytes wait in the backlog.
    backlog_reaches(&base, 700_000).await;
    let (status, body) = big_create("second").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "busy");
    release.release();
    let (status, body) = first.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let second = reqwest::get(format!("{base}/contexts/second"))
        .await
        .unwrap();
    assert_eq!(second.status(), 404, "a refused write was applied");
    server.shutdown().await;
}

/// Catches a turn's event bytes left out of the backlog: a turn admitted
/// with nothing waiting logs more than the 1 KiB limit of events while it
/// runs (written when it ends), and a write admitted meanwhile would take
/// the backlog past the limit, so it gets 503 `busy`; once the turn has
/// ended and its events are written, the same write is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_turns_event_bytes_count_in_the_backlog() {
    const LIMIT: u64 = 1024;
    let (server, _client, _corpus) = seeded(
        LocalNexus::builder()
            .write_backlog_limit(LIMIT)
            .frame_delay(Duration::from_millis(200)),
    )
    .await;
    let base = server.base_url().to_owned();
    let mut stream = post_stream(
        &base,
        json!({"ask": "How long does green tea steep, and black tea?", "scope": ["docs"], "stream": true}),
    )
    .await;
    // The signal: more event data than the limit reached this client
    // (the server counts at least these bytes), and the turn goes on.
    let mut seen = 0usize;
    let mut text = String::new();
    while seen <= LIMIT as usize {
        let chunk = tokio::time::timeout(Duration::from_secs(30), stream.chunk())
            .await
            .expect("no event within 30 s")
            .unwrap()
            .expect("the turn ended before it logged more than the limit");
        text.push_str(&String::from_utf8_lossy(&chunk));
        seen = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::len)
            .sum();
    }
    assert!(
        !text.contains("event: query"),
        "the turn already ended: {text}"
    );
    let (status, body, retry) = create(&base, "during").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "busy");
    assert_eq!(retry.as_deref(), Some("1"));
    // The turn ends; its events are written with its end.
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), stream.chunk())
        .await
        .expect("the turn did not end within 60 s")
        .unwrap()
    {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.contains("event: query"), "{text}");
    let (status, body, _) = create(&base, "after").await;
    assert_eq!(status, 200, "{body}");
    let (_, storage) = get_json(&format!("{base}/local/storage")).await;
    assert_eq!(storage["write_backlog_bytes"], 0, "{storage}");
    server.shutdown().await;
}
