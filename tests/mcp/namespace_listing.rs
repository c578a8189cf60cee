//! `list_namespaces` keeps the part of its text that depends only on the
//! cached discovery while the cache entry lives: the text follows the entry
//! (a refreshed entry is written anew) and its per-call fields still change.

use std::time::Duration;

use crate::support::mcp_process::{Launch, McpProcess};
use crate::support::pinecone_fake::PineconeFake;
use nexus_knowql::mcp::pinecone::PineconeServer;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

async fn connect(server: PineconeServer) -> RunningService<RoleClient, ()> {
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_io).await.expect("client connects")
}

/// The text of a `list_namespaces` answer, parsed.
async fn list(client: &RunningService<RoleClient, ()>) -> Value {
    let result = client
        .call_tool(
            CallToolRequestParams::new("list_namespaces")
                .with_arguments(json!({}).as_object().cloned().unwrap_or_default()),
        )
        .await
        .expect("list_namespaces answered");
    assert_eq!(result.is_error, Some(false));
    let text = result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .expect("text content");
    let body: Value = serde_json::from_str(&text).expect("JSON text");
    assert_eq!(result.structured_content.as_ref(), Some(&body));
    body
}

fn names(body: &Value) -> Vec<&str> {
    body["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect()
}

#[tokio::test]
async fn the_kept_listing_follows_its_cache_entry() {
    let fake = PineconeFake::start().await;
    let mut config = fake.config();
    // The cache reads tokio's clock, which the test moves past the
    // entry's lifetime: a long lifetime keeps the "still cached" call
    // inside it however loaded the machine.
    let ttl = Duration::from_secs(600);
    config.cache_ttl = ttl;
    let client = connect(PineconeServer::new(config).expect("server")).await;

    let first = list(&client).await;
    assert_eq!(first["cache_hit"], false);
    assert_eq!(names(&first), ["wg21-papers", "mailing"]);

    // While the entry lives, the answer is the entry's, with its per-call
    // fields.
    fake.add_empty_namespace("kb", "fresh", 3);
    let cached = list(&client).await;
    assert_eq!(cached["cache_hit"], true);
    assert_eq!(cached["count"], 2);
    assert_eq!(names(&cached), ["wg21-papers", "mailing"]);

    // A refreshed entry is written anew.
    crate::support::mcp::jump_clock(ttl + Duration::from_secs(1)).await;
    let refreshed = list(&client).await;
    assert_eq!(refreshed["cache_hit"], false);
    assert_eq!(refreshed["count"], 3);
    assert!(names(&refreshed).contains(&"fresh"), "{refreshed}");
    let again = list(&client).await;
    assert_eq!(again["cache_hit"], true);
    assert_eq!(again["count"], 3);
    assert_eq!(again["namespaces"], refreshed["namespaces"]);
}

/// 300 callers, each with its own key, list their namespaces over HTTP;
/// when they all come back, every answer is cached: the upstream sees
/// nothing new. (A cache that holds 64 keys answered each of them again.)
#[tokio::test]
async fn three_hundred_callers_stay_cached() {
    use crate::support::mcp::{caller_keys, serve};
    use crate::tenant_cache::list_namespaces_as;
    use nexus_knowql::mcp::NexusMcp;
    use nexus_knowql::mcp::http::HttpOptions;

    const CALLERS: usize = 300;
    let fake = PineconeFake::start().await;
    fake.accept_keys_starting("pcsk_tenant_");
    let pinecone = PineconeServer::new(fake.config())
        .expect("server")
        .with_key_policy(caller_keys(false));
    let served = serve(
        NexusMcp::new().with_pinecone(pinecone),
        HttpOptions::default().stateless(true),
    )
    .await;
    let key = |i: usize| format!("pcsk_tenant_{i:04}_0123456789abcdef");
    // One client for every caller: building one costs more than a call.
    let http = reqwest::Client::new();
    for pass in 0..2 {
        let seen_before = fake.headers().len();
        for i in 0..CALLERS {
            let body = list_namespaces_as(&http, &served.url, &key(i)).await;
            assert_eq!(body["cache_hit"], pass == 1, "caller {i}, pass {pass}");
            assert_eq!(names(&body), ["wg21-papers", "mailing"]);
        }
        let upstream = fake.headers().len() - seen_before;
        if pass == 1 {
            assert_eq!(upstream, 0, "the second pass reached Pinecone");
        } else {
            assert!(upstream >= CALLERS, "each new key is discovered once");
        }
    }
    // Each caller's discovery ran with its own key.
    let keys: std::collections::HashSet<String> =
        fake.headers().into_iter().map(|(key, _)| key).collect();
    assert!((0..CALLERS).all(|i| keys.contains(&key(i))));
}

/// A running `nexus-mcp --transport http` serving the Pinecone tools of
/// `fake`; killed on drop.
async fn nexus_mcp_for(fake: &PineconeFake, args: &[&str]) -> McpProcess {
    let mut launch = Launch::args(&[
        "--index-name",
        "kb",
        "--pinecone-controller-host",
        &fake.url,
    ]);
    launch.args.extend(args.iter().map(|a| (*a).to_owned()));
    launch.env("RUST_LOG", "nexus_knowql=info").start().await
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    session: Option<&str>,
    message: Value,
) -> reqwest::Response {
    let mut request = http
        .post(url)
        .header("X-Pinecone-Api-Key", key)
        .header("accept", "application/json, text/event-stream")
        .json(&message);
    if let Some(session) = session {
        request = request
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", "2025-06-18");
    }
    let answer = request.send().await.expect("answered");
    assert!(answer.status().is_success(), "{}", answer.status());
    answer
}

/// What a cached caller and a session cost the server: resident memory of
/// the binary before and after 2,000 more of each, divided by 2,000 (the
/// figures in docs/nexus-mcp.md, "Sizing"). Run with
/// `cargo test --all-features --test mcp memory_per -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "a measurement, not a check"]
async fn memory_per_cached_caller_and_per_session() {
    const N: usize = 2000;
    let fake = PineconeFake::start().await;
    fake.accept_keys_starting("pcsk_tenant_");
    let http = reqwest::Client::new();
    let key = |i: usize| format!("pcsk_tenant_{i:05}_0123456789abcdef");
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "list_namespaces", "arguments": {}}});

    let stateless = nexus_mcp_for(&fake, &["--stateless"]).await;
    for i in 0..100 {
        post(&http, &stateless.url, &key(i), None, list.clone()).await;
    }
    let before = stateless.resident();
    for i in 100..100 + N {
        post(&http, &stateless.url, &key(i), None, list.clone()).await;
    }
    let per_caller = stateless.resident().saturating_sub(before) / N as u64;
    eprintln!("per cached caller: {per_caller} bytes");

    let sessions = nexus_mcp_for(
        &fake,
        &[
            "--max-sessions",
            "100000",
            "--max-sessions-per-caller",
            "100000",
        ],
    )
    .await;
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "m", "version": "0"}}});
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let mut open = Vec::new();
    let mut before = 0;
    for i in 0..100 + N {
        if i == 100 {
            before = sessions.resident();
        }
        let answer = post(&http, &sessions.url, &key(0), None, initialize.clone()).await;
        let session = answer
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .expect("a session id")
            .to_owned();
        answer.bytes().await.expect("read");
        post(
            &http,
            &sessions.url,
            &key(0),
            Some(&session),
            initialized.clone(),
        )
        .await;
        open.push(session);
    }
    let per_session = sessions.resident().saturating_sub(before) / N as u64;
    eprintln!("per session: {per_session} bytes ({} open)", open.len());
}
