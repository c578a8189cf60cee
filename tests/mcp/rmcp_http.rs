//! The real `nexus-mcp --transport http` (with sessions and `--stateless`)
//! driven by rmcp's own client over Streamable HTTP, through the reqwest 0.12
//! adapter of `support::rmcp_http`: tools, resources, prompts, completions,
//! `logging/setLevel`, a task-augmented `query_context`, and each caller's key
//! seeing only its own contexts.
// rmcp marks the logging types deprecated; the revisions served define them.
#![allow(deprecated)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::mcp::context_json;
use crate::support::rmcp_http::{config, connect_http};
use nexus_knowql::local::LocalNexus;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig,
    GetPromptRequestParams, Implementation, LoggingLevel, LoggingMessageNotificationParam,
    ReadResourceRequestParams, ResourceContents, SetLevelRequestParams,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
const KEY_HEADER: &str = "x-pinecone-api-key";
const KEY_ONE: &str = "pcsk_rmcp_caller_one_abcdefghijklmnopqrstuv";
const KEY_TWO: &str = "pcsk_rmcp_caller_two_abcdefghijklmnopqrstuv";

/// A running `nexus-mcp --transport http`; killed on drop.
struct NexusMcpProcess {
    _child: tokio::process::Child,
    url: String,
}

async fn nexus_mcp(nexus_url: &str, stateless: bool, slow_call_ms: u64) -> NexusMcpProcess {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_nexus-mcp"));
    command
        .args(["--transport", "http", "--bind", "127.0.0.1:0"])
        .args(["--log-format", "text"])
        .env_clear()
        .env("NEXUS_BASE_URL", nexus_url)
        .env("NEXUS_MCP_SLOW_CALL_MS", slow_call_ms.to_string())
        .env("RUST_LOG", "nexus_knowql=info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if stateless {
        command.arg("--stateless");
    }
    let mut child = command.spawn().expect("nexus-mcp starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let addr = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.split("local_addr=").nth(1) {
                return rest.split_whitespace().next().map(str::to_owned);
            }
        }
        None
    })
    .await
    .expect("nexus-mcp serves within 20 s")
    .expect("nexus-mcp logs its address");
    // Keep draining the log so the process never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    NexusMcpProcess {
        _child: child,
        url: format!("http://{addr}/mcp"),
    }
}

/// rmcp's client, declaring task support and recording log messages.
#[derive(Clone, Default)]
struct Recorder {
    logs: Arc<Mutex<Vec<LoggingMessageNotificationParam>>>,
    logged: Arc<tokio::sync::Notify>,
}

