//! Unit tests of the resumable connection.

use super::*;
use crate::status::QueryStatus;

/// The next delivery, noted as delivered as the turn notes it.
async fn next(conn: &mut EventConnection) -> Option<Result<Delivery>> {
    let item = futures::future::poll_fn(|cx| conn.poll_next_event(cx)).await;
    if let Some(Ok(Delivery::Event(id, event))) = &item {
        conn.note_delivered(*id, event);
    }
    item
}

fn query_json(status: &str, answer: &str) -> serde_json::Value {
    serde_json::json!({
        "id": "q1", "object": "query", "session_id": "s1", "created": 0,
        "status": status, "input": [], "citations": [], "steps": [], "runtime_ms": 1,
        "output": [{"role": "assistant", "content": [{"type": "output_text", "text": answer}]}],
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    })
}

async fn server(events: &'static str) -> (wiremock::MockServer, Client) {
    server_for(events, Some("2")).await
}

/// Serves `events` to a resume from `last_event_id` (from any position when `None`).
async fn server_for(
    events: &'static str,
    last_event_id: Option<&str>,
) -> (wiremock::MockServer, Client) {
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, ResponseTemplate};
    let server = wiremock::MockServer::start().await;
    let mut events_mock = Mock::given(method("GET")).and(path("/queries/q1/events"));
    if let Some(id) = last_event_id {
        events_mock = events_mock.and(header("last-event-id", id));
    }
    events_mock
        .respond_with(
            ResponseTemplate::new(200).set_body_raw(events.as_bytes(), "text/event-stream"),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/queries/q1"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(query_json(crate::QueryStatus::Completed.as_str(), "ab")),
        )
        .mount(&server)
        .await;
    let client = Client::builder().base_url(server.uri()).build().unwrap();
    (server, client)
}

#[tokio::test]
async fn resume_from_a_known_event_skips_it_and_delivers_the_rest() {
    let (_server, client) = server(
        "id: 2\nevent: response.output_text.delta\ndata: {\"delta\":\"a\"}\n\n\
         id: 3\nevent: response.output_text.delta\ndata: {\"delta\":\"b\"}\n\n\
         id: 4\nevent: response.completed\ndata: {}\n\n",
    )
    .await;
    let mut conn = resumed(client, StreamConfig::default());
    match next(&mut conn).await {
        Some(Ok(Delivery::Event(Some(3), QueryEvent::TextDelta { delta }))) => {
            assert_eq!(delta, "b")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        next(&mut conn).await,
        Some(Ok(Delivery::Event(Some(4), QueryEvent::Completed)))
    ));
    // No `query` frame: the stored turn stands in for it.
    match next(&mut conn).await {
        Some(Ok(Delivery::Event(None, QueryEvent::Query(q)))) => {
            assert_eq!(q.answer_text(), "ab")
        }
        other => panic!("{other:?}"),
    }
    assert!(next(&mut conn).await.is_none());
}

#[tokio::test]
async fn resume_that_skips_an_unseen_event_hands_over_the_stored_turn() {
    // Event 3 was never delivered: a replay from event 4 misses it (one
    // from event 3, right after the id sent, would prove nothing missing).
    let (_server, client) =
        server("id: 4\nevent: response.output_text.delta\ndata: {\"delta\":\"b\"}\n\n").await;
    let mut conn = resumed(client, StreamConfig::default());
    let gap = expect_recovered(&mut conn, "event 4 instead of event 2").await;
    assert_eq!(gap.last_event_id, Some(2));
    assert!(next(&mut conn).await.is_none());
}

#[test]
fn only_server_trouble_is_resumable() {
    let api = |s| Error::api("op", s, None, String::new(), None, None);
    assert!(resumable(&api(503)));
    assert!(resumable(&api(429)));
    assert!(!resumable(&api(404)));
    assert!(!resumable(&api(403)));
    assert!(resumable(&Error::Timeout {
        operation: "op",
        elapsed_ms: 1,
        query_id: None,
    }));
}

#[test]
fn debug_shows_the_state_and_position() {
    let client = Client::builder()
        .base_url("http://127.0.0.1:9")
        .build()
        .unwrap();
    let conn =
        EventConnection::named_closed(client, StreamConfig::default(), TurnBinding::for_turn("q1"));
    assert_eq!(
        format!("{conn:?}"),
        "EventConnection { state: \"done\", query_id: Some(\"q1\"), last_seq: None, \
         terminal_seen: true, .. }"
    );
}

