//! Peers that hold capacity without doing work: HTTP/2 connections that
//! grant no flow-control window and never read their answers (pings
//! answered, so the connection looks alive), with sessions and keys, and
//! keyless `--stateless` callers whose request ids are too long to track.
//! While keyed ones hold every slot of the server, an honest caller must
//! still be served once their responses are past the request deadline;
//! keyless ones never hold more than a small anonymous share.
use crate::peer_support::{list_contexts, try_unread_h2, unread_h2};
use crate::support::mcp::{HttpMcp, nexus_client};
use crate::support::wait::within;

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
        // Paced load: a busy caller retries a quarter second later.
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

/// One flooding caller from `ip` (forwarded for `client` by a proxy, when
/// given): stateless tool calls, each with a fresh made-up key, one after
/// another until `stop`.
async fn made_up_keys(
    url: String,
    ip: [u8; 4],
    client: Option<&'static str>,
    caller: usize,
    stop: CancellationToken,
    sent: std::sync::Arc<tokio::sync::watch::Sender<usize>>,
) {
    let http = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(ip))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut n = 0u64;
    while !stop.is_cancelled() {
        n += 1;
        sent.send_modify(|sent| *sent += 1);
        let key = format!("pcsk_made_up_{}_{caller}_{n}_0123456789", ip[3]);
        let mut call = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .header("X-Pinecone-Api-Key", key)
            .body(list_contexts(json!(n)));
        if let Some(client) = client {
            call = call.header("x-forwarded-for", client);
        }
        let call = call.send();
        tokio::select! {
            answer = call => if let Ok(answer) = answer {
                let _ = answer.bytes().await;
            },
            () = stop.cancelled() => {}
        }
    }
}

/// A valid key the process has never seen, from `ip` (forwarded for
/// `client` by a proxy, when given), tried every half second until served
/// or [`NEVER_SEEN_WITHIN`] passes: how long it took, or what it got.
async fn never_seen_served(
    url: &str,
    ip: [u8; 4],
    client: Option<&str>,
) -> Result<Duration, Vec<String>> {
    let http = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(ip))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let start = Instant::now();
    let mut seen = Vec::new();
    while start.elapsed() < NEVER_SEEN_WITHIN {
        let mut call = http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .header("X-Pinecone-Api-Key", "pcsk_valid_never_seen_0123456789")
            .body(list_contexts(json!(1)));
        if let Some(client) = client {
            call = call.header("x-forwarded-for", client);
        }
        match call.send().await {
            Ok(answer) if answer.status() == 200 => {
                let body = answer.text().await.unwrap();
                if body.contains("\"isError\":false") {
                    return Ok(start.elapsed());
                }
                seen.push(body.chars().take(200).collect::<String>());
            }
            Ok(answer) => seen.push(answer.status().to_string()),
            Err(e) => seen.push(e.to_string()),
        }
        // Paced load: the caller tries again half a second later.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(seen)
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
    let sent = std::sync::Arc::new(tokio::sync::watch::Sender::new(0usize));
    let mut flood = Vec::new();
    for peer in 0..FLOOD_PEERS {
        for caller in 0..FLOOD_PER_PEER {
            flood.push(tokio::spawn(made_up_keys(
                url.clone(),
                [127, 0, 0, 10 + peer],
                None,
                caller,
                stop.clone(),
                std::sync::Arc::clone(&sent),
            )));
        }
    }
    // The flood is under way (each caller has sent a few calls): the probe
    // slots and the quarantine are full.
    let loops = usize::from(FLOOD_PEERS) * FLOOD_PER_PEER;
    let mut flooded = sent.subscribe();
    within(Duration::from_secs(60), "the flood starts", async {
        let _ = flooded.wait_for(|sent| *sent >= 2 * loops).await;
    })
    .await;

    let served = never_seen_served(&url, [127, 0, 0, 30], None).await;
    stop.cancel();
    for caller in flood {
        caller.abort();
    }
    let sent = *sent.borrow();
    assert!(sent > 2 * loops, "the flood ran: {sent} calls");
    let took = served.unwrap_or_else(|seen| {
        panic!("the never-seen key was not served within {NEVER_SEEN_WITHIN:?} ({sent} flood calls): {seen:?}")
    });
    assert!(took <= NEVER_SEEN_WITHIN, "{took:?}");
    shutdown.cancel();
}

