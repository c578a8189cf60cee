//! Uploads get the same re-login and connection retries as every other call
//! (the multipart body is rebuilt for each attempt), and a server's
//! `Retry-After`, however large, is clamped to the policy instead of
//! overflowing.

use std::time::Duration;

use nexus_knowql::{Client, RetryPolicy};
use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

const KEY: &str = "pcsk_upload_secret_0123456789";
const CONTENT: &str = "# Travel policy\nEvery trip above 5000 EUR needs approval.\n";

fn trigger() -> serde_json::Value {
    json!({"task_id": "task_1", "state": "scheduled", "importing": true})
}

fn login_ok(token: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "token": token, "principal": "me", "project_id": "p", "project_name": "P"
    }))
}

fn fast() -> RetryPolicy {
    RetryPolicy::default()
        .initial_delay(Duration::from_millis(20))
        .max_delay(Duration::from_millis(50))
        .max_retries(5)
}

async fn uploads(server: &MockServer) -> Vec<Request> {
    server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.url.path() == "/api/contexts/docs/import/upload")
        .collect()
}

fn carries_whole_file(r: &Request) -> bool {
    let body = String::from_utf8_lossy(&r.body);
    body.contains(CONTENT) && body.contains("filename=\"policy.md\"")
}

async fn login_server() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/auth/login"))
        .respond_with(login_ok("tok_first"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api/auth/login"))
        .respond_with(login_ok("tok_second"))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api/contexts/docs/import/upload"))
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({"message": "token expired"})))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api/contexts/docs/import/upload"))
        .respond_with(ResponseTemplate::new(200).set_body_json(trigger()))
        .mount(&server)
        .await;
    server
}

fn login_client(server: &MockServer) -> Client {
    Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_key(KEY)
        .login(true)
        .retry(fast())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_file_upload_logs_in_again_when_its_token_is_refused() {
    let server = login_server().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.md");
    std::fs::write(&file, CONTENT).unwrap();

    let started = login_client(&server)
        .sources("docs")
        .upload_file(&file, Some("uploads/policies"))
        .await
        .unwrap();
    assert_eq!(started.task_id, "task_1");

    let sent = uploads(&server).await;
    assert_eq!(sent.len(), 2, "the refused upload was sent once more");
    assert_eq!(sent[0].headers["authorization"], "Bearer tok_first");
    assert_eq!(sent[1].headers["authorization"], "Bearer tok_second");
    for r in &sent {
        assert!(
            carries_whole_file(r),
            "{}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.url.query(), Some("path=uploads%2Fpolicies"));
    }
    let logins = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.url.path() == "/api/auth/login")
        .count();
    assert_eq!(logins, 2);
}

#[tokio::test]
async fn a_bytes_upload_logs_in_again_when_its_token_is_refused() {
    let server = login_server().await;
    login_client(&server)
        .sources("docs")
        .upload_bytes("policy.md", CONTENT, None)
        .await
        .unwrap();
    let sent = uploads(&server).await;
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(carries_whole_file));
}

#[tokio::test]
async fn a_refused_token_twice_is_unauthorized_not_a_loop() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/auth/login"))
        .respond_with(login_ok("tok"))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api/contexts/docs/import/upload"))
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({"message": "no"})))
        .mount(&server)
        .await;
    let err = login_client(&server)
        .sources("docs")
        .upload_bytes("policy.md", CONTENT, None)
        .await
        .unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(401), "{err:?}");
    assert_eq!(
        uploads(&server).await.len(),
        2,
        "one re-login, then give up"
    );
}

#[tokio::test]
async fn a_file_upload_is_sent_again_after_a_connection_failure() {
    // A port with no listener yet: the first connection is refused.
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.md");
    std::fs::write(&file, CONTENT).unwrap();
    let client = Client::builder()
        .base_url(format!("http://127.0.0.1:{port}/api"))
        .api_key(KEY)
        .retry(
            RetryPolicy::default()
                .initial_delay(Duration::from_millis(400))
                .max_delay(Duration::from_millis(400))
                .jitter(0.0)
                .max_retries(3),
        )
        .build()
        .unwrap();
    let (_logs, mut retries) = crate::support::wait::retry_signal();
    let upload = tokio::spawn(async move {
        client
            .sources("docs")
            .upload_file(&file, None)
            .await
            .map(|t| t.task_id)
    });
    let refused = retries.wait_for(|n| *n >= 1);
    let what = "the first attempt is refused";
    crate::support::wait::within(crate::support::wait::PATIENCE, what, refused)
        .await
        .unwrap();
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let server = MockServer::builder().listener(listener).start().await;
    Mock::given(method("POST"))
        .and(path("/api/contexts/docs/import/upload"))
        .respond_with(ResponseTemplate::new(200).set_body_json(trigger()))
        .mount(&server)
        .await;
    assert_eq!(upload.await.unwrap().unwrap(), "task_1");
    let sent = uploads(&server).await;
    assert_eq!(sent.len(), 1);
    assert!(carries_whole_file(&sent[0]));
    assert_eq!(sent[0].headers["x-pinecone-api-key"], KEY);
    drop(dir);
}

#[tokio::test]
async fn huge_retry_after_values_are_clamped_not_overflowed() {
    for value in [
        "18446744073709551615",
        "184467440737095516150000",
        "Fri, 31 Dec 9999 23:59:59 GMT",
    ] {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/api/contexts"))
            .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", value))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/api/contexts"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
            .mount(&server)
            .await;
        let client = Client::builder()
            .base_url(format!("{}/api", server.uri()))
            .retry(fast())
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        client.contexts().list().await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{value}: waited {:?}",
            started.elapsed()
        );
        assert_eq!(server.received_requests().await.unwrap().len(), 2);
    }
}

/// Reproduction: an upload refused as busy (503 with `Retry-After`: shed
/// before anything changed, as a server answers concurrent uploads it
/// cannot stage yet) was returned as an error instead of being sent again;
/// a 503 without `Retry-After` (its outcome unknown) still is not retried.
#[tokio::test]
async fn an_upload_refused_as_busy_is_sent_again_after_its_wait() {
    let server = MockServer::start().await;
    let busy = json!({"message": "other uploads are being staged", "code": "busy"});
    Mock::given(method("POST"))
        .and(path("/api/contexts/docs/import/upload"))
        .respond_with(
            ResponseTemplate::new(503)
                .insert_header("Retry-After", "0")
                .set_body_json(&busy),
        )
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api/contexts/docs/import/upload"))
        .respond_with(ResponseTemplate::new(503).set_body_json(&busy))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api/contexts/docs/import/upload"))
        .respond_with(ResponseTemplate::new(200).set_body_json(trigger()))
        .mount(&server)
        .await;
    let client = Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .api_key(KEY)
        .retry(fast())
        .build()
        .unwrap();
    let docs = client.sources("docs");
    // Two busy answers, then one without a wait: an error after 3 sends.
    let err = docs
        .upload_bytes("policy.md", CONTENT, None)
        .await
        .unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503), "{err:?}");
    let sent = uploads(&server).await;
    assert_eq!(sent.len(), 3);
    assert!(sent.iter().all(carries_whole_file));
    // The next one goes through at once.
    let started = docs.upload_bytes("policy.md", CONTENT, None).await.unwrap();
    assert_eq!(started.task_id, "task_1");
    assert_eq!(uploads(&server).await.len(), 4);
}
