//! Operating nexus-mcp: health and readiness, Prometheus metrics that move
//! with tool calls, one access-log line per request and per tool call, no
//! key material in either, `--stateless` cancellation, the shutdown grace,
//! and JSON-RPC errors over stdio.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::mcp as mcp_support;
use mcp_support::*;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const CALLER_KEY: &str = "pcsk_operations_caller_key_9876543210zyxw";

/// A `nexus-mcp --transport http` process on a free port whose stderr is
/// collected; killed on drop.
pub(super) struct Process {
    pub(super) child: tokio::process::Child,
    pub(super) base: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Process {
    pub(super) fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

pub(super) async fn nexus_mcp(nexus_url: &str, extra: &[&str]) -> Process {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nexus-mcp"))
        .args(["--transport", "http", "--bind", "127.0.0.1:0"])
        .args(extra)
        .env_clear()
        .env("NEXUS_BASE_URL", nexus_url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let log = Arc::new(Mutex::new(Vec::new()));
    let addr = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            log.lock().unwrap().push(line.clone());
            if let Some(rest) = line.split("local_addr=").nth(1) {
                return rest.split_whitespace().next().unwrap().to_owned();
            }
        }
        panic!("nexus-mcp exited before serving: {:?}", log.lock().unwrap());
    })
    .await
    .expect("nexus-mcp starts within 20 s");
    let sink = Arc::clone(&log);
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            sink.lock().unwrap().push(line);
        }
    });
    Process {
        child,
        base: format!("http://{addr}"),
        log,
    }
}

/// The samples of a Prometheus text exposition: `name{labels}` -> value.
/// Panics on a line that is neither a comment nor a sample.
fn parse_prometheus(text: &str) -> Vec<(String, f64)> {
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not a sample: {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("not a number: {line}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name: {line}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "bad labels: {line}");
        }
        samples.push((series.to_owned(), value));
    }
    samples
}

fn sample(samples: &[(String, f64)], series: &str) -> f64 {
    samples
        .iter()
        .find(|(s, _)| s == series)
        .map_or(0.0, |(_, v)| *v)
}

async fn scrape(http: &reqwest::Client, base: &str) -> (String, Vec<(String, f64)>) {
    let answer = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let text = answer.text().await.unwrap();
    let samples = parse_prometheus(&text);
    (text, samples)
}