/// What a reconnecting holder saw: connections that held slots until cut,
/// and connections the server turned away (or some of whose calls it did).
#[derive(Debug, Default, Clone, Copy)]
struct Holds {
    admitted: usize,
    refused: usize,
    /// Connections admitted before the first refusal.
    admitted_before_refused: Option<usize>,
}

/// An HTTP/2 peer from `ip` that holds 4 unread tool calls (forwarded
/// for `client` when it is a proxy) and, the moment the server cuts its
/// connection or turns it or one of its calls away, connects again, until
/// aborted; what it saw goes to `seen`.
async fn reconnecting_holder(
    addr: SocketAddr,
    ip: [u8; 4],
    client: Option<&'static str>,
    seen: tokio::sync::watch::Sender<Holds>,
) {
    let mut headers = vec![
        (
            "x-pinecone-api-key",
            "pcsk_valid_reconnecting_holder_0123456789".to_owned(),
        ),
        ("mcp-protocol-version", "2025-06-18".to_owned()),
    ];
    if let Some(client) = client {
        headers.push(("x-forwarded-for", client.to_owned()));
    }
    let mut round = 0u64;
    loop {
        round += 1;
        let bodies = (0..4)
            .map(|n| list_contexts(json!(round * 10 + n)))
            .collect();
        match try_unread_h2(addr, ip, &headers, bodies).await {
            Ok((statuses, answers, connection)) if statuses.iter().all(|s| *s == 200) => {
                seen.send_modify(|h| h.admitted += 1);
                // Held unread until the server cuts it.
                let _ = connection.await;
                drop(answers);
            }
            turned_away => {
                if let Ok((_, _, connection)) = turned_away {
                    connection.abort();
                }
                seen.send_modify(|h| {
                    h.refused += 1;
                    h.admitted_before_refused.get_or_insert(h.admitted);
                });
                // Paced load: a refused peer retries at once, but not in
                // a loop that only measures the machine's CPU.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Once a reconnecting holder was turned away three times while others
/// made `calls`: it had `admitted` rounds before its first refusal, the
/// others were served, and every turn-away is counted on `/metrics`.
async fn assert_paced(
    addr: SocketAddr,
    holds: Holds,
    admitted: std::ops::Range<usize>,
    calls: usize,
) {
    let before = holds.admitted_before_refused.unwrap_or(usize::MAX);
    assert!(
        admitted.contains(&before),
        "cut, it came back at once and was turned away within {admitted:?} rounds: {holds:?}"
    );
    assert!(calls >= 1, "the honest clients were served meanwhile");
    let metrics = reqwest::get(format!("http://{addr}{}", http::METRICS_PATH))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let throttled = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"nexus_mcp_refusals_total{reason="reconnect_throttled"} "#))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(
        throttled >= 3.0,
        "every turn-away is counted: {throttled} ({holds:?})"
    );
}

/// An honest client from `ip` that opens a new connection for every
/// request: `calls` stateless `list_contexts`, each answered 200.
async fn connection_per_request(url: &str, ip: [u8; 4], calls: usize) {
    let client = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(ip))
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for n in 0..calls {
        let answer = honest_post(&client, url, None, list_contexts(json!(n)))
            .await
            .expect("a new connection per request is served");
        assert_eq!(answer.status(), 200, "call {n}");
        let _ = answer.bytes().await;
    }
}

/// A peer that holds unread calls and reconnects the moment its connection
/// is cut for making no progress is throttled at the default pace (4
/// connections after its first cut, then one a pace that doubles with
/// each cut): it is turned away before its 8th connection, and each turn
/// is counted. Honest clients beside it are never throttled: one on a
/// kept-alive connection, and one opening a connection for every request
/// from the next address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_reconnecting_to_hold_slots_again_is_throttled_and_honest_clients_are_not() {
    let nexus = nexus().await;
    // The shortest write-stall cut, so that the holder's loop turns
    // quickly; the throttle at its default.
    let options = HttpOptions::default()
        .stateless(true)
        .write_stall_timeout(Duration::from_secs(1));
    let (url, addr, shutdown) = serve(&nexus, options, false).await;
    let (seen, mut holds) = tokio::sync::watch::channel(Holds::default());
    let holder = tokio::spawn(reconnecting_holder(addr, [127, 0, 0, 40], None, seen));

    let honest = async {
        let mut calls = 0;
        let mut kept_alive = HttpMcp::new(&url).header("X-Pinecone-Api-Key", HONEST);
        while holds.borrow().refused < 3 {
            let result = kept_alive.call("list_contexts", json!({})).await;
            assert_eq!(result["isError"], false, "{result}");
            connection_per_request(&url, [127, 0, 0, 41], 5).await;
            calls += 1;
            // The pace of an honest client between its calls.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        calls
    };
    let calls = within(
        Duration::from_secs(60),
        "the reconnecting holder is turned away three times",
        honest,
    )
    .await;
    holder.abort();
    assert_paced(addr, *holds.borrow_and_update(), 2..8, calls).await;
    shutdown.cancel();
}

/// Behind a trusted proxy every caller comes from the proxy's address: a
/// flood of fresh made-up keys forwarded for one client leaves a valid
/// key the process has never seen, forwarded for another client through
/// the same proxy, served within [`NEVER_SEEN_WITHIN`]; no limit set but
/// the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_a_never_seen_key_is_served_during_one_clients_flood() {
    const FLOODERS: usize = 64;
    let nexus = slow_nexus().await;
    let options = HttpOptions::default()
        .stateless(true)
        .trusted_proxies(vec!["127.0.0.0/8".parse().unwrap()]);
    let (url, _addr, shutdown) = serve(&nexus, options, false).await;
    let proxy = [127, 0, 0, 60];
    let stop = CancellationToken::new();
    let sent = std::sync::Arc::new(tokio::sync::watch::Sender::new(0usize));
    let flood: Vec<_> = (0..FLOODERS)
        .map(|caller| {
            tokio::spawn(made_up_keys(
                url.clone(),
                proxy,
                Some("203.0.113.7"),
                caller,
                stop.clone(),
                std::sync::Arc::clone(&sent),
            ))
        })
        .collect();
    let mut flooded = sent.subscribe();
    within(Duration::from_secs(30), "the flood starts", async {
        let _ = flooded.wait_for(|sent| *sent >= 2 * FLOODERS).await;
    })
    .await;
    let served = never_seen_served(&url, proxy, Some("198.51.100.9")).await;
    stop.cancel();
    for caller in flood {
        caller.abort();
    }
    let sent = *sent.borrow();
    let took = served.unwrap_or_else(|seen| {
        panic!("the never-seen key was not served within {NEVER_SEEN_WITHIN:?} ({sent} flood calls): {seen:?}")
    });
    assert!(took <= NEVER_SEEN_WITHIN, "{took:?}");
    shutdown.cancel();
}

/// Behind a trusted proxy (exempt from the connection throttle: all its
/// clients share its address) the throttle applies to the client a request
/// is forwarded for: a client whose answers go unread until the proxy's
/// connection is cut gets its calls turned away (503, counted) within a
/// few rounds, while another client forwarded by the same proxy is served
/// throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_a_client_leaving_answers_unread_is_paced_and_others_are_not() {
    let nexus = nexus().await;
    let options = HttpOptions::default()
        .stateless(true)
        .write_stall_timeout(Duration::from_secs(1))
        .trusted_proxies(vec!["127.0.0.0/8".parse().unwrap()]);
    let (url, addr, shutdown) = serve(&nexus, options, false).await;
    let (seen, mut holds) = tokio::sync::watch::channel(Holds::default());
    let holder = tokio::spawn(reconnecting_holder(
        addr,
        [127, 0, 0, 70],
        Some("203.0.113.20"),
        seen,
    ));
    let honest = async {
        let mut calls = 0;
        let mut forwarded = HttpMcp::new(&url)
            .header("X-Pinecone-Api-Key", HONEST)
            .header("x-forwarded-for", "198.51.100.30");
        while holds.borrow().refused < 3 {
            let result = forwarded.call("list_contexts", json!({})).await;
            assert_eq!(result["isError"], false, "{result}");
            calls += 1;
            // The pace of an honest client between its calls.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        calls
    };
    let calls = within(
        Duration::from_secs(60),
        "the client whose answers go unread is turned away three times",
        honest,
    )
    .await;
    holder.abort();
    assert_paced(addr, *holds.borrow_and_update(), 1..8, calls).await;
    shutdown.cancel();
}
