//! Credentials go only to the configured origin: a redirect to another
//! scheme, host or port is refused before anything is sent there, for every
//! kind of request the client makes. A second listener records what reaches it.

use std::time::Duration;

use crate::support::sse_server;
use futures::StreamExt;
use nexus_knowql::{Client, Error, RetryPolicy, StreamConfig};
use serde_json::json;
use sse_server::{Reply, SseServer, Step, Turn};
use wiremock::matchers::{any, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const KEY: &str = "pcsk_redirect_secret_0123456789";

fn context_json(slug: &str) -> serde_json::Value {
    json!({
        "id": "6f1c2f7e-0000-4000-8000-000000000001", "slug": slug, "name": "Docs", "kind": "search",
        "created_by": "user-1", "description": "", "is_optimizing": false, "has_sources": true,
        "is_curating": false, "is_importing": false, "is_exploring": false, "is_restoring": false,
        "is_grooming": false, "created_at": "2026-07-01T10:00:00Z", "updated_at": "2026-07-02T10:00:00Z"
    })
}

fn builder(server: &MockServer) -> nexus_knowql::ClientBuilder {
    Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_key(KEY)
        .retry(RetryPolicy::never())
}

/// A listener that answers everything with 200 and records what it got.
async fn recorder() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&server)
        .await;
    server
}

/// `server` answers every request with `status` and `Location: location`.
async fn redirect_all(server: &MockServer, status: u16, location: &str) {
    Mock::given(any())
        .respond_with(ResponseTemplate::new(status).insert_header("Location", location))
        .mount(server)
        .await;
}

fn other_port_of(server: &MockServer) -> u16 {
    server.address().port()
}

