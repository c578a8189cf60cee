//! Edges of a turn's promise found by reading the SDK as a new user would:
//! the server's retry advice survives the SDK's own backoff, a turn made
//! from a JSON answer checkpoints at its end, a turn that does not keep
//! its text still checks it, and errors say what happened.

use crate::support::sse_server;

use std::time::Duration;

use futures::StreamExt;
use nexus_knowql::{Client, Error, QueryEvent, RetryPolicy, StreamConfig};
use sse_server::{Reply, SseServer, Step, Turn, query_json};

const DELTAS: &[&str] = &["Travel ", "is approved ", "by your ", "manager."];

fn client(url: &str, header_timeout: Duration) -> Client {
    Client::builder()
        .base_url(url)
        .api_key("pcsk_test")
        .header_timeout(Some(header_timeout))
        .retry(
            RetryPolicy::default()
                .max_retries(5)
                .max_delay(Duration::from_secs(30)),
        )
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn throttling_that_outlasts_the_header_timeout_stays_retry_advice() {
    // Every POST is throttled for 2 s; the header timeout is 5 s: the third
    // wait would end past it, so the SDK stops and hands over the 429.
    let server = SseServer::start(|_, _| {
        Reply::json(
            429,
            &["Retry-After: 2"],
            &serde_json::json!({"message": "slow down"}),
        )
    })
    .await;
    let c = client(&server.url, Duration::from_secs(5));
    let session = c.session(["docs"]).build().unwrap();
    let started = tokio::time::Instant::now();
    let e = session.ask("q").stream().await.unwrap_err();
    assert_eq!(e.status().map(|s| s.as_u16()), Some(429), "{e:?}");
    assert!(e.is_retryable(), "{e:?}");
    assert!(!e.may_have_started(), "{e:?}");
    assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(server.count("POST", "/query"), 3);
}

#[tokio::test]
async fn a_turn_made_from_a_json_answer_checkpoints_at_its_end() {
    let turn = Turn::completed("q_j", "s_j", DELTAS);
    let answer = turn.answer.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") || req.is("GET", "/queries/q_j") {
            Reply::json(200, &[], &query_json("q_j", "s_j", "completed", &answer))
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await;
    let c = server.client();
    let session = c.session(["docs"]).build().unwrap();
    let live = session.ask("q").stream().await.unwrap();
    // Before anything was read, and after: the end of the turn.
    let cp = live.checkpoint().unwrap();
    assert_eq!(cp.event_id, nexus_knowql::query::END_OF_TURN);
    let query = live.finish().await.unwrap();
    assert_eq!(query.answer_text(), turn.answer);

    // Continuing from it delivers nothing again and reads no events.
    let handle = c.queries().attach("q_j").await.unwrap();
    let mut rest = handle.resume_from(&cp).await.unwrap();
    let mut text = String::new();
    while let Some(e) = rest.next().await {
        if let QueryEvent::TextDelta { delta } = e.unwrap() {
            text.push_str(&delta);
        }
    }
    assert_eq!(text, turn.answer, "nothing was read before the checkpoint");
    assert_eq!(server.count("GET", "/queries/q_j/events"), 0);
}

#[tokio::test]
async fn a_turn_that_keeps_no_text_still_checks_it() {
    let turn = Turn::completed("q_k", "s_k", DELTAS);
    let t = turn.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(t.body().into_bytes())])
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let mut live = session
        .ask("q")
        .stream_config(StreamConfig::default().keep_text(false))
        .stream()
        .await
        .unwrap();
    let mut printed = String::new();
    while let Some(e) = live.next().await {
        if let QueryEvent::TextDelta { delta } = e.unwrap() {
            printed.push_str(&delta);
        }
    }
    assert_eq!(live.text(), "");
    assert_eq!(live.text_len(), turn.answer.len());
    assert_eq!(printed, turn.answer);
    live.finish().await.unwrap();

    // The same stream whose final answer differs: caught without the text.
    let t = turn.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            let body = t.body().replace(
                "\"text\":\"Travel is approved by your manager.\"",
                "\"text\":\"Travel is approved by your director.\"",
            );
            Reply::sse(vec![Step::Write(body.into_bytes())])
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let live = session
        .ask("q")
        .stream_config(StreamConfig::default().keep_text(false))
        .stream()
        .await
        .unwrap();
    let e = live.finish().await.unwrap_err();
    assert!(matches!(e, Error::AnswerMismatch { .. }), "{e:?}");
    assert_eq!(e.query_id(), Some("q_k"));
}

#[tokio::test]
async fn errors_name_their_cause() {
    // A connection cut mid-body, before the server named the turn.
    let server = SseServer::start(|_, _| {
        Reply::sse(vec![Step::Write(b"event: resp".to_vec()), Step::Reset])
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let live = session.ask("q").stream().await.unwrap();
    let e = live.finish().await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains("create_query"), "{text}");
    assert!(!text.contains("stream_query_events"), "{text}");
    assert!(!text.contains("decode"), "{text}");
    assert!(!text.contains("before the server named the turn"), "{text}");

    // Nothing listens: the transport error says where, its source why.
    let c = Client::builder()
        .base_url("http://127.0.0.1:1")
        .retry(RetryPolicy::never())
        .build()
        .unwrap();
    let e = c.contexts().list().await.unwrap_err();
    assert!(matches!(e, Error::Transport { connect: true, .. }), "{e:?}");
    assert_eq!(e.to_string(), "list_contexts: could not connect");
    let cause = std::error::Error::source(&e).expect("a cause");
    assert!(cause.to_string().len() > 5, "{cause}");
}
