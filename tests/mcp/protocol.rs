//! nexus-mcp's protocol features: MCP logging (`logging/setLevel`,
//! `notifications/message` about degraded results), `query_context` as an
//! MCP task against the embedded local Nexus, and the protocol revisions
//! served — with rmcp's client (in process and over stdio through the real
//! binary) and JSON-RPC over Streamable HTTP (sessions and stateless).
#![allow(deprecated)] // rmcp marks MCP logging deprecated (SEP-2577)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::mcp as mcp_support;
use crate::support::pinecone_fake::{KEY_A, PineconeFake};
use mcp_support::*;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::pinecone::PineconeServer;
use nexus_knowql::mcp::{NexusMcp, NexusServer};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig,
    GetTaskParams, Implementation, LoggingLevel, LoggingMessageNotificationParam, ProtocolVersion,
    SetLevelRequestParams, TaskPayload, TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, NotificationContext, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::process::Command;

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
const KEY_1: &str = "pcsk_first_caller_key_0123456789abcd";
const KEY_2: &str = "pcsk_second_caller_key_0123456789abc";
const TASKS: &str = "io.modelcontextprotocol/tasks";

async fn local_nexus(frame_delay: Duration) -> LocalNexus {
    LocalNexus::builder()
        .context("docs", CORPUS)
        .frame_delay(frame_delay)
        .start()
        .await
        .expect("local nexus starts")
}

/// An rmcp client that may declare task support and records log messages.
#[derive(Clone, Default)]
struct Client {
    tasks: bool,
    version: Option<ProtocolVersion>,
    logs: Arc<Mutex<Vec<LoggingMessageNotificationParam>>>,
    logged: Arc<tokio::sync::Notify>,
}

impl Client {
    fn with_tasks() -> Self {
        Client {
            tasks: true,
            ..Client::default()
        }
    }

    fn logs(&self) -> Vec<LoggingMessageNotificationParam> {
        self.logs.lock().unwrap().clone()
    }

    /// Waits (bounded) until at least `n` log messages arrived.
    async fn wait_logs(&self, n: usize) -> Vec<LoggingMessageNotificationParam> {
        let wait = async {
            loop {
                let notified = self.logged.notified();
                if self.logs.lock().unwrap().len() >= n {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("log messages arrive");
        self.logs()
    }
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        let caps = if self.tasks {
            ClientCapabilities::builder().enable_tasks().build()
        } else {
            ClientCapabilities::default()
        };
        let info = ClientConfig::new(caps, Implementation::new("protocol-test", "0"));
        match &self.version {
            Some(v) => info.with_protocol_version(v.clone()),
            None => info,
        }
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logs.lock().unwrap().push(params);
        self.logged.notify_waiters();
    }
}

async fn connect_with(server: NexusMcp, client: Client) -> RunningService<RoleClient, Client> {
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    client.serve(client_io).await.expect("client connects")
}

/// A 2026-07-28 connection (no `initialize`; each request carries its own
/// `_meta`, task support included when the client declares it).
async fn connect_2026(server: NexusMcp, client: Client) -> RunningService<RoleClient, Client> {
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    client
        .serve_with_lifecycle(
            client_io,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("client connects")
}

fn params(name: &'static str, args: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(name).with_arguments(args.as_object().cloned().unwrap_or_default())
}

fn ask() -> Value {
    json!({"context": "docs", "question": "How do I resume a stream?"})
}

// ---------------------------------------------------------------------------
// Logging.

fn degraded_query() -> CallToolRequestParams {
    params(
        "query",
        json!({"query_text": "coroutines", "namespace": "wg21-papers", "top_k": 2}),
    )
}

fn pinecone_with_rerank(fake: &PineconeFake) -> PineconeServer {
    let mut config = fake.config();
    config.sources[0].rerank_model = Some("bge-reranker-v2-m3".into());
    PineconeServer::new(config).expect("pinecone server")
}

#[tokio::test]
async fn a_degraded_result_is_logged_at_warning_filtered_by_set_level_without_the_key() {
    let fake = PineconeFake::start().await;
    let server = NexusMcp::new().with_pinecone(pinecone_with_rerank(&fake));
    let recorder = Client::default();
    let client = connect_with(server, recorder.clone()).await;
    let caps = client
        .peer_info()
        .expect("server info")
        .capabilities
        .clone();
    assert!(caps.logging.is_some(), "logging is declared: {caps:?}");

    // At `error`, a degraded result (a warning) is not sent.
    client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Error))
        .await
        .expect("setLevel");
    fake.fail("rerank", 503, 3);
    let first = client.call_tool(degraded_query()).await.expect("query");
    assert_eq!(
        first.structured_content.unwrap()["experimental"]["degraded"],
        true
    );

    // At `warning` it is.
    client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Warning))
        .await
        .expect("setLevel");
    fake.fail("rerank", 503, 3);
    client.call_tool(degraded_query()).await.expect("query");
    let logs = recorder.wait_logs(1).await;
    assert_eq!(logs.len(), 1, "only the second call was logged: {logs:?}");
    let log = &logs[0];
    assert_eq!(log.level, LoggingLevel::Warning);
    assert_eq!(log.logger.as_deref(), Some("nexus-mcp"));
    assert_eq!(log.data["event"], "degraded");
    assert_eq!(log.data["tool"], "query");
    let reason = log.data["reason"].as_str().expect("reason");
    assert!(reason.starts_with("rerank_failed"), "{reason}");
    assert!(
        !log.data.to_string().contains(KEY_A),
        "no key: {}",
        log.data
    );
    assert!(
        !log.data.to_string().contains("pcsk_"),
        "no key: {}",
        log.data
    );
}

