//! One error type: a generated call's error converts into
//! `nexus_knowql::Error` with `?`, keeping what the answer said, and an
//! error's causes are printed once along its `source()` chain.

use std::time::Duration;

use nexus_knowql::{Client, Error, RetryPolicy};
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn client(base_url: &str) -> Client {
    Client::builder()
        .base_url(base_url)
        .retry(RetryPolicy::never())
        .request_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A generated call in a function returning the crate's `Result`: the `?`
/// is what is tested.
async fn get_context(client: &Client, slug: &str) -> nexus_knowql::Result<String> {
    let context = client.api().get_context(slug).await?.into_inner();
    Ok(context.slug)
}

async fn list_contexts(client: &Client) -> nexus_knowql::Result<usize> {
    Ok(client.api().list_contexts().await?.into_inner().len())
}

#[tokio::test]
async fn a_declared_error_answer_keeps_status_code_message_and_request_id() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/contexts/missing"))
        .respond_with(
            ResponseTemplate::new(404)
                .insert_header("x-request-id", "req-404")
                .set_body_json(json!({"message": "no context missing", "code": "not_found"})),
        )
        .mount(&server)
        .await;
    let c = client(&format!("{}/api", server.uri()));
    let err = get_context(&c, "missing").await.unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(404));
    assert_eq!(err.code(), Some("not_found"));
    assert_eq!(err.request_id(), Some("req-404"));
    assert!(err.is_not_found());
    assert!(!err.is_retryable());
    let api = err.as_api().expect("an API error");
    assert_eq!(api.operation, "get_context");
    assert_eq!(api.message, "no context missing");
    assert_eq!(
        err.to_string(),
        "get_context: server answered 404 (not_found): no context missing"
    );
}

#[tokio::test]
async fn an_undeclared_error_answer_keeps_its_body_and_retry_after() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/contexts"))
        .respond_with(
            ResponseTemplate::new(503)
                .insert_header("x-pinecone-request-id", "req-503")
                .insert_header("retry-after", "7")
                .set_body_string("upstream overloaded"),
        )
        .mount(&server)
        .await;
    let c = client(&format!("{}/api", server.uri()));
    let err = list_contexts(&c).await.unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    assert_eq!(err.request_id(), Some("req-503"));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    assert!(err.is_retryable());
    let api = err.as_api().expect("an API error");
    assert_eq!(api.operation, "list_contexts");
    assert_eq!(api.message, "upstream overloaded");
    assert_eq!(api.raw_body.as_deref(), Some("upstream overloaded"));
}

#[tokio::test]
async fn an_unsupported_version_names_the_version_sent() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/contexts"))
        .respond_with(ResponseTemplate::new(400).set_body_json(
            json!({"message": "unknown version", "code": "unsupported_api_version"}),
        ))
        .mount(&server)
        .await;
    let c = Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_version("2099-01")
        .build()
        .unwrap();
    match list_contexts(&c).await.unwrap_err() {
        Error::UnsupportedApiVersion(refused) => {
            assert_eq!(refused.operation, "list_contexts");
            assert_eq!(refused.sent, "2099-01");
        }
        other => panic!("expected UnsupportedApiVersion, got {other:?}"),
    }
}

#[tokio::test]
async fn a_connection_that_cannot_open_is_a_retryable_transport_error() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = client(&format!("http://127.0.0.1:{port}/api"));
    let err = list_contexts(&c).await.unwrap_err();
    assert!(
        matches!(err, Error::Transport { connect: true, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert!(!err.may_have_started());
    assert_causes_print_once(&err);
}

/// Each text along the `source()` chain appears once: no error's text holds
/// its cause's, so a report that prints every cause shows each part once.
fn assert_causes_print_once(err: &(dyn std::error::Error + 'static)) {
    let mut texts = vec![err.to_string()];
    let mut next = err.source();
    while let Some(cause) = next {
        texts.push(cause.to_string());
        next = cause.source();
    }
    assert!(texts.len() > 1, "{err:?} has a cause");
    for (i, outer) in texts.iter().enumerate() {
        for inner in &texts[i + 1..] {
            assert!(
                !outer.contains(inner.as_str()),
                "{outer:?} repeats its cause {inner:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_rate_limited_answer_keeps_its_rate_limit_headers() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/contexts"))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("x-request-id", "req-429")
                .insert_header("retry-after", "3")
                .insert_header("x-ratelimit-limit-requests", "60")
                .insert_header("x-ratelimit-remaining-requests", "0")
                .set_body_json(json!({"message": "slow down", "code": "rate_limited"})),
        )
        .mount(&server)
        .await;
    let c = client(&format!("{}/api", server.uri()));
    let generated = list_contexts(&c).await.unwrap_err();
    let resource = c.contexts().list().await.unwrap_err();
    for err in [generated, resource] {
        assert!(err.is_rate_limited(), "{err:?}");
        assert_eq!(
            err.status(),
            Some(nexus_knowql::http::StatusCode::TOO_MANY_REQUESTS)
        );
        assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(err.request_id(), Some("req-429"));
        assert_eq!(err.rate_limits().get("remaining-requests"), Some("0"));
        assert_eq!(err.rate_limits().get("LIMIT-requests"), Some("60"));
        assert_eq!(err.rate_limits().iter().count(), 2);
    }
    let not_found = Error::InvalidRequest("x".into());
    assert!(!not_found.is_rate_limited() && not_found.rate_limits().is_empty());
}
