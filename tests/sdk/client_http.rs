//! The client core against scripted HTTP exchanges: headers, version
//! negotiation, retries, authentication and error mapping.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nexus_knowql::{Client, Error, RetryPolicy, types};
use serde_json::json;
use wiremock::matchers::{any, body_json, header, method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

const KEY: &str = "pcsk_test_key_0123456789abcdefghijklmnopqrstuvwxyz";

fn context_json(slug: &str) -> serde_json::Value {
    json!({
        "id": "6f1c2f7e-0000-4000-8000-000000000001", "slug": slug, "name": "Docs", "kind": "search",
        "created_by": "user-1", "description": "", "is_optimizing": false, "has_sources": true,
        "is_curating": false, "is_importing": false, "is_exploring": false, "is_restoring": false,
        "is_grooming": false, "created_at": "2026-07-01T10:00:00Z", "updated_at": "2026-07-02T10:00:00Z",
        "last_curated_at": "2026-07-02T09:00:00Z"
    })
}

/// A client with fast retries, for a mock server.
fn client(server: &MockServer) -> Client {
    Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_key(KEY)
        .retry(
            RetryPolicy::default()
                .initial_delay(Duration::from_millis(10))
                .max_retries(2),
        )
        .build()
        .unwrap()
}

async fn requests(server: &MockServer) -> Vec<Request> {
    server.received_requests().await.unwrap()
}

#[tokio::test]
async fn every_request_carries_version_key_and_user_agent() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/contexts"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([context_json("docs")])))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/models"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "default": "m", "models": [], "tiers": {}, "phase_defaults": {}, "supported_curate_models": []
        })))
        .mount(&server)
        .await;
    let c = client(&server);
    let contexts = c.contexts().list().await.unwrap();
    assert_eq!(contexts[0].slug, "docs");
    assert!(contexts[0].is_queryable());
    c.models().await.unwrap();
    let reqs = requests(&server).await;
    assert_eq!(reqs.len(), 2);
    for r in reqs {
        assert_eq!(r.headers["x-pinecone-api-version"], "2026-07");
        assert_eq!(r.headers["x-pinecone-api-key"], KEY);
        let ua = r.headers["user-agent"].to_str().unwrap();
        assert_eq!(ua, format!("nexus-knowql/{}", env!("CARGO_PKG_VERSION")));
        assert!(
            !r.headers.contains_key("api-version"),
            "only the Nexus header is sent"
        );
    }
}

#[tokio::test]
async fn custom_and_unstable_versions_are_sent_as_given() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&server)
        .await;
    for (version, want) in [
        (nexus_knowql::ApiVersion::Unstable, "unstable"),
        (nexus_knowql::ApiVersion::from("2027-01"), "2027-01"),
    ] {
        let c = Client::builder()
            .base_url(format!("{}/api", server.uri()))
            .api_version(version)
            .build()
            .unwrap();
        c.contexts().list().await.unwrap();
        let last = requests(&server).await.pop().unwrap();
        assert_eq!(last.headers["x-pinecone-api-version"], want);
        assert!(
            !last.headers.contains_key("x-pinecone-api-key"),
            "no key configured, none sent"
        );
    }
}

#[tokio::test]
async fn echoed_version_is_exposed() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("X-Pinecone-Api-Version", "2026-07")
                .set_body_json(json!([])),
        )
        .mount(&server)
        .await;
    let c = client(&server);
    assert_eq!(c.server_api_version(), None);
    c.contexts().list().await.unwrap();
    assert_eq!(c.server_api_version().as_deref(), Some("2026-07"));
}

