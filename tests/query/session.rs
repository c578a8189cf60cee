//! Sessions, synchronous and background turns against scripted HTTP (wiremock).

use std::time::Duration;

use nexus_knowql::{Client, Error, ThinkingLevel, WaitPolicy, Workflow};
use serde_json::{Value, json};
use wiremock::matchers::{body_partial_json, method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

fn query(id: &str, session: &str, status: &str) -> Value {
    json!({
        "id": id, "object": "query", "session_id": session, "created": 1_780_000_000,
        "status": status, "error": if status == "failed" { json!("no sources matched") } else { Value::Null },
        "input": [], "output": [{"role": "assistant", "content": [{"type": "output_text", "text": "Yes."}]}],
        "citations": [], "steps": [], "runtime_ms": 5,
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
        "output_json": {"approver": "manager", "limit_eur": 5000}
    })
}

/// Answers each `POST /query` with a new completed turn (`q1`, `q2`, ...)
/// of `session`: a server never answers a new turn with an earlier one.
fn new_turns(session: &'static str) -> impl wiremock::Respond {
    let n = std::sync::atomic::AtomicUsize::new(0);
    move |_: &Request| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        ResponseTemplate::new(200).set_body_json(query(&format!("q{i}"), session, "completed"))
    }
}

fn client(server: &MockServer) -> Client {
    Client::builder()
        .base_url(server.uri())
        .api_key("pcsk_test")
        .build()
        .unwrap()
}

/// Answers any request no mock matched with a loud 599.
async fn catch_all(server: &MockServer) {
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(599).set_body_string("unmatched request"))
        .with_priority(u8::MAX)
        .mount(server)
        .await;
}

fn bodies(requests: &[Request], p: &str) -> Vec<Value> {
    requests
        .iter()
        .filter(|r| r.url.path() == p)
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

#[tokio::test]
async fn first_turn_sends_scope_and_config_later_turns_send_session_id() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(new_turns("sess_a"))
        .mount(&server)
        .await;
    catch_all(&server).await;
    let session = client(&server)
        .session(["handbook", "policies"])
        .system_prompt("Be brief.")
        .guardrails("No legal advice.")
        .model("fast")
        .tools(["search"])
        .build()
        .unwrap();
    assert_eq!(session.id(), None);
    let first = session
        .ask("Who approves travel?")
        .max_steps(4)
        .timeout_seconds(60)
        .send()
        .await
        .unwrap();
    assert_eq!(first.answer_text(), "Yes.");
    assert_eq!(session.id().as_deref(), Some("sess_a"));
    assert_eq!(session.last_query_id().as_deref(), Some("q1"));
    session.ask("And above 5000 EUR?").send().await.unwrap();

    let sent = bodies(&server.received_requests().await.unwrap(), "/query");
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0]["scope"], json!(["handbook", "policies"]));
    assert_eq!(sent[0]["system_prompt"], "Be brief.");
    assert_eq!(sent[0]["guardrails"], "No legal advice.");
    assert_eq!(sent[0]["model"], "fast");
    assert_eq!(sent[0]["tools"], json!(["search"]));
    assert_eq!(sent[0]["max_steps"], 4);
    assert_eq!(sent[0]["timeout_seconds"], 60);
    assert!(sent[0].get("session_id").is_none());
    // send() runs on the streaming path (a server may still answer with the Query).
    assert_eq!(sent[0]["stream"], true);
    assert!(sent[0].get("background").is_none());
    assert_eq!(sent[1]["session_id"], "sess_a");
    assert_eq!(sent[1]["ask"], "And above 5000 EUR?");
    for pinned in ["scope", "system_prompt", "guardrails", "model", "tools"] {
        assert!(sent[1].get(pinned).is_none(), "{pinned} sent again");
    }
}

#[tokio::test]
async fn typed_workflows_and_thinking_levels_are_sent_as_the_api_spells_them() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(new_turns("sess_a"))
        .mount(&server)
        .await;
    let session = client(&server).session(["handbook"]).build().unwrap();
    session
        .ask("one")
        .workflow(Workflow::SearchCc)
        .thinking_level(ThinkingLevel::Minimal)
        .send()
        .await
        .unwrap();
    // A word this version does not know goes as it is.
    session
        .ask("two")
        .workflow(Workflow::from("search_graph"))
        .thinking_level("max")
        .send()
        .await
        .unwrap();
    let sent = bodies(&server.received_requests().await.unwrap(), "/query");
    assert_eq!(sent[0]["workflow"], "search_cc");
    assert_eq!(sent[0]["thinking_level"], "minimal");
    assert_eq!(sent[1]["workflow"], "search_graph");
    assert_eq!(sent[1]["thinking_level"], "max");
}