fn assert_refused(err: &Error, target: &str) {
    match err {
        Error::Redirect { location, .. } => {
            assert!(location.starts_with(target), "{location} vs {target}");
        }
        other => panic!("expected a refused redirect, got {other:?}"),
    }
    let text = err.to_string();
    assert!(!text.contains(KEY), "{text}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn a_redirect_to_another_port_is_refused_and_no_key_reaches_it() {
    let origin = MockServer::start().await;
    let other = recorder().await;
    for status in [301, 302, 303, 307, 308] {
        origin.reset().await;
        let target = format!("http://127.0.0.1:{}/api/contexts", other_port_of(&other));
        redirect_all(&origin, status, &format!("{target}?api_key=pcsk_in_query")).await;
        let err = builder(&origin)
            .build()
            .unwrap()
            .contexts()
            .list()
            .await
            .unwrap_err();
        assert_refused(&err, &target);
        assert!(!err.to_string().contains("pcsk_in_query"), "{err}");
    }
    assert!(other.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_redirect_to_another_host_name_on_the_same_port_is_refused() {
    // `localhost` and `127.0.0.1` are different origins even on one port:
    // the listener must see the original request only.
    let origin = MockServer::start().await;
    let port = origin.address().port();
    let target = format!("http://localhost:{port}/api/elsewhere");
    redirect_all(&origin, 307, &target).await;
    let err = builder(&origin)
        .build()
        .unwrap()
        .contexts()
        .get("docs")
        .await
        .unwrap_err();
    assert_refused(&err, &target);
    let got = origin.received_requests().await.unwrap();
    assert_eq!(got.len(), 1, "the redirect was not followed");
    assert_eq!(got[0].url.path(), "/api/contexts/docs");
}

#[tokio::test]
async fn a_redirect_from_localhost_to_the_loopback_address_is_refused() {
    let other = recorder().await;
    let origin = MockServer::start().await;
    let target = format!("http://127.0.0.1:{}/api/contexts", other.address().port());
    redirect_all(&origin, 308, &target).await;
    let client = Client::builder()
        .base_url(format!("http://localhost:{}/api", origin.address().port()))
        .api_key(KEY)
        .retry(RetryPolicy::never())
        .build()
        .unwrap();
    let err = client.contexts().list().await.unwrap_err();
    assert_refused(&err, &target);
    assert!(other.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_same_origin_redirect_is_followed_with_the_key() {
    let origin = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/contexts"))
        .respond_with(ResponseTemplate::new(307).insert_header("Location", "/api/v2/contexts"))
        .mount(&origin)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/v2/contexts"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([context_json("docs")])))
        .mount(&origin)
        .await;
    let contexts = builder(&origin)
        .build()
        .unwrap()
        .contexts()
        .list()
        .await
        .unwrap();
    assert_eq!(contexts[0].slug, "docs");
    let got = origin.received_requests().await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].url.path(), "/api/v2/contexts");
    assert_eq!(got[1].headers["x-pinecone-api-key"], KEY);
}

#[tokio::test]
async fn a_redirect_loop_ends_with_an_error() {
    let origin = MockServer::start().await;
    redirect_all(&origin, 307, "/api/contexts").await;
    let err = builder(&origin)
        .build()
        .unwrap()
        .contexts()
        .list()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Redirect { .. }), "{err:?}");
    let sent = origin.received_requests().await.unwrap().len();
    assert_eq!(sent, nexus_knowql::client::MAX_REDIRECTS + 1);
}

#[tokio::test]
async fn login_streamed_turns_and_uploads_are_covered() {
    let origin = MockServer::start().await;
    let other = recorder().await;
    let target = format!("http://127.0.0.1:{}/api/x", other.address().port());
    redirect_all(&origin, 307, &target).await;

    // The key travels in the login body.
    let login = builder(&origin).login(true).build().unwrap();
    let err = login.contexts().list().await.unwrap_err();
    assert_refused(&err, &target);

    let client = builder(&origin).build().unwrap();
    let session = client.session(["docs"]).build().unwrap();
    let err = session.ask("q").stream().await.unwrap_err();
    assert_refused(&err, &target);
    let err = session.ask("q").send().await.unwrap_err();
    assert_refused(&err, &target);

    let err = client
        .sources("docs")
        .upload_bytes("a.md", "hello", None)
        .await
        .unwrap_err();
    assert_refused(&err, &target);
    assert!(other.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_custom_client_with_the_crate_policy_refuses_too() {
    let origin = MockServer::start().await;
    let other = recorder().await;
    let target = format!("http://127.0.0.1:{}/api/contexts", other.address().port());
    redirect_all(&origin, 307, &target).await;
    let http = reqwest::Client::builder()
        .redirect(nexus_knowql::client::redirect_policy())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let err = builder(&origin)
        .http_client(http)
        .build()
        .unwrap()
        .contexts()
        .list()
        .await
        .unwrap_err();
    assert_refused(&err, &target);
    assert!(other.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_answer_a_custom_client_fetched_from_another_origin_is_never_used() {
    // reqwest's own policy follows the redirect (and keeps custom headers);
    // the crate cannot stop that, but it never hands on the foreign answer.
    let origin = MockServer::start().await;
    let other = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([context_json("evil")])))
        .mount(&other)
        .await;
    let target = format!("http://127.0.0.1:{}/api/contexts", other.address().port());
    redirect_all(&origin, 302, &target).await;
    let err = builder(&origin)
        .http_client(reqwest::Client::new())
        .build()
        .unwrap()
        .contexts()
        .list()
        .await
        .unwrap_err();
    assert_refused(&err, &target);
    assert!(err.to_string().contains("redirect_policy"), "{err}");
}

#[tokio::test]
async fn a_custom_client_keeps_the_crate_headers_and_the_user_agent_set_here() {
    let origin = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&origin)
        .await;
    let http = reqwest::Client::builder()
        .redirect(nexus_knowql::client::redirect_policy())
        .build()
        .unwrap();
    builder(&origin)
        .http_client(http)
        .user_agent("my-app/1.0")
        .build()
        .unwrap()
        .contexts()
        .list()
        .await
        .unwrap();
    let got = origin.received_requests().await.unwrap();
    assert_eq!(got[0].headers["user-agent"], "my-app/1.0");
    assert_eq!(got[0].headers["x-pinecone-api-key"], KEY);
    assert_eq!(got[0].headers["x-pinecone-api-version"], "2026-07");
}

#[tokio::test]
async fn an_event_resume_redirected_to_another_origin_is_refused() {
    let other = recorder().await;
    let target = format!(
        "http://127.0.0.1:{}/queries/q_r/events",
        other.address().port()
    );
    let turn = Turn::completed("q_r", "sess_r", &["Hello ", "there ", "world"]);
    let script_turn = turn.clone();
    let location = format!("Location: {target}");
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            // Two events, then the connection ends: the client resumes.
            Reply::sse(vec![Step::Write(script_turn.first(2).into_bytes())])
        } else {
            Reply::json(307, &[location.as_str()], &json!({"message": "moved"}))
        }
    })
    .await;
    let mut live = server
        .client()
        .session(["docs"])
        .build()
        .unwrap()
        .ask("q")
        .stream_config(
            StreamConfig::default()
                .reconnect_delay(Duration::from_millis(5), Duration::from_millis(50)),
        )
        .stream()
        .await
        .unwrap();
    let mut error = None;
    while let Some(item) = tokio::time::timeout(Duration::from_secs(20), live.next())
        .await
        .expect("the turn ends")
    {
        if let Err(e) = item {
            error.get_or_insert(e);
        }
    }
    let error = error.expect("the refused resume is reported");
    assert!(matches!(error, Error::Redirect { .. }), "{error:?}");
    assert!(
        server.count("GET", &turn.events_path()) >= 1,
        "the client did resume"
    );
    assert!(other.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_upload_follows_a_same_origin_redirect_with_its_body_rebuilt() {
    let origin = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/contexts/docs/import/upload"))
        .respond_with(
            ResponseTemplate::new(307)
                .insert_header("Location", "/api/v2/contexts/docs/import/upload"),
        )
        .mount(&origin)
        .await;
    Mock::given(method("POST"))
        .and(path("/api/v2/contexts/docs/import/upload"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"task_id": "task_9", "state": "scheduled"})),
        )
        .mount(&origin)
        .await;
    let started = builder(&origin)
        .build()
        .unwrap()
        .sources("docs")
        .upload_bytes("a.md", "hello upload", None)
        .await
        .unwrap();
    assert_eq!(started.task_id, "task_9");
    let got = origin.received_requests().await.unwrap();
    assert_eq!(got.len(), 2);
    assert!(String::from_utf8_lossy(&got[1].body).contains("hello upload"));
    assert_eq!(got[1].headers["x-pinecone-api-key"], KEY);
}
