//! Per-call headers (`CallOptions::header`) and per-answer metadata
//! (`Call::with_metadata`, `ResponseMeta`).

use std::time::Duration;

use nexus_knowql::{CallOptions, Client, Error, ResponseMeta, RetryPolicy};
use serde_json::json;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn client(server: &MockServer) -> Client {
    Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_key("pcsk_secret")
        .retry(RetryPolicy::never())
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
async fn concurrent_calls_each_see_their_own_request_id() {
    let server = MockServer::start().await;
    let slugs: Vec<String> = (0..16).map(|i| format!("c{i}")).collect();
    for slug in &slugs {
        Mock::given(method("GET"))
            .and(path(format!("/api/contexts/{slug}")))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("x-request-id", format!("req-{slug}").as_str())
                    // Held a moment, so the calls overlap on the one client.
                    .set_delay(Duration::from_millis(50))
                    .set_body_json(context_json(slug)),
            )
            .mount(&server)
            .await;
    }
    let c = client(&server);
    let calls = slugs
        .iter()
        .map(|slug| c.contexts().get(slug).with_metadata());
    let answers = futures::future::join_all(calls).await;
    for (slug, answer) in slugs.iter().zip(answers) {
        let (context, meta) = answer.unwrap();
        assert_eq!(context.slug, *slug);
        assert_eq!(meta.request_id(), Some(format!("req-{slug}").as_str()));
        assert_eq!(meta.status(), 200);
    }
    // Awaited without asking, a call gives the typed answer alone.
    assert_eq!(c.contexts().get("c3").await.unwrap().slug, "c3");
}

#[tokio::test]
async fn an_extra_header_reaches_the_server_on_every_call_of_its_copy() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/contexts"))
        .and(header("x-trace-id", "job-17"))
        .and(header("x-pinecone-api-key", "pcsk_secret"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/contexts"))
        .respond_with(ResponseTemplate::new(418))
        .mount(&server)
        .await;
    let base = client(&server);
    let traced = base.with_options(CallOptions::new().header("x-trace-id", "job-17").unwrap());
    assert!(traced.contexts().list().await.unwrap().is_empty());
    // The generated layer of the copy sends it too.
    traced.api().list_contexts().await.unwrap();
    // The client itself does not.
    assert_eq!(
        base.contexts()
            .list()
            .await
            .unwrap_err()
            .status()
            .map(|s| s.as_u16()),
        Some(418)
    );
    let sent: Vec<Option<String>> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            r.headers
                .get("x-trace-id")
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(sent, [Some("job-17".into()), Some("job-17".into()), None]);
}

#[tokio::test]
async fn a_call_cannot_replace_the_credentials_or_the_version() {
    for name in [
        "x-pinecone-api-key",
        "Authorization",
        "X-Pinecone-Api-Version",
    ] {
        let e = CallOptions::new().header(name, "pcsk_other").unwrap_err();
        assert!(matches!(e, Error::InvalidRequest(_)), "{name}: {e:?}");
        assert!(!e.to_string().contains("pcsk_other"), "{e}");
    }
}

#[tokio::test]
async fn metadata_reads_rate_limits_and_holds_no_secret() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/tasks/t1"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("x-pinecone-request-id", "req-t1")
                .insert_header("x-ratelimit-remaining-requests", "42")
                .insert_header("x-ratelimit-limit-requests", "100")
                .insert_header("retry-after", "3")
                // A server that echoes what it was sent, and sets a cookie.
                .insert_header("x-pinecone-api-key", "pcsk_secret")
                .insert_header("x-trace-id", "trace-secret")
                .insert_header("set-cookie", "session=cookie-secret")
                .set_body_json(json!({
                    "id": "t1", "project_id": "p", "created_by": "u", "workflow": "import",
                    "state": "running", "input": {}, "steps": [], "tokens_prompt": 0,
                    "tokens_completion": 0, "runtime_seconds": 1,
                    "created_at": "2026-07-01T10:00:00Z"
                })),
        )
        .mount(&server)
        .await;
    let c = client(&server);
    let traced = c.with_options(
        CallOptions::new()
            .header("x-trace-id", "trace-secret")
            .unwrap(),
    );
    let (task, meta) = traced.tasks().get("t1").with_metadata().await.unwrap();
    assert_eq!(task.id, "t1");
    assert_eq!(meta.request_id(), Some("req-t1"));
    assert_eq!(meta.rate_limit("remaining-requests"), Some("42"));
    assert_eq!(meta.rate_limit("limit-requests"), Some("100"));
    assert_eq!(meta.rate_limits().count(), 2);
    assert_eq!(meta.retry_after(), Some(Duration::from_secs(3)));
    for text in [format!("{meta:?}"), meta.to_string(), format!("{traced:?}")] {
        for secret in ["pcsk_secret", "trace-secret", "cookie-secret"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
    }
    // The metadata of a generated call, read from its `ResponseValue`.
    let rv = c.api().get_task("t1").await.unwrap();
    let generated = ResponseMeta::from_headers(rv.status().as_u16(), rv.headers());
    assert_eq!(generated, meta);
}
