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

/// Sends `head` (a whole HTTP/1 request head) on a fresh connection to
/// `addr` and returns the status line of the answer.
async fn raw_status(addr: std::net::SocketAddr, head: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tcp.read_to_end(&mut answer),
    )
    .await;
    assert!(read.is_ok(), "the server answers and closes");
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Catches paths that skip the `Host` rule on some HTTP version: an HTTP/2
/// request names its host only in `:authority`, and an HTTP/1.0 request
/// may name none. Every path but `/healthz` is refused then, and served
/// names compare without one trailing dot.
#[tokio::test]
async fn the_host_rule_holds_on_every_path_and_http_version() {
    use http_body_util::Empty;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let nexus = fake_nexus(0).await;
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(KeyPolicy::Caller {
            fallback_to_configured: false,
        }),
    );
    let listener = http::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let options = HttpOptions::default();
    tokio::spawn(async move { http::serve(listener, server, &options, token).await });

    let io = TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
    let (mut h2, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(connection);
    let port = addr.port();
    for path in [http::MCP_PATH, http::METRICS_PATH, http::READY_PATH] {
        for (authority, expected) in [
            (format!("evil.example:{port}"), 403),
            (format!("localhost.:{port}"), 0),
        ] {
            let request = hyper::Request::get(format!("http://{authority}{path}"))
                .body(Empty::<bytes::Bytes>::new())
                .unwrap();
            let status = h2.send_request(request).await.unwrap().status().as_u16();
            if expected == 403 {
                assert_eq!(status, 403, "HTTP/2 {authority}{path}");
            } else {
                assert_ne!(status, 403, "HTTP/2 {authority}{path}");
            }
        }
        let nameless = raw_status(addr, &format!("GET {path} HTTP/1.0\r\n\r\n")).await;
        assert!(nameless.contains(" 403 "), "HTTP/1.0 {path}: {nameless}");
        let named = raw_status(
            addr,
            &format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
        )
        .await;
        assert!(!named.contains(" 403 "), "HTTP/1.0 {path}: {named}");
    }
    let health = raw_status(addr, &format!("GET {} HTTP/1.0\r\n\r\n", http::HEALTH_PATH)).await;
    assert!(health.contains(" 200 "), "{health}");
    shutdown.cancel();
}
