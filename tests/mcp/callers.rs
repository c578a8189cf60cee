//! Unproven keys spend nothing shared; tasks work on any replica; a
//! cancellation reaches only its own request.
//!
//! - made-up keys are refused once the upstream has refused them, and never
//!   close an honest caller's session; keys the upstream cannot judge live
//!   in a small quarantine that never displaces a proven caller;
//! - a session has one GET stream (409 for another);
//! - connections are capped per client address;
//! - two `--stateless` replicas sharing a task secret serve each other's
//!   tasks, to the key that started them only;
//! - a `notifications/cancelled` from another key does not cancel a
//!   stateless request (the same key may, on any connection).
use crate::support::mcp::{
    HttpMcp, context_json, nexus_client, query_json, received_count, wait_until,
};

use std::time::Duration;

use crate::support::wait::{PATIENCE, until};

use nexus_knowql::mcp::http::{self, HttpOptions};
use nexus_knowql::mcp::tasks::TaskSeal;
use nexus_knowql::mcp::{KeyPolicy, NexusMcp, NexusServer};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const HONEST: &str = "pcsk_honest_caller_key_0123456789abcd";
const OTHER_HONEST: &str = "pcsk_other_honest_key_0123456789abcde";
const TASKS: &str = "io.modelcontextprotocol/tasks";

/// A Nexus that knows two keys: others get 401 (`refuse_others`) or 503
/// (it cannot tell). `GET /contexts` takes `delay`. Query `q_1` runs for
/// the first poll and is then completed.
async fn keyed_nexus(refuse_others: bool, delay: Duration) -> MockServer {
    let server = MockServer::start().await;
    for key in [HONEST, OTHER_HONEST] {
        Mock::given(method("GET"))
            .and(path("/contexts"))
            .and(header("x-pinecone-api-key", key))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!([]))
                    .set_delay(delay),
            )
            .with_priority(1)
            .mount(&server)
            .await;
    }
    let other = if refuse_others { 401 } else { 503 };
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(
            ResponseTemplate::new(other).set_body_json(json!({"message": "no", "code": "auth"})),
        )
        .with_priority(5)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/contexts/docs"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(context_json("docs", "search", true, false)),
        )
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(ResponseTemplate::new(202).set_body_json(query_json(
            "q_1",
            "in_progress",
            &[],
            None,
        )))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/queries/q_1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query_json(
            "q_1",
            "completed",
            &[("s1", "Writing")],
            Some("Done."),
        )))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/queries/q_1/cancel"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query_json(
            "q_1",
            "cancelled",
            &[],
            None,
        )))
        .mount(&server)
        .await;
    server
}

fn callers() -> KeyPolicy {
    KeyPolicy::Caller {
        fallback_to_configured: false,
    }
}

fn server_of(nexus: &MockServer) -> NexusMcp {
    NexusMcp::new()
        .with_nexus(NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(callers()))
}

struct Served {
    url: String,
    addr: std::net::SocketAddr,
    shutdown: CancellationToken,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn serve(server: NexusMcp, options: HttpOptions) -> Served {
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

async fn initialize(url: &str, key: &str) -> (HttpMcp, u16) {
    let mut mcp = HttpMcp::new(url).header("X-Pinecone-Api-Key", key);
    let (_, answer) = mcp
        .request(
            "initialize",
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "callers-test", "version": "0"}
            }),
        )
        .await;
    if answer.status == 200 {
        mcp.protocol = Some("2025-11-25".to_owned());
        mcp.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
    }
    (mcp, answer.status)
}