#[tokio::test]
async fn unsupported_api_version_is_its_own_error() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(
            ResponseTemplate::new(400)
                .insert_header("x-request-id", "req-42")
                .set_body_json(json!({"message": "unknown version 2099-01", "code": "unsupported_api_version"})),
        )
        .mount(&server)
        .await;
    let c = Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_version("2099-01")
        .build()
        .unwrap();
    // Both an operation that declares 400 and one that does not.
    for err in [
        c.contexts().get("docs").await.unwrap_err(),
        c.contexts().list().await.unwrap_err(),
    ] {
        match &err {
            Error::UnsupportedApiVersion(refused) => {
                assert_eq!(refused.sent, "2099-01");
                assert_eq!(refused.request_id.as_deref(), Some("req-42"));
                assert!(refused.message.contains("2099-01"));
            }
            other => panic!("expected UnsupportedApiVersion, got {other:?}"),
        }
        assert_eq!(err.code(), Some("unsupported_api_version"));
        assert!(!err.is_retryable());
    }
}

/// Captures log output of the whole test binary.
#[derive(Clone, Default)]
struct LogSink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogSink {
    type Writer = LogSink;
    fn make_writer(&'a self) -> LogSink {
        self.clone()
    }
}

#[tokio::test]
async fn version_mismatch_warns_once_and_logs_never_show_secrets() {
    let sink = LogSink::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(sink.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/auth/login"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "principal": "u", "project_id": "p", "project_name": "n", "token": "tok_secret_value_123"
        })))
        .mount(&server)
        .await;
    Mock::given(any())
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("X-Pinecone-Api-Version", "2026-07")
                .set_body_json(json!([])),
        )
        .mount(&server)
        .await;
    let c = Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_key(KEY)
        .login(true)
        .api_version(nexus_knowql::ApiVersion::Unstable)
        .build()
        .unwrap();
    for _ in 0..3 {
        c.contexts().list().await.unwrap();
    }
    let logs = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    let warnings = logs.matches("different API version").count();
    assert_eq!(warnings, 1, "warned exactly once:\n{logs}");
    assert!(
        logs.contains("echoed=\"2026-07\"") || logs.contains("echoed=2026-07"),
        "{logs}"
    );
    assert!(!logs.contains(KEY), "the key leaked into logs");
    assert!(
        !logs.contains("tok_secret_value_123"),
        "the token leaked into logs"
    );
}

#[tokio::test]
async fn retry_after_503_then_success() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/contexts/docs"))
        .respond_with(ResponseTemplate::new(503).insert_header("Retry-After", "1"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/contexts/docs"))
        .respond_with(ResponseTemplate::new(200).set_body_json(context_json("docs")))
        .mount(&server)
        .await;
    let c = client(&server);
    let started = std::time::Instant::now();
    let ctx = c.contexts().get("docs").await.unwrap();
    assert_eq!(ctx.slug, "docs");
    assert_eq!(requests(&server).await.len(), 2, "exactly one retry");
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "Retry-After: 1 was honoured"
    );
}

#[tokio::test]
async fn retry_after_as_http_date_is_honoured() {
    let server = MockServer::start().await;
    // Two seconds ahead, whole seconds: at least one second away. The retry
    // must not come before it (the policy's own backoff is 10 ms, so a
    // client that ignores a date-valued Retry-After retries far too early).
    let at = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(2));
    let not_before = httpdate::parse_http_date(&at).unwrap();
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", at.as_str()))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&server)
        .await;
    client(&server).contexts().list().await.unwrap();
    let retried_at = std::time::SystemTime::now();
    assert_eq!(requests(&server).await.len(), 2);
    // The clock's sub-second part and the sleep's rounding: 50 ms of slack.
    assert!(
        retried_at + Duration::from_millis(50) >= not_before,
        "retried {:?} before the Retry-After date",
        not_before.duration_since(retried_at).unwrap_or_default()
    );
}

