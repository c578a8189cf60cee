//! Per-call overrides (`Client::with_options`) of timeouts and retries.

use std::time::{Duration, Instant};

use nexus_knowql::{CallOptions, Client, Error, RetryPolicy};
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn client(server: &MockServer) -> Client {
    Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .retry(
            RetryPolicy::default()
                .initial_delay(Duration::from_millis(10))
                .max_retries(3),
        )
        .request_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn context_json(slug: &str) -> serde_json::Value {
    json!({
        "id": "6f1c2f7e-0000-4000-8000-000000000001", "slug": slug, "name": "Docs", "kind": "search",
        "created_by": "user-1", "description": "", "is_optimizing": false, "has_sources": true,
        "is_curating": false, "is_importing": false, "is_exploring": false, "is_restoring": false,
        "is_grooming": false, "created_at": "2026-07-01T10:00:00Z", "updated_at": "2026-07-02T10:00:00Z"
    })
}

#[tokio::test]
async fn a_retry_override_applies_to_its_calls_only() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/contexts"))
        .respond_with(ResponseTemplate::new(503))
        .mount(&server)
        .await;
    let base = client(&server);
    let once = base.with_options(CallOptions::new().retry(RetryPolicy::never()));
    let err = once.contexts().list().await.unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
    // The client itself keeps its policy: one try and three retries.
    base.contexts().list().await.unwrap_err();
    assert_eq!(server.received_requests().await.unwrap().len(), 5);
    // So does the generated layer of the copy.
    once.api().list_contexts().await.unwrap_err();
    assert_eq!(server.received_requests().await.unwrap().len(), 6);
}

#[tokio::test]
async fn a_timeout_override_cuts_a_slow_call_that_the_client_would_wait_for() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/contexts/c1"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_delay(Duration::from_millis(800))
                .set_body_json(context_json("c1")),
        )
        .mount(&server)
        .await;
    let base = client(&server);
    let quick = base.with_options(
        CallOptions::new()
            .request_timeout(Duration::from_millis(150))
            .retry(RetryPolicy::never()),
    );
    let started = Instant::now();
    let err = quick.contexts().get("c1").await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_millis(700));
    // `None` lifts the limit for the calls of its copy.
    let patient = quick.with_options(CallOptions::new().request_timeout(None));
    assert_eq!(patient.contexts().get("c1").await.unwrap().slug, "c1");
    assert_eq!(base.contexts().get("c1").await.unwrap().slug, "c1");
}
