//! The MCP server over Streamable HTTP: JSON-RPC posted with reqwest 0.12 to
//! an in-process axum server on 127.0.0.1:0.

use std::time::Duration;

use crate::support::mcp as mcp_support;
use mcp_support::*;
use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::{KeyPolicy, NexusMcp, NexusServer};
use serde_json::{Value, json};

const CALLER_KEY: &str = "pcsk_caller_key_abcdefghijklmnopqrstuv";

/// Nexus tools on `nexus_url` with `keys`, served over Streamable HTTP.
async fn serve_nexus(nexus_url: &str, keys: KeyPolicy, options: HttpOptions) -> Served {
    let server =
        NexusMcp::new().with_nexus(NexusServer::new(nexus_client(nexus_url)).with_key_policy(keys));
    serve(server, options).await
}

/// The `x-pinecone-api-key` values Nexus received.
async fn keys_received(nexus: &wiremock::MockServer) -> Vec<String> {
    nexus
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter_map(|r| r.headers.get("x-pinecone-api-key"))
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn http_session_uses_the_callers_key_for_each_request() {
    let nexus = fake_nexus(0).await;
    let served = serve_nexus(&nexus.uri(), caller_keys(false), HttpOptions::default()).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", CALLER_KEY);
    let init = mcp.initialize().await;
    assert_eq!(init["serverInfo"]["name"], "nexus-knowql");
    assert_eq!(init["serverInfo"]["version"], env!("CARGO_PKG_VERSION"));
    assert!(init["instructions"].as_str().unwrap().contains("get_query"));
    assert!(mcp.session.is_some(), "a session id was issued");

    let (id, tools) = mcp.request("tools/list", json!({})).await;
    let names: Vec<&str> = tools.response(id)["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["get_query", "list_contexts", "query_context"]);

    let result = mcp.call("list_contexts", json!({})).await;
    assert_eq!(result["isError"], false, "{result}");
    let slugs: Vec<&str> = result["structuredContent"]["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["slug"].as_str().unwrap())
        .collect();
    assert_eq!(slugs, ["handbook", "papers", "drafts", "fresh"]);
    // The key's one proof at initialize, then the call.
    assert_eq!(keys_received(&nexus).await, [CALLER_KEY, CALLER_KEY]);
}

#[tokio::test]
async fn http_query_flow_with_wait_seconds_streams_progress() {
    let nexus = fake_nexus(2).await;
    let served = serve_nexus(&nexus.uri(), caller_keys(false), HttpOptions::default()).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", CALLER_KEY);
    mcp.initialize().await;
    let started = mcp
        .call(
            "query_context",
            json!({"context": "papers", "question": "What is new?"}),
        )
        .await;
    assert_eq!(started["structuredContent"]["query_id"], "q_1");

    let (id, answer) = wait_with_progress(&mut mcp, "q_1", "tok-1").await;
    let result = &answer.response(id)["result"];
    assert_eq!(result["structuredContent"]["status"], "completed");
    assert_eq!(
        result["structuredContent"]["answer"],
        "Install it with cargo."
    );
    let progress = answer.notifications("notifications/progress");
    let messages: Vec<&str> = progress
        .iter()
        .map(|p| p["params"]["message"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages,
        [
            "Searching the handbook",
            "Reading guide.md",
            "Writing the answer"
        ]
    );
    assert!(
        progress
            .iter()
            .all(|p| p["params"]["progressToken"] == "tok-1")
    );
}

/// `get_query` waiting for `query_id` with a progress token.
async fn wait_with_progress(mcp: &mut HttpMcp, query_id: &str, token: &str) -> (u64, HttpAnswer) {
    mcp.request(
        "tools/call",
        json!({
            "name": "get_query",
            "arguments": {"query_id": query_id, "wait_seconds": 10},
            "_meta": {"progressToken": token}
        }),
    )
    .await
}

#[tokio::test]
async fn stateless_answers_are_json_unless_progress_comes_first() {
    answers_are_json_unless_progress_comes_first(true).await;
}

#[tokio::test]
async fn session_answers_are_json_unless_progress_comes_first() {
    answers_are_json_unless_progress_comes_first(false).await;
}

/// A quick answer is one JSON body; an answer that progress notifications
/// precede is an event stream, which in a session starts with a priming
/// event (an id to resume from).
async fn answers_are_json_unless_progress_comes_first(stateless: bool) {
    let nexus = fake_nexus(2).await;
    let options = HttpOptions::default().stateless(stateless);
    let served = serve_nexus(&nexus.uri(), caller_keys(false), options).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", CALLER_KEY);
    mcp.initialize().await;
    assert_eq!(
        mcp.session.is_none(),
        stateless,
        "a session unless stateless"
    );

    // A plain request-response call: one JSON body, no event stream.
    let (id, answer) = mcp
        .request(
            "tools/call",
            json!({"name": "list_contexts", "arguments": {}}),
        )
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
    assert_eq!(answer.response(id)["result"]["isError"], false);

    // A call that reports progress first: an event stream that loses nothing.
    mcp.call(
        "query_context",
        json!({"context": "papers", "question": "What is new?"}),
    )
    .await;
    let (id, answer) = wait_with_progress(&mut mcp, "q_1", "tok-2").await;
    assert!(
        answer
            .content_type
            .as_deref()
            .is_some_and(|t| t.starts_with("text/event-stream")),
        "{answer:?}"
    );
    assert_eq!(answer.notifications("notifications/progress").len(), 3);
    assert_eq!(
        answer.response(id)["result"]["structuredContent"]["status"],
        "completed"
    );
    if !stateless {
        assert_starts_with_priming_event(&answer.body);
        // A client that prefers an event stream gets one, even for a quick answer.
        let sse_first = mcp
            .http
            .post(&mcp.url)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream, application/json")
            .header("mcp-session-id", mcp.session.clone().unwrap_or_default())
            .header(
                "mcp-protocol-version",
                mcp.protocol.clone().unwrap_or_default(),
            )
            .header("X-Pinecone-Api-Key", CALLER_KEY)
            .json(&json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
                "params": {"name": "list_contexts", "arguments": {}}}))
            .send()
            .await
            .unwrap();
        assert_eq!(sse_first.status(), 200);
        assert!(
            sse_first.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        let body = sse_first.text().await.unwrap();
        assert_starts_with_priming_event(&body);
        assert!(body.contains(r#""id":99"#), "{body}");
    }
}

/// The first event of `body` has an id and no data: a priming event.
fn assert_starts_with_priming_event(body: &str) {
    let first = body.split("\n\n").next().unwrap_or_default();
    assert!(
        first.lines().any(|l| l.starts_with("id:"))
            && first
                .lines()
                .all(|l| !l.starts_with("data:") || l.trim() == "data:"),
        "the stream starts with a priming event: {body:?}"
    );
}

#[tokio::test]
async fn a_request_timeout_past_the_clock_means_no_deadline() {
    let nexus = fake_nexus(1).await;
    let options = HttpOptions::default().request_timeout(Duration::MAX);
    let served = serve_nexus(&nexus.uri(), caller_keys(false), options).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", CALLER_KEY);
    mcp.initialize().await;
    let result = mcp.call("list_contexts", json!({})).await;
    assert_eq!(result["isError"], false, "{result}");
    // An event stream (progress first) is not cut either.
    mcp.call(
        "query_context",
        json!({"context": "papers", "question": "What is new?"}),
    )
    .await;
    let (id, answer) = wait_with_progress(&mut mcp, "q_1", "tok-1").await;
    assert_eq!(
        answer.response(id)["result"]["structuredContent"]["status"],
        "completed"
    );
}

#[tokio::test]
async fn wait_without_a_progress_token_sends_no_progress() {
    let nexus = fake_nexus(1).await;
    let served = serve_nexus(&nexus.uri(), caller_keys(false), HttpOptions::default()).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", CALLER_KEY);
    mcp.initialize().await;
    let (id, answer) = mcp
        .request(
            "tools/call",
            json!({"name": "get_query", "arguments": {"query_id": "q_1", "wait_seconds": 10}}),
        )
        .await;
    assert_eq!(
        answer.response(id)["result"]["structuredContent"]["status"],
        "completed"
    );
    assert!(answer.notifications("notifications/progress").is_empty());
    // A slow answer with nothing before it is still one JSON body.
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
}

#[tokio::test]
async fn http_without_a_key_is_a_clear_unauthorized_tool_error() {
    let nexus = fake_nexus(0).await;
    let served = serve_nexus(&nexus.uri(), caller_keys(false), HttpOptions::default()).await;
    // No session without a key.
    let mut mcp = HttpMcp::new(&served.url);
    let (_, answer) = mcp
        .request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}),
        )
        .await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(answer.body.contains("X-Pinecone-Api-Key"), "{answer:?}");
    // Without sessions, a keyless call is a clear tool error.
    let served = serve_nexus(
        &nexus.uri(),
        caller_keys(false),
        HttpOptions::default().stateless(true),
    )
    .await;
    let mut mcp = HttpMcp::new(&served.url);
    mcp.protocol = Some("2025-06-18".to_owned());
    let result = mcp.call("list_contexts", json!({})).await;
    assert_eq!(result["isError"], true);
    let body: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(body["code"], "UNAUTHORIZED");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("X-Pinecone-Api-Key"),
        "{body}"
    );
    // The server's own key was not used: Nexus saw nothing.
    assert!(nexus.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn the_server_key_is_used_only_when_allowed() {
    let nexus = fake_nexus(0).await;
    let keys = KeyPolicy::Caller {
        fallback_to_configured: true,
    };
    let served = serve_nexus(&nexus.uri(), keys, HttpOptions::default()).await;
    let mut anonymous = HttpMcp::new(&served.url);
    anonymous.initialize().await;
    let result = anonymous.call("list_contexts", json!({})).await;
    assert_eq!(result["isError"], false, "{result}");
    let mut keyed = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", CALLER_KEY);
    keyed.initialize().await;
    keyed.call("list_contexts", json!({})).await;
    // A caller's own key still wins over the server's (proved once at
    // initialize, then used for the call).
    assert_eq!(
        keys_received(&nexus).await,
        [SERVER_KEY, CALLER_KEY, CALLER_KEY]
    );
}

#[tokio::test]
async fn a_foreign_origin_is_rejected_and_localhost_is_not() {
    let nexus = fake_nexus(0).await;
    let served = serve_nexus(&nexus.uri(), caller_keys(false), HttpOptions::default()).await;

    let mut evil = HttpMcp::new(&served.url)
        .header("X-Pinecone-Api-Key", CALLER_KEY)
        .header("Origin", "https://evil.example");
    let (_, answer) = evil
        .request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}),
        )
        .await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(answer.messages.is_empty());

    let mut local = HttpMcp::new(&served.url)
        .header("X-Pinecone-Api-Key", CALLER_KEY)
        .header("Origin", "http://localhost:3000");
    local.initialize().await;

    let served = serve_nexus(
        &nexus.uri(),
        caller_keys(false),
        HttpOptions::default().allowed_origins(["https://app.example:443"]),
    )
    .await;
    let mut allowed = HttpMcp::new(&served.url)
        .header("X-Pinecone-Api-Key", CALLER_KEY)
        .header("Origin", "https://app.example");
    allowed.initialize().await;
}

#[tokio::test]
async fn a_foreign_host_header_is_rejected() {
    let nexus = fake_nexus(0).await;
    let served = serve_nexus(&nexus.uri(), caller_keys(false), HttpOptions::default()).await;
    let mut rebound = HttpMcp::new(&served.url)
        .header("X-Pinecone-Api-Key", CALLER_KEY)
        .header("Host", "attacker.example");
    let (_, answer) = rebound
        .request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}),
        )
        .await;
    assert_eq!(answer.status, 403, "{answer:?}");
}

#[tokio::test]
async fn bad_arguments_over_http_are_tool_errors_not_protocol_errors() {
    let nexus = fake_nexus(0).await;
    let served = serve_nexus(&nexus.uri(), caller_keys(false), HttpOptions::default()).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", CALLER_KEY);
    mcp.initialize().await;
    let result = mcp
        .call(
            "get_query",
            json!({"query_id": true, "wait_seconds": "soon"}),
        )
        .await;
    assert_eq!(result["isError"], true);
    let body: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    // The body is also the structured content (the outputSchema admits it).
    assert_eq!(result["structuredContent"], body, "{result}");
    assert_eq!(body["code"], "VALIDATION");
    assert_eq!(body["field"], "query_id");
}