#[tokio::test]
async fn a_slow_call_is_logged_at_notice() {
    let fake = PineconeFake::start().await;
    fake.delay("search:kb", Duration::from_millis(300));
    let server = NexusMcp::new()
        .with_pinecone(PineconeServer::new(fake.config()).expect("pinecone server"))
        .with_slow_call_threshold(Duration::from_millis(200));
    let recorder = Client::default();
    let client = connect_with(server, recorder.clone()).await;
    client.call_tool(degraded_query()).await.expect("query");
    let logs = recorder.wait_logs(1).await;
    let slow = logs
        .iter()
        .find(|l| l.data["event"] == "slow_call")
        .unwrap_or_else(|| panic!("a slow-call message: {logs:?}"));
    assert_eq!(slow.level, LoggingLevel::Notice);
    assert_eq!(slow.data["threshold_ms"], 200);
    assert!(slow.data["duration_ms"].as_u64().unwrap() >= 200);
}

/// The session's level counts as it is when a call's messages go out: a
/// `logging/setLevel` sent while a slow call runs applies to that call.
#[tokio::test]
async fn a_level_set_during_a_call_applies_to_its_messages() {
    let fake = PineconeFake::start().await;
    fake.delay("search:kb", Duration::from_millis(800));
    fake.delay("search:kb-sparse", Duration::from_millis(800));
    let server = NexusMcp::new()
        .with_pinecone(PineconeServer::new(fake.config()).expect("pinecone server"))
        .with_slow_call_threshold(Duration::from_millis(200));
    let recorder = Client::default();
    let client = connect_with(server, recorder.clone()).await;
    let peer = client.peer().clone();
    let call = tokio::spawn(async move { peer.call_tool(degraded_query()).await });
    // The call is running: its search reached Pinecone.
    crate::support::mcp::wait_until(Duration::from_secs(10), "the search is sent", || async {
        fake.count("search:kb") >= 1
    })
    .await;
    client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Error))
        .await
        .expect("setLevel");
    call.await.expect("the call's task").expect("query");
    // A later slow call, at notice again: its message arrives after any
    // the first call sent (messages about a call go out before its result).
    client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Notice))
        .await
        .expect("setLevel");
    client
        .call_tool(params(
            "keyword_search",
            json!({"query_text": "coroutines", "namespace": "wg21-papers"}),
        ))
        .await
        .expect("keyword_search");
    let slow = |logs: &[LoggingMessageNotificationParam], tool: &str| {
        logs.iter()
            .filter(|l| l.data["event"] == "slow_call" && l.data["tool"] == tool)
            .count()
    };
    let mut logs = recorder.wait_logs(1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while slow(&logs, "keyword_search") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "{logs:?}");
        logs = recorder.wait_logs(logs.len() + 1).await;
    }
    assert_eq!(
        slow(&logs, "query"),
        0,
        "a notice after the level was raised to error: {logs:?}"
    );
}

