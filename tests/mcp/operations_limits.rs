//! Honest operations at the edges: failed resource, prompt and completion
//! reads counted as upstream errors; `open_sessions` after sessions expire;
//! the listener closed as soon as shutdown begins; log lines that name the
//! JSON-RPC method and a bare peer address; a flood of keyless requests
//! that stays a handful of log lines; and the binary under a small
//! open-file limit, where the connection cap answers instead of `accept`,
//! and whose `accept` backs off when the limit is lowered under it.
use std::sync::Arc;
use std::time::Duration;

use crate::support::mcp::{HttpMcp, SERVER_KEY, connect, fake_nexus, nexus_client};
use crate::support::mcp_process::{Launch, McpProcess};
use crate::support::pinecone_fake::PineconeFake;
use crate::support::wait::{until, until_some};
use nexus_knowql::mcp::http::{self, HttpOptions};
use nexus_knowql::mcp::pinecone::PineconeServer;
use nexus_knowql::mcp::{KeyPolicy, NexusMcp, NexusServer};
use rmcp::model::{GetPromptRequestParams, ReadResourceRequestParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

const KEY: &str = "pcsk_operations_limits_key_0123456789ab";

/// The value of the first sample whose line starts with `series`.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn failed_resource_prompt_and_completion_reads_count_as_upstream_errors() {
    let nexus = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path_regex("contexts"))
        .respond_with(ResponseTemplate::new(500).set_body_json(json!({"message": "down"})))
        .mount(&nexus)
        .await;
    let sdk = nexus_knowql::Client::builder()
        .base_url(nexus.uri())
        .api_key(SERVER_KEY)
        .retry(nexus_knowql::RetryPolicy::default().max_retries(0))
        .build()
        .unwrap();
    let fake = PineconeFake::start().await;
    fake.fail("stats:kb", 500, 100);
    let server = NexusMcp::new()
        .with_nexus(NexusServer::new(sdk))
        .with_pinecone(PineconeServer::new(fake.config()).unwrap());
    let metrics = Arc::clone(server.metrics());
    let client = connect(server).await;
    let nexus_errors = r#"nexus_mcp_upstream_errors_total{family="nexus",code="NEXUS_ERROR"}"#;
    let pinecone_errors =
        r#"nexus_mcp_upstream_errors_total{family="pinecone",code="PINECONE_ERROR"}"#;

    // resources/list answers what it can, and counts both failures.
    client.list_all_resources().await.expect("resources/list");
    let text = metrics.render();
    assert_eq!(sample(&text, nexus_errors), 1.0, "{text}");
    assert_eq!(sample(&text, pinecone_errors), 1.0, "{text}");
    // A failed read.
    let read = client
        .read_resource(ReadResourceRequestParams::new("nexus://contexts/docs"))
        .await;
    assert!(read.is_err(), "{read:?}");
    assert_eq!(sample(&metrics.render(), nexus_errors), 2.0);
    // A prompt whose namespace details could not be read still answers.
    let mut args = serde_json::Map::new();
    for (k, v) in [
        ("index", "kb"),
        ("namespace", "wg21-papers"),
        ("topic", "x"),
    ] {
        args.insert(k.into(), Value::from(v));
    }
    client
        .get_prompt(GetPromptRequestParams::new("research_namespace").with_arguments(args))
        .await
        .expect("prompts/get");
    assert_eq!(sample(&metrics.render(), pinecone_errors), 2.0);
    // A completion answers nothing, and counts the failure.
    let got = client
        .complete_prompt_simple("ask_context", "context", "")
        .await
        .expect("completion");
    assert!(got.is_empty());
    let text = metrics.render();
    assert_eq!(sample(&text, nexus_errors), 3.0, "{text}");
}

/// `server` on a free port with `options`, and its shutdown token.
async fn serve_until(
    server: NexusMcp,
    options: HttpOptions,
) -> (
    std::net::SocketAddr,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let listener = http::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let done = tokio::spawn(async move {
        http::serve(listener, server, &options, token)
            .await
            .expect("serve");
    });
    (addr, shutdown, done)
}

fn keyed_nexus(url: &str) -> NexusMcp {
    NexusMcp::new().with_nexus(NexusServer::new(nexus_client(url)).with_key_policy(
        KeyPolicy::Caller {
            fallback_to_configured: false,
        },
    ))
}

