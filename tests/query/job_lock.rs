//! One process runs a key at a time: a job takes its key in the store
//! before it reads or writes anything under it, and a second process (or a
//! second job in this one) gets a typed "busy" error without touching the
//! first's files.

use crate::support::sse_server;
use nexus_knowql::query::{Checkpoint, CheckpointRecord, CheckpointStore, FileCheckpointStore};
use nexus_knowql::{CheckpointedTurn, Error, error::CheckpointError};
use sse_server::{Reply, SseServer, Step, Turn};

fn busy(e: Error, key: &str) {
    match e {
        Error::Checkpoint(CheckpointError::Busy { key: k, .. }) => assert_eq!(k, key),
        other => panic!("expected busy, got {other:?}"),
    }
}

#[test]
fn a_key_is_held_by_one_lock_until_it_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let held = store.lock("job-1").unwrap();
    busy(store.lock("job-1").unwrap_err(), "job-1");
    let other = store.lock("job-2").unwrap();
    drop(held);
    let again = store.lock("job-1").unwrap();
    drop((again, other));
}

/// A second job under a held key fails at once: nothing posted, and the
/// first job's record and in-flight temporary file are left alone.
#[tokio::test]
async fn a_second_job_on_a_held_key_is_busy_and_touches_nothing() {
    let turn = Turn::completed("q_lock", "s_lock", &["Travel ", "is approved."]);
    let body = turn.body();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(body.clone().into_bytes())])
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let first = store.lock("job").unwrap();
    let record = CheckpointRecord::At(Checkpoint::after_text("q_other", 3, "Travel "));
    store.save("job", &record).unwrap();
    // A save of the first job in flight (its temporary file).
    let tmp = dir
        .path()
        .join(format!(".job.{}.99.tmp", std::process::id()));
    std::fs::write(&tmp, b"half").unwrap();

    let client = server.client();
    let ask = client
        .session(["docs"])
        .build()
        .unwrap()
        .ask("Who approves travel?");
    let e = CheckpointedTurn::start_or_resume(&client, &store, "job", ask)
        .await
        .unwrap_err();
    busy(e, "job");
    busy(
        CheckpointedTurn::resume(&client, &store, "job")
            .await
            .unwrap_err(),
        "job",
    );
    assert!(tmp.exists(), "the first job's temporary file is untouched");
    assert_eq!(store.load("job").unwrap(), Some(record));
    assert_eq!(server.count("POST", "/query"), 0);
    drop(first);
}