impl Recorder {
    /// Waits (bounded) until at least `n` log messages arrived.
    async fn wait_logs(&self, n: usize) -> Vec<LoggingMessageNotificationParam> {
        let wait = async {
            loop {
                let notified = self.logged.notified();
                if self.logs.lock().unwrap().len() >= n {
                    return self.logs.lock().unwrap().clone();
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("log messages arrive")
    }
}

impl ClientHandler for Recorder {
    fn get_info(&self) -> ClientConfig {
        let caps = ClientCapabilities::builder().enable_tasks().build();
        ClientConfig::new(caps, Implementation::new("rmcp-http-test", "0"))
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

type Session = RunningService<RoleClient, Recorder>;

async fn connect(url: &str, key: &str) -> Session {
    let config = config(url, &[(KEY_HEADER, key)]);
    connect_http(Recorder::default(), config)
        .await
        .expect("MCP initialization")
}

fn params(name: &'static str, args: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(name).with_arguments(args.as_object().cloned().unwrap_or_default())
}

/// The slugs `list_contexts` returns.
async fn listed_slugs(client: &Session) -> Vec<String> {
    let result = client
        .call_tool(params("list_contexts", json!({})))
        .await
        .expect("tools/call list_contexts");
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let body = result.structured_content.expect("structured content");
    body["contexts"]
        .as_array()
        .expect("contexts")
        .iter()
        .map(|c| c["slug"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn tools_resources_prompts_and_completions(stateless: bool) {
    let nexus = LocalNexus::builder()
        .context("docs", CORPUS)
        .start()
        .await
        .expect("local nexus starts");
    let served = nexus_mcp(nexus.base_url(), stateless, 10_000).await;
    let client = connect(&served.url, KEY_ONE).await;
    let caps = client
        .peer_info()
        .expect("server info")
        .capabilities
        .clone();
    assert!(caps.resources.is_some() && caps.prompts.is_some() && caps.completions.is_some());

    let tools = client.list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for name in ["list_contexts", "query_context", "get_query"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    assert_eq!(listed_slugs(&client).await, ["docs"]);

    let resources = client.list_all_resources().await.expect("resources/list");
    let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
    // The context, then its knowledge files.
    assert_eq!(uris[0], "nexus://contexts/docs");
    assert!(uris.len() > 1, "{uris:?}");
    assert!(
        uris[1..]
            .iter()
            .all(|u| u.starts_with("nexus://contexts/docs/knowledge/")),
        "{uris:?}"
    );
    let read = client
        .read_resource(ReadResourceRequestParams::new("nexus://contexts/docs"))
        .await
        .expect("resources/read");
    let ResourceContents::TextResourceContents {
        text, mime_type, ..
    } = &read.contents[0]
    else {
        panic!("text contents: {read:?}");
    };
    assert_eq!(mime_type.as_deref(), Some("application/json"));
    let body: Value = serde_json::from_str(text).expect("JSON");
    assert_eq!(body["status"], "ready", "{body}");

    let prompts = client.list_all_prompts().await.expect("prompts/list");
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["ask_context"]);
    let args = json!({"context": "docs", "question": "How do I resume a stream?"});
    let got = client
        .get_prompt(
            GetPromptRequestParams::new("ask_context")
                .with_arguments(args.as_object().cloned().unwrap_or_default()),
        )
        .await
        .expect("prompts/get");
    let text = serde_json::to_value(&got.messages[0]).expect("JSON")["content"]["text"].clone();
    let text = text.as_str().expect("a text message");
    assert!(
        text.contains("query_context with context=\"docs\""),
        "{text}"
    );

    let got = client
        .peer()
        .complete_prompt_argument("ask_context", "context", "d", None)
        .await
        .expect("completion/complete");
    assert_eq!(got.values, ["docs"]);

    client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Warning))
        .await
        .expect("logging/setLevel");
    client.cancel().await.expect("the client closes");
    nexus.shutdown().await;
}

#[tokio::test]
async fn rmcp_client_over_http_sessions() {
    tools_resources_prompts_and_completions(false).await;
}

#[tokio::test]
async fn rmcp_client_over_http_stateless() {
    tools_resources_prompts_and_completions(true).await;
}

#[tokio::test]
async fn a_session_client_declaring_tasks_gets_the_plain_answer_over_http() {
    let nexus = LocalNexus::builder()
        .context("docs", CORPUS)
        .frame_delay(Duration::from_millis(20))
        .start()
        .await
        .expect("local nexus starts");
    let served = nexus_mcp(nexus.base_url(), false, 10_000).await;
    let client = connect(&served.url, KEY_ONE).await;
    let caps = client
        .peer_info()
        .expect("server info")
        .capabilities
        .clone();
    // Tasks are defined from 2026-07-28 on: a session on an older revision
    // is not offered them, whatever it declared, and gets the plain answer.
    assert!(!caps.supports_tasks(), "{caps:?}");
    let ask = json!({"context": "docs", "question": "How do I resume a stream?"});
    let created = client
        .call_tool_once(params("query_context", ask))
        .await
        .expect("tools/call");
    let CallToolResponse::Complete(plain) = created else {
        panic!("a plain result: {created:?}");
    };
    let body = plain.structured_content.expect("structured content");
    assert!(body["query_id"].is_string(), "{body}");
    client.cancel().await.expect("the client closes");
    nexus.shutdown().await;
}

/// A Nexus that answers each key with its own context, 50 ms late.
async fn two_project_nexus() -> MockServer {
    let server = MockServer::start().await;
    for (key, slug) in [(KEY_ONE, "alpha-notes"), (KEY_TWO, "beta-notes")] {
        Mock::given(method("GET"))
            .and(path("/contexts"))
            .and(header(KEY_HEADER, key))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!([context_json(slug, "search", true, false)]))
                    .set_delay(Duration::from_millis(50)),
            )
            .mount(&server)
            .await;
    }
    server
}

#[tokio::test]
async fn each_callers_key_sees_its_own_contexts_in_both_modes() {
    let nexus = two_project_nexus().await;
    for stateless in [false, true] {
        let served = nexus_mcp(&nexus.uri(), stateless, 10_000).await;
        let one = connect(&served.url, KEY_ONE).await;
        let two = connect(&served.url, KEY_TWO).await;
        for (client, mine) in [(&one, "alpha-notes"), (&two, "beta-notes")] {
            assert_eq!(listed_slugs(client).await, [mine], "stateless: {stateless}");
            let resources = client.list_all_resources().await.expect("resources/list");
            let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
            assert_eq!(uris, [format!("nexus://contexts/{mine}")]);
            let got = client
                .peer()
                .complete_prompt_simple("ask_context", "context", "")
                .await
                .expect("completion/complete");
            assert_eq!(got, [mine]);
        }
        one.cancel().await.expect("closes");
        two.cancel().await.expect("closes");
    }
}

#[tokio::test]
async fn set_level_decides_which_log_messages_a_session_receives() {
    // Every call takes at least 50 ms, past a 20 ms slow-call threshold: a
    // `notice` each.
    let nexus = two_project_nexus().await;
    let served = nexus_mcp(&nexus.uri(), false, 20).await;
    let recorder = Recorder::default();
    let config = config(&served.url, &[(KEY_HEADER, KEY_ONE)]);
    let client = connect_http(recorder.clone(), config)
        .await
        .expect("MCP initialization");
    client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Warning))
        .await
        .expect("logging/setLevel");
    listed_slugs(&client).await;
    client
        .set_level(SetLevelRequestParams::new(LoggingLevel::Notice))
        .await
        .expect("logging/setLevel");
    listed_slugs(&client).await;
    // Messages arrive in order: had the first call been logged, its message
    // would be here before the second's.
    let logs = recorder.wait_logs(1).await;
    assert_eq!(logs.len(), 1, "only the second call: {logs:?}");
    assert_eq!(logs[0].level, LoggingLevel::Notice);
    assert_eq!(logs[0].data["event"], "slow_call");
    assert_eq!(logs[0].data["tool"], "list_contexts");
    assert!(!logs[0].data.to_string().contains(KEY_ONE));
    client.cancel().await.expect("closes");
}

#[tokio::test]
async fn an_initialize_answer_over_the_transports_limits_fails_in_both_modes() {
    let nexus = two_project_nexus().await;
    // The initialize answer (JSON without sessions, an SSE event with them)
    // is well over 64 bytes.
    for stateless in [true, false] {
        let served = nexus_mcp(&nexus.uri(), stateless, 10_000).await;
        let limited = config(&served.url, &[(KEY_HEADER, KEY_ONE)])
            .max_json_response_size(64)
            .max_sse_event_size(64);
        let connecting = connect_http(Recorder::default(), limited);
        let refused = tokio::time::timeout(Duration::from_secs(10), connecting)
            .await
            .expect("an over-limit answer ends the handshake");
        assert!(refused.is_err(), "stateless: {stateless}");
        // Within the limits, the same server answers.
        connect(&served.url, KEY_ONE)
            .await
            .cancel()
            .await
            .expect("closes");
    }
}