#[tokio::test]
async fn retries_are_capped() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(502).set_body_string("bad gateway"))
        .mount(&server)
        .await;
    let err = client(&server).contexts().list().await.unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(502));
    assert!(err.is_retryable());
    assert_eq!(
        requests(&server).await.len(),
        3,
        "first attempt + max_retries(2)"
    );
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    for status in [400u16, 404] {
        let server = MockServer::start().await;
        Mock::given(any())
            .respond_with(
                ResponseTemplate::new(status)
                    .set_body_json(json!({"message": "nope", "code": "bad"})),
            )
            .mount(&server)
            .await;
        let err = client(&server).contexts().get("docs").await.unwrap_err();
        assert_eq!(err.status().map(|s| s.as_u16()), Some(status));
        assert_eq!(err.code(), Some("bad"));
        assert_eq!(err.is_not_found(), status == 404);
        assert_eq!(requests(&server).await.len(), 1, "{status} is final");
    }
}

#[tokio::test]
async fn post_query_is_never_resent_once_received() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(503).insert_header("Retry-After", "0"))
        .mount(&server)
        .await;
    let c = client(&server);
    let req: types::QueryRequest =
        serde_json::from_value(json!({"ask": "hi", "scope": ["docs"]})).unwrap();
    let err = c.api().query(&req).await.unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    assert_eq!(
        requests(&server).await.len(),
        1,
        "a POST that reached the server is not sent again"
    );
}

#[tokio::test]
async fn post_is_retried_when_the_connection_was_refused() {
    // Reserve a port, free it, and only start listening after the first
    // attempt has been refused.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let c = Client::builder()
        .base_url(format!("http://127.0.0.1:{port}/api"))
        .retry(
            RetryPolicy::default()
                .initial_delay(Duration::from_millis(300))
                .jitter(0.0)
                .max_retries(4),
        )
        .build()
        .unwrap();
    let (_logs, mut retries) = crate::support::wait::retry_signal();
    let server_task = tokio::spawn(async move {
        let refused = retries.wait_for(|n| *n >= 1);
        let what = "the first attempt is refused";
        crate::support::wait::within(crate::support::wait::PATIENCE, what, refused)
            .await
            .unwrap();
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let server = MockServer::builder().listener(listener).start().await;
        Mock::given(method("POST"))
            .and(path("/api/query"))
            .and(body_json(json!({"ask": "hi", "scope": ["docs"]})))
            .respond_with(ResponseTemplate::new(200).set_body_json(query_json("q1")))
            .expect(1)
            .mount(&server)
            .await;
        server
    });
    let req: types::QueryRequest =
        serde_json::from_value(json!({"ask": "hi", "scope": ["docs"]})).unwrap();
    let q = c.api().query(&req).await.unwrap().into_inner();
    assert_eq!(q.id, "q1");
    // The server outlives the call and checks its `.expect(1)`: the POST
    // that got through was sent once.
    let server = server_task.await.unwrap();
    server.verify().await;
    assert_eq!(requests(&server).await.len(), 1);
}

fn query_json(id: &str) -> serde_json::Value {
    json!({
        "id": id, "object": "query", "session_id": "s1", "model": "m", "created": 1_780_000_000,
        "status": "completed", "input": [{"role": "user", "content": "hi"}],
        "output": [{"role": "assistant", "content": [{"type": "output_text", "text": "Hello "}, {"type": "output_text", "text": "world"}]}],
        "citations": [{"source": "docs/a.md", "section_paths": [["Intro"]]}],
        "steps": [{"step_id": "s-1", "status": "completed", "commentary": "searching"}],
        "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}, "runtime_ms": 12
    })
}

/// Answers 401 unless the bearer token is the current one.
struct TokenCheck {
    valid: &'static str,
}

impl Respond for TokenCheck {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let auth = req
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if auth == Some(&format!("Bearer {}", self.valid)) {
            ResponseTemplate::new(200).set_body_json(json!([]))
        } else {
            ResponseTemplate::new(401).set_body_json(json!({"message": "token expired"}))
        }
    }
}

fn login_answer(token: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "principal": "u", "project_id": "p", "project_name": "n", "token": token
    }))
}

