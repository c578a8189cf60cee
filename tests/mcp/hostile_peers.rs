//! Peers that hold capacity without doing work: HTTP/2 connections that
//! grant no flow-control window and never read their answers (pings
//! answered, so the connection looks alive), with sessions and keys, and
//! keyless `--stateless` callers whose request ids are too long to track.
//! While keyed ones hold every slot of the server, an honest caller must
//! still be served once their responses are past the request deadline;
//! keyless ones never hold more than a small anonymous share.
use crate::peer_support::{list_contexts, unread_h2};
use crate::support::mcp::{HttpMcp, nexus_client};

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use nexus_knowql::mcp::http::{self, HttpOptions};
use nexus_knowql::mcp::{KeyPolicy, NexusMcp, NexusServer};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const HONEST: &str = "pcsk_valid_honest_caller_0123456789";
/// Requests each non-reading peer keeps open.
const STREAMS: usize = 8;
/// The server's request deadline in these tests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(4);
/// How long the honest caller may wait for a slot: the deadline, the
/// grace and the timer's check interval, with room for a busy machine.
const HONEST_WITHIN: Duration = Duration::from_secs(15);

/// A Nexus that accepts every key and lists no contexts.
async fn nexus() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&server)
        .await;
    server
}

/// Serves the Nexus tools in front of `nexus` with `options`, with or
/// without the server's key for keyless callers.
async fn serve(
    nexus: &MockServer,
    options: HttpOptions,
    keyless: bool,
) -> (String, SocketAddr, CancellationToken) {
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(KeyPolicy::Caller {
            fallback_to_configured: keyless,
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

/// POSTs `body` as the honest caller (in `session`, when given).
async fn honest_post(
    client: &reqwest::Client,
    url: &str,
    session: Option<&str>,
    body: String,
) -> Result<reqwest::Response, reqwest::Error> {
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("X-Pinecone-Api-Key", HONEST)
        .header("mcp-protocol-version", "2025-06-18")
        .body(body);
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    request.send().await
}

/// The honest caller's `list_contexts` (after opening a session when
/// `sessions`), each step retried while the server is busy, until answered
/// 200 or [`HONEST_WITHIN`] passes: how long it took, or the statuses seen.
async fn honest_served(url: &str, sessions: bool) -> Result<Duration, Vec<u16>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let start = Instant::now();
    let mut seen = Vec::new();
    let mut session = None;
    while start.elapsed() < HONEST_WITHIN {
        if sessions && session.is_none() {
            let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "honest", "version": "0"}}});
            match honest_post(&client, url, None, initialize.to_string()).await {
                Ok(answer) if answer.status() == 200 => {
                    session = answer
                        .headers()
                        .get("mcp-session-id")
                        .map(|v| v.to_str().unwrap().to_owned());
                    let _ = answer.bytes().await;
                    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
                    let _ = honest_post(&client, url, session.as_deref(), note.to_string()).await;
                    continue;
                }
                Ok(answer) => seen.push(answer.status().as_u16()),
                Err(_) => seen.push(0),
            }
        } else {
            let call = list_contexts(json!(1));
            match honest_post(&client, url, session.as_deref(), call).await {
                Ok(answer) if answer.status() == 200 => {
                    let body = answer.text().await.unwrap();
                    assert!(body.contains("contexts"), "{body}");
                    return Ok(start.elapsed());
                }
                Ok(answer) => seen.push(answer.status().as_u16()),
                Err(_) => seen.push(0),
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(seen)
}

/// Two keys, each with a session and an HTTP/2 connection holding
/// [`STREAMS`] unread tool calls, fill the server; the honest caller is
/// served once those responses are past the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_http2_streams_of_two_keys_do_not_lock_out_an_honest_caller() {
    let nexus = nexus().await;
    let options = HttpOptions::default()
        .max_concurrent_requests(2 * STREAMS)
        .request_timeout(REQUEST_TIMEOUT);
    let (url, addr, shutdown) = serve(&nexus, options, false).await;

    let mut peers = Vec::new();
    for (i, ip) in [[127, 0, 0, 2], [127, 0, 0, 3]].into_iter().enumerate() {
        let key = format!("pcsk_valid_non_reader_{i}_0123456789");
        let mut session = HttpMcp::new(&url).header("X-Pinecone-Api-Key", &key);
        session.initialize().await;
        let headers = [
            ("x-pinecone-api-key", key.clone()),
            ("mcp-session-id", session.session.clone().unwrap()),
            ("mcp-protocol-version", session.protocol.clone().unwrap()),
        ];
        let bodies = (0..STREAMS)
            .map(|n| list_contexts(json!(100 + n)))
            .collect();
        let (statuses, answers, task) = unread_h2(addr, ip, &headers, bodies).await;
        assert!(
            statuses.iter().all(|s| *s == 200),
            "every stream holds a slot: {statuses:?}"
        );
        peers.push((answers, task));
    }

    let served = honest_served(&url, true).await;
    for (_, task) in &peers {
        task.abort();
    }
    let took = served.unwrap_or_else(|seen| {
        panic!("the honest caller was not served within {HONEST_WITHIN:?}: {seen:?}")
    });
    assert!(took <= HONEST_WITHIN, "{took:?}");
    shutdown.cancel();
}

