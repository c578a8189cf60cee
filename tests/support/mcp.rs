//! Shared pieces of the MCP tests: a scripted Nexus (wiremock), an in-process
//! MCP client over `tokio::io::duplex`, and a JSON-RPC-over-HTTP client built
//! on reqwest 0.12.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use nexus_knowql::Client;
use nexus_knowql::mcp::http::{self, HttpOptions};
use nexus_knowql::mcp::{KeyPolicy, NexusMcp, NexusServer};
use rmcp::model::{CallToolRequestParams, CallToolResult, ProgressNotificationParam};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{body_partial_json, method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// The key the tests' MCP servers are configured with.
pub const SERVER_KEY: &str = "pcsk_server_key_0123456789abcdefghij";

/// A context document as `GET /contexts` returns it.
pub fn context_json(slug: &str, kind: &str, curated: bool, curating: bool) -> Value {
    let mut c = json!({
        "id": format!("id-{slug}"), "slug": slug, "name": format!("The {slug}"), "kind": kind,
        "created_by": "tester", "description": format!("About {slug}"),
        "is_optimizing": false, "has_sources": true, "is_curating": curating,
        "is_importing": false, "is_exploring": false, "is_restoring": false,
        "is_grooming": false, "created_at": "2026-07-01T00:00:00Z",
        "updated_at": "2026-07-02T00:00:00Z", "some_future_field": {"x": 1}
    });
    if curated {
        c["last_curated_at"] = json!("2026-07-03T10:20:30Z");
    }
    c
}

/// A query turn document.
pub fn query_json(id: &str, status: &str, steps: &[(&str, &str)], answer: Option<&str>) -> Value {
    let steps: Vec<Value> = steps
        .iter()
        .map(
            |(sid, commentary)| json!({"step_id": sid, "status": "done", "commentary": commentary}),
        )
        .collect();
    let output = match answer {
        Some(text) => {
            json!([{"role": "assistant", "content": [{"type": "output_text", "text": text}]}])
        }
        None => json!([]),
    };
    let citations = if answer.is_some() {
        json!([{"source": "guide.md", "section_paths": [["Setup", "Install"]], "pages": [2], "kind": "source"}])
    } else {
        json!([])
    };
    json!({
        "id": id, "object": "query", "session_id": "sess-1", "model": "nexus-large",
        "created": 1_780_000_000, "status": status, "input": [],
        "output": output, "citations": citations, "steps": steps, "runtime_ms": 12,
        "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}
    })
}

fn not_found(what: &str) -> ResponseTemplate {
    ResponseTemplate::new(404)
        .set_body_json(json!({"message": format!("{what} not found"), "code": "not_found"}))
}

/// A scripted Nexus with three contexts (`handbook`: work; `papers`: curated
/// search; `drafts`: search never curated), a background query `q_1` that is
/// `in_progress` for `pending_polls` polls and then completes, and 404s for
/// everything else under `/contexts/` and `/queries/`.
pub async fn fake_nexus(pending_polls: u64) -> MockServer {
    let server = MockServer::start().await;
    let contexts = vec![
        context_json("handbook", "work", false, false),
        context_json("papers", "search", true, false),
        context_json("drafts", "search", false, false),
        context_json("fresh", "search", false, true),
    ];
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(ResponseTemplate::new(200).set_body_json(&contexts))
        .mount(&server)
        .await;
    for c in &contexts {
        let slug = c["slug"].as_str().unwrap_or_default();
        Mock::given(method("GET"))
            .and(path(format!("/contexts/{slug}")))
            .respond_with(ResponseTemplate::new(200).set_body_json(c))
            .with_priority(1)
            .mount(&server)
            .await;
    }
    Mock::given(method("GET"))
        .and(path_regex(r"^/contexts/[^/]+$"))
        .respond_with(not_found("context"))
        .with_priority(10)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .and(body_partial_json(json!({"background": true})))
        .respond_with(ResponseTemplate::new(202).set_body_json(query_json(
            "q_1",
            "in_progress",
            &[],
            None,
        )))
        .mount(&server)
        .await;
    if pending_polls > 0 {
        Mock::given(method("GET"))
            .and(path("/queries/q_1"))
            .respond_with(ResponseTemplate::new(200).set_body_json(query_json(
                "q_1",
                "in_progress",
                &[("s1", "Searching the handbook"), ("s2", "Reading guide.md")],
                None,
            )))
            .up_to_n_times(pending_polls)
            .with_priority(1)
            .mount(&server)
            .await;
    }
    Mock::given(method("GET"))
        .and(path("/queries/q_1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query_json(
            "q_1",
            "completed",
            &[
                ("s1", "Searching the handbook"),
                ("s2", "Reading guide.md"),
                ("s3", "Writing the answer"),
            ],
            Some("Install it with cargo."),
        )))
        .with_priority(2)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path_regex(r"^/queries/[^/]+$"))
        .respond_with(not_found("query"))
        .with_priority(10)
        .mount(&server)
        .await;
    server
}

