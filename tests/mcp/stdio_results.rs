//! Tool results over stdio, where the binary writes `structuredContent`
//! from the result's text: for each protocol revision, the structured
//! content is the text's JSON, and both are what the same tools answer in
//! process. Degradation notes, read from the structured content, still go
//! out.

use std::process::Stdio;
use std::time::Duration;

use crate::support::pinecone_fake::{KEY_A, PineconeFake};
use nexus_knowql::mcp::pinecone::PineconeServer;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

struct Binary {
    _child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    next_id: u64,
    /// Notifications read while waiting for answers.
    notes: Vec<Value>,
}

impl Binary {
    async fn start(fake: &PineconeFake, revision: &str) -> Binary {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nexus-mcp"))
            .env_clear()
            .env("PINECONE_API_KEY", KEY_A)
            .env("PINECONE_INDEX_NAME", "kb")
            .env("PINECONE_CONTROLLER_HOST", &fake.url)
            .env("PINECONE_DISABLE_SUGGEST_FLOW", "true")
            .env("RUST_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nexus-mcp starts");
        let mut binary = Binary {
            input: child.stdin.take().unwrap(),
            output: BufReader::new(child.stdout.take().unwrap()),
            _child: child,
            next_id: 1,
            notes: Vec::new(),
        };
        let init = json!({
            "protocolVersion": revision,
            "capabilities": {},
            "clientInfo": {"name": "stdio-results", "version": "0"}
        });
        binary.request("initialize", init).await;
        binary
            .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        binary
            .request("logging/setLevel", json!({"level": "debug"}))
            .await;
        binary
    }

    async fn send(&mut self, message: Value) {
        let mut line = message.to_string().into_bytes();
        line.push(b'\n');
        self.input.write_all(&line).await.unwrap();
        self.input.flush().await.unwrap();
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let line = self.request_line(method, params).await;
        let answer: Value = serde_json::from_str(&line).expect("one JSON message a line");
        assert!(answer.get("error").is_none(), "{answer}");
        answer["result"].clone()
    }

    /// The answer's line, as written.
    async fn request_line(&mut self, method: &str, params: Value) -> String {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let read = async {
            loop {
                let mut line = String::new();
                assert!(
                    self.output.read_line(&mut line).await.unwrap() > 0,
                    "stdout ended"
                );
                let message: Value = serde_json::from_str(&line).expect("one JSON message a line");
                if message["id"] == id {
                    return line.trim_end_matches('\n').to_owned();
                }
                self.notes.push(message);
            }
        };
        tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("an answer in time")
    }
}

async fn in_process(fake: &PineconeFake) -> RunningService<RoleClient, ()> {
    let server = PineconeServer::new(fake.config()).expect("server");
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_io).await.expect("client connects")
}

/// The structured content of a stdio answer, checked against its text.
fn structured(result: &Value) -> Value {
    let structured = result["structuredContent"].clone();
    assert!(structured.is_object(), "{result}");
    let text = result["content"][0]["text"]
        .as_str()
        .expect("a text content");
    assert_eq!(
        result["content"].as_array().map(Vec::len),
        Some(1),
        "{result}"
    );
    let from_text: Value = serde_json::from_str(text).expect("the text is JSON");
    assert_eq!(structured, from_text, "{result}");
    structured
}

/// `value` without the fields that change from call to call.
fn steady(mut value: Value) -> Value {
    if let Some(map) = value.as_object_mut() {
        for key in ["cache_hit", "cache_ttl_seconds", "expires_at_iso"] {
            map.remove(key);
        }
    }
    value
}