/// Keyed HTTP/2 peers that never read, at the default request deadline
/// (120 s): their responses stall, and after the write-stall timeout
/// (10 s by default) their connections are cut and their slots freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_http2_streams_are_cut_at_the_write_stall_timeout_long_before_the_deadline() {
    const WITHIN: Duration = Duration::from_secs(14);
    let nexus = nexus().await;
    let options = HttpOptions::default()
        .stateless(true)
        .max_concurrent_requests(STREAMS);
    let (url, addr, shutdown) = serve(&nexus, options, false).await;
    let headers = [
        (
            "x-pinecone-api-key",
            "pcsk_valid_non_reader_0123456789".to_owned(),
        ),
        ("mcp-protocol-version", "2025-06-18".to_owned()),
    ];
    let bodies = (0..STREAMS).map(|n| list_contexts(json!(n))).collect();
    let (statuses, answers, task) = unread_h2(addr, [127, 0, 0, 6], &headers, bodies).await;
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every stream holds a slot: {statuses:?}"
    );
    let served = honest_served(&url, false).await;
    task.abort();
    drop(answers);
    let took = served.unwrap_or_else(|seen| {
        panic!("the honest caller was not served within {HONEST_WITHIN:?}: {seen:?}")
    });
    assert!(took <= WITHIN, "{took:?}");
    shutdown.cancel();
}

/// Keyless `--stateless` callers (served with the server's key) from 8
/// addresses, each with 2 HTTP/2 connections holding 16 unread calls whose
/// ids are longer than the ids tracked for cancellation, at the default
/// settings: they share a small anonymous budget per network, so the
/// honest keyed caller is served within 5 s, with no flag set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_non_readers_from_eight_addresses_leave_an_honest_caller_served_at_the_defaults() {
    const WITHIN: Duration = Duration::from_secs(5);
    let nexus = nexus().await;
    let options = HttpOptions::default().stateless(true);
    let (url, addr, shutdown) = serve(&nexus, options, true).await;

    let mut peers = Vec::new();
    let mut admitted = 0;
    for host in 0..8u8 {
        for _ in 0..2 {
            let headers = [("mcp-protocol-version", "2025-06-18".to_owned())];
            let bodies = (0..STREAMS * 2)
                .map(|n| list_contexts(json!(format!("{n}-{}", "i".repeat(200)))))
                .collect();
            let (statuses, answers, task) =
                unread_h2(addr, [127, 0, 0, 10 + host], &headers, bodies).await;
            admitted += statuses.iter().filter(|s| **s == 200).count();
            peers.push((answers, task));
        }
    }
    assert!(admitted > 0, "the non-readers hold what they may");

    let served = honest_served(&url, false).await;
    for (_, task) in &peers {
        task.abort();
    }
    let took = served.unwrap_or_else(|seen| {
        panic!("the honest caller was not served within {HONEST_WITHIN:?}: {seen:?}")
    });
    assert!(
        took <= WITHIN,
        "{took:?} ({admitted} keyless calls admitted)"
    );
    shutdown.cancel();
}

