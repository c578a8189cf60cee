//! Stateless tool answers over HTTP are the bytes of a session's answers,
//! for every tool, successes and failures, as one JSON body or in an event
//! stream.

use std::time::Duration;

use crate::support::mcp as mcp_support;
use mcp_support::*;
use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::{NexusMcp, NexusServer};
use serde_json::{Value, json};

const CALLER_KEY: &str = "pcsk_caller_key_abcdefghijklmnopqrstuv";

/// A client of a server of its own (its own fake Nexus, so that both
/// sides see the same turn states), stateless or with a session.
async fn client(
    stateless: bool,
    slow_call: Option<Duration>,
) -> (HttpMcp, Served, wiremock::MockServer) {
    let nexus = fake_nexus(2).await;
    let mut server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(caller_keys(false)),
    );
    if let Some(threshold) = slow_call {
        server = server.with_slow_call_threshold(threshold);
    }
    let served = serve(server, HttpOptions::default().stateless(stateless)).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", CALLER_KEY);
    mcp.initialize().await;
    (mcp, served, nexus)
}

/// The text of the JSON-RPC response to `id` in `answer`: the whole body,
/// or the data of its event.
fn response_text(answer: &HttpAnswer, id: u64) -> String {
    let is_response = |text: &str| {
        serde_json::from_str::<Value>(text)
            .is_ok_and(|m| m["id"] == json!(id) && m.get("method").is_none())
    };
    if answer
        .content_type
        .as_deref()
        .is_some_and(|t| t.starts_with("text/event-stream"))
    {
        answer
            .body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .find(|d| is_response(d))
            .unwrap_or_else(|| panic!("no response {id}: {answer:?}"))
            .to_owned()
    } else {
        assert!(is_response(&answer.body), "{answer:?}");
        answer.body.clone()
    }
}

/// The calls compared: each tool, a failure, and a long poll with progress.
fn calls() -> Vec<Value> {
    vec![
        json!({"name": "list_contexts", "arguments": {}}),
        json!({"name": "query_context", "arguments": {"context": "papers", "question": "What is new?"}}),
        json!({"name": "get_query", "arguments": {"query_id": "q_1"}}),
        json!({"name": "get_query", "arguments": {"query_id": "q_unknown"}}),
        json!({"name": "query_context", "arguments": {"context": "drafts", "question": "Why?"}}),
        json!({"name": "get_query", "arguments": {"query_id": "q_1", "wait_seconds": 10},
            "_meta": {"progressToken": "tok"}}),
        json!({"name": "list_contexts", "arguments": {}}),
    ]
}

async fn compare(slow_call: Option<Duration>) {
    let (mut stateless, _a, _nexus_a) = client(true, slow_call).await;
    let (mut session, _b, _nexus_b) = client(false, slow_call).await;
    assert!(stateless.session.is_none() && session.session.is_some());
    for params in calls() {
        let (id, lean) = stateless.request("tools/call", params.clone()).await;
        let (same_id, whole) = session.request("tools/call", params.clone()).await;
        assert_eq!(id, same_id);
        assert_eq!(lean.status, 200, "{lean:?}");
        let lean_text = response_text(&lean, id);
        assert!(
            !lean.body.contains("structured-content-at-edge"),
            "{params}: {}",
            lean.body
        );
        assert_eq!(lean_text, response_text(&whole, id), "{params}");
        let message: Value = serde_json::from_str(&lean_text).unwrap();
        let result = &message["result"];
        // Both copies are there and say the same.
        let text: Value =
            serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
        let structured = &result["structuredContent"];
        if params["name"] == "list_contexts" && result["isError"] == false {
            assert_eq!(structured["contexts"], text, "{params}");
            assert_eq!(structured["contexts"].as_array().unwrap().len(), 4);
        } else {
            assert_eq!(structured, &text, "{params}");
        }
    }
}

#[tokio::test]
async fn stateless_tool_answers_are_the_bytes_a_session_sends() {
    compare(None).await;
}

/// With every call slow, each answer is an event stream (its log message
/// comes first): the result's event is still the same bytes.
#[tokio::test]
async fn stateless_streamed_tool_answers_are_the_bytes_a_session_sends() {
    compare(Some(Duration::ZERO)).await;
}
