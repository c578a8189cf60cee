//! Checkpoints that persist themselves: a turn read through
//! `CheckpointedTurn` keeps its checkpoint in a `FileCheckpointStore`; a
//! "crash" mid-answer and `CheckpointedTurn::resume` finish the same turn
//! with the verified path, and the two parts add up to the stored answer.
use std::cell::Cell;
use std::time::Duration;

use futures::StreamExt;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::query::{
    Checkpoint, CheckpointStore, CheckpointedTurn, FileCheckpointStore, MAX_CHECKPOINT_BYTES,
};
use nexus_knowql::{Error, QueryEvent};

async fn local() -> (LocalNexus, nexus_knowql::Client) {
    let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
    let nexus = LocalNexus::builder()
        .context("docs", corpus)
        .frame_delay(Duration::from_millis(10))
        .start()
        .await
        .unwrap();
    let client = nexus.client().unwrap();
    (nexus, client)
}

#[tokio::test]
async fn a_turn_resumed_from_its_store_finishes_with_the_exact_answer() {
    let (_nexus, client) = local().await;
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let session = client.session(["docs"]).build().unwrap();
    let turn = session
        .ask("How do I resume a broken stream?")
        .stream()
        .await
        .unwrap();
    let mut first = CheckpointedTurn::new(turn, store.clone(), "job-1");
    // Handle three text deltas, ask for the next event (which saves the
    // third's checkpoint), then "crash" with that event in hand.
    let mut handled = String::new();
    let mut deltas = 0;
    while deltas < 3 {
        if let QueryEvent::TextDelta { delta } = first.next().await.unwrap().unwrap() {
            handled.push_str(&delta);
            deltas += 1;
        }
    }
    let in_hand = first.next().await.unwrap().unwrap();
    let saved = store.load("job-1").unwrap().expect("a saved checkpoint");
    assert_eq!(saved.text_len, handled.len() as u64, "{in_hand:?}");
    assert!(saved.event_id > 0);
    assert_eq!(first.saved(), Some(&saved));
    drop(first);

    let mut second = CheckpointedTurn::resume(&client, store.clone(), "job-1")
        .await
        .unwrap()
        .expect("the stored checkpoint");
    let mut rest = String::new();
    while let Some(event) = second.next().await {
        if let QueryEvent::TextDelta { delta } = event.unwrap() {
            rest.push_str(&delta);
        }
        // Every handled event moves the stored checkpoint on.
        let now = store.load("job-1").unwrap().unwrap();
        assert!(now.event_id >= saved.event_id && now.text_len >= saved.text_len);
    }
    let query = second.finish().await.unwrap();
    assert_eq!(format!("{handled}{rest}"), query.answer_text());
    // The turn ended: nothing to resume any more.
    assert_eq!(store.load("job-1").unwrap(), None);
    assert!(
        CheckpointedTurn::resume(&client, store, "job-1")
            .await
            .unwrap()
            .is_none()
    );
}

/// A store whose saves fail from the `fail_from`-th on.
struct Flaky {
    inner: FileCheckpointStore,
    saves: Cell<usize>,
    fail_from: usize,
}

impl CheckpointStore for Flaky {
    fn load(&self, key: &str) -> nexus_knowql::Result<Option<Checkpoint>> {
        self.inner.load(key)
    }
    fn save(&self, key: &str, checkpoint: &Checkpoint) -> nexus_knowql::Result<()> {
        self.saves.set(self.saves.get() + 1);
        if self.saves.get() >= self.fail_from {
            return Err(Error::InvalidRequest("disk full".into()));
        }
        self.inner.save(key, checkpoint)
    }
    fn clear(&self, key: &str) -> nexus_knowql::Result<()> {
        self.inner.clear(key)
    }
}

#[tokio::test]
async fn a_failed_save_is_an_error_and_the_last_good_checkpoint_stays() {
    let (_nexus, client) = local().await;
    let dir = tempfile::tempdir().unwrap();
    let store = Flaky {
        inner: FileCheckpointStore::new(dir.path()).unwrap(),
        saves: Cell::new(0),
        fail_from: 3,
    };
    let session = client.session(["docs"]).build().unwrap();
    let turn = session.ask("What is a context?").stream().await.unwrap();
    let mut turn = CheckpointedTurn::new(turn, &store, "job-2");
    let mut items = Vec::new();
    for _ in 0..4 {
        items.push(turn.next().await.unwrap());
    }
    assert!(items[..3].iter().all(Result::is_ok), "{items:?}");
    let err = items[3].as_ref().unwrap_err();
    assert!(err.to_string().contains("disk full"), "{err}");
    let kept = store.inner.load("job-2").unwrap().unwrap();
    assert_eq!(turn.saved(), Some(&kept));
    // `finish` reports the store's error rather than going on unsaved.
    assert!(
        turn.finish()
            .await
            .unwrap_err()
            .to_string()
            .contains("disk full")
    );
    assert_eq!(store.inner.load("job-2").unwrap(), Some(kept));
}

#[test]
fn the_file_store_refuses_bad_keys_and_files_that_are_not_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let cp: Checkpoint = "q_1:5:10".parse().unwrap();
    for key in ["", ".hidden", "a/b", "../up", "x y", &"k".repeat(129)] {
        assert!(
            matches!(store.save(key, &cp), Err(Error::InvalidRequest(_))),
            "{key:?}"
        );
    }
    std::fs::write(dir.path().join("junk.checkpoint"), "not a checkpoint").unwrap();
    let e = store.load("junk").unwrap_err();
    assert!(e.to_string().contains("junk.checkpoint"), "{e}");
    let big = "9".repeat(MAX_CHECKPOINT_BYTES as usize + 10);
    std::fs::write(dir.path().join("big.checkpoint"), format!("q:1:{big}")).unwrap();
    assert!(store.load("big").is_err());
    // No temporary file is left behind by saves.
    store.save("ok", &cp).unwrap();
    store.save("ok", &cp).unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
    store.clear("ok").unwrap();
    store.clear("ok").unwrap();
    // A store whose directory is a file cannot be made.
    assert!(matches!(
        FileCheckpointStore::new(dir.path().join("junk.checkpoint")),
        Err(Error::Io { .. })
    ));
}

#[tokio::test]
async fn a_cancelled_checkpointed_turn_stops_on_the_server_and_leaves_nothing_to_resume() {
    let (_nexus, client) = local().await;
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let session = client.session(["docs"]).build().unwrap();
    let turn = session
        .ask("How do I resume a broken stream?")
        .stream()
        .await
        .unwrap();
    let mut turn = CheckpointedTurn::new(turn, store.clone(), "job-3");
    turn.next().await.unwrap().unwrap();
    turn.next().await.unwrap().unwrap();
    let saved = store.load("job-3").unwrap().expect("a saved checkpoint");
    let query = turn.cancel().await.unwrap();
    assert_eq!(query.id, saved.query_id);
    assert_eq!(query.status, "cancelled");
    assert_eq!(store.load("job-3").unwrap(), None);
}
