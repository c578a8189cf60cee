//! nexus-mcp as a shared HTTP service: per-caller keys for every tool
//! family, sessions bound to their caller, timeouts and limits, and
//! `--stateless` replicas behind a round-robin proxy.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::mcp as mcp_support;
use crate::support::pinecone_fake;
use crate::support::wait::until;
use mcp_support::*;
use nexus_knowql::mcp::http::{self, HttpOptions};
use nexus_knowql::mcp::pinecone::PineconeServer;
use nexus_knowql::mcp::{KeyPolicy, NexusMcp, NexusServer};
use pinecone_fake::{KEY_A, KEY_B, PineconeFake};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Pinecone tools whose configured (operator's) key is `KEY_A`.
fn pinecone(fake: &PineconeFake, keys: KeyPolicy) -> NexusMcp {
    let server = PineconeServer::new(fake.config())
        .unwrap()
        .with_key_policy(keys);
    NexusMcp::new().with_pinecone(server)
}

fn nexus(nexus_url: &str, keys: KeyPolicy) -> NexusMcp {
    NexusMcp::new().with_nexus(NexusServer::new(nexus_client(nexus_url)).with_key_policy(keys))
}

fn keys_seen(fake: &PineconeFake) -> Vec<String> {
    fake.headers().into_iter().map(|(key, _)| key).collect()
}

const SEARCH: &str = "keyword_search";

fn search_args() -> Value {
    json!({"query_text": "coroutines", "namespace": "wg21-papers"})
}

#[tokio::test]
async fn pinecone_tools_search_with_the_callers_key_never_the_operators() {
    let fake = PineconeFake::start().await;
    let served = serve(pinecone(&fake, caller_keys(false)), HttpOptions::default()).await;

    let mut caller = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_B);
    caller.initialize().await;
    let result = caller.call(SEARCH, search_args()).await;
    assert_eq!(result["isError"], false, "{result}");
    let listed = caller.call("list_namespaces", json!({})).await;
    assert_eq!(listed["isError"], false, "{listed}");
    let seen = keys_seen(&fake);
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|k| k == KEY_B), "{seen:?}");

    // Without a key: no session (403), and Pinecone sees nothing more.
    let before = fake.headers().len();
    let mut anonymous = HttpMcp::new(&served.url);
    let (_, answer) = anonymous
        .request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}),
        )
        .await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(answer.body.contains("X-Pinecone-Api-Key"), "{answer:?}");
    assert_eq!(fake.headers().len(), before);

    // A key Pinecone refuses is refused: the operator's key is not tried.
    // It is proved once and refused at the door (403, naming the header).
    let mut stranger =
        HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", "pcsk_unknown_key_1234");
    let (_, answer) = stranger
        .request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}),
        )
        .await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(answer.body.contains("X-Pinecone-Api-Key"), "{answer:?}");
    assert!(!keys_seen(&fake).iter().any(|k| k == KEY_A));
    assert!(
        keys_seen(&fake)
            .iter()
            .any(|k| k == "pcsk_unknown_key_1234")
    );
}

#[tokio::test]
async fn discovery_caches_are_per_caller_key() {
    let fake = PineconeFake::start().await;
    let served = serve(pinecone(&fake, caller_keys(false)), HttpOptions::default()).await;
    let mut a = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_A);
    a.initialize().await;
    let first = a.call("list_namespaces", json!({})).await;
    assert_eq!(first["isError"], false, "{first}");
    let again = a.call("list_namespaces", json!({})).await;
    assert_eq!(again["structuredContent"]["cache_hit"], true, "{again}");

    // Another key does not get the first key's cached namespaces: its own
    // discovery runs with its own key.
    let before = fake.headers().len();
    let mut b = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_B);
    b.initialize().await;
    let other = b.call("list_namespaces", json!({})).await;
    assert_eq!(other["structuredContent"]["cache_hit"], false, "{other}");
    let new_keys: Vec<String> = keys_seen(&fake).split_off(before);
    assert!(!new_keys.is_empty());
    assert!(new_keys.iter().all(|k| k == KEY_B), "{new_keys:?}");
}

