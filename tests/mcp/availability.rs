//! nexus-mcp stays up for an honest caller while others misbehave: silent
//! and idle connections, session floods, trickling bodies and made-up
//! keys, each against the real server on a real socket, with small caps
//! and short timeouts.

use std::time::Duration;

use crate::support::mcp as mcp_support;
use crate::support::pinecone_fake;
use mcp_support::*;
use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::pinecone::PineconeServer;
use nexus_knowql::mcp::{NexusMcp, NexusServer};
use pinecone_fake::{KEY_B, PineconeFake};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HONEST_KEY: &str = "pcsk_honest_caller_key_0123456789abcdef";

fn nexus(nexus_url: &str) -> NexusMcp {
    NexusMcp::new()
        .with_nexus(NexusServer::new(nexus_client(nexus_url)).with_key_policy(caller_keys(false)))
}

fn init_params() -> Value {
    json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}})
}

/// The honest caller: a session with its own key, and one tool call;
/// returns how long that took.
async fn honest_call(url: &str) -> Duration {
    let start = std::time::Instant::now();
    let mut honest = HttpMcp::new(url).header("X-Pinecone-Api-Key", HONEST_KEY);
    honest.initialize().await;
    let result = honest.call("list_contexts", json!({})).await;
    assert_eq!(result["isError"], false, "{result}");
    start.elapsed()
}

/// Whether the peer closed `socket` within `within` (a read of 0 bytes or
/// a reset).
async fn closed_within(socket: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    tokio::time::timeout(within, async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn silent_sockets_and_idle_h2c_connections_up_to_the_cap_are_closed() {
    use http_body_util::Empty;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let nexus_fake = fake_nexus(0).await;
    // All from one address: the per-address cap is the whole cap here.
    let options = HttpOptions::default()
        .max_connections(6)
        .max_connections_per_peer(6)
        .header_read_timeout(Duration::from_millis(400))
        .idle_timeout(Duration::from_millis(600));
    let served = serve(nexus(&nexus_fake.uri()), options).await;

    // Three sockets that send nothing, one HTTP/2 connection that sends
    // its preface and settings but no request, two that make one request
    // and then stay open: the cap is full.
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(TcpStream::connect(served.addr).await.unwrap());
    }
    let mut h2 = Vec::new();
    for requests in [0, 1, 1] {
        let io = TokioIo::new(TcpStream::connect(served.addr).await.unwrap());
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .unwrap();
        let ended = tokio::spawn(connection);
        for _ in 0..requests {
            let request = hyper::Request::get(format!("http://{}/healthz", served.addr))
                .body(Empty::<bytes::Bytes>::new())
                .unwrap();
            let response = sender.send_request(request).await.unwrap();
            assert_eq!(response.status(), 200);
        }
        h2.push((sender, ended));
    }
    // A seventh connection is refused while they are open.
    let mut seventh = TcpStream::connect(served.addr).await.unwrap();
    seventh
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_within(&mut seventh, Duration::from_secs(2)).await);

    // Each is closed by the server within a few seconds.
    for socket in &mut silent {
        assert!(
            closed_within(socket, Duration::from_secs(3)).await,
            "a silent socket stayed open"
        );
    }
    for (_sender, ended) in h2 {
        let ended = tokio::time::timeout(Duration::from_secs(3), ended).await;
        assert!(ended.is_ok(), "an idle HTTP/2 connection stayed open");
    }
    let took = honest_call(&served.url).await;
    assert!(took < Duration::from_secs(3), "{took:?}");
}

/// A connection's idle timer runs only while no request is in flight: a
/// call slower than the idle timeout is answered, and a keep-alive
/// connection left idle after its request is then closed.
#[tokio::test]
async fn a_call_longer_than_the_idle_timeout_is_answered_and_idle_keep_alives_are_closed() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let slow = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([]))
                .set_delay(Duration::from_millis(1500)),
        )
        .mount(&slow)
        .await;
    let options = HttpOptions::default().idle_timeout(Duration::from_millis(300));
    let served = serve(nexus(&slow.uri()), options).await;

    let mut caller = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", HONEST_KEY);
    caller.initialize().await;
    let started = std::time::Instant::now();
    let result = caller.call("list_contexts", json!({})).await;
    assert_eq!(result["isError"], false, "{result}");
    assert!(started.elapsed() >= Duration::from_millis(1400));

    // One request on a keep-alive connection, then silence: closed after
    // the idle timeout (300 ms) and the close grace, not kept.
    let mut socket = TcpStream::connect(served.addr).await.unwrap();
    socket
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    socket.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    assert!(
        closed_within(&mut socket, Duration::from_secs(5)).await,
        "an idle keep-alive connection stayed open"
    );
}