#[tokio::test]
async fn metrics_health_and_access_logs_carry_no_key() {
    let nexus_fake = fake_nexus(0).await;
    let process = nexus_mcp(&nexus_fake.uri(), &[]).await;
    let http = reqwest::Client::new();

    let health = http
        .get(format!("{}/healthz", process.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let ready = http
        .get(format!("{}/readyz", process.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200, "{:?}", ready.text().await);

    let series = r#"nexus_mcp_tool_calls_total{tool="list_contexts",outcome="ok"}"#;
    let (_, before) = scrape(&http, &process.base).await;
    assert_eq!(sample(&before, series), 0.0);

    let mut caller =
        HttpMcp::new(format!("{}/mcp", process.base)).header("X-Pinecone-Api-Key", CALLER_KEY);
    caller.initialize().await;
    let result = caller.call("list_contexts", json!({})).await;
    assert_eq!(result["isError"], false, "{result}");
    // A refused request is counted by reason.
    let keyless = HttpMcp::new(format!("{}/mcp", process.base))
        .request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}))
        .await;
    assert_eq!(keyless.1.status, 403);

    let (text, after) = scrape(&http, &process.base).await;
    assert_eq!(sample(&after, series), 1.0, "{text}");
    assert_eq!(
        sample(
            &after,
            r#"nexus_mcp_refusals_total{reason="keyless_session"}"#
        ),
        1.0,
        "{text}"
    );
    assert!(sample(&after, "nexus_mcp_open_sessions") >= 1.0, "{text}");
    assert!(
        sample(
            &after,
            r#"nexus_mcp_tool_call_duration_seconds_count{tool="list_contexts"}"#
        ) >= 1.0,
        "{text}"
    );
    assert!(
        !text.contains(CALLER_KEY) && !text.contains("pcsk_"),
        "{text}"
    );

    // The access log: a line for each request and the tool call, with a
    // request id and a caller tag, never the key.
    let logged = async || Some(process.log()).filter(|log| log.contains("tool call"));
    let log =
        crate::support::wait::until_some(Duration::from_secs(5), "a tool-call log line", logged)
            .await;
    let tool_line = log
        .lines()
        .find(|l| l.contains("tool call") && l.contains("list_contexts"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(tool_line.contains("request_id="), "{tool_line}");
    assert!(tool_line.contains("caller="), "{tool_line}");
    assert!(
        tool_line.contains("outcome=\"ok\"") || tool_line.contains("outcome=ok"),
        "{tool_line}"
    );
    let requests = log
        .lines()
        .filter(|l| l.contains("nexus_mcp::access") && l.contains(" request"))
        .count();
    assert!(requests >= 3, "{log}");
    assert!(!log.contains(CALLER_KEY), "{log}");
    assert!(!log.contains("pcsk_"), "{log}");
    drop(process.child);
}

#[tokio::test]
async fn stateless_cancellation_stops_the_named_request() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let nexus_fake = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([]))
                .set_delay(Duration::from_secs(20)),
        )
        .mount(&nexus_fake)
        .await;
    let process = nexus_mcp(&nexus_fake.uri(), &["--stateless"]).await;
    let url = format!("{}/mcp", process.base);
    // Both go over one HTTP/2 connection (another connection of the same
    // caller would do too).
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let call = {
        let url = url.clone();
        let h2 = h2.clone();
        tokio::spawn(async move {
            let mut mcp = HttpMcp::new(url).header("X-Pinecone-Api-Key", CALLER_KEY);
            mcp.http = h2;
            mcp.protocol = Some("2025-06-18".to_owned());
            mcp.post(&json!({"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": {"name": "list_contexts", "arguments": {}}}))
                .await
        })
    };
    // The call is in flight: a request of its reached Nexus.
    crate::support::mcp::wait_until(
        Duration::from_secs(10),
        "the call reaches Nexus",
        || async { crate::support::mcp::received_count(&nexus_fake).await > 0 },
    )
    .await;
    let mut other = HttpMcp::new(url.clone()).header("X-Pinecone-Api-Key", CALLER_KEY);
    other.http = h2;
    other.protocol = Some("2025-06-18".to_owned());
    let cancel = other
        .post(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 41}}))
        .await;
    assert!(cancel.status < 300, "{cancel:?}");
    let answer = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the cancelled call ends")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    let message: &Value = answer.response(41);
    assert_eq!(message["error"]["code"], -32800, "{answer:?}");
}

#[tokio::test]
async fn stdio_answers_bad_lines_with_json_rpc_errors() {
    let nexus_fake = fake_nexus(0).await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nexus-mcp"))
        .env_clear()
        .env("NEXUS_BASE_URL", nexus_fake.uri())
        .env("PINECONE_API_KEY", SERVER_KEY)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let long = format!("{{\"x\":\"{}\"}}\n", "a".repeat(1024 * 1024 + 10));
    for (line, code, message) in [
        (b"{not json\n".to_vec(), -32700, "parse error: "),
        (b"\xff\xfe{}\n".to_vec(), -32700, "parse error: "),
        (
            b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]\n".to_vec(),
            -32600,
            "invalid request: batches are not supported",
        ),
        (long.into_bytes(), -32600, "invalid request: "),
    ] {
        stdin.write_all(&line).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), stdout.next_line())
            .await
            .expect("an answer")
            .unwrap()
            .unwrap();
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
        assert_eq!(answer["id"], Value::Null, "{answer}");
        assert_eq!(answer["error"]["code"], code, "{answer}");
        let said = answer["error"]["message"].as_str().unwrap();
        assert!(
            said == message || (message.ends_with(": ") && said.starts_with(message)),
            "{answer}"
        );
    }
    // A valid message still works afterwards.
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"x\",\"version\":\"0\"}}}\n")
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), stdout.next_line())
        .await
        .expect("an answer")
        .unwrap()
        .unwrap();
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["id"], 1, "{answer}");
    assert!(answer["result"].is_object(), "{answer}");
}
