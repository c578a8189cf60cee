//! Unit tests of the store: per-change commits and their tickets.

use super::*;

use crate::local::scratch_dir::fresh as scratch_dir;

fn limits() -> QueryLimits {
    QueryLimits {
        count: 100,
        bytes: 1 << 20,
    }
}

#[tokio::test]
async fn a_crash_between_moving_files_and_recording_them_is_repaired_at_start() {
    let dir = scratch_dir("move");
    let context_id = {
        let store = Store::open(&dir, limits()).unwrap();
        let req: types::CreateContextRequest =
            serde_json::from_value(serde_json::json!({"slug": "c", "name": "C"})).unwrap();
        let mut change = store.change();
        let id = change.create_context(req).unwrap().id;
        store.saved(change.commit()).await.unwrap();
        let record = MoveRecord {
            files: vec![("uploads/a.md".to_owned(), 3)],
            ..MoveRecord::default()
        };
        let (_, n) = store.begin_move(&id, &record);
        store.wait_saved(n).await.unwrap();
        // The file lands (bigger than announced), then the process dies
        // before the sources are recorded.
        let target = store.context_dir(&id).join("sources/uploads/a.md");
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(&target, b"# A, longer").unwrap();
        id
    };
    let store = Store::open(&dir, limits()).unwrap();
    let size = store.lock().contexts[&context_id].sources["uploads/a.md"].size;
    assert_eq!(size, 11);
    store.settled().await.unwrap();
    drop(store);
    // Repaired once: the record of the move is gone, the source stays.
    let store = Store::open(&dir, limits()).unwrap();
    assert_eq!(store.lock().contexts[&context_id].sources.len(), 1);
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn work_running_at_a_crash_is_failed_and_ended_turns_stay_on_disk_only() {
    let dir = scratch_dir("restart");
    {
        let store = Store::open(&dir, limits()).unwrap();
        let input: types::TaskInput = serde_json::from_value(serde_json::json!({})).unwrap();
        let mut change = store.change();
        let t = change.new_task("curate", None, None, input, CancellationToken::new());
        store.saved(change.commit()).await.unwrap();
        assert_eq!(t.state.as_str(), "running");
    }
    let store = Store::open(&dir, limits()).unwrap();
    let inner = store.lock();
    let task = inner.tasks.values().next().unwrap();
    assert_eq!(task.task.state.as_str(), crate::status::word::FAILED);
    assert!(inner.queries.is_empty());
    drop(inner);
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Holds the state database's write lock until the returned sender
/// fires (or is dropped).
fn block_writes(dir: &Path) -> std::sync::mpsc::Sender<()> {
    db::tests::block_writes(&dir.join(db::DB_FILE))
}

fn new_context(store: &Store, slug: &str) -> String {
    let req: types::CreateContextRequest =
        serde_json::from_value(serde_json::json!({"slug": slug, "name": slug})).unwrap();
    store.change().create_context(req).unwrap().id
}

fn context_on_disk(dir: &Path, id: &str) -> bool {
    db::tests::on_disk(&dir.join(db::DB_FILE), id)
}

/// Catches a persistent store acknowledging without waiting (`!`
/// deleted in `wait_saved`) and a `commit_then` callback run at once
/// instead of after the commit (its guard replaced by `false`).
#[tokio::test]
async fn a_persistent_store_acknowledges_only_after_the_commit() {
    let dir = scratch_dir("ack");
    let store = Store::open(&dir, limits()).unwrap();
    assert!(store.is_persistent());
    let release = block_writes(&dir);
    new_context(&store, "a");
    let flushed = tokio::time::timeout(Duration::from_millis(300), store.settled()).await;
    assert!(
        flushed.is_err(),
        "flush answered while its commit was held up"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let mut change = store.change();
    let req: types::CreateContextRequest =
        serde_json::from_value(serde_json::json!({"slug": "b", "name": "b"})).unwrap();
    change.create_context(req).unwrap();
    let _ = change.commit_then(move |ok| {
        let _ = tx.send(ok);
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the callback ran before the commit"
    );
    release.send(()).unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(true));
    store.settled().await.unwrap();
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Catches `Store::close` doing nothing: a change recorded and never
/// flushed is on disk once `close` returns.
#[test]
fn closing_writes_what_is_pending() {
    let dir = scratch_dir("close");
    let store = Store::open(&dir, limits()).unwrap();
    let id = new_context(&store, "pending");
    store.close();
    assert!(
        context_on_disk(&dir, &id),
        "closed without writing the change"
    );
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}