#[tokio::test]
async fn keyless_and_single_key_session_floods_leave_room_for_others() {
    let nexus_fake = fake_nexus(0).await;
    let options = HttpOptions::default()
        .max_sessions(6)
        .max_sessions_per_caller(3);
    let served = serve(nexus(&nexus_fake.uri()), options).await;

    // Without a key, initialize is refused: no session is made.
    for _ in 0..20 {
        let mut keyless = HttpMcp::new(&served.url);
        let (_, answer) = keyless.request("initialize", init_params()).await;
        assert_eq!(answer.status, 403, "{answer:?}");
        assert!(keyless.session.is_none());
    }
    // One key gets its own share, then 429.
    let mut flood = Vec::new();
    let mut refused = 0;
    for _ in 0..20 {
        let mut mcp = HttpMcp::new(&served.url)
            .header("X-Pinecone-Api-Key", "pcsk_flooding_key_0000000000000");
        let (_, answer) = mcp.request("initialize", init_params()).await;
        match answer.status {
            200 => flood.push(mcp),
            429 => refused += 1,
            other => panic!("unexpected {other}: {answer:?}"),
        }
    }
    assert_eq!(flood.len(), 3);
    assert_eq!(refused, 17);
    let took = honest_call(&served.url).await;
    assert!(took < Duration::from_secs(3), "{took:?}");

    // At the server's cap, the least recently used idle session gives
    // way: the honest caller's recent session survives five newcomers.
    let mut honest = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", HONEST_KEY);
    honest.initialize().await;
    for n in 0..4 {
        let mut newcomer = HttpMcp::new(&served.url).header(
            "X-Pinecone-Api-Key",
            &format!("pcsk_newcomer_key_{n}_000000000"),
        );
        newcomer.initialize().await;
    }
    let result = honest.call("list_contexts", json!({})).await;
    assert_eq!(result["isError"], false, "{result}");
    // The flood's oldest session was closed.
    let (_, answer) = flood[0].request("tools/list", json!({})).await;
    assert_eq!(answer.status, 404, "{answer:?}");
}