#[tokio::test]
async fn the_operators_key_serves_keyless_callers_only_when_allowed() {
    let fake = PineconeFake::start().await;
    let served = serve(pinecone(&fake, caller_keys(true)), HttpOptions::default()).await;
    let mut anonymous = HttpMcp::new(&served.url);
    anonymous.initialize().await;
    let result = anonymous.call(SEARCH, search_args()).await;
    assert_eq!(result["isError"], false, "{result}");
    assert!(keys_seen(&fake).iter().all(|k| k == KEY_A));

    // A caller's own key still wins.
    let before = fake.headers().len();
    let mut keyed = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_B);
    keyed.initialize().await;
    keyed.call(SEARCH, search_args()).await;
    let new_keys: Vec<String> = keys_seen(&fake).split_off(before);
    assert!(!new_keys.is_empty());
    assert!(new_keys.iter().all(|k| k == KEY_B), "{new_keys:?}");
}

#[tokio::test]
async fn an_empty_or_malformed_key_header_is_an_authentication_error() {
    let fake = PineconeFake::start().await;
    let nexus_fake = fake_nexus(0).await;
    let server = pinecone(&fake, caller_keys(true)).with_nexus(
        NexusServer::new(nexus_client(&nexus_fake.uri())).with_key_policy(caller_keys(true)),
    );
    let served = serve(server, HttpOptions::default()).await;
    let long = "k".repeat(600);
    for bad in ["", "   ", "two words", "k\u{e9}y", long.as_str()] {
        let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", bad);
        let (_, answer) = mcp
            .request(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}),
            )
            .await;
        assert_eq!(answer.status, 403, "{bad:?}: {answer:?}");
        assert!(answer.body.contains("X-Pinecone-Api-Key"), "{answer:?}");
    }
    // Sent twice.
    let mut twice = HttpMcp::new(&served.url)
        .header("X-Pinecone-Api-Key", KEY_A)
        .header("X-Pinecone-Api-Key", KEY_B);
    let (_, answer) = twice.request("ping", json!({})).await;
    assert_eq!(answer.status, 403, "{answer:?}");
    // Neither backend was called with the server's key.
    assert!(fake.headers().is_empty());
    assert!(nexus_fake.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_session_serves_only_the_key_that_created_it() {
    let nexus_fake = fake_nexus(0).await;
    let served = serve(
        nexus(&nexus_fake.uri(), caller_keys(true)),
        HttpOptions::default(),
    )
    .await;
    let mut owner = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", SERVER_KEY);
    owner.initialize().await;
    let session = owner.session.clone().unwrap();

    for other in [Some("pcsk_someone_else_0123456789"), None] {
        let mut thief = HttpMcp::new(&served.url).joining(&owner);
        if let Some(key) = other {
            thief = thief.header("X-Pinecone-Api-Key", key);
        }
        let (_, answer) = thief.request("tools/list", json!({})).await;
        assert_eq!(answer.status, 404, "{other:?}: {answer:?}");
        // Nor may it resume the session's stream or delete it.
        let get = thief
            .http
            .get(&served.url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &session)
            .headers(key_header(other))
            .send()
            .await
            .unwrap();
        assert_eq!(get.status(), 404);
        let delete = thief
            .http
            .delete(&served.url)
            .header("mcp-session-id", &session)
            .headers(key_header(other))
            .send()
            .await
            .unwrap();
        assert_eq!(delete.status(), 404);
    }
    // The owner still has its session, and may end it.
    let (id, answer) = owner.request("tools/list", json!({})).await;
    assert_eq!(answer.status, 200);
    assert!(answer.response(id)["result"]["tools"].is_array());
    let delete = owner
        .http
        .delete(&served.url)
        .header("mcp-session-id", &session)
        .header("x-pinecone-api-key", SERVER_KEY)
        .send()
        .await
        .unwrap();
    // 204, as clients expect of a session ended (not rmcp's 202).
    assert_eq!(delete.status(), 204);
    let (_, answer) = owner.request("tools/list", json!({})).await;
    assert_eq!(answer.status, 404);
}

fn key_header(key: Option<&str>) -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = key {
        headers.insert("x-pinecone-api-key", key.parse().unwrap());
    }
    headers
}

