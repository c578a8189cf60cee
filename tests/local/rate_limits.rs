//! Rate limits tried offline: every answer carries an `x-request-id`, and
//! a simulated limit answers 429 with `Retry-After` and `x-ratelimit-*`,
//! which the SDK's error keeps.

use std::time::Duration;

use nexus_knowql::RetryPolicy;
use nexus_knowql::local::LocalNexus;

#[tokio::test]
async fn every_answer_carries_a_request_id() {
    let server = LocalNexus::start().await.unwrap();
    let client = server.client().unwrap();
    let (_, first) = client.contexts().list().with_metadata().await.unwrap();
    let (_, second) = client.contexts().list().with_metadata().await.unwrap();
    let (first, second) = (first.request_id().unwrap(), second.request_id().unwrap());
    assert!(first.starts_with("req_"), "{first}");
    assert_ne!(first, second);
    // An error answer carries one too.
    let missing = client.contexts().get("missing").await.unwrap_err();
    assert!(
        missing
            .request_id()
            .is_some_and(|id| id.starts_with("req_")),
        "{missing:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_simulated_rate_limit_answers_429_with_its_headers() {
    let server = LocalNexus::builder()
        .rate_limit(2, Duration::from_secs(3600))
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let (_, meta) = client.contexts().list().with_metadata().await.unwrap();
    assert_eq!(meta.rate_limit("limit-requests"), Some("2"));
    assert_eq!(meta.rate_limit("remaining-requests"), Some("1"));
    client.contexts().list().await.unwrap();
    let refused = client
        .with_options(nexus_knowql::CallOptions::default().retry(RetryPolicy::never()))
        .contexts()
        .list()
        .await
        .unwrap_err();
    assert!(refused.is_rate_limited(), "{refused:?}");
    assert_eq!(refused.code(), Some("rate_limited"));
    assert_eq!(refused.rate_limits().get("remaining-requests"), Some("0"));
    let retry_after = refused.retry_after().expect("a Retry-After");
    assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(3600));
    assert!(refused.request_id().is_some());
    server.shutdown().await;
}

#[test]
fn the_binary_offers_the_simulation_and_refuses_a_zero_limit() {
    let bin = env!("CARGO_BIN_EXE_nexus-local");
    let help = std::process::Command::new(bin)
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success(), "{help:?}");
    assert!(text.contains("--rate-limit <N[/SECS]>"), "{text}");
    assert!(text.contains("429"), "{text}");
    let zero = std::process::Command::new(bin)
        .args(["--bind", "127.0.0.1:0", "--rate-limit", "0/1"])
        .output()
        .unwrap();
    assert_eq!(zero.status.code(), Some(2), "{zero:?}");
}
