//! The database's unit tests: what an acknowledgement waits for, what
//! closing waits for, and how failed writes are reported.

use super::*;

const LIMITS: QueryLimits = QueryLimits {
    count: 100,
    bytes: 1 << 20,
};

fn scratch(label: &str) -> std::path::PathBuf {
    let dir = crate::local::scratch_dir::fresh(label);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A database opened in a fresh scratch directory: `(dir, file, db)`.
fn scratch_db(label: &str) -> (std::path::PathBuf, std::path::PathBuf, Db) {
    let dir = scratch(label);
    let path = dir.join(DB_FILE);
    let (db, _) = Db::open(&path, Durability::Full, LIMITS).unwrap();
    (dir, path, db)
}

/// An op that reports on its channel whether the ops sent before it in
/// the same `send` were saved.
fn reported() -> (Op, mpsc::Receiver<bool>) {
    let (tx, rx) = mpsc::channel();
    let then = Op::Then(Box::new(move |ok| {
        let _ = tx.send(ok);
    }));
    (then, rx)
}

fn put(id: &str) -> Op {
    Op::PutContext {
        id: id.to_owned(),
        doc: "{}".to_owned(),
        new: false,
    }
}

/// A SIGKILL cannot see a commit that was never synced (the kernel still
/// holds it), so the setting that syncs is checked on the connections
/// the database uses (all made by `connect`).
#[test]
fn a_durable_database_syncs_its_log_at_every_commit() {
    let dir = scratch("sync");
    let (db, _) = Db::open(&dir.join(DB_FILE), Durability::Full, LIMITS).unwrap();
    // 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA: in WAL mode only FULL and EXTRA
    // sync the log before a commit returns.
    let sync: i64 = db
        .read(|c| c.pragma_query_value(None, "synchronous", |r| r.get(0)))
        .unwrap();
    assert!(sync >= 2, "synchronous is {sync}, not FULL");
    let mode: String = db
        .read(|c| c.pragma_query_value(None, "journal_mode", |r| r.get(0)))
        .unwrap();
    assert_eq!(mode, "wal");
    db.close();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn nothing_is_acknowledged_before_its_commit() {
    let (dir, path, db) = scratch_db("ack");
    // Another connection holds the write lock: the writer's commit
    // waits for it (busy timeout).
    let blocker = connect(&path, Durability::Full).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (then, rx) = reported();
    let n = db.send([put("a"), then]);
    // The newest op's number is known at once; it is saved only later.
    assert_eq!(db.sent(), n);
    assert!(n >= 2, "two ops are two numbers");
    assert_eq!(
        db.wait_saved(n, Duration::from_millis(300)).await,
        Saved::Unknown,
        "acknowledged while its commit was blocked"
    );
    assert!(rx.try_recv().is_err(), "the callback ran before the commit");
    assert!(db.saved() < n);
    blocker.execute_batch("COMMIT").unwrap();
    assert_eq!(db.wait_saved(n, Duration::from_secs(10)).await, Saved::Yes);
    assert_eq!(db.saved(), n);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(true));
    // On disk: a new connection reads it.
    let doc: String = connect(&path, Durability::Full)
        .unwrap()
        .query_row("SELECT doc FROM contexts WHERE id = 'a'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(doc, "{}");
    db.close();
    drop(blocker);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Whether context `id` is on disk, read through a new connection.
pub(crate) fn on_disk(path: &Path, id: &str) -> bool {
    connect(path, Durability::Full)
        .unwrap()
        .query_row("SELECT count(*) FROM contexts WHERE id = ?1", [id], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap()
        == 1
}

/// Holds the database's write lock from another connection until
/// `release` fires, so the writer's commit waits (busy timeout).
pub(crate) fn block_writes(path: &Path) -> mpsc::Sender<()> {
    let blocker = connect(path, Durability::Full).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (release, released) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let _ = released.recv();
        blocker.execute_batch("COMMIT").unwrap();
    });
    release
}

/// Catches `close` or `Drop for Db` doing nothing: ops sent and not waited
/// for are committed before closing returns, even when the commit is held
/// up.
#[test]
fn closing_waits_for_everything_sent() {
    for by_drop in [false, true] {
        let (dir, path, db) = scratch_db("close");
        let release = block_writes(&path);
        db.send([put("a"), put("b")]);
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let _ = release.send(());
        });
        if by_drop {
            drop(db);
        } else {
            db.close();
        }
        assert!(
            on_disk(&path, "a") && on_disk(&path, "b"),
            "closed (by drop: {by_drop}) before its commit"
        );
        releaser.join().unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// Catches the saved mark passing a lost batch and writes going on after
/// it (the `has_failed` check in the writer or in `send` removed): once a
/// batch fails, it and every later write are reported not saved, none
/// reaches the disk, and the backlog empties.
#[tokio::test]
async fn nothing_is_written_after_a_lost_batch() {
    let (dir, path, db) = scratch_db("lost");
    let kept = db.send([put("kept")]);
    assert_eq!(
        db.wait_saved(kept, Duration::from_secs(10)).await,
        Saved::Yes
    );
    // Contexts named `lost…` cannot be written.
    connect(&path, Durability::Full)
        .unwrap()
        .execute_batch(
            "CREATE TRIGGER refuse BEFORE INSERT ON contexts WHEN NEW.id LIKE 'lost%'
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
        )
        .unwrap();
    let (then, rx) = reported();
    let lost = db.send([put("lost-1"), then]);
    assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Ok(false));
    assert!(db.has_failed());
    let (then, rx) = reported();
    let after = db.send([put("after"), then]);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(false));
    for n in [lost, after] {
        assert_eq!(db.wait_saved(n, Duration::from_secs(1)).await, Saved::No);
    }
    assert_eq!(db.saved(), kept, "the saved mark passed a lost batch");
    assert_eq!(db.backlog_bytes(), 0);
    db.close();
    assert!(on_disk(&path, "kept"));
    assert!(!on_disk(&path, "lost-1") && !on_disk(&path, "after"));
    std::fs::remove_dir_all(dir).unwrap();
}

