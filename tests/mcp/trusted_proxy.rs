//! `--trusted-proxy`: behind a proxy every client shares its address, so
//! the forwarding headers of trusted proxies (and only theirs) name the
//! client that per-client budgets count.

use std::time::Duration;

use crate::peer_support::{list_contexts, seen_within};
use crate::support::mcp::{Served, caller_keys, nexus_client, serve};
use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::{NexusMcp, NexusServer};
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// A keyless stateless server (the server's key serves keyless callers)
/// allowing one request per client in flight, over a Nexus whose context
/// list takes 2 s.
async fn served(nexus: &MockServer, trusted: &[&str]) -> Served {
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([]))
                .set_delay(Duration::from_secs(2)),
        )
        .mount(nexus)
        .await;
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(caller_keys(true)),
    );
    let options = HttpOptions::default()
        .stateless(true)
        .max_requests_per_caller(1)
        .trusted_proxies(trusted.iter().map(|t| t.parse().unwrap()).collect());
    serve(server, options).await
}

/// The status of a keyless `list_contexts` forwarded for `client`.
async fn status_for(url: &str, client: &str) -> u16 {
    reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .header("x-forwarded-for", client)
        .body(list_contexts(json!(1)))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Client A holds its one slot; then the statuses of A again and of B.
async fn a_again_and_b(trusted: &[&str]) -> (u16, u16) {
    let nexus = MockServer::start().await;
    let served = served(&nexus, trusted).await;
    let url = served.url.clone();
    let first = tokio::spawn(async move { status_for(&url, "203.0.113.1").await });
    assert!(seen_within(&nexus, ("GET", "/contexts"), Duration::from_secs(10)).await);
    let again = status_for(&served.url, "203.0.113.1").await;
    let other = status_for(&served.url, "203.0.113.2").await;
    first.abort();
    (again, other)
}

#[tokio::test]
async fn a_trusted_proxys_clients_get_a_budget_each() {
    let (again, other) = a_again_and_b(&["127.0.0.0/8"]).await;
    assert_eq!(again, 429, "the same forwarded client is over its budget");
    assert_eq!(other, 200, "another forwarded client has its own budget");
}

#[tokio::test]
async fn forwarding_headers_from_an_untrusted_peer_are_ignored() {
    let (again, other) = a_again_and_b(&["10.0.0.0/8"]).await;
    assert_eq!(again, 429);
    assert_eq!(other, 429, "a header anyone can write names no client");
}