#[tokio::test]
async fn trickling_bodies_hold_only_their_callers_share_and_are_cut_at_the_body_deadline() {
    let nexus_fake = fake_nexus(0).await;
    // A body is read inside its request's admission: trickling ones hold
    // their caller's share of the slots (2 here), never the server's 4.
    let options = HttpOptions::default()
        .stateless(true)
        .max_concurrent_requests(4)
        .max_requests_per_caller(2)
        .body_read_timeout(Duration::from_millis(500));
    let server = nexus(&nexus_fake.uri());
    let counted = std::sync::Arc::clone(server.metrics());
    let served = serve(server, options).await;
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nX-Pinecone-Api-Key: {HONEST_KEY}x\r\n\
         Content-Length: 400\r\n\r\n{{"
    );
    let mut tricklers = Vec::new();
    for _ in 0..12 {
        let head = head.clone();
        let addr = served.addr;
        tricklers.push(tokio::spawn(async move {
            let mut socket = TcpStream::connect(addr).await.unwrap();
            socket.write_all(head.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            let mut buf = [0u8; 512];
            // Paced load: one byte every 100 ms, until the server answers.
            loop {
                tokio::select! {
                    read = socket.read(&mut buf) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => answer.extend_from_slice(&buf[..n]),
                    },
                    () = tokio::time::sleep(Duration::from_millis(100)) => {
                        if socket.write_all(b" ").await.is_err() {
                            break;
                        }
                    }
                }
                if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            String::from_utf8_lossy(&answer).into_owned()
        }));
    }
    // Every trickler's connection is open at the server.
    crate::support::mcp::wait_until(Duration::from_secs(10), "the tricklers connect", || {
        let open = crate::support::mcp::sample(&counted, "nexus_mcp_open_connections");
        async move { open >= 12.0 }
    })
    .await;
    // Served at once, while every trickler is still sending: they hold
    // only their own caller's share.
    let took = honest_call(&served.url).await;
    assert!(took < Duration::from_secs(2), "{took:?}");
    let mut cut = 0;
    for trickler in tricklers {
        let answer = tokio::time::timeout(Duration::from_secs(5), trickler)
            .await
            .unwrap()
            .unwrap();
        // Admitted ones are cut at the body deadline; the others were
        // over their caller's budget.
        assert!(
            answer.starts_with("HTTP/1.1 408") || answer.starts_with("HTTP/1.1 429"),
            "{answer}"
        );
        cut += usize::from(answer.starts_with("HTTP/1.1 408"));
    }
    assert_eq!(cut, 2, "the caller's two slots were held by its tricklers");
}

/// Matches requests whose Nexus key header is not `key`.
struct KeyIsNot(&'static str);

impl wiremock::Match for KeyIsNot {
    fn matches(&self, request: &wiremock::Request) -> bool {
        request
            .headers
            .get("x-pinecone-api-key")
            .and_then(|v| v.to_str().ok())
            != Some(self.0)
    }
}

#[tokio::test]
async fn made_up_keys_cannot_push_out_a_real_callers_state() {
    // Both families behind one server; Nexus, like Pinecone, accepts only
    // the real caller's key.
    let fake = PineconeFake::start().await;
    let mut config = fake.config();
    config.suggest_flow = true;
    let nexus_fake = fake_nexus(0).await;
    wiremock::Mock::given(KeyIsNot(KEY_B))
        .respond_with(wiremock::ResponseTemplate::new(401).set_body_json(
            json!({"error": {"code": "UNAUTHENTICATED", "message": "invalid API key"}}),
        ))
        // Above every route `list_contexts` reaches.
        .with_priority(1)
        .mount(&nexus_fake)
        .await;
    let server = nexus(&nexus_fake.uri()).with_pinecone(
        PineconeServer::new(config)
            .unwrap()
            .with_key_policy(caller_keys(false)),
    );
    let served = serve(server, HttpOptions::default()).await;
    let mut real = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", KEY_B);
    real.initialize().await;
    let suggested = real
        .call(
            "suggest_query_params",
            json!({"namespace": "wg21-papers", "user_query": "schedulers"}),
        )
        .await;
    assert_eq!(suggested["isError"], false, "{suggested}");
    let listed = real.call("list_contexts", json!({})).await;
    assert_eq!(listed["isError"], false, "{listed}");
    for n in 0..70 {
        let key = format!("pcsk_made_up_key_{n:03}_0000000000000");
        // Refused upstream: the key gets no session at all.
        let mut stranger = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", &key);
        let (_, answer) = stranger
            .request(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}),
            )
            .await;
        assert_eq!(answer.status, 403, "{answer:?}");
    }
    // The real caller is served at once, its suggest-flow record (kept in
    // its per-key state) still there.
    let start = std::time::Instant::now();
    let query = real
        .call(
            "query",
            json!({"query_text": "schedulers", "namespace": "wg21-papers"}),
        )
        .await;
    assert_eq!(query["isError"], false, "{query}");
    let listed = real.call("list_contexts", json!({})).await;
    assert_eq!(listed["isError"], false, "{listed}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// Status, the headers a client acts on, and body of a raw answer; the
/// per-request `x-request-id` is left out as it differs by design.
async fn raw_answer(request: reqwest::RequestBuilder) -> (u16, Vec<(String, String)>, String) {
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    let mut headers: Vec<(String, String)> = answer
        .headers()
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "x-request-id" | "date"))
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                value.to_str().unwrap_or("?").to_owned(),
            )
        })
        .collect();
    headers.sort();
    (status, headers, answer.text().await.unwrap())
}

#[tokio::test]
async fn bad_messages_get_json_rpc_errors_and_foreign_sessions_a_uniform_404() {
    let nexus_fake = fake_nexus(0).await;
    let served = serve(nexus(&nexus_fake.uri()), HttpOptions::default()).await;
    let http = reqwest::Client::new();
    let post = |body: Vec<u8>| {
        http.post(&served.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("x-pinecone-api-key", HONEST_KEY)
            .body(body)
    };
    // Each answer is the guard's own: a 400 with one JSON-RPC error object,
    // a null id and the guard's wording.
    for (body, code, message) in [
        (&b"{not json"[..], -32700, "parse error: "),
        (&b"\xff\xfe{}"[..], -32700, "parse error: "),
        (
            &br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#[..],
            -32600,
            "invalid request: batches are not supported",
        ),
        (
            &br#"{"id":1,"method":"ping"}"#[..],
            -32600,
            "invalid request: `jsonrpc` must be \"2.0\"",
        ),
    ] {
        let (status, headers, text) = raw_answer(post(body.to_vec())).await;
        assert_eq!(status, 400, "{text}");
        assert!(
            headers.contains(&("content-type".to_owned(), "application/json".to_owned())),
            "{headers:?}"
        );
        let json: Value = serde_json::from_str(&text).unwrap();
        let mut keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["error", "id", "jsonrpc"], "{json}");
        assert_eq!(json["jsonrpc"], "2.0", "{json}");
        assert_eq!(json["id"], Value::Null, "{json}");
        assert_eq!(json["error"]["code"], code, "{json}");
        let said = json["error"]["message"].as_str().unwrap();
        assert!(
            said == message || (message.ends_with(": ") && said.starts_with(message)),
            "{json}"
        );
    }

    let mut owner = HttpMcp::new(&served.url).header("X-Pinecone-Api-Key", HONEST_KEY);
    owner.initialize().await;
    let session = owner.session.clone().unwrap();
    let protocol = owner.protocol.clone().unwrap();
    let list =
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).unwrap();
    let with_session = |key: &str, id: &str| {
        http.post(&served.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("x-pinecone-api-key", key)
            .header("mcp-session-id", id)
            .header("mcp-protocol-version", &protocol)
            .body(list.clone())
    };
    let stolen = raw_answer(with_session("pcsk_thief_key_00000000000000", &session)).await;
    let unknown = raw_answer(with_session(HONEST_KEY, "no-such-session")).await;
    // Another caller's session is indistinguishable from one that never was.
    assert_eq!(stolen, unknown);
    assert_eq!(unknown.0, 404);
    assert_eq!(
        unknown.2,
        "Not Found: session not found; start a new one with initialize"
    );
    // The owner still uses it.
    let (_, mine) = owner.request("tools/list", json!({})).await;
    assert_eq!(mine.status, 200, "{}", mine.body);
}

