//! A data directory is private to its owner, and its write-ahead log does
//! not stay large once a reader that held it open has gone.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use crate::support::local::*;
use crate::support::wait::until;
use nexus_knowql::local::LocalNexus;
use serde_json::json;

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Catches a data directory or database readable by other users: the
/// directory is 0700 and `state.db` (with its log) 0600, even when the
/// directory existed with a wider mode.
#[tokio::test]
async fn the_data_directory_and_database_are_private() {
    let data = TempDir::new("private");
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{}/contexts", server.base_url()))
        .json(&json!({"slug": "p", "name": "P"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(mode(data.path()), 0o700);
    for name in ["state.db", "state.db-wal"] {
        let path = data.path().join(name);
        if path.exists() {
            assert_eq!(mode(&path), 0o600, "{name}");
        }
    }
    server.shutdown().await;
}

/// Catches a write-ahead log that is never truncated: it grows while
/// another connection holds a read transaction, and is back under 4 MiB
/// within seconds of that reader leaving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_shrinks_once_a_reader_leaves() {
    let data = TempDir::new("wal");
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let create = |slug: String| {
        http.post(format!("{}/contexts", server.base_url()))
            .json(&json!({"slug": slug, "name": "W", "description": "w".repeat(200_000)}))
            .send()
    };
    assert_eq!(create("first".to_owned()).await.unwrap().status(), 200);
    let reader = rusqlite::Connection::open(data.path().join("state.db")).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT COUNT(*) FROM contexts", [], |r| r.get(0))
        .unwrap();
    for i in 0..40 {
        assert_eq!(create(format!("c{i}")).await.unwrap().status(), 200);
    }
    let wal = data.path().join("state.db-wal");
    let grown = std::fs::metadata(&wal).unwrap().len();
    assert!(grown > 8 << 20, "the log did not grow: {grown}");
    // The operator sees it.
    let storage = || async {
        let url = format!("{}/local/storage", server.base_url());
        let (status, body) = get_json(&url).await;
        assert_eq!(status, 200, "{body}");
        body
    };
    let shown = storage().await;
    assert!(
        shown["wal_bytes"].as_u64().unwrap() > 8 << 20,
        "GET /local/storage: {shown}"
    );
    assert_eq!(shown["wal_limit_bytes"], 4 << 20);
    assert_eq!(shown["persistent"], true);
    drop(reader);
    let started = Instant::now();
    let shrunk = async || std::fs::metadata(&wal).map_or(0, |m| m.len()) < 4 << 20;
    until(Duration::from_secs(15), "the log under 4 MiB", shrunk).await;
    let shown = storage().await;
    assert!(
        shown["wal_bytes"].as_u64().unwrap() < 4 << 20,
        "GET /local/storage: {shown}"
    );
    eprintln!(
        "log grown to {grown} bytes under a reader; {} bytes {:?} after it left",
        shown["wal_bytes"],
        started.elapsed()
    );
    server.shutdown().await;
}