/// Upstream latency of every call in the flood test.
const UPSTREAM_LATENCY: Duration = Duration::from_secs(1);
/// Addresses the flood comes from, and callers per address.
const FLOOD_PEERS: u8 = 5;
const FLOOD_PER_PEER: usize = 16;
/// How long a never-seen valid key may take to be served during a flood.
const NEVER_SEEN_WITHIN: Duration = Duration::from_secs(10);

/// A Nexus that answers after [`UPSTREAM_LATENCY`]: keys starting with
/// `pcsk_valid` are accepted, all others refused.
async fn slow_nexus() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .and(wiremock::matchers::header_regex(
            "x-pinecone-api-key",
            "^pcsk_valid",
        ))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([]))
                .set_delay(UPSTREAM_LATENCY),
        )
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(
            ResponseTemplate::new(401)
                .set_body_json(json!({"message": "no"}))
                .set_delay(UPSTREAM_LATENCY),
        )
        .with_priority(5)
        .mount(&server)
        .await;
    server
}

/// One flooding caller from `ip`: stateless tool calls, each with a fresh
/// made-up key, one after another until `stop`.
async fn made_up_keys(
    url: String,
    ip: [u8; 4],
    caller: usize,
    stop: CancellationToken,
    sent: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let client = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(ip))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut n = 0u64;
    while !stop.is_cancelled() {
        n += 1;
        sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = format!("pcsk_made_up_{}_{caller}_{n}_0123456789", ip[3]);
        let call = client
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .header("X-Pinecone-Api-Key", key)
            .body(list_contexts(json!(n)))
            .send();
        tokio::select! {
            answer = call => if let Ok(answer) = answer {
                let _ = answer.bytes().await;
            },
            () = stop.cancelled() => {}
        }
    }
}

/// With the upstream taking a second per call, a flood of fresh made-up
/// keys from a few addresses keeps every probe slot busy; a valid key the
/// process has never seen, from another address, is still probed in turn
/// and served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_never_seen_valid_key_is_served_during_a_flood_of_made_up_keys() {
    let nexus = slow_nexus().await;
    // Room for 8 requests of unproven keys (an eighth): the flood fills it.
    let options = HttpOptions::default()
        .stateless(true)
        .max_concurrent_requests(64);
    let (url, _addr, shutdown) = serve(&nexus, options, false).await;

    let stop = CancellationToken::new();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut flood = Vec::new();
    for peer in 0..FLOOD_PEERS {
        for caller in 0..FLOOD_PER_PEER {
            flood.push(tokio::spawn(made_up_keys(
                url.clone(),
                [127, 0, 0, 10 + peer],
                caller,
                stop.clone(),
                std::sync::Arc::clone(&sent),
            )));
        }
    }
    // The flood is under way (each caller has sent a few calls): the probe
    // slots and the quarantine are full.
    let loops = usize::from(FLOOD_PEERS) * FLOOD_PER_PEER;
    let began = Instant::now();
    while sent.load(std::sync::atomic::Ordering::Relaxed) < 3 * loops {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "the flood starts"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let client = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 30]))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let start = Instant::now();
    let mut seen = Vec::new();
    let mut served = None;
    while start.elapsed() < NEVER_SEEN_WITHIN {
        let answer = client
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .header("X-Pinecone-Api-Key", "pcsk_valid_never_seen_0123456789")
            .body(list_contexts(json!(1)))
            .send()
            .await;
        match answer {
            Ok(answer) if answer.status() == 200 => {
                let body = answer.text().await.unwrap();
                if body.contains("\"isError\":false") {
                    served = Some(start.elapsed());
                    break;
                }
                seen.push(body.chars().take(200).collect::<String>());
            }
            Ok(answer) => seen.push(answer.status().to_string()),
            Err(e) => seen.push(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.cancel();
    for caller in flood {
        caller.abort();
    }
    let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sent > 3 * loops, "the flood ran: {sent} calls");
    let took = served.unwrap_or_else(|| {
        panic!("the never-seen key was not served within {NEVER_SEEN_WITHIN:?} ({sent} flood calls): {seen:?}")
    });
    assert!(took <= NEVER_SEEN_WITHIN, "{took:?}");
    shutdown.cancel();
}