/// Catches a backlog that does not count what waits (or never shrinks):
/// while the writer is held up the bytes sent are counted; once written,
/// none are.
#[test]
fn the_backlog_counts_the_bytes_waiting() {
    let (dir, path, db) = scratch_db("backlog");
    let release = block_writes(&path);
    db.send([Op::PutContext {
        id: "big".to_owned(),
        doc: "x".repeat(100_000),
        new: true,
    }]);
    assert!(db.backlog_bytes() >= 100_000);
    release.send(()).unwrap();
    db.close();
    assert_eq!(db.backlog_bytes(), 0);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Catches the writer committing one send at a time (`batch.len() <
/// MAX_BATCH` as `==` or `>`): what waits while a commit is held up is
/// committed in one transaction, so when the callback of the first waiting
/// send runs, the send after it is already on disk.
#[test]
fn sends_that_wait_are_committed_together() {
    let (dir, path, db) = scratch_db("batch");
    let release = block_writes(&path);
    // The writer takes the first send and waits for the lock.
    let first = db.send([put("first")]);
    let (tx, rx) = mpsc::channel();
    let check = path.clone();
    db.send([
        put("second"),
        Op::Then(Box::new(move |ok| {
            let _ = tx.send((ok, on_disk(&check, "third")));
        })),
    ]);
    let third = db.send([put("third")]);
    release.send(()).unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(30)),
        Ok((true, true)),
        "the send after the callback's was not in its transaction"
    );
    assert!(first < third && db.saved() >= third);
    db.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// Catches a database of earlier versions (turns without a `session_id`
/// column) left unpaged: opening it adds the column, fills it from the
/// turns' documents, and a session's page lists its turns newest first.
#[test]
fn an_older_database_gets_its_turns_tagged_with_their_session() {
    let dir = scratch("older");
    let path = dir.join(DB_FILE);
    {
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE queries (
                seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
                terminal INTEGER NOT NULL, bytes INTEGER NOT NULL, doc TEXT NOT NULL, trace TEXT);
             INSERT INTO queries (id, terminal, bytes, doc) VALUES
                ('q1', 1, 2, '{\"id\":\"q1\",\"session_id\":\"s1\"}'),
                ('q2', 1, 2, '{\"id\":\"q2\",\"session_id\":\"s2\"}'),
                ('q3', 1, 2, '{\"id\":\"q3\",\"session_id\":\"s1\"}');",
        )
        .unwrap();
    }
    let (db, _) = Db::open(&path, Durability::Full, LIMITS).unwrap();
    let ids = |rows: Option<Vec<(String, String)>>| -> Vec<String> {
        rows.unwrap().into_iter().map(|(id, _)| id).collect()
    };
    assert_eq!(ids(db.session_turns("s1", 10, 0)), ["q3", "q1"]);
    assert_eq!(ids(db.session_turns("s1", 1, 1)), ["q1"]);
    assert_eq!(ids(db.session_turns("s2", 10, 0)), ["q2"]);
    // New turns carry their session.
    let n = db.send([Op::PutQuery {
        id: "q4".to_owned(),
        session_id: "s2".to_owned(),
        terminal: true,
        doc: "{}".to_owned(),
        trace: None,
        // A turn's first ended row carries its events (a change to an
        // ended turn whose row is gone writes nothing).
        events: Some(Vec::new()),
        new: true,
    }]);
    assert!(db.wait_saved_blocking(n, Duration::from_secs(10)));
    assert_eq!(ids(db.session_turns("s2", 10, 0)), ["q4", "q2"]);
    db.close();
    drop(db);
    // Opening again changes nothing.
    let (db, _) = Db::open(&path, Durability::Full, LIMITS).unwrap();
    assert_eq!(ids(db.session_turns("s1", 10, 0)), ["q3", "q1"]);
    db.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// Catches a creation written with `INSERT OR REPLACE` (or an upsert): a
/// new record whose id a row already has fails its write and leaves that
/// row as it was; a known record's write updates its row.
#[tokio::test]
async fn a_new_record_never_replaces_a_row() {
    let (dir, path, db) = scratch_db("collide");
    let doc = |text: &str| Op::PutContext {
        id: "ctx_1".to_owned(),
        doc: text.to_owned(),
        new: true,
    };
    let first = db.send([doc(r#"{"slug":"docs"}"#)]);
    assert_eq!(
        db.wait_saved(first, Duration::from_secs(10)).await,
        Saved::Yes
    );
    let update = db.send([Op::PutContext {
        id: "ctx_1".to_owned(),
        doc: r#"{"slug":"docs","name":"Docs"}"#.to_owned(),
        new: false,
    }]);
    assert_eq!(
        db.wait_saved(update, Duration::from_secs(10)).await,
        Saved::Yes
    );
    let (then, rx) = reported();
    let clash = db.send([doc(r#"{"slug":"scratch"}"#), then]);
    assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Ok(false));
    assert_eq!(
        db.wait_saved(clash, Duration::from_secs(1)).await,
        Saved::No
    );
    db.close();
    let kept: String = connect(&path, Durability::Full)
        .unwrap()
        .query_row("SELECT doc FROM contexts WHERE id = 'ctx_1'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(kept, r#"{"slug":"docs","name":"Docs"}"#);
    std::fs::remove_dir_all(dir).unwrap();
}