#[tokio::test]
async fn sessions_are_capped_and_expire_when_idle() {
    let nexus_fake = fake_nexus(0).await;
    let options = HttpOptions::default()
        .max_sessions(2)
        .session_idle_timeout(Duration::from_millis(1500));
    let served = serve(nexus(&nexus_fake.uri(), caller_keys(true)), options).await;
    let mut first = HttpMcp::new(&served.url);
    first.initialize().await;
    let mut second = HttpMcp::new(&served.url);
    second.initialize().await;
    // At the cap, the least recently used idle session gives way.
    let mut third = HttpMcp::new(&served.url);
    third.initialize().await;
    let (_, answer) = first.request("tools/list", json!({})).await;
    assert_eq!(answer.status, 404, "{answer:?}");

    // A session in use stays (catches an idle limit counted from the
    // session's start): the second one is pinged every second of tokio's
    // clock (which the idle limit reads), inside its 1.5 s limit, for more
    // than twice that limit.
    for _ in 0..4 {
        let (_, answer) = second.request("ping", json!({})).await;
        assert_eq!(answer.status, 200, "an active session ended: {answer:?}");
        crate::support::mcp::jump_clock(Duration::from_secs(1)).await;
    }

    // Idle sessions end: past the limit, the session is gone once its
    // expiry has run (a request that comes first keeps it, so the clock
    // moves past the limit again).
    let mut status = 0;
    for _ in 0..20 {
        crate::support::mcp::jump_clock(Duration::from_secs(2)).await;
        status = second.request("tools/list", json!({})).await.1.status;
        if status == 404 {
            break;
        }
    }
    assert_eq!(status, 404, "an idle session stayed");
    let mut fourth = HttpMcp::new(&served.url);
    fourth.initialize().await;
}

#[tokio::test]
async fn a_client_that_sends_half_a_request_head_is_cut_after_the_header_timeout() {
    let nexus_fake = fake_nexus(0).await;
    let options = HttpOptions::default().header_read_timeout(Duration::from_millis(300));
    let served = serve(nexus(&nexus_fake.uri(), caller_keys(false)), options).await;
    let addr = served
        .url
        .trim_start_matches("http://")
        .trim_end_matches(http::MCP_PATH)
        .to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl")
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut buf = Vec::new();
    // The server closes the connection (perhaps after a 408); never hangs.
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "still connected after 5 s");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "cut too early: {waited:?}"
    );
    assert!(!String::from_utf8_lossy(&buf).contains("200 OK"));

    // A complete request on a fresh connection is served.
    let mut mcp = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", SERVER_KEY);
    mcp.initialize().await;
}

/// A fake Nexus whose context listing answers only after 10 s.
async fn slow_contexts() -> wiremock::MockServer {
    use wiremock::matchers::{method, path};
    let nexus_fake = wiremock::MockServer::start().await;
    wiremock::Mock::given(method("GET"))
        .and(path("/api/contexts"))
        .respond_with(
            wiremock::ResponseTemplate::new(200)
                .set_body_json(json!({"data": []}))
                .set_delay(Duration::from_secs(10)),
        )
        .mount(&nexus_fake)
        .await;
    nexus_fake
}

#[tokio::test]
async fn a_response_stream_ends_at_the_request_deadline() {
    let nexus_fake = slow_contexts().await;
    let options = HttpOptions::default().request_timeout(Duration::from_millis(500));
    let served = serve(
        nexus(&format!("{}/api", nexus_fake.uri()), caller_keys(true)),
        options,
    )
    .await;
    let mut mcp = HttpMcp::new(&served.url);
    mcp.initialize().await;
    let started = tokio::time::Instant::now();
    let (id, answer) = mcp
        .request(
            "tools/call",
            json!({"name": "list_contexts", "arguments": {}}),
        )
        .await;
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert!(
        !answer.messages.iter().any(|m| m["id"] == json!(id)),
        "{answer:?}"
    );
}