async fn metrics(served: &Served) -> String {
    reqwest::get(format!("http://{}/metrics", served.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn made_up(i: usize) -> String {
    format!("pcsk_made_up_key_{i:04}_0123456789abcdef")
}

#[tokio::test]
async fn refused_keys_get_403_and_never_evict_an_honest_session() {
    let nexus = keyed_nexus(true, Duration::ZERO).await;
    let served = serve(server_of(&nexus), HttpOptions::default().max_sessions(20)).await;
    let (mut honest, status) = initialize(&served.url, HONEST).await;
    assert_eq!(status, 200);
    let mut refused = 0;
    for i in 0..60 {
        let (_, status) = initialize(&served.url, &made_up(i % 12)).await;
        if status == 403 {
            refused += 1;
        }
    }
    assert_eq!(refused, 60, "every made-up key is refused");
    let listed = honest.call("list_contexts", json!({})).await;
    assert_eq!(listed["isError"], false, "{listed}");
    // One upstream probe per made-up key, not one per request.
    let probes = nexus
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.url.path() == "/contexts")
        .count();
    assert!(probes <= 12 + 2, "{probes} probes");
    let text = metrics(&served).await;
    assert!(text.contains("reason=\"key_refused\""), "{text}");
}

/// A keyless `initialize` is refused with 403 and a plain reason naming
/// the header: this server has no HTTP authentication scheme, and MCP
/// clients answer a 401 with an OAuth discovery (`mcp-remote` then shows
/// a failed client registration, never the reason).
#[tokio::test]
async fn a_keyless_initialize_is_refused_naming_the_key_header_without_an_oauth_challenge() {
    let nexus = keyed_nexus(true, Duration::ZERO).await;
    let served = serve(server_of(&nexus), HttpOptions::default()).await;
    let response = reqwest::Client::new()
        .post(&served.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"0"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    assert!(
        response.headers().get("www-authenticate").is_none(),
        "no challenge: nothing to sign in to"
    );
    let body = response.text().await.unwrap();
    assert!(body.contains("X-Pinecone-Api-Key"), "{body}");
    assert!(
        !body.contains("Unauthorized"),
        "mcp-remote reads `Unauthorized` in an error as a sign-in request: {body}"
    );
}

#[tokio::test]
async fn undecided_keys_stay_in_a_quarantine_that_never_displaces_a_proven_caller() {
    // The upstream cannot judge made-up keys (503): they are quarantined.
    let nexus = keyed_nexus(false, Duration::ZERO).await;
    let options = HttpOptions::default().max_sessions(16);
    let served = serve(server_of(&nexus), options).await;
    let (mut honest, status) = initialize(&served.url, HONEST).await;
    assert_eq!(status, 200);
    // An open GET stream on the honest session.
    let stream = reqwest::Client::new()
        .get(&served.url)
        .header("accept", "text/event-stream")
        .header("X-Pinecone-Api-Key", HONEST)
        .header("mcp-session-id", honest.session.clone().unwrap())
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    // Made-up keys open sessions and hold a GET stream on each: the
    // quarantine (16 / 8 = 2 sessions) fills, and then they are turned away.
    let mut admitted = 0;
    let mut busy = 0;
    let mut held = Vec::new();
    for i in 0..20 {
        let (mcp, status) = initialize(&served.url, &made_up(i)).await;
        match status {
            200 => {
                admitted += 1;
                let get = reqwest::Client::new()
                    .get(&served.url)
                    .header("accept", "text/event-stream")
                    .header("X-Pinecone-Api-Key", made_up(i))
                    .header("mcp-session-id", mcp.session.clone().unwrap())
                    .header("mcp-protocol-version", "2025-11-25")
                    .send()
                    .await
                    .unwrap();
                held.push(get);
            }
            503 => busy += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(admitted, 2, "{admitted} admitted, {busy} busy");
    assert_eq!(busy, 18);
    // The honest caller keeps its session, and a second honest caller
    // still gets one although made-up keys came first.
    let listed = honest.call("list_contexts", json!({})).await;
    assert_eq!(listed["isError"], false, "{listed}");
    let (mut other, status) = initialize(&served.url, OTHER_HONEST).await;
    assert_eq!(status, 200);
    assert_eq!(
        other.call("list_contexts", json!({})).await["isError"],
        false
    );
    let text = metrics(&served).await;
    assert!(text.contains("reason=\"quarantine_full\""), "{text}");
    drop(stream);
    drop(held);
}

#[tokio::test]
async fn a_session_has_one_get_stream() {
    let nexus = keyed_nexus(true, Duration::ZERO).await;
    let served = serve(server_of(&nexus), HttpOptions::default()).await;
    let (honest, status) = initialize(&served.url, HONEST).await;
    assert_eq!(status, 200);
    let get = || {
        reqwest::Client::new()
            .get(&served.url)
            .header("accept", "text/event-stream")
            .header("X-Pinecone-Api-Key", HONEST)
            .header("mcp-session-id", honest.session.clone().unwrap())
            .header("mcp-protocol-version", "2025-11-25")
            .send()
    };
    let first = get().await.unwrap();
    assert_eq!(first.status(), 200);
    let second = get().await.unwrap();
    assert_eq!(second.status(), 409);
    drop(first);
    // Once the first stream is gone, another may open (the server notices
    // the close on its own time: its answers are looked at).
    until(
        PATIENCE,
        "another stream opens once the first is gone",
        async || get().await.unwrap().status() == 200,
    )
    .await;
}

#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let nexus = keyed_nexus(true, Duration::ZERO).await;
    let options = HttpOptions::default()
        .max_connections(20)
        .header_read_timeout(Duration::from_secs(30));
    let server = server_of(&nexus);
    let counted = std::sync::Arc::clone(server.metrics());
    let served = serve(server, options).await;
    // Twenty silent connections from 127.0.0.2.
    let mut held = Vec::new();
    for _ in 0..20 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        if let Ok(stream) = socket.connect(served.addr).await {
            held.push(stream);
        }
    }
    // The server has taken each of them: held open or refused.
    wait_until(
        Duration::from_secs(10),
        "the 20 connections are taken",
        || {
            let open = crate::support::mcp::sample(&counted, "nexus_mcp_open_connections");
            let refused = crate::support::mcp::sample(
                &counted,
                r#"nexus_mcp_refusals_total{reason="peer_connections"}"#,
            );
            async move { open + refused >= 20.0 }
        },
    )
    .await;
    // The honest caller from 127.0.0.1 connects and is served at once.
    let start = std::time::Instant::now();
    let (mut honest, status) = initialize(&served.url, HONEST).await;
    assert_eq!(status, 200);
    assert_eq!(
        honest.call("list_contexts", json!({})).await["isError"],
        false
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let text = metrics(&served).await;
    assert!(text.contains("reason=\"peer_connections\""), "{text}");
    drop(held);
}

// ---------------------------------------------------------------------------
// Tasks on any replica.

const SECRET: &[u8] = b"the replicas' shared task secret";

fn meta_2026() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "replica-test", "version": "0"},
    })
}