/// Made-up keys' requests, a new key each time, `initialize` after
/// `initialize`, until `stop`: each waits for its key's verdict.
async fn made_up_key_flood(
    http: reqwest::Client,
    url: String,
    key: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sent: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init_params()});
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let made_up = format!("{key}_{}", sent.load(std::sync::atomic::Ordering::Relaxed));
        let _ = http
            .post(&url)
            .header("accept", "application/json, text/event-stream")
            .header("X-Pinecone-Api-Key", &made_up)
            .json(&body)
            .send()
            .await;
        sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A session of `key` and one `list_contexts` in it; `false` on any
/// refusal on the way.
async fn served_once(url: &str, key: &str) -> bool {
    let mut caller = HttpMcp::new(url).header("X-Pinecone-Api-Key", key);
    let (id, opened) = caller.request("initialize", init_params()).await;
    if opened.status != 200 || opened.response(id).get("result").is_none() {
        return false;
    }
    let (id, listed) = caller
        .request(
            "tools/call",
            json!({"name": "list_contexts", "arguments": {}}),
        )
        .await;
    listed.status == 200 && listed.response(id)["result"]["isError"] == false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_never_seen_key_behind_one_address_with_a_flood_of_made_up_keys_is_served() {
    let nexus_fake = fake_nexus(0).await;
    // The upstream refuses every other key, taking a moment each time.
    wiremock::Mock::given(KeyIsNot(HONEST_KEY))
        .respond_with(
            wiremock::ResponseTemplate::new(401)
                .set_body_json(
                    json!({"error": {"code": "UNAUTHENTICATED", "message": "invalid API key"}}),
                )
                .set_delay(Duration::from_millis(20)),
        )
        .with_priority(1)
        .mount(&nexus_fake)
        .await;
    let served = serve(nexus(&nexus_fake.uri()), HttpOptions::default()).await;
    // Everyone on one address (as behind a proxy): 50 made-up keys at a
    // time, each answered key followed by a new one; 200 distinct keys
    // have been sent before the never-seen key comes.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let http = reqwest::Client::new();
    let flood: Vec<_> = (0..50)
        .map(|n| {
            tokio::spawn(made_up_key_flood(
                http.clone(),
                served.url.clone(),
                format!("pcsk_made_up_flood_{n:03}_0000000000000"),
                std::sync::Arc::clone(&stop),
                std::sync::Arc::clone(&sent),
            ))
        })
        .collect();
    crate::support::wait::until(
        crate::support::wait::PATIENCE,
        "the flood is answered",
        async || sent.load(std::sync::atomic::Ordering::Relaxed) >= 200,
    )
    .await;
    // A key never seen before, from the same address: proven and served
    // within 5 s (a refusal on the way may be retried).
    let start = std::time::Instant::now();
    crate::support::wait::until(
        Duration::from_secs(5),
        "the never-seen key is served",
        async || {
            // A connection refused or cut on the way counts as a refusal.
            let url = served.url.clone();
            let once = tokio::spawn(async move { served_once(&url, HONEST_KEY).await });
            once.await.unwrap_or(false)
        },
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in flood {
        task.abort();
    }
    assert!(start.elapsed() < Duration::from_secs(5));
}
