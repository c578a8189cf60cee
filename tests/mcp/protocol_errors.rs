//! Exact JSON-RPC errors over stdio (the real binary) and HTTP:
//!
//! - malformed parameters of a known method: `-32602` with the request's id;
//! - a body that is no valid request (object id, array params, result and
//!   error together): `-32600` with `"id": null` (HTTP 400);
//! - a cursor on a one-page list: `-32602`;
//! - `completion/complete` for an unknown prompt: an empty list, which the
//!   official conformance scenario requires;
//! - a second `initialize` in a live session: refused.
use crate::support::mcp::{
    HttpMcp, SERVER_KEY, Served, caller_keys, fake_nexus, nexus_client, serve as serve_http,
};

use std::process::Stdio;
use std::time::Duration;

use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::{NexusMcp, NexusServer};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const KEY: &str = "pcsk_protocol_caller_key_0123456789ab";

fn init_params() -> Value {
    json!({
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "protocol-test", "version": "0"}
    })
}

/// Requests with malformed parameters of known methods.
fn malformed() -> Vec<Value> {
    vec![
        json!({"jsonrpc": "2.0", "id": 11, "method": "logging/setLevel", "params": {"level": "verbose"}}),
        json!({"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": {"name": "list_contexts", "arguments": [1, 2]}}),
        json!({"jsonrpc": "2.0", "id": 13, "method": "completion/complete", "params": {"ref": {"type": "ref/nothing"}, "argument": {"name": "a", "value": ""}}}),
    ]
}

/// Bodies that are no valid JSON-RPC request.
fn invalid() -> Vec<&'static str> {
    vec![
        r#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":21,"method":"tools/list","params":[1]}"#,
        r#"{"jsonrpc":"2.0","id":22,"result":{},"error":{"code":1,"message":"both"}}"#,
    ]
}

/// Requests refused for what they ask: (request, expected code).
fn refused() -> Vec<Value> {
    vec![
        json!({"jsonrpc": "2.0", "id": 31, "method": "tools/list", "params": {"cursor": "bogus"}}),
        json!({"jsonrpc": "2.0", "id": 32, "method": "prompts/list", "params": {"cursor": "bogus"}}),
        json!({"jsonrpc": "2.0", "id": 33, "method": "resources/templates/list", "params": {"cursor": "bogus"}}),
        json!({"jsonrpc": "2.0", "id": 35, "method": "initialize", "params": init_params()}),
    ]
}

fn assert_error(answer: &Value, id: &Value, code: i64) {
    assert_eq!(&answer["id"], id, "{answer}");
    assert_eq!(answer["error"]["code"], code, "{answer}");
    assert!(answer.get("result").is_none(), "{answer}");
}

// ---------------------------------------------------------------------------
// stdio.

struct Stdio2 {
    _child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Stdio2 {
    fn start(nexus_url: &str) -> Stdio2 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nexus-mcp"))
            .env_clear()
            .env("NEXUS_BASE_URL", nexus_url)
            .env("PINECONE_API_KEY", SERVER_KEY)
            .env("RUST_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nexus-mcp starts");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        Stdio2 {
            _child: child,
            input,
            output,
        }
    }

    async fn send_line(&mut self, line: &str) {
        self.input.write_all(line.as_bytes()).await.unwrap();
        self.input.write_all(b"\n").await.unwrap();
        self.input.flush().await.unwrap();
    }

    /// The next line that is a response (has `result` or `error`).
    async fn next_answer(&mut self) -> Value {
        let read = async {
            loop {
                let mut line = String::new();
                let n = self.output.read_line(&mut line).await.unwrap();
                assert!(n > 0, "stdout ended");
                let message: Value = serde_json::from_str(&line).unwrap();
                if message.get("result").is_some() || message.get("error").is_some() {
                    return message;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("an answer in time")
    }
}

#[tokio::test]
async fn stdio_answers_each_case_with_its_exact_error() {
    let nexus = fake_nexus(0).await;
    let mut mcp = Stdio2::start(&nexus.uri());
    mcp.send_line(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init_params()})
            .to_string(),
    )
    .await;
    let init = mcp.next_answer().await;
    assert!(init["result"].is_object(), "{init}");
    mcp.send_line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    for request in malformed() {
        mcp.send_line(&request.to_string()).await;
        let answer = mcp.next_answer().await;
        assert_error(&answer, &request["id"], -32602);
    }
    for body in invalid() {
        mcp.send_line(body).await;
        let answer = mcp.next_answer().await;
        assert!(answer.as_object().unwrap().contains_key("id"), "{answer}");
        assert_error(&answer, &Value::Null, -32600);
    }
    for request in refused() {
        mcp.send_line(&request.to_string()).await;
        let answer = mcp.next_answer().await;
        let code = if request["method"] == "initialize" {
            -32600
        } else {
            -32602
        };
        assert_error(&answer, &request["id"], code);
    }
    // The session still works.
    mcp.send_line(r#"{"jsonrpc":"2.0","id":99,"method":"tools/list"}"#)
        .await;
    let listed = mcp.next_answer().await;
    assert!(listed["result"]["tools"].is_array(), "{listed}");
}

// ---------------------------------------------------------------------------
// HTTP.

async fn serve(stateless: bool) -> (Served, wiremock::MockServer) {
    let nexus = fake_nexus(0).await;
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(caller_keys(false)),
    );
    let served = serve_http(server, HttpOptions::default().stateless(stateless)).await;
    (served, nexus)
}

async fn post_raw(mcp: &HttpMcp, body: &str) -> (u16, Value) {
    let mut req = mcp
        .http
        .post(&mcp.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_owned());
    if let Some(s) = &mcp.session {
        req = req.header("mcp-session-id", s);
    }
    if let Some(p) = &mcp.protocol {
        req = req.header("mcp-protocol-version", p);
    }
    for (k, v) in &mcp.headers {
        req = req.header(k, v);
    }
    let response = req.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m.get("result").is_some() || m.get("error").is_some())
        .or_else(|| serde_json::from_str(&text).ok())
        .unwrap_or_else(|| panic!("no JSON-RPC answer ({status}): {text}"));
    (status, value)
}

async fn http_answers_each_case_with_its_exact_error(stateless: bool) {
    let (served, _nexus) = serve(stateless).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY);
    let (id, answer) = mcp.request("initialize", init_params()).await;
    assert!(answer.response(id)["result"].is_object(), "{answer:?}");
    mcp.protocol = Some("2025-11-25".to_owned());
    mcp.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    for request in malformed() {
        let (status, answer) = post_raw(&mcp, &request.to_string()).await;
        assert_eq!(status, 200, "{answer}");
        assert_error(&answer, &request["id"], -32602);
    }
    for body in invalid() {
        let (status, answer) = post_raw(&mcp, body).await;
        assert_eq!(status, 400, "{answer}");
        assert!(answer.as_object().unwrap().contains_key("id"), "{answer}");
        assert_error(&answer, &Value::Null, -32600);
    }
    for request in refused() {
        if stateless && request["method"] == "initialize" {
            // Without sessions every initialize is a first one.
            continue;
        }
        let (_, answer) = post_raw(&mcp, &request.to_string()).await;
        let code = if request["method"] == "initialize" {
            -32600
        } else {
            -32602
        };
        assert_error(&answer, &request["id"], code);
    }
}

#[tokio::test]
async fn http_sessions_answer_each_case_with_its_exact_error() {
    http_answers_each_case_with_its_exact_error(false).await;
}

#[tokio::test]
async fn http_stateless_answers_each_case_with_its_exact_error() {
    http_answers_each_case_with_its_exact_error(true).await;
}
