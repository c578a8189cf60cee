//! A tool call's log notes travel on the call's own stream, before its
//! result: the POST response over Streamable HTTP with sessions (a client
//! need not open the session's GET stream to see "degraded" warnings), and
//! stdout over stdio (the real binary).

use std::process::Stdio;
use std::time::Duration;

use crate::support::mcp as mcp_support;
use crate::support::pinecone_fake::{KEY_A, PineconeFake};
use mcp_support::*;
use nexus_knowql::mcp::NexusMcp;
use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::pinecone::PineconeServer;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// The position of the first message matching `pick`, and that message.
fn position(messages: &[Value], pick: impl Fn(&Value) -> bool) -> Option<(usize, &Value)> {
    messages.iter().enumerate().find(|(_, m)| pick(m))
}

#[tokio::test]
async fn a_sessions_call_gets_its_degraded_warning_on_its_own_response_stream() {
    let fake = PineconeFake::start().await;
    let mut config = fake.config();
    config.sources[0].rerank_model = Some("bge-reranker-v2-m3".into());
    let pinecone = PineconeServer::new(config)
        .expect("pinecone server")
        .with_key_policy(caller_keys(false));
    let served = serve(
        NexusMcp::new().with_pinecone(pinecone),
        HttpOptions::default().stateless(false),
    )
    .await;
    // No GET stream is ever opened on this session.
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_A);
    mcp.initialize().await;
    let args = json!({"query_text": "coroutines", "namespace": "wg21-papers", "top_k": 2});
    for round in 0..2 {
        fake.fail("rerank", 503, 3);
        let (id, answer) = mcp
            .request("tools/call", json!({"name": "query", "arguments": args}))
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
        let (note_at, note) =
            position(&answer.messages, |m| m["method"] == "notifications/message").unwrap_or_else(
                || panic!("round {round}: a log note on the call's stream: {answer:?}"),
            );
        let (result_at, result) = position(&answer.messages, |m| m["id"] == id)
            .unwrap_or_else(|| panic!("the result: {answer:?}"));
        assert!(note_at < result_at, "the note comes before the result");
        assert_eq!(note["params"]["level"], "warning");
        assert_eq!(note["params"]["data"]["event"], "degraded");
        assert_eq!(
            result["result"]["structuredContent"]["experimental"]["degraded"],
            true
        );
        assert!(!note.to_string().contains(KEY_A));
    }
}

#[tokio::test]
async fn the_binary_over_stdio_sends_a_calls_note_before_its_result() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let nexus = MockServer::start().await;
    // The first listing fails once: the call is retried, and says so.
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(ResponseTemplate::new(503).set_body_json(json!({"message": "busy"})))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&nexus)
        .await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .with_priority(2)
        .mount(&nexus)
        .await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_nexus-mcp"))
        .env_clear()
        .env("NEXUS_BASE_URL", nexus.uri())
        .env("PINECONE_API_KEY", SERVER_KEY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("nexus-mcp starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let lines = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "notes", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "list_contexts", "arguments": {}}}),
    ];
    for line in lines {
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write");
    }
    stdin.flush().await.expect("flush");
    let mut seen = Vec::new();
    let read = async {
        while let Some(line) = stdout.next_line().await.expect("read") {
            let message: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            let done = message["id"] == 2;
            seen.push(message);
            if done {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the call is answered");
    let (note_at, note) = position(&seen, |m| m["method"] == "notifications/message")
        .unwrap_or_else(|| panic!("a log note: {seen:?}"));
    assert_eq!(note["params"]["data"]["event"], "retried", "{note}");
    assert_eq!(
        note_at,
        seen.len() - 2,
        "the note comes right before the result"
    );
    assert_eq!(seen[seen.len() - 1]["result"]["isError"], false);
}