#[tokio::test]
async fn retried_nexus_calls_are_logged_at_notice() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let nexus = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(ResponseTemplate::new(503).set_body_json(json!({"message": "busy"})))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&nexus)
        .await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .with_priority(2)
        .mount(&nexus)
        .await;
    let sdk = nexus_knowql::Client::builder()
        .base_url(nexus.uri())
        .api_key(SERVER_KEY)
        .retry(nexus_knowql::RetryPolicy::default().initial_delay(Duration::from_millis(5)))
        .build()
        .unwrap();
    let recorder = Client::default();
    let client = connect_with(
        NexusMcp::new().with_nexus(NexusServer::new(sdk)),
        recorder.clone(),
    )
    .await;
    let listed = client
        .call_tool(params("list_contexts", json!({})))
        .await
        .expect("list_contexts");
    assert_eq!(listed.is_error, Some(false));
    let logs = recorder.wait_logs(1).await;
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert_eq!(logs[0].level, LoggingLevel::Notice);
    assert_eq!(logs[0].data["event"], "retried");
    assert_eq!(logs[0].data["upstream"], "nexus");
    assert_eq!(logs[0].data["retries"], 2);
    assert!(!logs[0].data.to_string().contains(SERVER_KEY));
}

async fn serve_http(server: NexusMcp, stateless: bool) -> Served {
    serve(server, HttpOptions::default().stateless(stateless)).await
}

/// The 2026-07-28 request `_meta`: every request says who it is.
fn meta_2026(tasks: bool, level: Option<&str>) -> Value {
    let mut caps = json!({});
    if tasks {
        caps = json!({"extensions": {TASKS: {}}});
    }
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "http-test", "version": "0"},
    });
    if let Some(level) = level {
        meta["io.modelcontextprotocol/logLevel"] = json!(level);
    }
    meta
}

/// A 2026-07-28 request over HTTP: the method and name also ride in the
/// `Mcp-Method` and `Mcp-Name` headers.
async fn request_2026(mcp: &mut HttpMcp, method: &str, params: Value) -> (u64, HttpAnswer) {
    let saved = mcp.headers.clone();
    mcp.headers
        .push(("Mcp-Method".to_owned(), method.to_owned()));
    let name = params
        .get("name")
        .or_else(|| params.get("taskId"))
        .and_then(Value::as_str);
    if let Some(name) = name {
        mcp.headers.push(("Mcp-Name".to_owned(), name.to_owned()));
    }
    let answer = mcp.request(method, params).await;
    mcp.headers = saved;
    answer
}

#[tokio::test]
async fn stateless_http_logs_per_request_level() {
    let fake = PineconeFake::start().await;
    let server = NexusMcp::new()
        .with_pinecone(pinecone_with_rerank(&fake).with_key_policy(caller_keys(false)));
    let served = serve_http(server, true).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_A);
    mcp.protocol = Some("2026-07-28".to_owned());
    let args = json!({"query_text": "coroutines", "namespace": "wg21-papers", "top_k": 2});

    for (level, expected) in [("error", 0), ("warning", 1)] {
        fake.fail("rerank", 503, 3);
        let (id, answer) = request_2026(
            &mut mcp,
            "tools/call",
            json!({"name": "query", "arguments": args, "_meta": meta_2026(false, Some(level))}),
        )
        .await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(
            answer.response(id)["result"]["structuredContent"]["experimental"]["degraded"],
            true
        );
        let logs = answer.notifications("notifications/message");
        assert_eq!(logs.len(), expected, "at {level}: {logs:?}");
        for log in logs {
            assert_eq!(log["params"]["level"], "warning");
            assert_eq!(log["params"]["data"]["event"], "degraded");
            assert!(!log.to_string().contains(KEY_A));
        }
    }
}