/// A server answering every `GET /queries/q1/events` with `reply`.
async fn events_server(reply: wiremock::ResponseTemplate) -> wiremock::MockServer {
    use wiremock::matchers::{method, path};
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(method("GET"))
        .and(path("/queries/q1/events"))
        .respond_with(reply)
        .mount(&server)
        .await;
    server
}

/// A connection resuming turn `q1` after event 2.
fn resumed(client: Client, config: StreamConfig) -> EventConnection {
    EventConnection::resume(client, config, TurnBinding::for_turn("q1"), Some(2))
}

/// Expects the stored turn (answer "ab") handed over for a gap whose cause
/// says `cause`; returns the gap.
async fn expect_recovered(conn: &mut EventConnection, cause: &str) -> ReplayGap {
    match next(conn).await {
        Some(Ok(Delivery::Recovered(query, gap))) => {
            assert_eq!(query.answer_text(), "ab");
            assert!(gap.cause.contains(cause), "{}", gap.cause);
            gap
        }
        other => panic!("{other:?}"),
    }
}

/// Serves `frames` to a resume after event 2 and resumes from it, quick
/// to give up.
async fn replaying(frames: String) -> (wiremock::MockServer, EventConnection) {
    let (server, client) = server(Box::leak(frames.into_boxed_str())).await;
    (server, resumed(client, quick()))
}

fn quick() -> StreamConfig {
    StreamConfig::default()
        .reconnect_delay(Duration::from_millis(5), Duration::from_millis(20))
        .reconnect_attempts(1)
}

#[tokio::test]
async fn a_replay_that_sends_the_final_query_without_the_known_event_is_not_trusted() {
    let frame = format!(
        "event: query\ndata: {}\n\n",
        query_json(QueryStatus::Completed.as_str(), "ab")
    );
    let (_server, mut conn) = replaying(frame).await;
    expect_recovered(&mut conn, "final Query without event 2").await;
    assert!(next(&mut conn).await.is_none());
}

#[tokio::test]
async fn id_less_frames_replayed_before_the_known_event_are_skipped() {
    let (_server, client) = server(
        "event: response.output_text.delta\ndata: {\"delta\":\"x\"}\n\n\
         id: 2\nevent: response.output_text.delta\ndata: {\"delta\":\"a\"}\n\n\
         id: 3\nevent: response.output_text.delta\ndata: {\"delta\":\"b\"}\n\n",
    )
    .await;
    let mut conn = resumed(client, quick());
    match next(&mut conn).await {
        Some(Ok(Delivery::Event(Some(3), QueryEvent::TextDelta { delta }))) => {
            assert_eq!(delta, "b")
        }
        other => panic!("{other:?}"),
    }
}

fn delta(id: u64, text: &str) -> String {
    format!("id: {id}\nevent: response.output_text.delta\ndata: {{\"delta\":\"{text}\"}}\n\n")
}

async fn expect_delta(conn: &mut EventConnection, seq: u64, text: &str) {
    match next(conn).await {
        Some(Ok(Delivery::Event(Some(id), QueryEvent::TextDelta { delta }))) => {
            assert_eq!((id, delta.as_str()), (seq, text))
        }
        other => panic!("expected event {seq}: {other:?}"),
    }
}

#[tokio::test]
async fn an_id_sent_again_mid_stream_is_delivered_once() {
    let body = [delta(2, "a"), delta(3, "b"), delta(3, "b"), delta(4, "c")].concat();
    let (_server, mut conn) = replaying(body).await;
    expect_delta(&mut conn, 3, "b").await;
    expect_delta(&mut conn, 4, "c").await;
}

#[tokio::test]
async fn a_jump_in_the_ids_is_noticed_and_resumed_from_the_last_delivered_event() {
    // Every connection, the resumed one too, skips from 3 to 5.
    let body = [delta(2, "a"), delta(3, "b"), delta(5, "d")].concat();
    let (server, client) = server_for(Box::leak(body.into_boxed_str()), None).await;
    let mut conn = resumed(client, quick());
    expect_delta(&mut conn, 3, "b").await;
    let gap = expect_recovered(&mut conn, "jumped from event 3 to event 5").await;
    assert_eq!(gap.last_event_id, Some(3));
    // Resumed once from event 3 before giving up on the log.
    let resumes = server.received_requests().await.unwrap_or_default();
    let resumes: Vec<_> = resumes
        .iter()
        .filter(|r| r.url.path() == "/queries/q1/events")
        .map(|r| r.headers.get("last-event-id").cloned())
        .collect();
    assert_eq!(resumes.len(), 2, "{resumes:?}");
    assert_eq!(resumes[1].as_ref().map(|v| v.as_bytes()), Some(&b"3"[..]));
    assert!(next(&mut conn).await.is_none());
}