#[tokio::test]
async fn open_sessions_falls_when_sessions_expire() {
    let nexus = fake_nexus(0).await;
    // Long enough that a busy machine still scrapes both sessions open.
    let options = HttpOptions::default().session_idle_timeout(Duration::from_secs(3));
    let (addr, shutdown, _done) = serve_until(keyed_nexus(&nexus.uri()), options).await;
    let url = format!("http://{addr}{}", http::MCP_PATH);
    let metrics = format!("http://{addr}{}", http::METRICS_PATH);
    for _ in 0..2 {
        HttpMcp::new(&url)
            .header("X-Pinecone-Api-Key", KEY)
            .initialize()
            .await;
    }
    let scrape = || async {
        let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
        sample(&text, "nexus_mcp_open_sessions")
    };
    assert_eq!(scrape().await, 2.0);
    // Expiry is swept, not timed to the millisecond: the metrics are
    // looked at until it shows.
    until(
        Duration::from_secs(20),
        "expired sessions are not open",
        async || scrape().await == 0.0,
    )
    .await;
    shutdown.cancel();
}

#[tokio::test]
async fn shutdown_closes_the_listener_before_the_requests_in_flight_end() {
    let nexus = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path_regex("contexts"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([]))
                .set_delay(Duration::from_millis(1500)),
        )
        .mount(&nexus)
        .await;
    let (addr, shutdown, done) =
        serve_until(keyed_nexus(&nexus.uri()), HttpOptions::default()).await;
    let url = format!("http://{addr}{}", http::MCP_PATH);
    let mut mcp = HttpMcp::new(&url).header("X-Pinecone-Api-Key", KEY);
    mcp.initialize().await;
    let before = crate::support::mcp::received_count(&nexus).await;
    let call = tokio::spawn(async move { mcp.call("list_contexts", json!({})).await });
    // The call is in flight: its request reached Nexus.
    crate::support::mcp::wait_until(
        Duration::from_secs(10),
        "the call reaches Nexus",
        || async { crate::support::mcp::received_count(&nexus).await > before },
    )
    .await;
    shutdown.cancel();
    // Nobody new gets in, while the slow call is still running.
    crate::support::mcp::wait_until(Duration::from_secs(10), "the listener closes", || async {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    assert!(!call.is_finished());
    let result = call.await.expect("the call's task");
    assert_eq!(result["isError"], false, "{result}");
    tokio::time::timeout(Duration::from_secs(10), done)
        .await
        .expect("serving ends")
        .expect("cleanly");
}

/// `nexus-mcp --transport http` in front of the Nexus at `nexus_url`, with
/// `extra` arguments (and under `open_files`, when given).
async fn start_binary(nexus_url: &str, extra: &[&str], open_files: Option<u32>) -> McpProcess {
    let mut launch = Launch::args(extra)
        .env("NEXUS_BASE_URL", nexus_url)
        .env("NO_COLOR", "1");
    if let Some(limit) = open_files {
        launch = launch.open_files(limit);
    }
    launch.start().await
}

#[tokio::test]
async fn log_lines_name_the_method_and_a_bare_peer_and_keyless_floods_stay_quiet() {
    let nexus = fake_nexus(0).await;
    let binary = start_binary(&nexus.uri(), &[], None).await;
    let url = format!("{}/mcp", binary.base);
    let mut mcp = HttpMcp::new(&url).header("X-Pinecone-Api-Key", KEY);
    mcp.initialize().await;
    mcp.call("list_contexts", json!({})).await;
    // 200 keyless requests in a burst: refused, counted, hardly logged.
    let http = reqwest::Client::new();
    let keyless = (0..200).map(|_| {
        http.post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"0"}}}"#,
            )
            .send()
    });
    for answer in futures::future::join_all(keyless).await {
        assert_eq!(answer.unwrap().status(), 403);
    }
    // A later call's access line: once it is read, so is all the burst
    // logged before it.
    mcp.call("list_contexts", json!({})).await;
    let calls_logged = || {
        binary
            .log()
            .iter()
            .filter(|l| l.contains("nexus_mcp::access") && l.contains("tools/call"))
            .count()
    };
    crate::support::mcp::wait_until(Duration::from_secs(10), "the later call is logged", || {
        let logged = calls_logged();
        async move { logged >= 2 }
    })
    .await;
    let log = binary.log();
    let call = log
        .iter()
        .find(|l| l.contains("nexus_mcp::access") && l.contains("tools/call"))
        .unwrap_or_else(|| panic!("an access line naming tools/call: {log:#?}"));
    assert!(call.contains("rpc_method="), "{call}");
    assert!(call.contains("peer=127.0.0.1:"), "{call}");
    assert!(
        log.iter().all(|l| !l.contains("Some(")),
        "a peer printed as Some(…): {log:#?}"
    );
    let warnings = log.iter().filter(|l| l.contains("WARN")).count();
    assert!(warnings <= 12, "{warnings} warning lines for 200 refusals");
    assert!(
        !log.iter().any(|l| l.contains("WARN") && l.contains("rmcp")),
        "{log:#?}"
    );
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn under_a_small_open_file_limit_the_connection_cap_answers_not_accept() {
    let nexus = fake_nexus(0).await;
    let binary = start_binary(&nexus.uri(), &[], Some(100)).await;
    let log = binary.log().join("\n");
    assert!(
        log.contains("open-file limit") && log.contains("capped_at=36"),
        "the startup check lowers --max-connections: {log}"
    );
    let addr = binary.base.trim_start_matches("http://").to_owned();
    // Far more connections than the limit could hold, all at once.
    let mut held = Vec::new();
    for _ in 0..150 {
        if let Ok(tcp) = tokio::net::TcpStream::connect(&addr).await {
            held.push(tcp);
        }
    }
    crate::support::mcp::wait_until(Duration::from_secs(10), "a refusal is logged", || {
        let refused = binary
            .log()
            .join("\n")
            .contains("refused connection: too many open connections");
        async move { refused }
    })
    .await;
    let log = binary.log().join("\n");
    let accept_failures = log.matches("accept failed").count();
    assert!(
        accept_failures <= 1,
        "{accept_failures} accept failures: {log}"
    );
    // Once they go, the server serves again.
    drop(held);
    let health = format!("{}/healthz", binary.base);
    until(
        Duration::from_secs(5),
        "served after the connections closed",
        async || matches!(reqwest::get(&health).await, Ok(r) if r.status() == 200),
    )
    .await;
}

