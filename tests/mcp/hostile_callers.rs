//! A hostile-caller simulation: while many callers with made-up keys (some
//! the upstream refuses, some it cannot judge) and without keys open
//! sessions, hold GET streams, poll made-up tasks, send cancellations and
//! trickle request bodies, all at once and from other client addresses,
//! an honest caller's tool calls keep succeeding, each within
//! [`HONEST_LATENCY`]. Runs for about [`ATTACK`] (CI-bounded). The same
//! with `--stateless`, where cancellations come from callers who know the honest ids (not its key:
//! whoever holds the key is that caller, and may cancel its requests from
//! any connection). And `--stateless` again while HTTP/2 peers with keys
//! Nexus accepts hold streams they never read (reopening them whenever
//! the server cuts their connection), and other callers give up at every
//! stage of a call: mid-head, after the head, mid-body, with the whole
//! request sent, by cancelling it from another connection, and after
//! reading the first bytes of the answer.
use crate::peer_support::{list_contexts, unread_h2};
use crate::support::mcp::{HttpMcp, nexus_client};
use crate::support::wait::within;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nexus_knowql::mcp::http::{self, HttpOptions};
use nexus_knowql::mcp::{KeyPolicy, NexusMcp, NexusServer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{header, header_regex, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const HONEST: &str = "pcsk_honest_caller_key_0123456789abcd";
/// How long the attack lasts.
const ATTACK: Duration = Duration::from_secs(6);
/// Each attacker's pause between rounds: the attackers run on the test's
/// own two threads, beside the server, so an unpaced flood measures only
/// how the machine shares its CPU (about 500 attempts a second in all).
const PACE: Duration = Duration::from_millis(100);
/// The longest an honest call may take during the attack (generous: the
/// attackers share the test's two threads with the server).
const HONEST_LATENCY: Duration = Duration::from_secs(5);

/// A Nexus that accepts only the honest caller's key.
async fn nexus() -> MockServer {
    nexus_answering_after(Duration::ZERO).await
}

/// A Nexus that accepts only the honest caller's key and answers it after
/// `delay` (so its calls stay in flight where cancellations can reach).
async fn nexus_answering_after(delay: Duration) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .and(header("x-pinecone-api-key", HONEST))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([]))
                .set_delay(delay),
        )
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({"message": "no"})))
        .with_priority(5)
        .mount(&server)
        .await;
    server
}

/// An HTTP client whose connections come from `ip` (another loopback
/// address: another client as far as the server can tell).
fn client_from(ip: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(ip))
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap()
}

fn initialize_body() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "hostile", "version": "0"}}})
    .to_string()
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    session: Option<&str>,
    body: String,
) -> Option<reqwest::Response> {
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body);
    if let Some(key) = key {
        req = req.header("X-Pinecone-Api-Key", key);
    }
    if let Some(session) = session {
        req = req
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", "2025-11-25");
    }
    req.send().await.ok()
}

/// One attacker: sessions, a GET stream per session, made-up tasks and
/// cancellations, with a made-up key (or none), until `stop`.
async fn attacker(
    url: String,
    ip: [u8; 4],
    key: Option<String>,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
) {
    let client = client_from(ip);
    let mut streams = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        sent.fetch_add(1, Ordering::Relaxed);
        let Some(answer) = post(&client, &url, key.as_deref(), None, initialize_body()).await
        else {
            // Paced load: a refused attacker tries again soon.
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let session = answer
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        drop(answer);
        let Some(session) = session else {
            // Paced load: the attacker's next round.
            tokio::time::sleep(PACE).await;
            continue;
        };
        // Two GET streams (the second must be refused), held open.
        for _ in 0..2 {
            let mut get = client
                .get(&url)
                .header("accept", "text/event-stream")
                .header("mcp-session-id", &session)
                .header("mcp-protocol-version", "2025-11-25");
            if let Some(key) = &key {
                get = get.header("X-Pinecone-Api-Key", key);
            }
            if let Ok(stream) = get.send().await {
                streams.push(stream);
            }
        }
        let task = json!({"jsonrpc": "2.0", "id": n, "method": "tasks/get", "params": {"taskId": format!("t1.1.9999999999999.00.q_{n}")}});
        let _ = post(
            &client,
            &url,
            key.as_deref(),
            Some(&session),
            task.to_string(),
        )
        .await;
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}});
        let _ = post(
            &client,
            &url,
            key.as_deref(),
            Some(&session),
            cancel.to_string(),
        )
        .await;
        if streams.len() > 64 {
            streams.drain(..32);
        }
        // Paced load: the attacker's next round.
        tokio::time::sleep(PACE).await;
    }
}