/// A client of `base_url` with the server key.
pub fn nexus_client(base_url: &str) -> Client {
    Client::builder()
        .base_url(base_url)
        .api_key(SERVER_KEY)
        .build()
        .unwrap()
}

/// An MCP client that records the progress notifications it receives and
/// signals each one.
#[derive(Debug, Clone)]
pub struct RecordingClient {
    pub progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    arrived: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Default for RecordingClient {
    fn default() -> Self {
        RecordingClient {
            progress: Arc::default(),
            arrived: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
}

impl RecordingClient {
    /// The progress notifications, once at least `n` arrived (bounded wait
    /// on the handler's signal).
    pub async fn progress_at_least(&self, n: usize) -> Vec<ProgressNotificationParam> {
        let mut signal = self.arrived.subscribe();
        let what = format!("{n} progress notifications");
        super::wait::signalled(&mut signal, &what, || {
            self.progress.lock().unwrap().len() >= n
        })
        .await;
        self.progress.lock().unwrap().clone()
    }
}

impl ClientHandler for RecordingClient {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
        self.arrived.send_modify(|n| *n += 1);
    }
}

/// An MCP session with `server`, in process over `tokio::io::duplex`.
pub async fn connect(server: NexusMcp) -> RunningService<RoleClient, RecordingClient> {
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    RecordingClient::default().serve(client_io).await.unwrap()
}

/// An MCP session with the Nexus tools of `base_url`, in process.
pub async fn connect_nexus(base_url: &str) -> RunningService<RoleClient, RecordingClient> {
    connect(NexusMcp::new().with_nexus(NexusServer::new(nexus_client(base_url)))).await
}

/// Calls `name` with `args` (a JSON object).
pub async fn call(
    client: &RunningService<RoleClient, RecordingClient>,
    name: &'static str,
    args: Value,
) -> CallToolResult {
    let mut params = CallToolRequestParams::new(name);
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    client.call_tool(params).await.unwrap()
}

/// The JSON of a result's first text block.
pub fn text_json(result: &CallToolResult) -> Value {
    let text = result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .expect("a text block");
    serde_json::from_str(&text).expect("the text block is JSON")
}

/// The error body of a failed call (asserting that it failed).
pub fn tool_error(result: &CallToolResult) -> Value {
    assert_eq!(
        result.is_error,
        Some(true),
        "expected a tool error: {result:?}"
    );
    text_json(result)
}

// ---------------------------------------------------------------------------
// JSON-RPC over Streamable HTTP with reqwest 0.12.

/// One answer of the HTTP endpoint.
#[derive(Debug)]
pub struct HttpAnswer {
    pub status: u16,
    /// The response's `Content-Type`.
    pub content_type: Option<String>,
    /// Every JSON-RPC message of the body (one for JSON, any number for SSE).
    pub messages: Vec<Value>,
    /// The raw body when it was neither.
    pub body: String,
}

impl HttpAnswer {
    /// The response to request `id`.
    pub fn response(&self, id: u64) -> &Value {
        self.messages
            .iter()
            .find(|m| m["id"] == json!(id))
            .unwrap_or_else(|| panic!("no response to {id}: {self:?}"))
    }

    /// The notifications that came before the response.
    pub fn notifications(&self, method_name: &str) -> Vec<&Value> {
        self.messages
            .iter()
            .filter(|m| m["method"] == method_name)
            .collect()
    }
}

/// A Streamable HTTP MCP client session.
#[derive(Debug)]
pub struct HttpMcp {
    pub http: reqwest::Client,
    pub url: String,
    pub session: Option<String>,
    pub protocol: Option<String>,
    /// Extra headers sent with every request.
    pub headers: Vec<(String, String)>,
    next_id: u64,
}

impl HttpMcp {
    pub fn new(url: impl Into<String>) -> Self {
        HttpMcp {
            http: reqwest::Client::new(),
            url: url.into(),
            session: None,
            protocol: None,
            headers: Vec::new(),
            next_id: 1,
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Uses `other`'s session and protocol version (a second connection to
    /// the same session, perhaps with another key).
    pub fn joining(mut self, other: &HttpMcp) -> Self {
        self.session = other.session.clone();
        self.protocol = other.protocol.clone();
        self
    }

    /// POSTs one JSON-RPC message and reads the whole answer.
    pub async fn post(&mut self, message: &Value) -> HttpAnswer {
        let mut req = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .json(message);
        if let Some(s) = &self.session {
            req = req.header("mcp-session-id", s);
        }
        if let Some(p) = &self.protocol {
            req = req.header("mcp-protocol-version", p);
        }
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        if let Some(s) = resp.headers().get("mcp-session-id") {
            self.session = Some(s.to_str().unwrap().to_owned());
        }
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let sse = content_type
            .as_deref()
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let body = resp.text().await.unwrap();
        let messages = if sse {
            body.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .collect()
        } else {
            serde_json::from_str::<Value>(&body)
                .ok()
                .into_iter()
                .collect()
        };
        HttpAnswer {
            status,
            content_type,
            messages,
            body,
        }
    }

    /// Sends request `method` and returns the answer and the request id.
    pub async fn request(&mut self, method_name: &str, params: Value) -> (u64, HttpAnswer) {
        let id = self.next_id;
        self.next_id += 1;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method_name, "params": params});
        (id, self.post(&msg).await)
    }

    /// `initialize` then `notifications/initialized`; returns the initialize result.
    pub async fn initialize(&mut self) -> Value {
        let (id, answer) = self
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "http-test", "version": "0"}
                }),
            )
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
        let result = answer.response(id)["result"].clone();
        self.protocol = result["protocolVersion"].as_str().map(str::to_owned);
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let ack = self.post(&note).await;
        assert!(ack.status < 300, "{ack:?}");
        result
    }

    /// `tools/call`; returns the JSON-RPC `result` (or panics on a protocol error).
    pub async fn call(&mut self, name: &str, args: Value) -> Value {
        let (id, answer) = self
            .request("tools/call", json!({"name": name, "arguments": args}))
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
        answer.response(id)["result"].clone()
    }
}