async fn request_2026(url: &str, key: &str, method_name: &str, mut params: Value) -> Value {
    params["_meta"] = meta_2026();
    let mut mcp = HttpMcp::new(url)
        .header("X-Pinecone-Api-Key", key)
        .header("Mcp-Method", method_name);
    if let Some(name) = params
        .get("name")
        .or_else(|| params.get("taskId"))
        .and_then(Value::as_str)
    {
        mcp = mcp.header("Mcp-Name", name);
    }
    mcp.protocol = Some("2026-07-28".to_owned());
    let (id, answer) = mcp.request(method_name, params).await;
    answer.response(id).clone()
}

async fn replica(nexus: &MockServer, secret: &[u8]) -> Served {
    let server = server_of(nexus).with_task_seal(TaskSeal::new(secret).unwrap());
    serve(server, HttpOptions::default().stateless(true)).await
}

#[tokio::test]
async fn tasks_are_served_by_any_replica_with_the_secret_to_their_owner_only() {
    let nexus = keyed_nexus(true, Duration::ZERO).await;
    let a = replica(&nexus, SECRET).await;
    let b = replica(&nexus, SECRET).await;
    let stranger = replica(&nexus, b"another secret, another fleet").await;
    let call = json!({"name": "query_context", "arguments": {"context": "docs", "question": "?"}});
    let created = request_2026(&a.url, HONEST, "tools/call", call).await;
    let result = &created["result"];
    assert_eq!(result["resultType"], "task", "{created}");
    let id = result["taskId"].as_str().unwrap().to_owned();
    let ttl = result["ttlMs"].as_u64().unwrap();
    assert_eq!(ttl, 3_600_000);

    let params = json!({"taskId": id});
    let on_b = request_2026(&b.url, HONEST, "tasks/get", params.clone()).await;
    assert_eq!(on_b["result"]["status"], "completed", "{on_b}");
    assert_eq!(on_b["result"]["ttlMs"], ttl);
    let on_a = request_2026(&a.url, HONEST, "tasks/get", params.clone()).await;
    assert_eq!(on_a["result"]["status"], "completed", "{on_a}");

    let never = request_2026(
        &b.url,
        OTHER_HONEST,
        "tasks/get",
        json!({"taskId": "t1.1.2.00.q_9"}),
    )
    .await;
    assert_eq!(never["error"]["code"], -32602, "{never}");
    for url in [&a.url, &b.url] {
        let theirs = request_2026(url, OTHER_HONEST, "tasks/get", params.clone()).await;
        assert_eq!(theirs["error"], never["error"], "{theirs}");
        let cancel = request_2026(url, OTHER_HONEST, "tasks/cancel", params.clone()).await;
        assert_eq!(cancel["error"], never["error"], "{cancel}");
    }
    let elsewhere = request_2026(&stranger.url, HONEST, "tasks/get", params.clone()).await;
    assert_eq!(elsewhere["error"], never["error"], "{elsewhere}");
    // The task has ended: cancelling it is an error, and nothing was cancelled.
    let cancel = request_2026(&b.url, HONEST, "tasks/cancel", params).await;
    assert_eq!(cancel["error"]["code"], -32602, "{cancel}");
    assert!(
        cancel["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ended"),
        "{cancel}"
    );
    let cancels = nexus
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.url.path().ends_with("/cancel"))
        .count();
    assert_eq!(cancels, 0);
}

