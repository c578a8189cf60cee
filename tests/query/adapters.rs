//! Adapters stack over one turn and give it back: a checkpointed turn read
//! as numbered events, and a typed, checkpointed turn read as text, each
//! finished through every layer.

use std::time::Duration;

use crate::support::sse_server;
use futures::StreamExt;
use nexus_knowql::query::{CheckpointRecord, CheckpointStore, FileCheckpointStore};
use nexus_knowql::{CheckpointedTurn, QueryTurn, StreamConfig, TurnView};
use sse_server::{Reply, SseServer, Step, Turn};

const DELTAS: &[&str] = &["Travel ", "is approved ", "by your ", "manager."];

/// A server that streams `turn` whole.
async fn serve(turn: &Turn) -> SseServer {
    let body = turn.body();
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(body.clone().into_bytes())])
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await
}

async fn stream(server: &SseServer) -> QueryTurn {
    let config = StreamConfig::default()
        .reconnect_delay(Duration::from_millis(5), Duration::from_millis(50));
    server
        .client()
        .session(["docs"])
        .build()
        .unwrap()
        .ask("Who approves travel?")
        .stream_config(config)
        .stream()
        .await
        .unwrap()
}

/// The record `store` holds under `key`, which must be a position in `query_id`.
fn saved_position(store: &FileCheckpointStore, key: &str, query_id: &str) {
    match store.load(key).unwrap() {
        Some(CheckpointRecord::At(cp)) => assert_eq!(cp.query_id, query_id),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_checkpointed_turn_read_as_numbered_events_gives_the_turn_back() {
    let turn = Turn::completed("q_ad1", "s_ad1", DELTAS);
    let server = serve(&turn).await;
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let mut events = CheckpointedTurn::new(stream(&server).await, &store, "job").sequenced();
    let mut ids = Vec::new();
    while let Some(numbered) = events.next().await {
        ids.push(numbered.unwrap().id);
    }
    // The script's ids; the id-less `query` frame keeps the one before it.
    let mut expected = Vec::new();
    let mut last = None;
    for (id, _) in &turn.frames {
        last = id.or(last);
        expected.push(last);
    }
    assert_eq!(ids, expected);
    let checkpointed = events.into_inner();
    assert_eq!(checkpointed.turn().text(), turn.answer);
    let query = checkpointed.finish().await.unwrap();
    assert_eq!(query.answer_text(), turn.answer);
    saved_position(&store, "job", "q_ad1");
}

#[cfg(feature = "schema")]
#[tokio::test]
async fn a_typed_checkpointed_turn_read_as_text_decodes_its_answer() {
    use nexus_knowql::typed::TypedTurn;

    /// The script's `output_json` is `{"answer": <the answer text>}`.
    #[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
    struct Answer {
        answer: String,
    }

    let turn = Turn::completed("q_ad2", "s_ad2", DELTAS);
    let server = serve(&turn).await;
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let job = CheckpointedTurn::new(stream(&server).await, &store, "job");
    let mut text = TypedTurn::<Answer, _>::new(job).unwrap().text_stream();
    let mut streamed = String::new();
    while let Some(delta) = text.next().await {
        streamed.push_str(&delta.unwrap());
    }
    assert_eq!(streamed, turn.answer);
    let typed = text.into_inner();
    assert_eq!(typed.turn().query_id(), Some("q_ad2"));
    let answer = typed.finish().await.unwrap();
    assert_eq!(answer.value.answer, turn.answer);
    assert_eq!(answer.query.answer_text(), turn.answer);
    saved_position(&store, "job", "q_ad2");
}