#[tokio::test]
async fn session_http_logs_on_the_calls_stream_after_set_level() {
    let fake = PineconeFake::start().await;
    let server = NexusMcp::new()
        .with_pinecone(pinecone_with_rerank(&fake).with_key_policy(caller_keys(false)));
    let served = serve_http(server, false).await;
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_A);
    let init = mcp.initialize().await;
    assert!(init["capabilities"]["logging"].is_object(), "{init}");
    let args = json!({"query_text": "coroutines", "namespace": "wg21-papers", "top_k": 2});
    // Another session's level is its own.
    let mut other = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_A);
    other.initialize().await;
    // The rerank fails with 503 at `error`, with 500 at `warning`: a call's
    // messages travel on its own response stream, before its result.
    for (level, status, expected) in [("error", 503, 0), ("warning", 500, 1)] {
        let (id, answer) = mcp
            .request("logging/setLevel", json!({"level": level}))
            .await;
        assert!(answer.response(id)["result"].is_object(), "{answer:?}");
        let (id, answer) = other
            .request("logging/setLevel", json!({"level": "emergency"}))
            .await;
        assert!(answer.response(id)["result"].is_object(), "{answer:?}");
        fake.fail("rerank", status, 3);
        let (id, answer) = mcp
            .request("tools/call", json!({"name": "query", "arguments": args}))
            .await;
        assert!(answer.response(id)["result"].is_object(), "{answer:?}");
        let logs = answer.notifications("notifications/message");
        assert_eq!(logs.len(), expected, "at {level}: {answer:?}");
        for log in logs {
            assert_eq!(log["params"]["level"], "warning");
            let reason = log["params"]["data"]["reason"].as_str().unwrap_or_default();
            assert!(reason.contains("HTTP 500"), "the second call's: {log}");
            assert!(!log.to_string().contains(KEY_A));
        }
    }
}

// ---------------------------------------------------------------------------
// Tasks.

async fn task_server(nexus: &LocalNexus) -> NexusMcp {
    NexusMcp::new().with_nexus(NexusServer::new(nexus_client(nexus.base_url())))
}

/// Polls `tasks/get` until the task ends.
async fn until_ended(
    client: &RunningService<RoleClient, Client>,
    id: &str,
) -> rmcp::model::DetailedTask {
    let what = format!("task {id} ending");
    crate::support::wait::until_some(Duration::from_secs(10), &what, async || {
        let got = client
            .get_task(GetTaskParams::new(id))
            .await
            .expect("tasks/get");
        got.task.status().is_terminal().then_some(got.task)
    })
    .await
}

#[tokio::test]
async fn query_context_runs_as_a_task_whose_result_is_the_answer() {
    let nexus = local_nexus(Duration::from_millis(20)).await;
    let client = connect_2026(task_server(&nexus).await, Client::with_tasks()).await;
    let caps = client
        .peer_info()
        .expect("server info")
        .capabilities
        .clone();
    assert!(caps.supports_tasks(), "{caps:?}");

    let created = client
        .call_tool_once(params("query_context", ask()))
        .await
        .expect("tools/call");
    let CallToolResponse::Task(created) = created else {
        panic!("a task: {created:?}");
    };
    let id = created.task.task_id.clone();
    assert_eq!(created.task.status, TaskStatus::Working);
    // The task id seals the Nexus query id.
    let query_id = id
        .splitn(5, '.')
        .nth(4)
        .expect("a sealed query id")
        .to_owned();
    let query = nexus_client(nexus.base_url())
        .queries()
        .get(&query_id)
        .await
        .expect("the turn exists in Nexus");
    assert_eq!(query.id, query_id);

    let ended = until_ended(&client, &id).await;
    assert_eq!(ended.status(), TaskStatus::Completed);
    let TaskPayload::Completed { result } = ended.payload else {
        panic!("completed with a result");
    };
    let body = &result["structuredContent"];
    assert_eq!(body["query_id"], query_id.as_str());
    assert_eq!(body["status"], "completed");
    let answer = body["answer"].as_str().expect("an answer");
    assert!(answer.contains("Last-Event-ID"), "{answer}");
    let citations = body["citations"].as_array().expect("citations");
    assert!(
        citations.iter().any(|c| c["source"] == "streaming.md"),
        "{citations:?}"
    );
    // An unknown id is an error, like another caller's.
    let missing = client.get_task(GetTaskParams::new("qry_nope")).await;
    assert!(missing.is_err(), "{missing:?}");
    nexus.shutdown().await;
}