/// An in-process Streamable HTTP server on 127.0.0.1; shut down on drop.
pub struct Served {
    /// The MCP endpoint (`http://127.0.0.1:PORT/mcp`).
    pub url: String,
    /// The listening address.
    pub addr: SocketAddr,
    pub shutdown: CancellationToken,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Serves `server` over Streamable HTTP on a free loopback port.
pub async fn serve(server: NexusMcp, options: HttpOptions) -> Served {
    let listener = http::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let url = format!("http://{addr}{}", http::MCP_PATH);
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    tokio::spawn(async move { http::serve(listener, server, &options, token).await });
    Served {
        url,
        addr,
        shutdown,
    }
}

/// Every caller brings its own key; `fallback`: keyless callers get the
/// configured one.
pub fn caller_keys(fallback: bool) -> KeyPolicy {
    KeyPolicy::Caller {
        fallback_to_configured: fallback,
    }
}

/// The outcome label of the first finished call to `tool` that `metrics`
/// recorded, waiting for one (a bounded poll: the server records a call
/// when its handler returns, so this is the signal that the call's work
/// is over). Panics when none ends within `within`.
pub async fn ended_call(
    metrics: &nexus_knowql::mcp::Metrics,
    tool: &str,
    within: std::time::Duration,
) -> String {
    let series = format!("nexus_mcp_tool_calls_total{{tool=\"{tool}\",outcome=\"");
    let ended = || {
        metrics.render().lines().find_map(|line| {
            let rest = line.strip_prefix(series.as_str())?;
            let (outcome, count) = rest.split_once("\"} ")?;
            (count.trim().parse::<f64>().ok()? > 0.0).then(|| outcome.to_owned())
        })
    };
    let what = format!("a call to {tool} ending");
    super::wait::until_some(within, &what, async || ended()).await
}

/// Moves tokio's clock `by` forward at once, then lets it run again: what
/// reads `tokio::time::Instant` (the Pinecone caches and gates) sees `by`
/// pass, without a wall-clock wait and without pausing the clock while
/// requests are on the wire. Needs a current-thread runtime.
pub async fn jump_clock(by: std::time::Duration) {
    tokio::time::pause();
    tokio::time::advance(by).await;
    tokio::time::resume();
}

/// The shared bounded poll ([`super::wait::until`]), by the name the MCP
/// tests know it.
pub async fn wait_until(within: std::time::Duration, what: &str, check: impl AsyncFnMut() -> bool) {
    super::wait::until(within, what, check).await;
}

/// How many requests `nexus` received.
pub async fn received_count(nexus: &MockServer) -> usize {
    nexus.received_requests().await.map_or(0, |r| r.len())
}

/// The value of one series (its full name with labels, as rendered) in
/// `metrics`; 0 when absent.
pub fn sample(metrics: &nexus_knowql::mcp::Metrics, series: &str) -> f64 {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}