#[tokio::test]
async fn a_call_without_an_answer_by_the_request_deadline_gets_408_and_is_counted() {
    let nexus_fake = slow_contexts().await;
    let options = HttpOptions::default()
        .stateless(true)
        .request_timeout(Duration::from_millis(300));
    let served = serve(
        nexus(&format!("{}/api", nexus_fake.uri()), caller_keys(true)),
        options,
    )
    .await;
    let mut mcp = HttpMcp::new(&served.url);
    let started = tokio::time::Instant::now();
    let message = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "list_contexts", "arguments": {}}
    });
    let answer = mcp.post(&message).await;
    let waited = started.elapsed();
    assert_eq!(answer.status, 408, "{answer:?}");
    assert!(
        answer.body.contains("--request-timeout"),
        "a 408 says why (clients show its body): {answer:?}"
    );
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    // Answered by the guard, so logged and counted like any other answer.
    let metrics_url = served.url.replace(http::MCP_PATH, http::METRICS_PATH);
    let text = reqwest::get(&metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("nexus_mcp_http_requests_total{method=\"POST\",status=\"408\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn requests_past_the_concurrency_limit_are_refused_with_503() {
    use wiremock::matchers::{method, path};
    let nexus_fake = wiremock::MockServer::start().await;
    wiremock::Mock::given(method("GET"))
        .and(path("/api/contexts"))
        .respond_with(
            wiremock::ResponseTemplate::new(200)
                .set_body_json(json!([]))
                .set_delay(Duration::from_millis(1500)),
        )
        .mount(&nexus_fake)
        .await;
    // One request at a time over all connections; a stateless request is
    // handled until its answer is ready.
    let options = HttpOptions::default()
        .stateless(true)
        .max_concurrent_requests(1);
    let served = serve(
        nexus(&format!("{}/api", nexus_fake.uri()), caller_keys(true)),
        options,
    )
    .await;
    // The other caller's key is proved (one slow upstream call) first.
    let mut other = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", SERVER_KEY);
    let (_, answer) = other.request("ping", json!({})).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let proved = crate::support::mcp::received_count(&nexus_fake).await;
    let url = served.url.clone();
    let holder = tokio::spawn(async move {
        let mut slow = HttpMcp::new(url);
        slow.protocol = Some("2025-06-18".to_owned());
        slow.request(
            "tools/call",
            json!({"name": "list_contexts", "arguments": {}}),
        )
        .await
    });
    // The slow call holds the one slot: its request reached Nexus.
    crate::support::mcp::wait_until(
        Duration::from_secs(10),
        "the call reaches Nexus",
        || async { crate::support::mcp::received_count(&nexus_fake).await > proved },
    )
    .await;
    let (_, answer) = other.request("ping", json!({})).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    let _ = holder.await;
    let (_, answer) = other.request("ping", json!({})).await;
    assert_ne!(answer.status, 503, "{answer:?}");
}

/// A round-robin reverse proxy over `backends` (each an `http://host:port`):
/// consecutive requests go to consecutive backends.
async fn round_robin(backends: Vec<String>) -> (String, tokio::task::JoinHandle<()>) {
    let next = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let (next, client, backends) = (next.clone(), client.clone(), backends.clone());
        async move {
            let backend = &backends[next.fetch_add(1, Ordering::SeqCst) % backends.len()];
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            let mut forward =
                client.request(parts.method, format!("{backend}{}", parts.uri.path()));
            for (name, value) in &parts.headers {
                if name != "host" && name != "content-length" {
                    forward = forward.header(name, value);
                }
            }
            let answer = forward.body(body).send().await.unwrap();
            let mut response = axum::response::Response::builder().status(answer.status());
            for (name, value) in answer.headers() {
                response = response.header(name, value);
            }
            response
                .body(axum::body::Body::from_stream(answer.bytes_stream()))
                .unwrap()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}{}",
        listener.local_addr().unwrap(),
        http::MCP_PATH
    );
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, task)
}