/// Connections that send a request head and then trickle the body.
async fn slow_bodies(addr: SocketAddr, stop: Arc<AtomicBool>) {
    let mut held = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.9:0".parse().unwrap()).unwrap();
        if let Ok(mut stream) = socket.connect(addr).await {
            let head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nX-Pinecone-Api-Key: pcsk_refused_slow\r\nContent-Length: 100000\r\n\r\n{";
            let _ = stream.write_all(head.as_bytes()).await;
            held.push(stream);
        }
        for stream in &mut held {
            let _ = stream.write_all(b" ").await;
        }
        if held.len() > 200 {
            held.drain(..100);
        }
        // Paced load: the pace of the trickle.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server of the Nexus tools in front of `nexus`, each caller with its
/// own key, serving with `options`: its MCP URL, address and shutdown.
async fn serve_for(
    nexus: &MockServer,
    options: HttpOptions,
) -> (String, SocketAddr, CancellationToken) {
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(KeyPolicy::Caller {
            fallback_to_configured: false,
        }),
    );
    let listener = http::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let url = format!("http://{addr}{}", http::MCP_PATH);
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    tokio::spawn(async move { http::serve(listener, server, &options, token).await });
    (url, addr, shutdown)
}

/// The honest caller's `list_contexts` calls for [`ATTACK`], each result
/// passed to `check`; then the attack stops. Asserts the calls were made
/// and that each waited at most [`HONEST_LATENCY`] for the server: its
/// time less that of a request that needs no slot (`GET /healthz` on
/// `url`'s server, sent beside it), so that a machine slowed by other
/// work delays both alike and only what the attack holds counts.
async fn honest_calls_through(
    url: &str,
    honest: &mut HttpMcp,
    check: impl Fn(&serde_json::Value),
    stop: &AtomicBool,
    attackers: Vec<tokio::task::JoinHandle<()>>,
    sent: &AtomicUsize,
) {
    let health = url.replace(http::MCP_PATH, http::HEALTH_PATH);
    let control = reqwest::Client::new();
    let start = Instant::now();
    let mut calls = 0;
    let mut slowest = Duration::ZERO;
    while start.elapsed() < ATTACK {
        let began = Instant::now();
        let call =
            tokio::time::timeout(HONEST_LATENCY * 4, honest.call("list_contexts", json!({})));
        let slotless = async {
            let sent = Instant::now();
            let _ = control.get(&health).send().await;
            sent.elapsed()
        };
        let (result, slotless) = tokio::join!(call, slotless);
        let result = result.expect("the honest call answers");
        let waited = began.elapsed().saturating_sub(slotless);
        slowest = slowest.max(waited);
        check(&result);
        calls += 1;
        // Paced load: the honest caller's pace between its calls.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.abort();
    }
    assert!(calls >= 3, "{calls} honest calls");
    assert!(
        slowest <= HONEST_LATENCY,
        "longest honest wait {slowest:?} ({calls} calls, {} attacker requests)",
        sent.load(Ordering::Relaxed)
    );
    assert!(sent.load(Ordering::Relaxed) > 30, "the attack ran");
}

/// How many requests reached `nexus` with a made-up key.
async fn made_up_key_probes(nexus: &MockServer) -> usize {
    nexus
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| {
            r.headers
                .get("x-pinecone-api-key")
                .is_some_and(|k| k.to_str().unwrap_or_default().contains("made_up"))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_honest_caller_is_served_throughout_an_attack() {
    let nexus = nexus().await;
    // The default limits: no flag set.
    let (url, addr, shutdown) = serve_for(&nexus, HttpOptions::default()).await;

    // The honest caller's session first.
    let mut honest = HttpMcp::new(&url).header("X-Pinecone-Api-Key", HONEST);
    honest.initialize().await;

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut attackers = Vec::new();
    for i in 0..18u8 {
        let ip = [127, 0, 0, 2 + i % 6];
        let key = match i % 3 {
            0 => Some(format!("pcsk_refused_made_up_{i:03}_0123456789")),
            1 => Some(format!("pcsk_another_made_up_{i:03}_0123456789")),
            _ => None,
        };
        attackers.push(tokio::spawn(attacker(
            url.clone(),
            ip,
            key,
            Arc::clone(&stop),
            Arc::clone(&sent),
        )));
    }
    attackers.push(tokio::spawn(slow_bodies(addr, Arc::clone(&stop))));

    honest_calls_through(
        &url,
        &mut honest,
        |result| assert_eq!(result["isError"], false, "{result}"),
        &stop,
        attackers,
        &sent,
    )
    .await;
    // Made-up keys reached the upstream at most once each.
    let probes = made_up_key_probes(&nexus).await;
    assert!(probes <= 16, "{probes} upstream calls with made-up keys");
    shutdown.cancel();
}

/// One stateless attacker: tool calls with a made-up key or none, large
/// arguments, and cancellations naming the ids the honest caller uses,
/// until `stop`.
async fn stateless_attacker(
    url: String,
    ip: [u8; 4],
    key: Option<String>,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
) {
    let client = client_from(ip);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        sent.fetch_add(1, Ordering::Relaxed);
        let filler = "x".repeat(usize::try_from(n % 4).unwrap_or(0) * 100_000);
        let call = json!({"jsonrpc": "2.0", "id": n % 8, "method": "tools/call",
            "params": {"name": "list_contexts", "arguments": {"filler": filler}}});
        let _ = post(&client, &url, key.as_deref(), None, call.to_string()).await;
        for id in 0..8 {
            let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": n % 16 + id}});
            let _ = post(&client, &url, key.as_deref(), None, cancel.to_string()).await;
        }
        // Paced load: the attacker's next round.
        tokio::time::sleep(PACE).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_honest_stateless_caller_is_served_throughout_an_attack() {
    let nexus = nexus_answering_after(Duration::from_millis(150)).await;
    // The default limits: no flag set.
    let options = HttpOptions::default().stateless(true);
    let (url, addr, shutdown) = serve_for(&nexus, options).await;

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut attackers = Vec::new();
    for i in 0..12u8 {
        let ip = [127, 0, 0, 2 + i % 6];
        let key = match i % 4 {
            0 => Some(format!("pcsk_refused_made_up_{i:03}_0123456789")),
            // Another key that knows the honest ids cancels nothing of
            // the honest caller's.
            1 => Some(format!("pcsk_knows_ids_made_up_{i:03}_0123456789")),
            2 => Some(format!("pcsk_another_made_up_{i:03}_0123456789")),
            _ => None,
        };
        attackers.push(tokio::spawn(stateless_attacker(
            url.clone(),
            ip,
            key,
            Arc::clone(&stop),
            Arc::clone(&sent),
        )));
    }
    attackers.push(tokio::spawn(slow_bodies(addr, Arc::clone(&stop))));

    let mut honest = HttpMcp::new(&url).header("X-Pinecone-Api-Key", HONEST);
    honest_calls_through(
        &url,
        &mut honest,
        |result| {
            assert_eq!(result["isError"], false, "{result}");
            assert_eq!(
                result["structuredContent"]["contexts"],
                json!([]),
                "{result}"
            );
        },
        &stop,
        attackers,
        &sent,
    )
    .await;
    let probes = made_up_key_probes(&nexus).await;
    // Nine made-up keys (three kinds of attacker), each probed at most
    // about twice (two of its first requests may race to prove it).
    assert!(probes <= 18, "{probes} upstream calls with made-up keys");
    shutdown.cancel();
}

/// Keys Nexus accepts besides the honest caller's: the peers that hold
/// streams unread and the callers that give up.
const ACCEPTED_PREFIX: &str = "pcsk_accepted_";

/// An HTTP/2 peer from `ip` with an accepted key that keeps `streams`
/// tool calls unread, and opens a new connection each time the server
/// cuts its connection, until `stop`. Each cut is counted in `cuts`.
async fn non_reader(
    addr: SocketAddr,
    ip: [u8; 4],
    streams: usize,
    stop: Arc<AtomicBool>,
    cuts: tokio::sync::watch::Sender<usize>,
    sent: Arc<AtomicUsize>,
) {
    let key = format!("{ACCEPTED_PREFIX}non_reader_{}_0123456789", ip[3]);
    let headers = [
        ("x-pinecone-api-key", key),
        ("mcp-protocol-version", "2025-06-18".to_owned()),
    ];
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let bodies = (0..streams as u64)
            .map(|n| list_contexts(json!(round * 100 + n)))
            .collect();
        sent.fetch_add(streams, Ordering::Relaxed);
        let (_statuses, answers, connection) = unread_h2(addr, ip, &headers, bodies).await;
        // Held unread until the server cuts the connection.
        if connection.await.is_ok() {
            cuts.send_modify(|n| *n += 1);
        }
        drop(answers);
    }
}

/// A stage at which a caller gives up on a call.
#[derive(Clone, Copy, Debug)]
enum GiveUp {
    MidHead,
    AfterHead,
    MidBody,
    AfterRequest,
    CancelledElsewhere,
    AfterFirstAnswerBytes,
}

impl GiveUp {
    const ALL: [GiveUp; 6] = [
        GiveUp::MidHead,
        GiveUp::AfterHead,
        GiveUp::MidBody,
        GiveUp::AfterRequest,
        GiveUp::CancelledElsewhere,
        GiveUp::AfterFirstAnswerBytes,
    ];
}

/// A caller from `ip` with an accepted key that makes plain stateless
/// `list_contexts` calls over HTTP/1.1 and gives up on each at the next
/// stage, until `stop`.
async fn quitter(
    addr: SocketAddr,
    url: String,
    ip: [u8; 4],
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
) {
    let key = format!("{ACCEPTED_PREFIX}quitter_{}_0123456789", ip[3]);
    let cancels = client_from(ip);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        sent.fetch_add(1, Ordering::Relaxed);
        let stage = GiveUp::ALL[usize::try_from(n).unwrap_or(0) % GiveUp::ALL.len()];
        let body = list_contexts(json!(n));
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n\
             X-Pinecone-Api-Key: {key}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        let _ = socket.bind(SocketAddr::from((ip, 0)));
        let Ok(mut stream) = socket.connect(addr).await else {
            // Paced load: a refused caller tries again later.
            tokio::time::sleep(PACE).await;
            continue;
        };
        let (head, body) = (head.as_bytes(), body.as_bytes());
        let _ = match stage {
            GiveUp::MidHead => stream.write_all(&head[..head.len() / 2]).await,
            GiveUp::AfterHead => stream.write_all(head).await,
            GiveUp::MidBody => {
                let _ = stream.write_all(head).await;
                stream.write_all(&body[..body.len() / 2]).await
            }
            GiveUp::AfterRequest => {
                let _ = stream.write_all(head).await;
                stream.write_all(body).await
            }
            GiveUp::CancelledElsewhere => {
                let _ = stream.write_all(head).await;
                let _ = stream.write_all(body).await;
                let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                    "params": {"requestId": n}});
                let _ = post(&cancels, &url, Some(&key), None, cancel.to_string()).await;
                // The cancelled call is answered (or cut) all the same.
                let mut rest = Vec::new();
                let read = stream.read_to_end(&mut rest);
                let _ = tokio::time::timeout(Duration::from_secs(3), read).await;
                Ok(())
            }
            GiveUp::AfterFirstAnswerBytes => {
                let _ = stream.write_all(head).await;
                let _ = stream.write_all(body).await;
                let mut first = [0u8; 12];
                let read = stream.read_exact(&mut first);
                let _ = tokio::time::timeout(Duration::from_secs(3), read).await;
                Ok(())
            }
        };
        drop(stream);
        // Paced load: the caller's next call.
        tokio::time::sleep(PACE / 2).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_honest_stateless_caller_is_served_while_peers_never_read_and_give_up_at_every_stage() {
    let nexus = nexus_answering_after(Duration::from_millis(150)).await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .and(header_regex(
            "x-pinecone-api-key",
            &format!("^{ACCEPTED_PREFIX}"),
        ))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([]))
                .set_delay(Duration::from_millis(150)),
        )
        .with_priority(2)
        .mount(&nexus)
        .await;
    // The default limits: no flag set (unread streams are cut at the
    // default write-stall timeout, reconnects throttled at the default
    // pace).
    let options = HttpOptions::default().stateless(true);
    let (url, addr, shutdown) = serve_for(&nexus, options).await;

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut attackers = Vec::new();
    let mut non_readers = Vec::new();
    for last in [2u8, 3] {
        let (cuts, cut) = tokio::sync::watch::channel(0);
        let peer = tokio::spawn(non_reader(
            addr,
            [127, 0, 0, last],
            8,
            Arc::clone(&stop),
            cuts,
            Arc::clone(&sent),
        ));
        non_readers.push((peer, cut));
    }
    for last in [4u8, 5, 6] {
        attackers.push(tokio::spawn(quitter(
            addr,
            url.clone(),
            [127, 0, 0, last],
            Arc::clone(&stop),
            Arc::clone(&sent),
        )));
    }
    for i in 0..4u8 {
        let key = (i % 2 == 0).then(|| format!("pcsk_refused_made_up_{i:03}_0123456789"));
        attackers.push(tokio::spawn(stateless_attacker(
            url.clone(),
            [127, 0, 0, 7 + i],
            key,
            Arc::clone(&stop),
            Arc::clone(&sent),
        )));
    }
    attackers.push(tokio::spawn(slow_bodies(addr, Arc::clone(&stop))));

    let mut honest = HttpMcp::new(&url).header("X-Pinecone-Api-Key", HONEST);
    honest_calls_through(
        &url,
        &mut honest,
        |result| assert_eq!(result["isError"], false, "{result}"),
        &stop,
        attackers,
        &sent,
    )
    .await;
    // No non-reader keeps its unread streams for ever: the signal is its
    // connection ending, closed by the server (given ample time).
    let every_peer_cut = async {
        for (_, cut) in &mut non_readers {
            let _ = cut.wait_for(|cuts| *cuts > 0).await;
        }
    };
    within(
        Duration::from_secs(30),
        "the server cuts the connections of peers that never read",
        every_peer_cut,
    )
    .await;
    for (peer, _) in non_readers {
        peer.abort();
    }
    shutdown.cancel();
}