#[tokio::test]
async fn stdio_results_carry_their_text_as_structured_content() {
    let fake = PineconeFake::start().await;
    let client = in_process(&fake).await;
    let calls = [
        ("list_namespaces", json!({})),
        (
            "query",
            json!({"query_text": "coroutines", "namespace": "wg21-papers", "preset": "fast"}),
        ),
        (
            "query",
            json!({"query_text": "exception \"safety\"", "namespace": "wg21-papers", "use_reranking": false}),
        ),
        (
            "count",
            json!({"query_text": "coroutines", "namespace": "wg21-papers"}),
        ),
        ("namespace_router", json!({"user_query": "wg21 papers"})),
    ];
    for revision in ["2025-06-18", "2025-11-25"] {
        let mut binary = Binary::start(&fake, revision).await;
        for (tool, arguments) in &calls {
            let over_stdio = binary
                .request("tools/call", json!({"name": tool, "arguments": arguments}))
                .await;
            assert_eq!(over_stdio["isError"], false, "{over_stdio}");
            let params = CallToolRequestParams::new(*tool)
                .with_arguments(arguments.as_object().cloned().unwrap_or_default());
            let here = client.call_tool(params).await.expect("tools/call");
            let here = here.structured_content.expect("structured content");
            assert_eq!(
                steady(structured(&over_stdio)),
                steady(here),
                "{tool} at {revision}"
            );
        }
    }
}

#[tokio::test]
async fn a_degraded_result_over_stdio_still_sends_its_note() {
    let fake = PineconeFake::start().await;
    let mut binary = Binary::start(&fake, "2025-11-25").await;
    fake.fail("search:kb-sparse", 400, 1);
    let result = binary
        .request(
            "tools/call",
            json!({"name": "query", "arguments": {"query_text": "exception safety", "namespace": "wg21-papers", "use_reranking": false}}),
        )
        .await;
    assert_eq!(
        structured(&result)["experimental"],
        json!({"hybrid_leg_failed": "sparse"})
    );
    let fallback = binary.notes.iter().find(|n| {
        n["method"] == "notifications/message" && n["params"]["data"]["event"] == "fallback"
    });
    assert!(fallback.is_some(), "{:?}", binary.notes);
}

/// The keys of a JSON object, in the order written.
fn keys(value: &Value) -> Vec<&str> {
    value
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn resources_and_prompts_over_stdio_are_written_as_before() {
    let fake = PineconeFake::start().await;
    let mut binary = Binary::start(&fake, "2025-11-25").await;
    let reads = [
        (
            "resources/read",
            json!({"uri": "pinecone://kb/wg21-papers"}),
        ),
        (
            "prompts/get",
            json!({"name": "research_namespace", "arguments": {
                "index": "kb", "namespace": "wg21-papers", "topic": "coroutines \"safety\""
            }}),
        ),
        ("resources/list", json!({})),
        ("prompts/list", json!({})),
        ("resources/templates/list", json!({})),
    ];
    for (method, params) in reads {
        let line = binary.request_line(method, params).await;
        // Written compactly, keys in their declared order: the bytes are
        // those of the message's own serialization.
        let answer: Value = serde_json::from_str(&line).expect("JSON");
        assert!(answer.get("error").is_none(), "{line}");
        assert_eq!(answer.to_string(), line, "{method}");
        if method == "resources/read" {
            let contents = &answer["result"]["contents"];
            assert_eq!(contents.as_array().map(Vec::len), Some(1), "{line}");
            let text = contents[0]["text"].as_str().expect("a text");
            let body: Value = serde_json::from_str(text).expect("a JSON body");
            // The body as the JSON object it always was: these keys, in
            // this order, null where unknown, written compactly.
            assert_eq!(
                keys(&body),
                [
                    "index",
                    "namespace",
                    "source",
                    "record_count",
                    "metadata_fields",
                    "schema_source",
                    "description"
                ],
                "{text}"
            );
            let expected = json!({
                "index": "kb",
                "namespace": "wg21-papers",
                "source": null,
                "record_count": body["record_count"],
                "metadata_fields": body["metadata_fields"],
                "schema_source": body["schema_source"],
                "description": body["description"],
            });
            assert_eq!(text, expected.to_string());
            assert_eq!(body["record_count"], 4, "{text}");
            assert!(body["metadata_fields"]["title"].is_string(), "{text}");
        }
    }
}