/// Two replicas sharing one Nexus, behind a round-robin proxy; runs
/// list_contexts, query_context, get_query and returns each call's answer.
async fn replicas_flow(stateless: bool) -> Vec<Result<Value, String>> {
    let nexus_fake = fake_nexus(0).await;
    let options = HttpOptions::default().stateless(stateless);
    let one = serve(
        nexus(&nexus_fake.uri(), caller_keys(false)),
        options.clone(),
    )
    .await;
    let two = serve(nexus(&nexus_fake.uri(), caller_keys(false)), options).await;
    let base = |s: &Served| s.url.trim_end_matches(http::MCP_PATH).to_owned();
    flow_through_proxy(vec![base(&one), base(&two)]).await
}

/// Runs the flow through a round-robin proxy over `backends`.
async fn flow_through_proxy(backends: Vec<String>) -> Vec<Result<Value, String>> {
    let (url, proxy) = round_robin(backends).await;
    let mut mcp = HttpMcp::new(&url).header("X-Pinecone-Api-Key", SERVER_KEY);
    let (id, init) = mcp
        .request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}),
        )
        .await;
    assert_eq!(init.status, 200, "{init:?}");
    mcp.protocol = init.response(id)["result"]["protocolVersion"]
        .as_str()
        .map(str::to_owned);
    let mut answers = Vec::new();
    let note = mcp
        .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    if note.status >= 300 {
        answers.push(Err(format!(
            "notifications/initialized: HTTP {} {}",
            note.status, note.body
        )));
    }
    for (name, args) in [
        ("list_contexts", json!({})),
        (
            "query_context",
            json!({"context": "papers", "question": "What is new?"}),
        ),
        ("get_query", json!({"query_id": "q_1", "wait_seconds": 5})),
    ] {
        let (id, answer) = mcp
            .request("tools/call", json!({"name": name, "arguments": args}))
            .await;
        answers.push(if answer.status == 200 {
            Ok(answer.response(id)["result"].clone())
        } else {
            Err(format!("{name}: HTTP {} {}", answer.status, answer.body))
        });
    }
    proxy.abort();
    answers
}

#[tokio::test]
async fn stateless_replicas_behind_a_round_robin_proxy_serve_a_whole_flow() {
    let answers = replicas_flow(true).await;
    let results: Vec<Value> = answers.into_iter().map(Result::unwrap).collect();
    assert!(results.iter().all(|r| r["isError"] == false), "{results:?}");
    assert_eq!(results[1]["structuredContent"]["query_id"], "q_1");
    assert_eq!(results[2]["structuredContent"]["status"], "completed");
}

#[tokio::test]
async fn session_replicas_behind_a_round_robin_proxy_fail_clearly() {
    let answers = replicas_flow(false).await;
    let failures: Vec<&String> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(!failures.is_empty(), "{answers:?}");
    assert!(
        failures
            .iter()
            .all(|f| f.contains("HTTP 404") && f.to_lowercase().contains("session not found")),
        "{failures:?}"
    );
}

/// A `nexus-mcp --transport http` process on a free port; killed on drop.
struct Process {
    _child: tokio::process::Child,
    base: String,
}

async fn nexus_mcp_process(nexus_url: &str, extra: &[&str]) -> Process {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nexus-mcp"))
        .args([
            "--transport",
            "http",
            "--bind",
            "127.0.0.1:0",
            "--log-format",
            "text",
        ])
        .args(extra)
        .env_clear()
        .env("NEXUS_BASE_URL", nexus_url)
        .env("RUST_LOG", "nexus_knowql=info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.split("local_addr=").nth(1) {
                return rest.split_whitespace().next().unwrap().to_owned();
            }
        }
        panic!("nexus-mcp exited before serving");
    })
    .await
    .expect("nexus-mcp starts within 20 s");
    // Keep draining the log so the process never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Process {
        _child: child,
        base: format!("http://{addr}"),
    }
}

