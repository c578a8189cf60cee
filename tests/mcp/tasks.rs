//! Tasks only where a request asks for one, and schemas every client reads.
//!
//! A 2025-11-25 client that lists the tasks extension at `initialize` (as
//! the official MCP Inspector does) gets `query_context`'s plain result with
//! its structured content, over stdio (the real binary) and over HTTP
//! (sessions and stateless); the extension is not offered to revisions
//! without it. A 2026-07-28 request whose own capabilities carry the
//! extension still gets a task. Every tool's schemas use only JSON Schema
//! formats, and input schemas have no `$ref`, no `oneOf` and no type arrays.
use crate::support::mcp::{
    HttpMcp, SERVER_KEY, Served, caller_keys, fake_nexus, nexus_client, serve as serve_http,
};
use crate::support::pinecone_fake::PineconeFake;

use std::process::Stdio;
use std::time::Duration;

use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::pinecone::PineconeServer;
use nexus_knowql::mcp::{KeyPolicy, NexusMcp, NexusServer};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const TASKS: &str = "io.modelcontextprotocol/tasks";
const KEY: &str = "pcsk_tasks_caller_key_0123456789abcdef";

/// The `initialize` of a 2025-11-25 client listing the tasks extension.
fn initialize_listing_tasks() -> Value {
    json!({
        "protocolVersion": "2025-11-25",
        "capabilities": {"extensions": {TASKS: {}}},
        "clientInfo": {"name": "inspector-like", "version": "0"}
    })
}

fn ask() -> Value {
    json!({"name": "query_context", "arguments": {"context": "handbook", "question": "How?"}})
}

/// A plain `query_context` result: complete, with structured content.
fn assert_plain(result: &Value) {
    assert_ne!(result["resultType"], "task", "{result}");
    assert!(result.get("taskId").is_none(), "{result}");
    let body = &result["structuredContent"];
    assert!(body["query_id"].is_string(), "structured content: {result}");
}

// ---------------------------------------------------------------------------
// stdio: the binary, raw JSON lines.

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
            .env("RUST_LOG", "warn")
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

    async fn send(&mut self, message: &Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.input.write_all(line.as_bytes()).await.unwrap();
        self.input.flush().await.unwrap();
    }

    /// The next message whose `id` is `id` (others are skipped).
    async fn answer(&mut self, id: &Value) -> Value {
        let read = async {
            loop {
                let mut line = String::new();
                let n = self.output.read_line(&mut line).await.unwrap();
                assert!(n > 0, "stdout ended");
                let message: Value = serde_json::from_str(&line).unwrap();
                if &message["id"] == id {
                    return message;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("an answer in time")
    }

    async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        self.answer(&json!(id)).await
    }
}

#[tokio::test]
async fn stdio_client_listing_tasks_at_initialize_gets_the_plain_result() {
    let nexus = fake_nexus(0).await;
    let mut mcp = Stdio2::start(&nexus.uri());
    let init = mcp
        .request(1, "initialize", initialize_listing_tasks())
        .await;
    let result = &init["result"];
    assert_eq!(result["protocolVersion"], "2025-11-25", "{init}");
    assert!(
        result["capabilities"]["extensions"][TASKS].is_null(),
        "not offered at 2025-11-25: {result}"
    );
    mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let called = mcp.request(2, "tools/call", ask()).await;
    assert_plain(&called["result"]);
    let listed = mcp.request(3, "tools/list", json!({})).await;
    assert_portable_schemas(&listed["result"]);
}

// ---------------------------------------------------------------------------
// HTTP: sessions and stateless.

async fn serve(server: NexusMcp, stateless: bool) -> Served {
    serve_http(server, HttpOptions::default().stateless(stateless)).await
}

fn callers() -> KeyPolicy {
    caller_keys(false)
}

async fn both_families(nexus_url: &str, pinecone: &PineconeFake) -> NexusMcp {
    let pinecone = PineconeServer::new(pinecone.multi_config())
        .unwrap()
        .with_key_policy(callers());
    NexusMcp::new()
        .with_nexus(NexusServer::new(nexus_client(nexus_url)).with_key_policy(callers()))
        .with_pinecone(pinecone)
}

async fn http_client_listing_tasks_gets_the_plain_result(stateless: bool) {
    let nexus = fake_nexus(0).await;
    let pinecone = PineconeFake::start().await;
    let served = serve(both_families(&nexus.uri(), &pinecone).await, stateless).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY);
    let (id, answer) = mcp.request("initialize", initialize_listing_tasks()).await;
    let result = &answer.response(id)["result"];
    assert_eq!(result["protocolVersion"], "2025-11-25", "{result}");
    assert!(
        result["capabilities"]["extensions"][TASKS].is_null(),
        "not offered at 2025-11-25: {result}"
    );
    mcp.protocol = Some("2025-11-25".to_owned());
    mcp.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let (id, answer) = mcp.request("tools/call", ask()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_plain(&answer.response(id)["result"]);
    let (id, answer) = mcp.request("tools/list", json!({})).await;
    assert_portable_schemas(&answer.response(id)["result"]);
}

#[tokio::test]
async fn http_session_client_listing_tasks_at_initialize_gets_the_plain_result() {
    http_client_listing_tasks_gets_the_plain_result(false).await;
}

#[tokio::test]
async fn http_stateless_client_listing_tasks_at_initialize_gets_the_plain_result() {
    http_client_listing_tasks_gets_the_plain_result(true).await;
}

/// The 2026-07-28 request `_meta`, declaring tasks or not.
fn meta_2026(tasks: bool) -> Value {
    let caps = if tasks {
        json!({"extensions": {TASKS: {}}})
    } else {
        json!({})
    };
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "http-test", "version": "0"},
    })
}

