//! Operations over HTTP: CORS for allowed origins (preflight, exposed
//! `Mcp-Session-Id`), `Host`/`Origin` refusals on every path (operator
//! endpoints included) counted by reason, and the per-method counter.
use crate::support::mcp::{fake_nexus, nexus_client};

use nexus_knowql::mcp::http::{self, HttpOptions};
use nexus_knowql::mcp::{KeyPolicy, NexusMcp, NexusServer};
use tokio_util::sync::CancellationToken;

const KEY: &str = "pcsk_operations_key_0123456789abcdef";
const APP: &str = "https://app.example";

fn init_body() -> &'static str {
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"ops","version":"0"}}}"#
}

#[tokio::test]
async fn cors_host_and_origin_checks_and_per_method_counts() {
    let nexus = fake_nexus(0).await;
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(KeyPolicy::Caller {
            fallback_to_configured: false,
        }),
    );
    let listener = http::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let url = format!("http://{addr}{}", http::MCP_PATH);
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let options = HttpOptions::default().allowed_origins([APP]);
    tokio::spawn(async move { http::serve(listener, server, &options, token).await });
    let client = reqwest::Client::new();

    // A preflight from an allowed origin needs no key.
    let preflight = client
        .request(reqwest::Method::OPTIONS, &url)
        .header("origin", APP)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type, x-pinecone-api-key, mcp-session-id",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(preflight.status(), 204);
    let h = preflight.headers();
    assert_eq!(h["access-control-allow-origin"], APP);
    let allowed = h["access-control-allow-headers"].to_str().unwrap();
    assert!(allowed.contains("mcp-session-id") && allowed.contains("x-pinecone-api-key"));

    // The real request: the session id is readable by the page.
    let answer = client
        .post(&url)
        .header("origin", APP)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("x-pinecone-api-key", KEY)
        .body(init_body())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let h = answer.headers();
    assert_eq!(h["access-control-allow-origin"], APP);
    let exposed = h["access-control-expose-headers"].to_str().unwrap();
    assert!(exposed.contains("mcp-session-id"), "{exposed}");
    assert!(h.contains_key("mcp-session-id"));

    // Another origin, another host: 403 on the MCP path and on the
    // operator endpoints alike.
    let foreign = client
        .post(&url)
        .header("origin", "https://evil.example")
        .header("content-type", "application/json")
        .header("x-pinecone-api-key", KEY)
        .body(init_body())
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status(), 403);
    for path in [http::MCP_PATH, http::METRICS_PATH, http::READY_PATH] {
        let rebound = client
            .get(format!("http://{addr}{path}"))
            .header("host", "evil.example")
            .send()
            .await
            .unwrap();
        assert_eq!(rebound.status(), 403, "{path}");
    }
    let metrics = client
        .get(format!("http://{addr}{}", http::METRICS_PATH))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let refused = metrics
        .lines()
        .find(|l| l.contains("reason=\"host_origin\"") && !l.starts_with('#'))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(refused.trim_end().ends_with(" 4"), "{refused}");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("nexus_mcp_rpc_requests_total{method=\"initialize\"} ")),
        "{metrics}"
    );
    assert!(metrics.contains("nexus_mcp_open_sessions 1"), "{metrics}");
    shutdown.cancel();
}