#[tokio::test]
async fn login_token_is_used_and_refreshed_once_on_401() {
    let server = MockServer::start().await;
    // First login hands out a token the API will refuse; the second a good one.
    Mock::given(method("POST"))
        .and(path("/api/auth/login"))
        .and(body_json(json!({"api_key": KEY})))
        .respond_with(login_answer("stale"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api/auth/login"))
        .respond_with(login_answer("fresh"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/contexts"))
        .respond_with(TokenCheck { valid: "fresh" })
        .mount(&server)
        .await;
    let c = Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_key(KEY)
        .login(true)
        .build()
        .unwrap();
    c.contexts().list().await.unwrap();
    c.contexts().list().await.unwrap();
    let reqs = requests(&server).await;
    let seen: Vec<String> = reqs
        .iter()
        .map(|r| {
            let auth = r
                .headers
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_owned());
            format!("{} {} {}", r.method, r.url.path(), auth.unwrap_or_default())
        })
        .collect();
    assert_eq!(
        seen,
        [
            "POST /api/auth/login ",
            "GET /api/contexts Bearer stale",
            "POST /api/auth/login ",
            "GET /api/contexts Bearer fresh",
            "GET /api/contexts Bearer fresh",
        ]
    );
    assert!(
        reqs.iter()
            .skip(1)
            .all(|r| !r.headers.contains_key("x-pinecone-api-key")),
        "with login the key travels only to /auth/login"
    );
}

#[tokio::test]
async fn a_second_401_surfaces_unauthorized() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/auth/login"))
        .respond_with(login_answer("never-good"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({"message": "token expired"})))
        .mount(&server)
        .await;
    let c = Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_key(KEY)
        .login(true)
        .build()
        .unwrap();
    let err = c.contexts().list().await.unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    assert!(!format!("{err:?} {err}").contains(KEY));
    // login, GET (401), login again, GET (401): one re-login, no more.
    assert_eq!(requests(&server).await.len(), 4);
}

#[tokio::test]
async fn refused_login_is_unauthorized() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/auth/login"))
        .respond_with(
            ResponseTemplate::new(401).set_body_json(json!({"message": "invalid API key"})),
        )
        .mount(&server)
        .await;
    let c = Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_key(KEY)
        .login(true)
        .build()
        .unwrap();
    let err = c.contexts().list().await.unwrap_err();
    match err {
        Error::Unauthorized { message, .. } => assert_eq!(message, "invalid API key"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        requests(&server).await.len(),
        1,
        "no API call without a token"
    );
}

#[tokio::test]
async fn api_key_header_without_login() {
    let server = MockServer::start().await;
    Mock::given(header("x-pinecone-api-key", KEY))
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({"message": "bad key"})))
        .mount(&server)
        .await;
    let err = client(&server).contexts().list().await.unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }));
    assert_eq!(
        requests(&server).await.len(),
        1,
        "401 without login is final"
    );
}

#[tokio::test]
async fn error_envelope_is_decoded_with_request_id() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(
            ResponseTemplate::new(409)
                .insert_header("x-request-id", "req-7")
                .set_body_json(
                    json!({"message": "an import is in flight", "code": "busy", "extra": 1}),
                ),
        )
        .mount(&server)
        .await;
    let err = client(&server).contexts().get("docs").await.unwrap_err();
    let api = err.as_api().expect("an API error");
    assert_eq!(api.status, 409);
    assert_eq!(api.code.as_deref(), Some("busy"));
    assert_eq!(api.message, "an import is in flight");
    assert_eq!(api.request_id.as_deref(), Some("req-7"));
    assert_eq!(api.operation, "get_context");
    assert_eq!(api.raw_body, None);
    assert!(err.is_conflict());
    assert_eq!(
        err.to_string(),
        "get_context: server answered 409 (busy): an import is in flight"
    );
}