#[tokio::test]
async fn two_stateless_nexus_mcp_processes_serve_one_client_in_turn() {
    let nexus_fake = fake_nexus(0).await;
    let one = nexus_mcp_process(&nexus_fake.uri(), &["--stateless"]).await;
    let two = nexus_mcp_process(&nexus_fake.uri(), &["--stateless"]).await;
    let answers = flow_through_proxy(vec![one.base.clone(), two.base.clone()]).await;
    let results: Vec<Value> = answers.into_iter().map(Result::unwrap).collect();
    assert!(results.iter().all(|r| r["isError"] == false), "{results:?}");
    assert_eq!(results[1]["structuredContent"]["query_id"], "q_1");
    assert_eq!(results[2]["structuredContent"]["status"], "completed");

    // Two processes without --stateless lose the session.
    let one = nexus_mcp_process(&nexus_fake.uri(), &[]).await;
    let two = nexus_mcp_process(&nexus_fake.uri(), &[]).await;
    let answers = flow_through_proxy(vec![one.base.clone(), two.base.clone()]).await;
    assert!(
        answers
            .iter()
            .any(|a| a.as_ref().is_err_and(|e| e.contains("HTTP 404"))),
        "{answers:?}"
    );
}

#[tokio::test]
async fn one_worker_thread_serves_sessions_and_stateless_calls() {
    let nexus_fake = fake_nexus(0).await;
    for extra in [
        &["--worker-threads", "1"][..],
        &["--stateless", "--worker-threads", "1"][..],
        &["--worker-threads", "2"][..],
        &["--stateless", "--worker-threads", "2"][..],
    ] {
        let process = nexus_mcp_process(&nexus_fake.uri(), extra).await;
        let answers = flow_through_proxy(vec![process.base.clone()]).await;
        let results: Vec<Value> = answers.into_iter().map(Result::unwrap).collect();
        assert!(
            results.iter().all(|r| r["isError"] == false),
            "{extra:?}: {results:?}"
        );
        assert_eq!(results[2]["structuredContent"]["status"], "completed");
    }
}

#[test]
fn zero_worker_threads_is_refused() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_nexus-mcp"))
        .args(["--transport", "http", "--worker-threads", "0"])
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--worker-threads"), "{stderr}");
    assert!(output.stdout.is_empty());
}

#[tokio::test]
async fn serving_threads_share_sessions_and_stop_together() {
    let nexus_fake = fake_nexus(0).await;
    let served = serve(
        nexus(&nexus_fake.uri(), caller_keys(false)),
        HttpOptions::default().threads(4),
    )
    .await;
    let mut owner = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", SERVER_KEY);
    owner.initialize().await;
    assert!(owner.session.is_some(), "initialize opens a session");

    // Each client is a new connection, accepted by whichever thread wins it:
    // the session answers on every one, and stays bound to its key.
    for round in 0..12 {
        let mut caller = HttpMcp::new(&served.url)
            .header("X-Pinecone-Api-Key", SERVER_KEY)
            .joining(&owner);
        let result = caller.call("list_contexts", json!({})).await;
        assert_eq!(result["isError"], false, "round {round}: {result}");
        assert_eq!(
            result["structuredContent"]["contexts"][0]["slug"],
            "handbook"
        );

        let mut thief = HttpMcp::new(&served.url)
            .header("X-Pinecone-Api-Key", "pcsk_someone_else_0123456789")
            .joining(&owner);
        let (_, answer) = thief.request("tools/list", json!({})).await;
        assert_eq!(answer.status, 404, "round {round}: {answer:?}");
    }

    // Cancelling the server stops every thread: no connection is accepted
    // (the listener is closed once the last thread has let go of it).
    let addr = served
        .url
        .trim_start_matches("http://")
        .trim_end_matches(http::MCP_PATH)
        .to_owned();
    drop(owner);
    drop(served);
    until(
        Duration::from_secs(10),
        &format!("the listener on {addr} closed after shutdown"),
        async || tokio::net::TcpStream::connect(&addr).await.is_err(),
    )
    .await;
}