#[tokio::test]
async fn resumed_and_continued_sessions_send_their_ids() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(new_turns("sess_z"))
        .mount(&server)
        .await;
    let c = client(&server);
    // A resumed session must be answered about itself (the server says sess_z).
    c.continue_session("sess_z")
        .ask("one")
        .send()
        .await
        .unwrap();
    let continued = c.continue_after("q_prev");
    continued.ask("two").send().await.unwrap();
    continued.ask("three").send().await.unwrap();
    let sent = bodies(&server.received_requests().await.unwrap(), "/query");
    assert_eq!(sent[0]["session_id"], "sess_z");
    assert_eq!(sent[1]["previous_query_id"], "q_prev");
    assert!(sent[1].get("session_id").is_none());
    assert_eq!(sent[2]["session_id"], "sess_z");
    assert!(sent[2].get("previous_query_id").is_none());
}

#[tokio::test]
async fn invalid_turns_are_rejected_before_sending() {
    let server = MockServer::start().await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(500))
        .expect(0)
        .mount(&server)
        .await;
    let c = client(&server);
    let empty: [&str; 0] = [];
    assert!(matches!(
        c.session(empty).build(),
        Err(Error::InvalidRequest(_))
    ));
    let eleven: Vec<String> = (0..11).map(|i| format!("ctx{i}")).collect();
    assert!(matches!(
        c.session(eleven).build(),
        Err(Error::InvalidRequest(_))
    ));
    let session = c.session(["docs"]).build().unwrap();
    for t in [0, 901] {
        let e = session
            .ask("q")
            .timeout_seconds(t)
            .send()
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidRequest(ref m) if m.contains("timeout_seconds")),
            "{e}"
        );
    }
    let e = session.ask("  ").stream().await.unwrap_err();
    assert!(matches!(e, Error::InvalidRequest(_)));
    assert!(!session.is_busy());
}

#[tokio::test]
async fn a_second_turn_in_flight_is_session_busy_not_a_409() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .and(body_partial_json(json!({"background": true})))
        .respond_with(ResponseTemplate::new(202).set_body_json(query(
            "q1",
            "sess_b",
            "in_progress",
        )))
        .mount(&server)
        .await;
    // Running when the second turn asks, completed afterwards.
    Mock::given(method("GET"))
        .and(path("/queries/q1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query(
            "q1",
            "sess_b",
            "in_progress",
        )))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/queries/q1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query("q1", "sess_b", "completed")))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query("q2", "sess_b", "completed")))
        .mount(&server)
        .await;
    let session = client(&server).session(["docs"]).build().unwrap();
    let handle = session.ask("slow one").background().await.unwrap();
    let e = session.ask("meanwhile").send().await.unwrap_err();
    match &e {
        Error::SessionBusy { query_id, .. } => assert_eq!(query_id, "q1"),
        other => panic!("{other:?}"),
    }
    assert!(e.is_conflict());
    assert_eq!(
        bodies(&server.received_requests().await.unwrap(), "/query").len(),
        1
    );
    // The handle is still held, but the server says its turn has ended:
    // the session is free (no false SessionBusy).
    assert!(session.is_busy());
    session.ask("next").send().await.unwrap();
    drop(handle);
    let sent = bodies(&server.received_requests().await.unwrap(), "/query");
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1]["session_id"], "sess_b");
}