#[tokio::test]
async fn non_json_error_bodies_keep_status_and_text() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/contexts/docs"))
        .respond_with(ResponseTemplate::new(404).set_body_string("<html>not here</html>"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/contexts"))
        .respond_with(ResponseTemplate::new(500).set_body_string("upstream exploded"))
        .mount(&server)
        .await;
    let c = Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .retry(RetryPolicy::never())
        .build()
        .unwrap();
    // Declared error status with an HTML body.
    let err = c.contexts().get("docs").await.unwrap_err();
    let api = err.as_api().expect("api error");
    assert_eq!(
        (api.status, api.raw_body.as_deref()),
        (404, Some("<html>not here</html>"))
    );
    assert!(err.is_not_found());
    // Undeclared status with a text body.
    let err = c.contexts().list().await.unwrap_err();
    let api = err.as_api().expect("api error");
    assert_eq!(
        (api.status, api.message.as_str()),
        (500, "upstream exploded")
    );
    assert_eq!(api.raw_body.as_deref(), Some("upstream exploded"));
}

#[tokio::test]
async fn invalid_json_success_is_a_decode_error() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200).set_body_string("{\"slug\": truncated"))
        .mount(&server)
        .await;
    let err = client(&server).contexts().get("docs").await.unwrap_err();
    match err {
        Error::Decode(failure) => {
            assert_eq!(failure.operation, "get_context");
            assert!(failure.snippet.starts_with("{\"slug\""));
        }
        other => panic!("expected Decode, got {other:?}"),
    }
}

#[tokio::test]
async fn connection_failure_is_a_transport_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let c = Client::builder()
        .base_url(format!("http://127.0.0.1:{port}/api"))
        .retry(RetryPolicy::never())
        .build()
        .unwrap();
    let err = c.contexts().list().await.unwrap_err();
    assert!(
        matches!(err, Error::Transport { connect: true, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
}

#[tokio::test]
async fn slow_answers_hit_the_request_timeout() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([]))
                .set_delay(Duration::from_secs(3)),
        )
        .mount(&server)
        .await;
    let c = Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .request_timeout(Some(Duration::from_millis(200)))
        .retry(RetryPolicy::never())
        .build()
        .unwrap();
    let err = c.contexts().list().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                operation: "list_contexts",
                elapsed_ms: 200,
                query_id: None,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_retryable());
}

#[tokio::test]
async fn retry_policy_never_sends_one_request() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(503))
        .mount(&server)
        .await;
    let c = Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_key(KEY)
        .retry(RetryPolicy::never().initial_delay(Duration::from_millis(1)))
        .build()
        .unwrap();
    let err = c.contexts().list().await.unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    // Catches never() that keeps the default three retries.
    assert_eq!(requests(&server).await.len(), 1);
}

/// A server that answers every request with `head` then `body`, then closes.
async fn raw_answer(head: &'static str, body: &'static str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = vec![0u8; 4096];
            let _ = socket.read(&mut request).await;
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(body.as_bytes()).await;
        }
    });
    format!("http://127.0.0.1:{port}/api")
}

#[tokio::test]
async fn a_body_of_declared_length_is_bounded_and_a_cut_one_is_a_transport_error() {
    let build = |url: &str, limit: usize| {
        Client::builder()
            .base_url(url)
            .retry(RetryPolicy::never())
            .max_response_bytes(limit)
            .build()
            .unwrap()
    };
    // Whole and within the limit.
    let whole = raw_answer(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n",
        "[]",
    )
    .await;
    assert!(build(&whole, 2).contexts().list().await.unwrap().is_empty());
    // Declared over the limit: refused before it is read.
    match build(&whole, 1).contexts().list().await {
        Err(Error::ResponseTooLarge {
            operation, limit, ..
        }) => {
            assert_eq!((operation, limit), ("list_contexts", 1));
        }
        other => panic!("{other:?}"),
    }
    // Declared within the limit, cut short: the connection's fault.
    let cut = raw_answer(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 400\r\nconnection: close\r\n\r\n",
        "[{\"slug\":",
    )
    .await;
    let err = build(&cut, 1000).contexts().list().await.unwrap_err();
    assert!(
        matches!(err, Error::Transport { connect: false, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("list_contexts"), "{text}");
    assert!(!text.contains("decod"), "{text}");
}
