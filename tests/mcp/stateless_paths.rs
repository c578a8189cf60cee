//! `--stateless` calls mean the same with or without an allowed `Origin`
//! (a CORS request): both cancel the Nexus turn they started when the call
//! ends by its deadline, by its client going away, or by a
//! `notifications/cancelled` from the same caller on another connection;
//! and a streamed answer counts in its caller's budget until its last byte
//! and gets the shutdown grace. Every test runs the `nexus-mcp` binary.

use std::time::Duration;

use crate::operations::{Process, nexus_mcp};
use crate::peer_support::{cancelled, post, query_context, seen_within, turn_nexus};
use crate::support::mcp::fake_nexus;
use crate::support::wait::until;
use serde_json::json;

const KEY: &str = "pcsk_stateless_paths_key_0123456789abcd";
const OTHER_KEY: &str = "pcsk_stateless_other_key_0123456789abc";

/// An allowed `Origin` (`with_origin`), or none.
fn origin(process: &Process, with_origin: bool) -> Option<String> {
    let port = process.base.rsplit(':').next().unwrap_or_default();
    with_origin.then(|| format!("http://localhost:{port}"))
}

#[tokio::test]
async fn a_cancelled_query_context_cancels_its_turn_with_or_without_an_origin() {
    for with_origin in [false, true] {
        let nexus = turn_nexus(Duration::from_millis(1500)).await;
        let process = nexus_mcp(&nexus.uri(), &["--stateless"]).await;
        let url = format!("{}/mcp", process.base);
        let origin = origin(&process, with_origin);
        let name = &origin;
        let call = {
            let (url, origin) = (url.clone(), origin.clone());
            tokio::spawn(async move { post(&url, KEY, origin.as_deref(), &query_context(7)).await })
        };
        assert!(
            seen_within(&nexus, ("POST", "/query"), Duration::from_secs(10)).await,
            "{name:?}: the turn is sent"
        );
        // Another key's cancellation names the same id: nothing happens to
        // this call. The caller's own, on another connection (as HTTP/1.1
        // clients send it), stops it.
        let (status, _) = post(&url, OTHER_KEY, origin.as_deref(), &cancelled(7)).await;
        assert!(status < 300, "{name:?}: {status}");
        let (status, _) = post(&url, KEY, origin.as_deref(), &cancelled(7)).await;
        assert!(status < 300, "{name:?}: {status}");
        let (status, body) = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("the cancelled call ends")
            .unwrap();
        assert_eq!(status, 200, "{name:?}: {body}");
        assert!(body.contains("-32800"), "{name:?}: {body}");
        assert!(
            seen_within(
                &nexus,
                ("POST", "/queries/q_1/cancel"),
                Duration::from_secs(5)
            )
            .await,
            "{name:?}: the turn is cancelled upstream"
        );
    }
}

#[tokio::test]
async fn a_query_context_whose_client_goes_away_cancels_its_turn_with_or_without_an_origin() {
    for with_origin in [false, true] {
        let nexus = turn_nexus(Duration::from_millis(1500)).await;
        let process = nexus_mcp(&nexus.uri(), &["--stateless"]).await;
        let url = format!("{}/mcp", process.base);
        let origin = origin(&process, with_origin);
        let call = {
            let (url, origin) = (url.clone(), origin.clone());
            tokio::spawn(async move { post(&url, KEY, origin.as_deref(), &query_context(8)).await })
        };
        assert!(seen_within(&nexus, ("POST", "/query"), Duration::from_secs(10)).await);
        // The client gives up: its connection closes.
        call.abort();
        assert!(
            seen_within(
                &nexus,
                ("POST", "/queries/q_1/cancel"),
                Duration::from_secs(5)
            )
            .await,
            "origin {origin:?}: the turn is cancelled upstream"
        );
    }
}

#[tokio::test]
async fn a_query_context_past_its_deadline_cancels_its_turn_with_or_without_an_origin() {
    for with_origin in [false, true] {
        // The turn is sent, and the request deadline passes before Nexus
        // answers it.
        let nexus = turn_nexus(Duration::from_millis(2500)).await;
        let process = nexus_mcp(&nexus.uri(), &["--stateless", "--request-timeout", "1"]).await;
        let url = format!("{}/mcp", process.base);
        let origin = origin(&process, with_origin);
        // Prove the key first: the deadline is for the call.
        let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
        post(&url, KEY, origin.as_deref(), &ping).await;
        let (status, body) = post(&url, KEY, origin.as_deref(), &query_context(9)).await;
        assert_eq!(status, 408, "origin {origin:?}: {body}");
        assert!(
            seen_within(
                &nexus,
                ("POST", "/queries/q_1/cancel"),
                Duration::from_secs(5)
            )
            .await,
            "origin {origin:?}: the turn is cancelled upstream"
        );
    }
}

/// Opens `get_query` waits with a progress token (answered as event
/// streams) until one is refused; the statuses.
async fn open_waits(url: &str, wanted: usize) -> (Vec<u16>, Vec<reqwest::Response>) {
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    let mut open = Vec::new();
    for id in 1..=wanted as u64 {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "get_query", "arguments": {"query_id": "q_1", "wait_seconds": 40},
                       "_meta": {"progressToken": id}}});
        let response = http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .header("x-pinecone-api-key", KEY)
            .body(message.to_string())
            .send()
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
        if response.status() == 200 {
            open.push(response);
        }
    }
    (statuses, open)
}

#[tokio::test]
async fn stateless_streamed_answers_count_in_the_callers_budget() {
    let nexus = fake_nexus(10_000).await;
    let process = nexus_mcp(
        &nexus.uri(),
        &["--stateless", "--max-requests-per-caller", "2"],
    )
    .await;
    let url = format!("{}/mcp", process.base);
    // Each wait's head arrives with its first progress note, while it goes
    // on streaming: the third is over the caller's two.
    let (statuses, open) = open_waits(&url, 4).await;
    assert_eq!(statuses, [200, 200, 429, 429], "{}", process.log());
    // A stream closed gives its slot back.
    drop(open);
    until(Duration::from_secs(10), "the slots come back", async || {
        open_waits(&url, 1).await.0 == [200]
    })
    .await;
}

#[tokio::test]
async fn sigterm_gives_stateless_streams_the_shutdown_grace() {
    // The turn completes after a few polls (a few seconds).
    let nexus = fake_nexus(4).await;
    let process = nexus_mcp(&nexus.uri(), &["--stateless", "--shutdown-grace", "30"]).await;
    let url = format!("{}/mcp", process.base);
    let (statuses, mut open) = open_waits(&url, 1).await;
    assert_eq!(statuses, [200]);
    let pid = process.child.id().expect("running").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    // The stream runs on to its result.
    let body = tokio::time::timeout(Duration::from_secs(30), open.remove(0).text())
        .await
        .expect("the stream ends")
        .unwrap_or_default();
    assert!(
        body.contains("Install it with cargo."),
        "{body}\n{}",
        process.log()
    );
}
