//! One bound per turn: the client's `turn_timeout` (or the turn's own)
//! ends the turn whichever way it runs (`send`, `stream`, `background` and
//! `wait`, a checkpointed resume) against a server that keeps the
//! connection alive with keep-alives but never finishes the turn.

use std::time::{Duration, Instant};

use crate::support::sse_server;
use futures::StreamExt;
use nexus_knowql::query::{Checkpoint, CheckpointRecord, CheckpointStore, FileCheckpointStore};
use nexus_knowql::{CallOptions, CheckpointedTurn, Client, Error};
use sse_server::{Reply, SseServer, Step, Turn, last_event_id, query_json};

const Q: &str = "q_ob";
const S: &str = "s_ob";
const DELTAS: &[&str] = &["Travel ", "is approved ", "by your ", "manager."];

/// The bound under test.
const BOUND: Duration = Duration::from_millis(1000);
/// Far above the bound: a turn that gets here ignored it.
const GENEROUS: Duration = Duration::from_secs(20);

/// `events` then keep-alives for a minute: a live connection, no end.
fn stall(events: String) -> Reply {
    let mut steps = vec![Step::Write(events.into_bytes())];
    for _ in 0..600 {
        steps.push(Step::Sleep(Duration::from_millis(100)));
        steps.push(Step::Write(b": keep-alive\n\n".to_vec()));
    }
    Reply::sse(steps)
}

/// A server whose turn `Q` never ends: a streamed `POST /query` sends the
/// first three events then only keep-alives, a background one answers 202,
/// the stored turn stays `in_progress` and its events replay then stall.
async fn never_ending() -> SseServer {
    let turn = Turn::completed(Q, S, DELTAS);
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            if req.json()["background"] == serde_json::json!(true) {
                let body = query_json(Q, S, "in_progress", "");
                Reply::json(202, &[], &body)
            } else {
                stall(turn.first(3))
            }
        } else if req.is("GET", &format!("/queries/{Q}")) {
            Reply::json(200, &[], &query_json(Q, S, "in_progress", ""))
        } else if req.method == "GET" && req.path == turn.events_path() {
            let replay: String = turn
                .frames
                .iter()
                .filter(|(id, _)| id.is_some_and(|id| id >= last_event_id(req).unwrap_or(0)))
                .take(1)
                .map(|(_, f)| f.as_str())
                .collect();
            stall(replay)
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await
}

/// A client for `server` whose turns are bounded by [`BOUND`].
fn bounded(server: &SseServer) -> Client {
    server
        .client()
        .with_options(CallOptions::new().turn_timeout(BOUND))
}

/// Checks that `e` is the bound ending the turn, after `started`.
fn assert_bound_ended(e: &Error, started: Instant) {
    assert!(e.is_timeout(), "{e:?}");
    let took = started.elapsed();
    assert!(
        took >= BOUND.mul_f32(0.9),
        "ended before the bound: {took:?}"
    );
}

#[tokio::test]
async fn the_bound_ends_send() {
    let server = never_ending().await;
    let session = bounded(&server).session(["docs"]).build().unwrap();
    let started = Instant::now();
    let e = tokio::time::timeout(GENEROUS, session.ask("q").send())
        .await
        .expect("send() ends by the turn timeout")
        .unwrap_err();
    assert_bound_ended(&e, started);
    assert_eq!(server.count("POST", "/query"), 1);
}

#[tokio::test]
async fn the_bound_ends_stream() {
    let server = never_ending().await;
    let session = bounded(&server).session(["docs"]).build().unwrap();
    let started = Instant::now();
    let live = session.ask("q").stream().await.unwrap();
    let e = tokio::time::timeout(GENEROUS, live.finish())
        .await
        .expect("the stream ends by the turn timeout")
        .unwrap_err();
    assert_bound_ended(&e, started);
}

#[tokio::test]
async fn the_turns_own_bound_replaces_the_clients() {
    let server = never_ending().await;
    // The client waits long; the turn's own bound ends it.
    let session = server.client().session(["docs"]).build().unwrap();
    let started = Instant::now();
    let e = tokio::time::timeout(GENEROUS, session.ask("q").turn_timeout(BOUND).send())
        .await
        .expect("send() ends by the turn's own timeout")
        .unwrap_err();
    assert_bound_ended(&e, started);
}

#[tokio::test]
async fn the_bound_ends_a_background_wait() {
    let server = never_ending().await;
    let session = bounded(&server).session(["docs"]).build().unwrap();
    let mut handle = session.ask("q").background().await.unwrap();
    let started = Instant::now();
    let e = tokio::time::timeout(GENEROUS, handle.wait(nexus_knowql::WaitPolicy::default()))
        .await
        .expect("wait() ends by the turn timeout")
        .unwrap_err();
    assert_bound_ended(&e, started);
    assert!(server.count("GET", &format!("/queries/{Q}")) >= 1);
}

#[tokio::test]
async fn the_bound_ends_a_checkpointed_resume() {
    let server = never_ending().await;
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let checkpoint = Checkpoint::after_text(Q, 2, "");
    store
        .save("job", &CheckpointRecord::At(checkpoint))
        .unwrap();
    let client = bounded(&server);
    let started = Instant::now();
    let run = async {
        let mut turn = CheckpointedTurn::resume(&client, &store, "job")
            .await?
            .expect("the job is stored");
        while let Some(item) = turn.next().await {
            item?;
        }
        turn.finish().await
    };
    let e = tokio::time::timeout(GENEROUS, run)
        .await
        .expect("the resume ends by the turn timeout")
        .unwrap_err();
    assert_bound_ended(&e, started);
    assert!(server.count("GET", &format!("/queries/{Q}/events")) >= 1);
}
