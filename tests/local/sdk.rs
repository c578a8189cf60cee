//! The SDK's query engine end to end against the local Nexus: every mode,
//! sessions over several turns, resume through injected cuts, cancel.

use std::time::Duration;

use crate::support::local as local_support;
use futures::StreamExt;
use local_support::*;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::{Error, QueryEvent, StreamConfig, TurnView};

#[tokio::test]
async fn send_returns_the_completed_turn() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let session = client.session(["docs"]).build().unwrap();
    let q = session
        .ask("How long does green tea steep?")
        .send()
        .await
        .unwrap();
    assert_eq!(q.status, "completed");
    assert!(q.answer_text().contains("two minutes"));
    assert_eq!(q.citations[0].source, "guide/tea.md");
    assert_eq!(session.id().as_deref(), Some(q.session_id.as_str()));
}

#[tokio::test]
async fn stream_delivers_text_steps_and_the_final_query() {
    let (_server, client, _dir) =
        seeded(LocalNexus::builder().frame_delay(Duration::from_millis(1))).await;
    let session = client.session(["docs"]).build().unwrap();
    let mut turn = session
        .ask("how do I resume a stream")
        .stream()
        .await
        .unwrap();
    let mut text = String::new();
    let mut step_events = 0;
    while let Some(event) = turn.next().await {
        match event.unwrap() {
            QueryEvent::TextDelta { delta } => text.push_str(&delta),
            QueryEvent::Step(_) => step_events += 1,
            _ => {}
        }
    }
    assert_eq!(step_events, 4);
    assert_eq!(turn.steps().len(), 2, "steps merge by step_id");
    assert!(turn.steps().iter().all(|s| s.status == "completed"));
    let q = turn.finish().await.unwrap();
    assert_eq!(q.answer_text(), text);
    assert!(text.contains("Last-Event-ID"));
}

#[tokio::test]
async fn text_stream_survives_cuts_with_exactly_once_text() {
    // Live cuts while the turn runs, and cuts of replays of a finished log.
    for delay in [Duration::from_millis(2), Duration::ZERO] {
        cut_and_resume(delay).await;
    }
}

async fn cut_and_resume(frame_delay: Duration) {
    let (_server, client, _dir) = seeded(
        LocalNexus::builder()
            .cut_streams_after(3)
            .frame_delay(frame_delay),
    )
    .await;
    let session = client.session(["docs"]).build().unwrap();
    let turn = session
        .ask("how do I resume a broken stream")
        .stream_config(
            StreamConfig::default()
                .reconnect_attempts(1000)
                .reconnect_delay(Duration::from_millis(1), Duration::from_millis(5)),
        )
        .stream()
        .await
        .unwrap();
    let mut text_stream = turn.text_stream();
    let mut text = String::new();
    while let Some(delta) = text_stream.next().await {
        text.push_str(&delta.unwrap());
    }
    let q = text_stream.into_inner().finish().await.unwrap();
    let stored = client.queries().get(&q.id).await.unwrap();
    assert_eq!(text, stored.answer_text(), "each delta exactly once");
    assert!(text.contains("reconnect with the Last-Event-ID header"));
    // One turn in one session: a resume that posted the question again
    // (in this session or a new one) would show a second turn.
    let sessions = client.sessions().list().await.unwrap();
    assert_eq!(sessions.len(), 1, "exactly one session: {sessions:?}");
    let stored_session = client.sessions().get(&q.session_id).await.unwrap();
    assert_eq!(stored_session.queries.len(), 1, "exactly one turn");
}

#[tokio::test]
async fn background_turns_can_be_waited_for_or_followed() {
    let (_server, client, _dir) =
        seeded(LocalNexus::builder().frame_delay(Duration::from_millis(2))).await;
    let session = client.session(["docs"]).build().unwrap();
    let mut handle = session.ask("black tea").background().await.unwrap();
    assert_eq!(handle.last_seen().status, "in_progress");
    let q = handle
        .wait(nexus_knowql::WaitPolicy::default())
        .await
        .unwrap();
    assert_eq!(q.status, "completed");
    assert!(q.answer_text().contains("four minutes"));

    let handle = session.ask("and green?").background().await.unwrap();
    let id = handle.id().to_owned();
    let mut turn = handle.events().await.unwrap();
    let mut text = String::new();
    while let Some(e) = turn.next().await {
        if let QueryEvent::TextDelta { delta } = e.unwrap() {
            text.push_str(&delta);
        }
    }
    let q = turn.finish().await.unwrap();
    assert_eq!(q.id, id);
    assert_eq!(q.answer_text(), text);
    assert!(text.contains("two minutes"), "{text}");
}

#[tokio::test]
async fn a_session_carries_several_turns() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let session = client.session(["docs"]).build().unwrap();
    let first = session.ask("green tea").send().await.unwrap();
    let second = session.ask("what about black?").send().await.unwrap();
    let third = session
        .ask("lighthouse ships")
        .stream()
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(second.session_id, first.session_id);
    assert_eq!(third.session_id, first.session_id);
    assert_eq!(second.previous_query_id.as_deref(), Some(first.id.as_str()));
    assert_eq!(third.previous_query_id.as_deref(), Some(second.id.as_str()));
    assert!(second.answer_text().contains("four minutes"));
    assert!(third.answer_text().contains("42 ships"));
    let stored = session.get().await.unwrap();
    assert_eq!(stored.queries.len(), 3);
    // The same session continued from a turn id.
    let again = client.continue_after(third.id.clone());
    let fourth = again.ask("green tea").send().await.unwrap();
    assert_eq!(fourth.session_id, first.session_id);
}

#[tokio::test]
async fn cancel_ends_a_streaming_turn_as_cancelled() {
    let (_server, client, _dir) =
        seeded(LocalNexus::builder().frame_delay(Duration::from_millis(100))).await;
    let session = client.session(["docs"]).build().unwrap();
    let mut turn = session.ask("tea").stream().await.unwrap();
    // Wait until the turn has started, then cancel it.
    while turn.query_id().is_none() {
        turn.next().await.unwrap().unwrap();
    }
    let q = turn.cancel().await.unwrap();
    assert_eq!(q.status, "cancelled");
    // The session is free again.
    let next = session.ask("green tea").send().await.unwrap();
    assert_eq!(next.status, "completed");
}

#[tokio::test]
async fn a_failed_shape_surfaces_as_turn_failed() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let session = client.session(["docs"]).build().unwrap();
    let shape = serde_json::json!({
        "type": "object",
        "properties": {"ships": {"type": "integer"}, "organic": {"type": "boolean"}},
        "required": ["organic"]
    });
    let err = session
        .ask("lighthouse ships")
        .shape(shape.as_object().unwrap().clone())
        .stream()
        .await
        .unwrap()
        .finish()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TurnFailed { .. }), "{err:?}");
    #[derive(serde::Deserialize)]
    struct Ships {
        ships: i64,
    }
    let shape = serde_json::json!({"type": "object", "properties": {"ships": {"type": "integer"}}});
    let got: Ships = session
        .ask("how many ships does the lighthouse keeper count")
        .shape(shape.as_object().unwrap().clone())
        .stream()
        .await
        .unwrap()
        .finish()
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(got.ships, 42);
}