#[tokio::test]
async fn id_less_frames_between_replayed_events_are_skipped() {
    let body = [
        delta(2, "a"),
        delta(3, "b"),
        // The server goes back: 2 and the id-less frame after it were delivered already.
        delta(2, "a"),
        "event: response.output_text.delta\ndata: {\"delta\":\"x\"}\n\n".to_string(),
        delta(3, "b"),
        delta(4, "c"),
    ]
    .concat();
    let (_server, mut conn) = replaying(body).await;
    expect_delta(&mut conn, 3, "b").await;
    expect_delta(&mut conn, 4, "c").await;
}

#[tokio::test]
async fn the_final_query_is_delivered_even_between_replayed_events() {
    let body = [
        delta(2, "a"),
        delta(3, "b"),
        delta(2, "a"),
        format!(
            "event: query\ndata: {}\n\n",
            query_json(QueryStatus::Completed.as_str(), "zz")
        ),
    ]
    .concat();
    let (_server, mut conn) = replaying(body).await;
    expect_delta(&mut conn, 3, "b").await;
    // The frame itself, not the stored turn ("ab") standing in for it.
    match next(&mut conn).await {
        Some(Ok(Delivery::Event(None, QueryEvent::Query(q)))) => assert_eq!(q.answer_text(), "zz"),
        other => panic!("{other:?}"),
    }
    assert!(next(&mut conn).await.is_none());
}

fn idless(text: &str) -> String {
    format!("event: response.output_text.delta\ndata: {{\"delta\":\"{text}\"}}\n\n")
}

#[tokio::test]
async fn id_less_frames_after_the_last_id_are_skipped_once_on_the_next_connection() {
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, ResponseTemplate};
    let server = wiremock::MockServer::start().await;
    let replies = [
        ("2", [delta(2, "a"), delta(3, "b"), idless("x")].concat()),
        // Sends the id-less frame after event 3 again, then a new one.
        (
            "3",
            [delta(3, "b"), idless("x"), idless("y"), delta(4, "c")].concat(),
        ),
    ];
    for (last, body) in replies {
        Mock::given(method("GET"))
            .and(path("/queries/q1/events"))
            .and(header("last-event-id", last))
            .respond_with(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream"))
            .mount(&server)
            .await;
    }
    let client = Client::builder().base_url(server.uri()).build().unwrap();
    let mut conn = resumed(client, quick());
    expect_delta(&mut conn, 3, "b").await;
    for text in ["x", "y"] {
        match next(&mut conn).await {
            Some(Ok(Delivery::Event(None, QueryEvent::TextDelta { delta }))) => {
                assert_eq!(delta, text)
            }
            other => panic!("expected the id-less {text}: {other:?}"),
        }
    }
    expect_delta(&mut conn, 4, "c").await;
    assert_eq!(conn.resumes(), 1);
}

#[tokio::test]
async fn a_silent_server_meets_the_turn_timeout() {
    use wiremock::ResponseTemplate;
    let server = events_server(
        ResponseTemplate::new(200)
            .set_body_raw(delta(3, "b"), "text/event-stream")
            .set_delay(Duration::from_secs(20)),
    )
    .await;
    let client = Client::builder()
        .base_url(server.uri())
        .turn_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let config = quick().idle_timeout(None);
    let mut conn = EventConnection::resume(client, config, TurnBinding::for_turn("q1"), Some(2));
    let got = tokio::time::timeout(Duration::from_secs(10), next(&mut conn))
        .await
        .expect("the turn's deadline ends the wait");
    match got {
        Some(Err(Error::Timeout { operation, .. })) => assert_eq!(operation, "query_turn"),
        other => panic!("{other:?}"),
    }
    assert!(next(&mut conn).await.is_none());
}

#[tokio::test]
async fn a_refused_resume_is_final_even_after_delivered_events() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, ResponseTemplate};
    let server = events_server(
        ResponseTemplate::new(403).set_body_json(serde_json::json!({"message": "revoked"})),
    )
    .await;
    // Not to be read: a refusal is not a gap the stored turn makes up for.
    Mock::given(method("GET"))
        .and(path("/queries/q1"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(query_json(QueryStatus::Completed.as_str(), "ab")),
        )
        .mount(&server)
        .await;
    let client = Client::builder().base_url(server.uri()).build().unwrap();
    let mut conn = resumed(client, quick());
    match next(&mut conn).await {
        Some(Err(e)) => assert_eq!(e.status().map(|s| s.as_u16()), Some(403), "{e:?}"),
        other => panic!("{other:?}"),
    }
    assert!(next(&mut conn).await.is_none());
}