#[tokio::test]
async fn server_409_is_reported_as_a_conflict() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(
            ResponseTemplate::new(409)
                .set_body_json(json!({"message": "turn in flight", "code": "conflict"})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let session = client(&server).continue_session("sess_busy");
    let e = session.ask("q").send().await.unwrap_err();
    assert!(e.is_conflict(), "{e:?}");
    assert!(!session.is_busy());
}

#[tokio::test]
async fn background_wait_polls_until_the_turn_completes() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(ResponseTemplate::new(202).set_body_json(query("q3", "s", "in_progress")))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/queries/q3"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query("q3", "s", "in_progress")))
        .up_to_n_times(3)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/queries/q3"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query("q3", "s", "completed")))
        .with_priority(2)
        .mount(&server)
        .await;
    let session = client(&server).session(["docs"]).build().unwrap();
    let mut handle = session.ask("q").background().await.unwrap();
    assert_eq!(handle.id(), "q3");
    assert_eq!(handle.last_seen().status, "in_progress");
    let done = handle
        .wait(WaitPolicy::default().interval(Duration::from_millis(5), Duration::from_millis(20)))
        .await
        .unwrap();
    assert_eq!(done.status, "completed");
    let polls = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.url.path() == "/queries/q3")
        .count();
    assert_eq!(polls, 4);
    let sent = bodies(&server.received_requests().await.unwrap(), "/query");
    assert_eq!(sent[0]["background"], true);
    assert!(sent[0].get("stream").is_none());
}

#[tokio::test]
async fn background_wait_reports_failure_and_timeout() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .and(body_partial_json(json!({"ask": "fails"})))
        .respond_with(ResponseTemplate::new(202).set_body_json(query("qf", "s", "in_progress")))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .and(body_partial_json(json!({"ask": "hangs"})))
        .respond_with(ResponseTemplate::new(202).set_body_json(query("qh", "s2", "in_progress")))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/queries/qf"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query("qf", "s", "failed")))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/queries/qh"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query("qh", "s2", "in_progress")))
        .mount(&server)
        .await;
    let c = client(&server);
    let mut failing = c
        .session(["docs"])
        .build()
        .unwrap()
        .ask("fails")
        .background()
        .await
        .unwrap();
    match failing.wait(WaitPolicy::default()).await {
        Err(Error::TurnFailed {
            query_id, message, ..
        }) => {
            assert_eq!(query_id, "qf");
            assert_eq!(message, "no sources matched");
        }
        other => panic!("{other:?}"),
    }
    let mut hanging = c
        .session(["docs"])
        .build()
        .unwrap()
        .ask("hangs")
        .turn_timeout(Duration::from_millis(500))
        .background()
        .await
        .unwrap();
    let e = hanging
        .wait(WaitPolicy::default().interval(Duration::from_millis(5), Duration::from_millis(50)))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
}

#[tokio::test]
async fn background_cancel_posts_the_cancel() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(ResponseTemplate::new(202).set_body_json(query("q4", "s", "in_progress")))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/queries/q4/cancel"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query("q4", "s", "cancelled")))
        .expect(1)
        .mount(&server)
        .await;
    let session = client(&server).session(["docs"]).build().unwrap();
    let mut handle = session.ask("q").background().await.unwrap();
    assert!(session.is_busy());
    let q = handle.cancel().await.unwrap();
    assert_eq!(q.status, "cancelled");
    assert!(!session.is_busy());
}

#[tokio::test]
async fn json_deserializes_output_json_into_the_callers_type() {
    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Policy {
        approver: String,
        limit_eur: u32,
    }
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Wrong {
        missing: String,
    }
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query("q5", "s", "completed")))
        .mount(&server)
        .await;
    let session = client(&server).session(["docs"]).build().unwrap();
    let mut shape = serde_json::Map::new();
    shape.insert("approver".into(), json!("string"));
    let q = session.ask("q").shape(shape).send().await.unwrap();
    assert_eq!(
        q.json::<Policy>().unwrap(),
        Policy {
            approver: "manager".into(),
            limit_eur: 5000
        }
    );
    assert!(matches!(q.json::<Wrong>(), Err(Error::Decode { .. })));
    let sent = bodies(&server.received_requests().await.unwrap(), "/query");
    assert_eq!(sent[0]["shape"], json!({"approver": "string"}));
}

#[tokio::test]
async fn a_failed_synchronous_turn_is_turn_failed() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query("q6", "s", "failed")))
        .mount(&server)
        .await;
    let session = client(&server).session(["docs"]).build().unwrap();
    match session.ask("q").send().await {
        Err(Error::TurnFailed {
            query_id, message, ..
        }) => {
            assert_eq!(query_id, "q6");
            assert_eq!(message, "no sources matched");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(session.id().as_deref(), Some("s"));
}