/// `prlimit` is there to run (util-linux).
#[cfg(target_os = "linux")]
fn has_prlimit() -> bool {
    std::process::Command::new("prlimit")
        .arg("--version")
        .output()
        .is_ok()
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_failing_accept_backs_off_instead_of_spinning() {
    if !has_prlimit() {
        eprintln!("prlimit is not installed: skipped");
        return;
    }
    let nexus = fake_nexus(0).await;
    let binary = start_binary(&nexus.uri(), &["--max-connections", "1000"], None).await;
    let pid = binary.pid().to_string();
    // The soft limit drops under the running server, past its startup check:
    // from now on `accept` fails with EMFILE while clients queue.
    let lowered = std::process::Command::new("prlimit")
        .args(["--pid", &pid, "--nofile=32:"])
        .status()
        .expect("prlimit runs");
    assert!(lowered.success());
    let addr = binary.base.trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    for _ in 0..80 {
        if let Ok(tcp) = tokio::net::TcpStream::connect(&addr).await {
            held.push(tcp);
        }
    }
    // Paced load: the window in which a spinning accept loop would count
    // thousands of failures (a measured span, not a wait for an event).
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(held);
    let raised = std::process::Command::new("prlimit")
        .args(["--pid", &pid, "--nofile=1024:"])
        .status()
        .expect("prlimit runs");
    assert!(raised.success());
    // It serves again, and counted a few failures, not a spin's thousands.
    let metrics = format!("{}/metrics", binary.base);
    let text = until_some(
        Duration::from_secs(10),
        "served again after the limit was raised",
        async || match reqwest::get(&metrics).await {
            Ok(r) if r.status() == 200 => r.text().await.ok(),
            _ => None,
        },
    )
    .await;
    let failures = sample(&text, r#"nexus_mcp_refusals_total{reason="accept_failed"}"#);
    eprintln!("failed accepts while the limit was low: {failures}");
    assert!(failures >= 1.0, "accept never failed: {text}");
    assert!(failures <= 100.0, "{failures} failed accepts in about 2 s");
    let log = binary.log().join("\n");
    assert!(log.contains("accept failed"), "{log}");
}
