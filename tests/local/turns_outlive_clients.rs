//! Turns that outlive their client, end to end against the local Nexus:
//! attach from a second client, continue after a checkpoint, `send()`
//! across cut connections, a dropped turn and the next `ask()`.

use std::time::Duration;

use crate::support::local as local_support;
use crate::support::wait::until_some;
use futures::StreamExt;
use local_support::*;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::{Error, QueryEvent, StreamConfig, WaitPolicy, WhenBusy};

fn fast() -> StreamConfig {
    StreamConfig::default()
        .reconnect_delay(Duration::from_millis(1), Duration::from_millis(5))
        .reconnect_attempts(50)
}

#[tokio::test]
async fn a_second_client_attaches_and_finishes_a_turn_another_client_started() {
    let (server, first_client, _dir) =
        seeded(LocalNexus::builder().frame_delay(Duration::from_millis(20))).await;
    let session = first_client.session(["docs"]).build().unwrap();
    let mut live = session
        .ask("How do I resume a broken stream?")
        .stream()
        .await
        .unwrap();
    // Read until some of the answer arrived, then checkpoint and "crash".
    let mut before = Vec::new();
    while !before
        .iter()
        .any(|e| matches!(e, QueryEvent::TextDelta { .. }))
    {
        before.push(live.next().await.unwrap().unwrap());
    }
    let query_id = live.query_id().unwrap().to_owned();
    let checkpoint = live.checkpoint().unwrap();
    let text_before = live.text().to_owned();
    drop(live);

    // Another client, as another process would have.
    let second_client = server.client().unwrap();
    let handle = second_client.queries().attach(&query_id).await.unwrap();
    assert_eq!(handle.id(), query_id);
    assert_eq!(handle.session_id(), session.id().unwrap());
    let mut rest = handle.resume_from(&checkpoint).await.unwrap();
    let mut after = Vec::new();
    while let Some(e) = rest.next().await {
        after.push(e.unwrap());
    }
    let rest_text = rest.text().to_owned();
    let query = rest.finish().await.unwrap();
    assert_eq!(query.status, "completed");
    assert_eq!(format!("{text_before}{rest_text}"), query.answer_text());
    assert!(query.answer_text().contains("Last-Event-ID"));
    // No event twice: `response.created` came before the checkpoint only.
    assert!(
        !after
            .iter()
            .any(|e| matches!(e, QueryEvent::Created { .. }))
    );
    assert!(after.iter().any(|e| e.is_terminal()));
}

#[tokio::test]
async fn send_across_cut_connections_returns_the_answer_with_one_turn() {
    let (_server, client, _dir) = seeded(
        LocalNexus::builder()
            .cut_streams_after(3)
            .frame_delay(Duration::from_millis(2)),
    )
    .await;
    let session = client.session(["docs"]).build().unwrap();
    let query = session
        .ask("how do I resume a stream")
        .stream_config(fast())
        .send()
        .await
        .unwrap();
    assert_eq!(query.status, "completed");
    assert!(query.answer_text().contains("Last-Event-ID"));
    let stored = client.sessions().get(&query.session_id).await.unwrap();
    assert_eq!(stored.queries.len(), 1, "exactly one turn started");
    assert_eq!(stored.queries[0].answer_text(), query.answer_text());
    // And no other session: a resume that posted the question again without
    // the session would have started its turn in a new one.
    let sessions = client.sessions().list().await.unwrap();
    assert_eq!(sessions.len(), 1, "exactly one session: {sessions:?}");
}

#[tokio::test]
async fn dropping_a_running_turn_then_asking_is_session_busy_or_waits() {
    let (_server, client, _dir) =
        seeded(LocalNexus::builder().frame_delay(Duration::from_millis(30))).await;
    let session = client.session(["docs"]).build().unwrap();
    let mut live = session.ask("green tea").stream().await.unwrap();
    live.next().await.unwrap().unwrap();
    let first_id = live.query_id().unwrap().to_owned();
    drop(live);
    let e = session.ask("and black?").send().await.unwrap_err();
    match &e {
        Error::SessionBusy { query_id, .. } => assert_eq!(query_id, &first_id),
        other => panic!("expected SessionBusy, got {other:?}"),
    }
    assert!(e.is_conflict() && e.status().is_none());
    // Waiting instead: the second turn runs once the first has ended.
    let second = session
        .ask("and black?")
        .when_busy(WhenBusy::Wait(
            WaitPolicy::default().interval(Duration::from_millis(20), Duration::from_millis(100)),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status, "completed");
    let stored = client.sessions().get(&second.session_id).await.unwrap();
    assert_eq!(stored.queries.len(), 2);
    assert_eq!(
        client.queries().get(&first_id).await.unwrap().status,
        "completed"
    );
}

#[tokio::test]
async fn cancel_on_drop_cancels_a_running_turn() {
    let (_server, client, _dir) =
        seeded(LocalNexus::builder().frame_delay(Duration::from_millis(100))).await;
    let session = client.session(["docs"]).build().unwrap();
    let mut live = session
        .ask("green tea")
        .stream_config(StreamConfig::default().cancel_on_drop(true))
        .stream()
        .await
        .unwrap();
    live.next().await.unwrap().unwrap();
    let id = live.query_id().unwrap().to_owned();
    drop(live);
    let status = until_some(Duration::from_secs(10), "the turn ending", async || {
        let status = client.queries().get(&id).await.unwrap().status;
        status.is_terminal().then_some(status)
    })
    .await;
    assert_eq!(status, "cancelled");
    // The session sees the turn ended and asks again at once.
    let next = session.ask("black tea").send().await.unwrap();
    assert_eq!(next.status, "completed");
}