async fn call_2026(mcp: &mut HttpMcp, tasks: bool) -> Value {
    let mut params = ask();
    params["_meta"] = meta_2026(tasks);
    let saved = mcp.headers.clone();
    mcp.headers.push(("Mcp-Method".into(), "tools/call".into()));
    mcp.headers
        .push(("Mcp-Name".into(), "query_context".into()));
    let (id, answer) = mcp.request("tools/call", params).await;
    mcp.headers = saved;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.response(id)["result"].clone()
}

#[tokio::test]
async fn a_2026_request_gets_a_task_only_when_its_own_capabilities_ask() {
    let nexus = fake_nexus(0).await;
    let server = NexusMcp::new()
        .with_nexus(NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(callers()));
    let served = serve(server, true).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY);
    mcp.protocol = Some("2026-07-28".to_owned());
    let task = call_2026(&mut mcp, true).await;
    assert_eq!(task["resultType"], "task", "{task}");
    let plain = call_2026(&mut mcp, false).await;
    assert_plain(&plain);
}

// ---------------------------------------------------------------------------
// Schemas.

/// Every non-standard `format` in `schema`, with its path.
fn odd_formats(schema: &Value, at: &str, out: &mut Vec<String>) {
    const STANDARD: &[&str] = &[
        "date-time",
        "date",
        "time",
        "duration",
        "email",
        "idn-email",
        "hostname",
        "idn-hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "iri",
        "iri-reference",
        "uuid",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
        "regex",
    ];
    match schema {
        Value::Object(map) => {
            if let Some(Value::String(f)) = map.get("format")
                && !STANDARD.contains(&f.as_str())
            {
                out.push(format!("{at}: {f}"));
            }
            for (k, v) in map {
                if !matches!(k.as_str(), "enum" | "const" | "default" | "examples") {
                    odd_formats(v, &format!("{at}/{k}"), out);
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                odd_formats(v, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// `$ref`, `oneOf` and type arrays anywhere in an input schema.
fn unportable(schema: &Value, at: &str, out: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            for key in ["$ref", "$defs", "definitions", "oneOf"] {
                if map.contains_key(key) {
                    out.push(format!("{at}: {key}"));
                }
            }
            if map.get("type").is_some_and(Value::is_array) {
                out.push(format!("{at}: type array"));
            }
            for (k, v) in map {
                if !matches!(k.as_str(), "enum" | "const" | "default" | "examples") {
                    unportable(v, &format!("{at}/{k}"), out);
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                unportable(v, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

fn assert_portable_schemas(listed: &Value) {
    let tools = listed["tools"].as_array().expect("tools");
    assert!(!tools.is_empty(), "{listed}");
    let mut problems = Vec::new();
    for tool in tools {
        let name = tool["name"].as_str().unwrap_or("?");
        odd_formats(
            &tool["inputSchema"],
            &format!("{name}/input"),
            &mut problems,
        );
        odd_formats(
            &tool["outputSchema"],
            &format!("{name}/output"),
            &mut problems,
        );
        unportable(
            &tool["inputSchema"],
            &format!("{name}/input"),
            &mut problems,
        );
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[tokio::test]
async fn pinecone_input_schemas_keep_their_enums_and_ranges() {
    let nexus = fake_nexus(0).await;
    let pinecone = PineconeFake::start().await;
    let served = serve(both_families(&nexus.uri(), &pinecone).await, false).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY);
    mcp.initialize().await;
    let (id, answer) = mcp.request("tools/list", json!({})).await;
    let listed = answer.response(id)["result"].clone();
    assert_portable_schemas(&listed);
    let tool = |name: &str| {
        listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} listed"))
    };
    let query = tool("query");
    let props = &query["inputSchema"]["properties"];
    assert_eq!(props["preset"]["type"], "string", "{props}");
    assert_eq!(props["preset"]["enum"], json!(["fast", "detailed", "full"]));
    assert_eq!(props["top_k"]["type"], "integer");
    assert_eq!(props["top_k"]["minimum"], 1);
    assert_eq!(props["top_k"]["maximum"], 100);
    assert_eq!(props["source"]["type"], "string");
    let required = query["inputSchema"]["required"].to_string();
    assert!(required.contains("query_text") && required.contains("namespace"));
    let guided = tool("guided_query");
    let tool_enum = &guided["inputSchema"]["properties"]["preferred_tool"]["enum"];
    assert_eq!(
        tool_enum,
        &json!(["auto", "count", "fast", "detailed", "full"])
    );
    // Output schemas keep their shape: only formats go.
    let count = tool("count");
    assert!(count["outputSchema"].is_object(), "{count}");
    drop(nexus);
}
