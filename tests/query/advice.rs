//! What errors advise, against a scripted server: 409s that are not a busy
//! session, busy sessions and their waits, retry advice for `create_query`,
//! the bound on response bodies, and cancels that are delivered.

use std::time::Duration;

use crate::support::sse_server;
use futures::StreamExt;
use nexus_knowql::{CallOptions, Error, RetryPolicy, StreamConfig, WaitPolicy, WhenBusy};
use sse_server::{Reply, SseServer, Step, Turn, query_json};

const DELTAS: &[&str] = &["Travel ", "is approved."];

fn session_json(id: &str, queries: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({
        "id": id, "project_id": "p", "created_by": "u", "scope": ["docs"],
        "models": [], "tools": [], "created_at": "2026-07-01T00:00:00Z",
        "updated_at": "2026-07-01T00:00:00Z", "queries": queries
    })
}

#[tokio::test]
async fn a_409_that_is_not_a_running_turn_keeps_the_servers_answer() {
    let turn = Turn::completed("q_1", "sess_p", DELTAS);
    let t = turn.clone();
    let server = SseServer::start(move |req, index| {
        if req.is("POST", "/query") && index == 0 {
            Reply::sse(vec![Step::Write(t.body().into_bytes())])
        } else if req.is("POST", "/query") {
            Reply::json(
                409,
                &[],
                &serde_json::json!({"message": "preview cap: one turn per session", "code": "preview_cap"}),
            )
        } else if req.is("GET", "/sessions/sess_p") {
            let done = query_json("q_1", "sess_p", "completed", &t.answer);
            Reply::json(200, &[], &session_json("sess_p", vec![done]))
        } else if req.is("GET", "/queries/q_1") {
            Reply::json(200, &[], &query_json("q_1", "sess_p", "completed", &t.answer))
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await;
    let wait = WhenBusy::Wait(WaitPolicy::default());
    let session = server
        .client()
        .with_options(CallOptions::new().turn_timeout(Duration::from_secs(5)))
        .session(["docs"])
        .when_busy(wait)
        .build()
        .unwrap();
    session.ask("first").send().await.unwrap();
    assert_eq!(session.last_query_id().as_deref(), Some("q_1"));
    let e = session.ask("second").send().await.unwrap_err();
    assert_eq!(e.status().map(|s| s.as_u16()), Some(409), "{e:?}");
    assert_eq!(e.code(), Some("preview_cap"));
    assert!(e.to_string().contains("preview cap"), "{e}");
    assert!(!matches!(e, Error::SessionBusy { .. }));
    // No waiting and no third POST for a 409 that no wait can fix.
    assert_eq!(server.count("POST", "/query"), 2);
}

#[tokio::test]
async fn waiting_for_a_busy_session_backs_off_and_stops_at_its_limit() {
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::json(
                409,
                &[],
                &serde_json::json!({"message": "a query is already in flight", "code": "conflict"}),
            )
        } else if req.is("GET", "/sessions/sess_w") {
            let running = query_json("q_run", "sess_w", "in_progress", "");
            Reply::json(200, &[], &session_json("sess_w", vec![running]))
        } else if req.is("GET", "/queries/q_run") {
            Reply::json(200, &[], &query_json("q_run", "sess_w", "in_progress", ""))
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await;
    let wait =
        WaitPolicy::default().interval(Duration::from_millis(100), Duration::from_millis(400));
    // The wait for the session counts against the turn timeout.
    let client = server
        .client()
        .with_options(CallOptions::new().turn_timeout(Duration::from_millis(1500)));
    let session = client
        .continue_session("sess_w")
        .with_when_busy(WhenBusy::Wait(wait));
    let started = std::time::Instant::now();
    let e = session.ask("q").send().await.unwrap_err();
    assert!(
        matches!(&e, Error::SessionBusy { query_id, .. } if query_id == "q_run"),
        "{e:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    // One POST; the wait polled the running turn, with growing intervals.
    assert_eq!(server.count("POST", "/query"), 1);
    let polls = server.count("GET", "/queries/q_run");
    assert!((1..=12).contains(&polls), "{polls} polls");
}

#[tokio::test]
async fn two_turns_at_once_on_one_session_value_are_session_busy() {
    let turn = Turn::completed("q_two", "sess_two", DELTAS);
    let t = turn.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(t.first(1).into_bytes()), Step::AwaitClose])
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    // The first turn runs, not yet named (nothing was read from it).
    let first = session.ask("first").stream().await.unwrap();
    let e = session.ask("second").send().await.unwrap_err();
    assert!(matches!(&e, Error::SessionBusy { .. }), "{e:?}");
    assert!(e.is_conflict());
    assert_eq!(e.query_id(), None);
    assert_eq!(server.count("POST", "/query"), 1);
    drop(first);
}

fn failing_post(
    status: u16,
    headers: &'static [&'static str],
) -> impl Fn(&sse_server::Request, usize) -> Reply {
    move |req, _| {
        if req.is("POST", "/query") {
            Reply::json(
                status,
                headers,
                &serde_json::json!({"message": "upstream trouble"}),
            )
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    }
}

#[tokio::test]
async fn create_query_gateway_errors_are_not_retryable_but_may_have_started() {
    for status in [500, 502, 504] {
        let server = SseServer::start(failing_post(status, &[])).await;
        let session = server.client().session(["docs"]).build().unwrap();
        let e = session.ask("q").stream().await.unwrap_err();
        assert_eq!(e.status().map(|s| s.as_u16()), Some(status));
        assert!(!e.is_retryable(), "{status}");
        assert!(e.may_have_started(), "{status}");
        assert_eq!(server.count("POST", "/query"), 1, "{status}");
    }
}

#[tokio::test]
async fn a_503_with_retry_after_proves_the_turn_did_not_start() {
    let server = SseServer::start(failing_post(503, &["Retry-After: 7"])).await;
    let session = server.client().session(["docs"]).build().unwrap();
    let e = session.ask("q").send().await.unwrap_err();
    assert_eq!(e.status().map(|s| s.as_u16()), Some(503));
    assert!(e.is_retryable());
    assert!(!e.may_have_started());
    assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(server.count("POST", "/query"), 1);

    let plain = SseServer::start(failing_post(503, &[])).await;
    let e = plain
        .client()
        .session(["docs"])
        .build()
        .unwrap()
        .ask("q")
        .send()
        .await
        .unwrap_err();
    assert!(!e.is_retryable());
    assert!(e.may_have_started());
    assert_eq!(e.retry_after(), None);
}

#[tokio::test]
async fn a_429_on_create_query_is_retried_within_max_delay() {
    let turn = Turn::completed("q_429", "sess_429", DELTAS);
    let t = turn.clone();
    let server = SseServer::start(move |req, index| {
        if req.is("POST", "/query") && index == 0 {
            Reply::json(
                429,
                &["Retry-After: 0"],
                &serde_json::json!({"message": "slow down"}),
            )
        } else if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(t.body().into_bytes())])
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let query = session.ask("q").send().await.unwrap();
    assert_eq!(query.answer_text(), turn.answer);
    assert_eq!(server.count("POST", "/query"), 2);

    // A wait beyond max_delay is the caller's decision.
    let long = SseServer::start(failing_post(429, &["Retry-After: 3600"])).await;
    let e = long
        .client()
        .session(["docs"])
        .build()
        .unwrap()
        .ask("q")
        .send()
        .await
        .unwrap_err();
    assert_eq!(e.status().map(|s| s.as_u16()), Some(429));
    assert!(e.is_retryable());
    assert!(!e.may_have_started());
    assert_eq!(e.retry_after(), Some(Duration::from_secs(3600)));
    assert_eq!(long.count("POST", "/query"), 1);
}

#[tokio::test]
async fn every_response_body_is_bounded_generated_calls_included() {
    let big = "x".repeat(300_000);
    let doc = query_json("q_big", "sess_big", "completed", &big);
    let body = doc.to_string().into_bytes();
    let server = SseServer::start(move |req, _| {
        if req.is("GET", "/queries/q_big") {
            Reply::json(200, &[], &doc)
        } else if req.is("GET", "/queries/q_chunked") {
            // No length: the body ends when the connection closes.
            Reply {
                head:
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n"
                        .into(),
                steps: vec![Step::WriteSplit(body.clone(), vec![8192])],
            }
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await;
    let client = nexus_knowql::Client::builder()
        .base_url(&server.url)
        .retry(RetryPolicy::never())
        .max_response_bytes(100_000)
        .build()
        .unwrap();
    for id in ["q_big", "q_chunked"] {
        match client.queries().get(id).await {
            Err(Error::ResponseTooLarge {
                operation, limit, ..
            }) => {
                assert_eq!(operation, "get_query");
                assert_eq!(limit, 100_000);
            }
            other => panic!("{id}: {other:?}"),
        }
    }
    // The login answer is bounded too.
    let login = SseServer::start(|req, _| {
        if req.is("POST", "/auth/login") {
            Reply::json(200, &[], &serde_json::json!({"token": "t".repeat(50_000)}))
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await;
    let client = nexus_knowql::Client::builder()
        .base_url(&login.url)
        .api_key("pcsk_test")
        .login(true)
        .retry(RetryPolicy::never())
        .max_response_bytes(10_000)
        .build()
        .unwrap();
    match client.queries().get("q_any").await {
        Err(Error::ResponseTooLarge { limit, .. }) => assert_eq!(limit, 10_000),
        other => panic!("{other:?}"),
    }
    let roomy = nexus_knowql::Client::builder()
        .base_url(&server.url)
        .max_response_bytes(1_000_000)
        .build()
        .unwrap();
    assert_eq!(
        roomy
            .queries()
            .get("q_chunked")
            .await
            .unwrap()
            .answer_text(),
        big
    );
}

#[test]
fn a_dropped_turn_is_cancelled_before_a_current_thread_program_exits() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let turn = Turn::completed("q_cx", "sess_cx", DELTAS);
        let t = turn.clone();
        let server = SseServer::start(move |req, _| {
            if req.is("POST", "/query") {
                Reply::sse(vec![Step::Write(t.first(2).into_bytes()), Step::AwaitClose])
            } else if req.is("POST", "/queries/q_cx/cancel") {
                Reply::json(200, &[], &query_json("q_cx", "sess_cx", "cancelled", ""))
            } else {
                Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
            }
        })
        .await;
        let client = server.client();
        let session = client.session(["docs"]).build().unwrap();
        let mut live = session
            .ask("q")
            .stream_config(StreamConfig::default().cancel_on_drop(true))
            .stream()
            .await
            .unwrap();
        live.next().await.unwrap().unwrap();
        drop(live);
        // What `main` does before it returns: nothing else yields here.
        assert_eq!(client.finish_cancels(Duration::from_secs(5)).await, 0);
        assert_eq!(server.count("POST", "/queries/q_cx/cancel"), 1);
    });
}

#[tokio::test]
async fn cancel_is_awaitable_on_a_live_turn() {
    let turn = Turn::completed("q_ca", "sess_ca", DELTAS);
    let t = turn.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(t.first(2).into_bytes()), Step::AwaitClose])
        } else if req.is("POST", "/queries/q_ca/cancel") {
            Reply::json(200, &[], &query_json("q_ca", "sess_ca", "cancelled", ""))
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let live = session.ask("q").stream().await.unwrap();
    let cancelled = live.cancel().await.unwrap();
    assert_eq!(cancelled.status, "cancelled");
    assert_eq!(server.count("POST", "/queries/q_ca/cancel"), 1);
    assert!(!session.is_busy());
}