#[tokio::test]
async fn tasks_cancel_cancels_the_nexus_turn() {
    // A slow turn: still running when the cancel arrives.
    let nexus = local_nexus(Duration::from_millis(400)).await;
    let client = connect_2026(task_server(&nexus).await, Client::with_tasks()).await;
    let created = client
        .call_tool_once(params("query_context", ask()))
        .await
        .expect("tools/call");
    let CallToolResponse::Task(created) = created else {
        panic!("a task: {created:?}");
    };
    let id = created.task.task_id;
    client
        .cancel_task(CancelTaskParams::new(id.clone()))
        .await
        .expect("tasks/cancel");
    let ended = until_ended(&client, &id).await;
    assert_eq!(ended.status(), TaskStatus::Cancelled);
    // Nexus itself says so.
    let query_id = id.splitn(5, '.').nth(4).expect("a sealed query id");
    let query = nexus_client(nexus.base_url())
        .queries()
        .get(query_id)
        .await
        .expect("the turn");
    assert_eq!(query.status, "cancelled");
    nexus.shutdown().await;
}

#[tokio::test]
async fn a_client_without_task_support_keeps_the_plain_flow() {
    let nexus = local_nexus(Duration::from_millis(20)).await;
    let client = connect_with(task_server(&nexus).await, Client::default()).await;
    let plain = client
        .call_tool_once(params("query_context", ask()))
        .await
        .expect("tools/call");
    let CallToolResponse::Complete(plain) = plain else {
        panic!("a plain result: {plain:?}");
    };
    let started = plain.structured_content.expect("structured content");
    let id = started["query_id"].as_str().expect("query id");
    let refused = client.get_task(GetTaskParams::new(id)).await;
    assert!(
        refused.is_err(),
        "tasks/get needs task support: {refused:?}"
    );
    let polled = client
        .call_tool(params(
            "get_query",
            json!({"query_id": id, "wait_seconds": 30}),
        ))
        .await
        .expect("get_query");
    assert_eq!(polled.structured_content.unwrap()["status"], "completed");
    nexus.shutdown().await;
}

/// `tasks/get` or `tasks/cancel` over HTTP; returns the JSON-RPC answer.
async fn task_request(mcp: &mut HttpMcp, method: &str, id: &str) -> Value {
    let params = json!({"taskId": id, "_meta": meta_2026(true, None)});
    let (rid, answer) = request_2026(mcp, method, params).await;
    answer.response(rid).clone()
}

async fn another_callers_task_is_not_found(stateless: bool) {
    let nexus = local_nexus(Duration::from_millis(100)).await;
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(nexus.base_url())).with_key_policy(caller_keys(false)),
    );
    let served = serve_http(server, stateless).await;
    let mut first = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_1);
    let mut second = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_2);
    // Tasks are a 2026-07-28 feature: each request declares them, in
    // sessions mode as without sessions.
    for mcp in [&mut first, &mut second] {
        mcp.protocol = Some("2026-07-28".to_owned());
    }
    let call = json!({"name": "query_context", "arguments": ask(), "_meta": meta_2026(true, None)});
    let (rid, answer) = request_2026(&mut first, "tools/call", call).await;
    let created = &answer.response(rid)["result"];
    assert_eq!(created["resultType"], "task", "{created}");
    let id = created["taskId"].as_str().expect("task id").to_owned();

    let mine = task_request(&mut first, "tasks/get", &id).await;
    assert!(mine["result"]["status"].is_string(), "{mine}");
    let never = task_request(&mut second, "tasks/get", "qry_never_existed").await;
    let theirs = task_request(&mut second, "tasks/get", &id).await;
    assert!(theirs["error"].is_object(), "{theirs}");
    assert_eq!(
        theirs["error"], never["error"],
        "the same answer as for no task"
    );
    let cancel = task_request(&mut second, "tasks/cancel", &id).await;
    assert_eq!(cancel["error"], never["error"], "{cancel}");
    // The turn was not cancelled by the other caller.
    let query = nexus_client(nexus.base_url())
        .queries()
        .get(id.splitn(5, '.').nth(4).expect("a sealed query id"))
        .await
        .expect("the turn");
    assert_ne!(query.status, "cancelled");
    nexus.shutdown().await;
}