#[tokio::test]
async fn a_rotated_secret_still_opens_the_previous_secrets_tasks() {
    const NEW: &[u8] = b"the fleet's next task secret";
    let nexus = keyed_nexus(true, Duration::ZERO).await;
    let before = replica(&nexus, SECRET).await;
    let call = json!({"name": "query_context", "arguments": {"context": "docs", "question": "?"}});
    let created = request_2026(&before.url, HONEST, "tools/call", call.clone()).await;
    let id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let params = json!({"taskId": id});

    let rotating_seal = TaskSeal::new(NEW).unwrap().with_previous(SECRET).unwrap();
    let rotating = serve(
        server_of(&nexus).with_task_seal(rotating_seal),
        HttpOptions::default().stateless(true),
    )
    .await;
    let read = request_2026(&rotating.url, HONEST, "tasks/get", params.clone()).await;
    assert_eq!(read["result"]["status"], "completed", "{read}");
    let theirs = request_2026(&rotating.url, OTHER_HONEST, "tasks/get", params.clone()).await;
    assert_eq!(theirs["error"]["code"], -32602, "{theirs}");

    let new_only = replica(&nexus, NEW).await;
    let unknown = request_2026(&new_only.url, HONEST, "tasks/get", params).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert_eq!(unknown["error"]["message"], "unknown task", "{unknown}");

    // What the rotating replica seals now is the new secret's.
    let created = request_2026(&rotating.url, HONEST, "tools/call", call).await;
    let id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let read = request_2026(&new_only.url, HONEST, "tasks/get", json!({"taskId": id})).await;
    assert_eq!(read["result"]["status"], "completed", "{read}");
}

// ---------------------------------------------------------------------------
// Cancellation.

#[tokio::test]
async fn another_key_cannot_cancel_a_stateless_request() {
    let nexus = keyed_nexus(true, Duration::from_millis(800)).await;
    let served = serve(server_of(&nexus), HttpOptions::default().stateless(true)).await;
    // Prove the keys first (the probe is slow too).
    let _ = request_2026(&served.url, HONEST, "tools/list", json!({})).await;
    let _ = request_2026(&served.url, OTHER_HONEST, "tools/list", json!({})).await;

    let proved = received_count(&nexus).await;
    let url = served.url.clone();
    let first = tokio::spawn(async move {
        request_2026(
            &url,
            HONEST,
            "tools/call",
            json!({"name": "list_contexts", "arguments": {}}),
        )
        .await
    });
    // The call is in flight: its request reached Nexus.
    wait_until(
        Duration::from_secs(10),
        "the call reaches Nexus",
        || async { received_count(&nexus).await > proved },
    )
    .await;
    // Another key, the same JSON-RPC id (1).
    let mut other = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", OTHER_HONEST);
    other.protocol = Some("2026-07-28".to_owned());
    other
        .post(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "reason": "not mine"}}))
        .await;
    let answer = first.await.unwrap();
    assert_eq!(answer["result"]["isError"], false, "{answer}");
}
