//! `QueryTurn::sequenced`: every delivered event carries the turn's event
//! id, across a cut and a resume, and past a gap made up from the stored
//! turn.

use std::time::Duration;

use crate::support::sse_server;
use futures::TryStreamExt;
use nexus_knowql::query::{END_OF_TURN, SequencedEvent};
use nexus_knowql::{QueryEvent, StreamConfig, TurnView};
use sse_server::{Reply, SseServer, Step, Turn, last_event_id, query_json};

const DELTAS: &[&str] = &["Travel ", "is approved ", "by your ", "manager."];

/// The POST sends the first `cut` frames; a resume is answered by `resume`.
async fn server(
    turn: &Turn,
    cut: usize,
    resume: impl Fn(&Turn, Option<u64>) -> Reply + Send + Sync + 'static,
) -> SseServer {
    let t = turn.clone();
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(t.first(cut).into_bytes())])
        } else if req.method == "GET" && req.path == t.events_path() {
            resume(&t, last_event_id(req))
        } else if req.is("GET", &format!("/queries/{}", t.query_id)) {
            Reply::json(
                200,
                &[],
                &query_json(&t.query_id, &t.session_id, "completed", &t.answer),
            )
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await
}

async fn sequenced(server: &SseServer) -> (Vec<SequencedEvent>, nexus_knowql::types::Query) {
    let config = StreamConfig::default()
        .reconnect_delay(Duration::from_millis(5), Duration::from_millis(50));
    let mut events = server
        .client()
        .session(["handbook"])
        .build()
        .unwrap()
        .ask("Who approves travel?")
        .stream_config(config)
        .stream()
        .await
        .unwrap()
        .sequenced();
    let mut got = Vec::new();
    while let Some(e) = events.try_next().await.unwrap() {
        assert_eq!(e.id, events.turn().last_event_id());
        got.push(e);
    }
    let query = events.into_inner().finish().await.unwrap();
    (got, query)
}

// Frame ids of `Turn::completed` with four deltas: 1 created, 2 step,
// 3..=6 deltas, 7 step, 8 rollup, 9 completed, then the id-less `query`.

#[tokio::test]
async fn each_event_carries_its_id_across_a_resume() {
    let turn = Turn::completed("q_sq1", "s_sq1", DELTAS);
    // Cut after the second delta (id 4); the resume replays from 4.
    let server = server(&turn, 4, |t, from| {
        Reply::sse(vec![Step::Write(t.replay_from(from).into_bytes())])
    })
    .await;
    let (events, query) = sequenced(&server).await;
    let ids: Vec<Option<u64>> = events.iter().map(|e| e.id).collect();
    let mut want: Vec<Option<u64>> = (1..=9).map(Some).collect();
    want.push(Some(9)); // the `query` frame has no id of its own
    assert_eq!(ids, want);
    assert!(matches!(events[9].event, QueryEvent::Query(_)));
    assert_eq!(server.last_event_ids(), vec![Some("4".to_owned())]);
    assert_eq!(query.answer_text(), turn.answer);
}

#[tokio::test]
async fn the_rest_taken_from_the_stored_turn_is_at_the_end_of_the_turn() {
    let turn = Turn::completed("q_sq2", "s_sq2", DELTAS);
    // The event log is gone after the cut at id 4.
    let server = server(&turn, 4, |_, _| {
        Reply::json(
            410,
            &[],
            &serde_json::json!({"message": "event log expired"}),
        )
    })
    .await;
    let (events, query) = sequenced(&server).await;
    let ids: Vec<Option<u64>> = events.iter().map(|e| e.id).collect();
    assert_eq!(&ids[..4], &[Some(1), Some(2), Some(3), Some(4)]);
    assert_eq!(
        events[4].event,
        QueryEvent::TextDelta {
            delta: "by your manager.".into()
        }
    );
    assert!(
        ids[4..].iter().all(|id| *id == Some(END_OF_TURN)),
        "{ids:?}"
    );
    assert_eq!(query.answer_text(), turn.answer);
}
