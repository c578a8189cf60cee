//! The rule for a failed write, against the in-process server: a write
//! the database cannot take is answered 503 `not_saved`, is never saved
//! later, and stops the server; a writer that falls behind refuses new
//! writes with 503 `busy` and `Retry-After` before applying anything.

use std::time::Duration;

use crate::support::local::*;
use nexus_knowql::local::LocalNexus;
use serde_json::{Value, json};

/// Holds the write lock of `dir/state.db` from another connection (as a
/// `sqlite3` shell inside a transaction would) until the sender fires.
fn hold_write_lock(dir: &std::path::Path) -> std::sync::mpsc::Sender<()> {
    let conn = rusqlite::Connection::open(dir.join("state.db")).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (release, released) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let _ = released.recv();
        let _ = conn.execute_batch("COMMIT");
    });
    release
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
    release.send(()).unwrap();
    // The lock is gone once a write transaction can be had; then the
    // shutdown stops the writer after what it still had to write.
    let db = data.path().join("state.db");
    tokio::task::spawn_blocking(move || {
        let probe = rusqlite::Connection::open(db).unwrap();
        probe.busy_timeout(Duration::from_secs(10)).unwrap();
        probe.execute_batch("BEGIN IMMEDIATE; COMMIT").unwrap();
    })
    .await
    .unwrap();
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
    // The first create waits in the writer's backlog.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, storage) = get_json(&format!("{base}/local/storage")).await;
        if storage["write_backlog_bytes"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{storage}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body, retry) = create(&base, "second").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "busy");
    assert_eq!(retry.as_deref(), Some("1"));
    release.send(()).unwrap();
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
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, storage) = get_json(&format!("{base}/local/storage")).await;
        if storage["write_backlog_bytes"].as_u64().unwrap_or(0) >= 700_000 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{storage}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = big_create("second").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "busy");
    release.send(()).unwrap();
    let (status, body) = first.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let second = reqwest::get(format!("{base}/contexts/second"))
        .await
        .unwrap();
    assert_eq!(second.status(), 404, "a refused write was applied");
    server.shutdown().await;
}