#[tokio::test]
async fn another_callers_task_is_not_found_in_sessions() {
    another_callers_task_is_not_found(false).await;
}

#[tokio::test]
async fn another_callers_task_is_not_found_stateless() {
    another_callers_task_is_not_found(true).await;
}

// ---------------------------------------------------------------------------
// Protocol revisions.

fn nexus_mcp_stdio(nexus_url: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nexus-mcp"));
    cmd.env_clear()
        .env("NEXUS_BASE_URL", nexus_url)
        .env("PINECONE_API_KEY", SERVER_KEY)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    cmd
}

#[tokio::test]
async fn stdio_serves_each_protocol_revision() {
    let nexus = local_nexus(Duration::ZERO).await;
    for version in [ProtocolVersion::V_2025_06_18, ProtocolVersion::V_2025_11_25] {
        let transport = TokioChildProcess::new(nexus_mcp_stdio(nexus.base_url())).unwrap();
        let client = Client {
            version: Some(version.clone()),
            ..Client::default()
        };
        let running = client.serve(transport).await.expect("initialize");
        let info = running.peer_info().expect("server info");
        assert_eq!(info.protocol_version, version);
        let listed = running
            .call_tool(params("list_contexts", json!({})))
            .await
            .expect("list_contexts");
        assert_eq!(listed.is_error, Some(false));
        running.cancel().await.unwrap();
    }
    // 2026-07-28: no `initialize`; `server/discover`, then requests that
    // carry their own `_meta`.
    let transport = TokioChildProcess::new(nexus_mcp_stdio(nexus.base_url())).unwrap();
    let running = Client::with_tasks()
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("discover");
    let info = running.peer_info().expect("server info");
    assert_eq!(info.protocol_version, ProtocolVersion::V_2026_07_28);
    let created = running
        .call_tool_once(params("query_context", ask()))
        .await
        .expect("tools/call");
    let CallToolResponse::Task(created) = created else {
        panic!("a task over stdio at 2026-07-28: {created:?}");
    };
    let ended = until_ended(&running, &created.task.task_id).await;
    assert_eq!(ended.status(), TaskStatus::Completed);
    running.cancel().await.unwrap();
    nexus.shutdown().await;
}

async fn http_serves_each_protocol_revision(stateless: bool) {
    let nexus = local_nexus(Duration::ZERO).await;
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(nexus.base_url())).with_key_policy(caller_keys(false)),
    );
    let served = serve_http(server, stateless).await;
    for version in ["2025-06-18", "2025-11-25"] {
        let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_1);
        let (id, answer) = mcp
            .request(
                "initialize",
                json!({
                    "protocolVersion": version,
                    "capabilities": {},
                    "clientInfo": {"name": "http-test", "version": "0"}
                }),
            )
            .await;
        let result = &answer.response(id)["result"];
        assert_eq!(result["protocolVersion"], version, "{result}");
        mcp.protocol = Some(version.to_owned());
        mcp.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        let listed = mcp.call("list_contexts", json!({})).await;
        assert_eq!(listed["isError"], false, "{listed}");
    }
    // 2026-07-28 without `initialize`.
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_1);
    mcp.protocol = Some("2026-07-28".to_owned());
    let (id, answer) = request_2026(
        &mut mcp,
        "server/discover",
        json!({"_meta": meta_2026(false, None)}),
    )
    .await;
    let found = &answer.response(id)["result"];
    let versions = found["supportedVersions"].to_string();
    for v in ["2025-06-18", "2025-11-25", "2026-07-28"] {
        assert!(versions.contains(v), "{found}");
    }
    let (id, answer) = request_2026(
        &mut mcp,
        "tools/call",
        json!({"name": "list_contexts", "arguments": {}, "_meta": meta_2026(false, None)}),
    )
    .await;
    let listed = &answer.response(id)["result"];
    assert_eq!(listed["isError"], false, "{answer:?}");
    assert_eq!(listed["resultType"], "complete", "{listed}");
    nexus.shutdown().await;
}

#[tokio::test]
async fn http_sessions_serve_each_protocol_revision() {
    http_serves_each_protocol_revision(false).await;
}

#[tokio::test]
async fn http_stateless_serves_each_protocol_revision() {
    http_serves_each_protocol_revision(true).await;
}
