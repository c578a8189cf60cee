//! Checkpoints that persist themselves: a turn read through
//! `CheckpointedTurn` keeps its record in a `FileCheckpointStore`; a
//! "crash" mid-answer and `CheckpointedTurn::resume` finish the same turn
//! with the verified path, and the two parts add up to the stored answer.
//! A checkpoint that does not prove the stored answer's beginning is a
//! failure recorded under the key, never a position; a job that died
//! between `POST /query` and its first checkpoint finds its turn again.
use std::cell::Cell;
use std::time::Duration;

use futures::StreamExt;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::query::{
    Checkpoint, CheckpointError, CheckpointRecord, CheckpointStore, CheckpointedTurn,
    FileCheckpointStore, MAX_CHECKPOINT_BYTES,
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

/// The checkpoint stored under `key`, if the record is one.
fn at(store: &impl CheckpointStore, key: &str) -> Option<Checkpoint> {
    match store.load(key).unwrap() {
        Some(CheckpointRecord::At(cp)) => Some(cp),
        _ => None,
    }
}

/// Reads `turn` to its end: the text delivered and the first error.
async fn drain<S: CheckpointStore + Unpin>(
    turn: &mut CheckpointedTurn<S>,
) -> (String, Option<Error>) {
    let mut text = String::new();
    let mut error = None;
    while let Some(event) = turn.next().await {
        match event {
            Ok(QueryEvent::TextDelta { delta }) => text.push_str(&delta),
            Ok(_) => {}
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    (text, error)
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
    let saved = at(&store, "job-1").expect("a saved checkpoint");
    assert_eq!(saved.text_len, handled.len() as u64, "{in_hand:?}");
    // The checkpoint proves the text handled, computed here from the text.
    assert_eq!(
        saved.digest,
        Checkpoint::after_text(&saved.query_id, saved.event_id, &handled).digest
    );
    assert!(saved.event_id > 0);
    assert_eq!(first.saved(), Some(&saved));
    drop(first);

    let mut second = CheckpointedTurn::resume(&client, store.clone(), "job-1")
        .await
        .unwrap()
        .expect("the stored checkpoint");
    assert_eq!(second.resumed_from(), Some(&saved));
    let mut rest = String::new();
    while let Some(event) = second.next().await {
        if let QueryEvent::TextDelta { delta } = event.unwrap() {
            rest.push_str(&delta);
        }
        // Every handled event moves the stored checkpoint on.
        let now = at(&store, "job-1").unwrap();
        assert!(now.event_id >= saved.event_id && now.text_len >= saved.text_len);
    }
    let query = second.finish().await.unwrap();
    assert_eq!(format!("{handled}{rest}"), query.answer_text());
    // The key keeps the final checkpoint, which proves the whole answer: a
    // process that died after `finish` resumes to nothing more.
    let last = at(&store, "job-1").unwrap();
    assert_eq!(last.text_len, query.answer_text().len() as u64);
    assert!(last.proves_prefix_of(query.answer_text()));
    let mut again = CheckpointedTurn::resume(&client, store.clone(), "job-1")
        .await
        .unwrap()
        .unwrap();
    let (more, error) = drain(&mut again).await;
    assert!(more.is_empty() && error.is_none(), "{more:?} {error:?}");
    assert_eq!(again.finish().await.unwrap().id, query.id);
    // Once the job's result is handed on, the key is cleared.
    store.clear("job-1").unwrap();
    assert!(
        CheckpointedTurn::resume(&client, store, "job-1")
            .await
            .unwrap()
            .is_none()
    );
}

/// A checkpoint of the right turn and length whose text is not the
/// answer's beginning (what a splice of two answers, or a checkpoint saved
/// from events later shown wrong, looks like).
fn forged(cp: &Checkpoint) -> Checkpoint {
    let wrong = "x".repeat(usize::try_from(cp.text_len).unwrap());
    Checkpoint::after_text(&cp.query_id, cp.event_id, &wrong)
}

#[tokio::test]
async fn a_checkpoint_that_does_not_prove_the_answer_is_a_recorded_failure() {
    let (_nexus, client) = local().await;
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let session = client.session(["docs"]).build().unwrap();
    let turn = session
        .ask("How do I resume a broken stream?")
        .stream()
        .await
        .unwrap();
    let mut first = CheckpointedTurn::new(turn, store.clone(), "job-f");
    let mut deltas = 0;
    while deltas < 2 {
        if let QueryEvent::TextDelta { .. } = first.next().await.unwrap().unwrap() {
            deltas += 1;
        }
    }
    first.next().await.unwrap().unwrap();
    let honest = at(&store, "job-f").unwrap();
    drop(first);
    store
        .save("job-f", &CheckpointRecord::At(forged(&honest)))
        .unwrap();

    // The turn is still running: the rest streams, and the final answer
    // does not begin with the text the checkpoint proves.
    let mut second = CheckpointedTurn::resume(&client, store.clone(), "job-f")
        .await
        .unwrap()
        .unwrap();
    let (_, error) = drain(&mut second).await;
    assert!(
        matches!(error, Some(Error::AnswerMismatch { .. })),
        "{error:?}"
    );
    assert!(second.finish().await.is_err());
    // The key records the failure, not a position to resume from.
    match store.load("job-f").unwrap() {
        Some(CheckpointRecord::Failed(f)) => assert_eq!(f.query_id, honest.query_id),
        other => panic!("{other:?}"),
    }
    let again = CheckpointedTurn::resume(&client, store.clone(), "job-f").await;
    assert!(
        matches!(
            again,
            Err(Error::Checkpoint(CheckpointError::Failed { .. }))
        ),
        "{again:?}"
    );

    // Now the turn has completed: `resume_from` refuses the forged
    // checkpoint at once, and the key records that too.
    store
        .save("job-f", &CheckpointRecord::At(forged(&honest)))
        .unwrap();
    let handle = client.queries().attach(&honest.query_id).await.unwrap();
    assert!(matches!(
        handle.resume_from(&forged(&honest)).await,
        Err(Error::AnswerMismatch { .. })
    ));
    let resumed = CheckpointedTurn::resume(&client, store.clone(), "job-f").await;
    assert!(
        matches!(resumed, Err(Error::AnswerMismatch { .. })),
        "{resumed:?}"
    );
    assert!(matches!(
        store.load("job-f").unwrap(),
        Some(CheckpointRecord::Failed(_))
    ));
    // The honest checkpoint still resumes to the exact answer.
    store
        .save("job-f", &CheckpointRecord::At(honest.clone()))
        .unwrap();
    let mut third = CheckpointedTurn::resume(&client, store.clone(), "job-f")
        .await
        .unwrap()
        .unwrap();
    let (rest, error) = drain(&mut third).await;
    assert!(error.is_none(), "{error:?}");
    let query = third.finish().await.unwrap();
    assert!(query.answer_text().ends_with(&rest));
    assert!(honest.proves_prefix_of(query.answer_text()));
    assert_eq!(
        honest.text_len as usize + rest.len(),
        query.answer_text().len()
    );
}

#[tokio::test]
async fn a_job_that_died_before_its_first_checkpoint_finds_its_turn_again() {
    let (_nexus, client) = local().await;
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let question = "What is a context?";
    let ask = || client.session(["docs"]).build().unwrap().ask(question);
    // An earlier job asked the same: its turn is not this job's.
    let earlier = ask().send().await.unwrap();
    let first = CheckpointedTurn::start_or_resume(&client, store.clone(), "job-s", ask())
        .await
        .unwrap();
    // The process dies with the turn posted, before any event was handled.
    assert!(matches!(
        store.load("job-s").unwrap(),
        Some(CheckpointRecord::Starting(_))
    ));
    drop(first);
    let mut second = CheckpointedTurn::start_or_resume(&client, store.clone(), "job-s", ask())
        .await
        .unwrap();
    let resumed = second
        .resumed_from()
        .cloned()
        .expect("attached, not started");
    assert_ne!(resumed.query_id, earlier.id);
    assert_eq!(resumed.text_len, 0);
    let (text, error) = drain(&mut second).await;
    assert!(error.is_none(), "{error:?}");
    let query = second.finish().await.unwrap();
    assert_eq!(query.id, resumed.query_id);
    assert_eq!(text, query.answer_text());
    // Two turns on the server: the earlier job's and this job's one.
    let sessions = client.sessions().list().await.unwrap();
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    // A finished job resumes to its own turn, never a new one.
    let done = CheckpointedTurn::start_or_resume(&client, store.clone(), "job-s", ask())
        .await
        .unwrap();
    assert_eq!(done.finish().await.unwrap().id, query.id);
    assert_eq!(client.sessions().list().await.unwrap().len(), 2);
}

/// A store whose saves fail from the `fail_from`-th on.
struct Flaky {
    inner: FileCheckpointStore,
    saves: Cell<usize>,
    fail_from: usize,
}

impl CheckpointStore for Flaky {
    fn load(&self, key: &str) -> nexus_knowql::Result<Option<CheckpointRecord>> {
        self.inner.load(key)
    }
    fn save(&self, key: &str, record: &CheckpointRecord) -> nexus_knowql::Result<()> {
        self.saves.set(self.saves.get() + 1);
        if self.saves.get() >= self.fail_from {
            return Err(Error::InvalidRequest("disk full".into()));
        }
        self.inner.save(key, record)
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
    let kept = at(&store.inner, "job-2").unwrap();
    assert_eq!(turn.saved(), Some(&kept));
    // `finish` reports the store's error rather than going on unsaved.
    assert!(
        turn.finish()
            .await
            .unwrap_err()
            .to_string()
            .contains("disk full")
    );
    assert_eq!(at(&store.inner, "job-2"), Some(kept));
}

#[test]
fn the_file_store_refuses_bad_keys_and_files_that_are_not_records() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let cp = CheckpointRecord::At(Checkpoint::after_text("q_1", 5, "0123456789"));
    for key in ["", ".hidden", "a/b", "../up", "x y", &"k".repeat(129)] {
        assert!(
            matches!(store.save(key, &cp), Err(Error::InvalidRequest(_))),
            "{key:?}"
        );
    }
    let unreadable = |key: &str| match store.load(key) {
        Err(Error::Checkpoint(e @ CheckpointError::Unreadable { .. })) => e.to_string(),
        other => panic!("{key}: {other:?}"),
    };
    std::fs::write(dir.path().join("junk.checkpoint"), "SECRET-JUNK").unwrap();
    let e = unreadable("junk");
    assert!(
        e.contains("junk.checkpoint") && e.contains("remove it"),
        "{e}"
    );
    assert!(!e.contains("SECRET"), "{e}");
    let big = "9".repeat(MAX_CHECKPOINT_BYTES as usize + 10);
    std::fs::write(dir.path().join("big.checkpoint"), big).unwrap();
    unreadable("big");
    // A record written for another key (a file copied or renamed).
    store.save("other", &cp).unwrap();
    std::fs::copy(
        dir.path().join("other.checkpoint"),
        dir.path().join("mine.checkpoint"),
    )
    .unwrap();
    assert!(unreadable("mine").contains("another key"));
    // An old checkpoint without a digest is not a record.
    std::fs::write(dir.path().join("old.checkpoint"), "q_1:5:10\n").unwrap();
    unreadable("old");
    // A symbolic link is not followed, and its target never shows.
    #[cfg(unix)]
    {
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "nexus-checkpoint 1 link TOP-SECRET\n").unwrap();
        std::os::unix::fs::symlink(&secret, dir.path().join("link.checkpoint")).unwrap();
        let e = unreadable("link");
        assert!(
            e.contains("symbolic link") && !e.contains("TOP-SECRET"),
            "{e}"
        );
    }
    // Saves leave no temporary file; a crashed save's leftovers of the key
    // go with its next load, others' stay.
    for leftover in [".ok.4242.7.tmp", ".ok.x.tmp", ".ok.b.4242.7.tmp"] {
        std::fs::write(dir.path().join(leftover), "half").unwrap();
    }
    store.save("ok", &cp).unwrap();
    store.save("ok", &cp).unwrap();
    assert_eq!(store.load("ok").unwrap(), Some(cp));
    let mut tmps: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    tmps.sort();
    assert_eq!(tmps, [".ok.b.4242.7.tmp", ".ok.x.tmp"]);
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
    let saved = at(&store, "job-3").expect("a saved checkpoint");
    let query = turn.cancel().await.unwrap();
    assert_eq!(query.id, saved.query_id);
    assert_eq!(query.status, "cancelled");
    assert_eq!(store.load("job-3").unwrap(), None);
}
