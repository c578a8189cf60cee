//! A proxy in front of the embedded Nexus that admits new sessions slowly:
//! `GET /sessions` leaves out every session created less than `delay` ago,
//! as a busy server whose listing lags its writes does. Everything else
//! passes through as it is, streams included.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::TryStreamExt;

#[derive(Clone)]
struct Upstream {
    base: String,
    http: reqwest::Client,
    delay: Duration,
}

/// Starts the proxy to `upstream` on a loopback port: its base URL.
pub(super) async fn start(upstream: &str, delay: Duration) -> String {
    let state = Upstream {
        base: upstream.trim_end_matches('/').to_owned(),
        http: reqwest::Client::new(),
        delay,
    };
    let app = axum::Router::new().fallback(forward).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// Hop-by-hop headers, and the length a rewritten body no longer has.
fn passes(name: &str) -> bool {
    !matches!(
        name,
        "host" | "connection" | "content-length" | "transfer-encoding" | "keep-alive"
    )
}

async fn forward(State(up): State<Upstream>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let body = axum::body::to_bytes(body, 1 << 24)
        .await
        .unwrap_or_default();
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if passes(name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    let sent = up
        .http
        .request(parts.method.clone(), format!("{}{path}", up.base))
        .headers(headers)
        .body(body)
        .send()
        .await;
    let resp = match sent {
        Ok(resp) => resp,
        Err(_) => {
            return Response::builder()
                .status(StatusCode::BAD_GATEWAY)
                .body(Body::empty())
                .unwrap();
        }
    };
    let mut out = Response::builder().status(resp.status());
    for (name, value) in resp.headers() {
        if passes(name.as_str()) {
            out = out.header(name, value);
        }
    }
    let listing = parts.method == axum::http::Method::GET && parts.uri.path() == "/sessions";
    if listing && resp.status().is_success() {
        let bytes = resp.bytes().await.unwrap_or_default();
        return out.body(Body::from(admitted(&bytes, up.delay))).unwrap();
    }
    out.body(Body::from_stream(
        resp.bytes_stream().map_err(std::io::Error::other),
    ))
    .unwrap()
}

/// The listing without the sessions created less than `delay` ago.
fn admitted(bytes: &[u8], delay: Duration) -> Vec<u8> {
    let Ok(mut list) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return bytes.to_vec();
    };
    let cutoff = chrono::Utc::now() - chrono::Duration::from_std(delay).unwrap();
    let young = |s: &serde_json::Value| {
        s.get("created_at")
            .and_then(|c| c.as_str())
            .and_then(|c| chrono::DateTime::parse_from_rfc3339(c).ok())
            .is_some_and(|c| c > cutoff)
    };
    let items = match &mut list {
        serde_json::Value::Array(items) => Some(items),
        serde_json::Value::Object(o) => o.get_mut("data").and_then(|d| d.as_array_mut()),
        _ => None,
    };
    if let Some(items) = items {
        items.retain(|s| !young(s));
    }
    serde_json::to_vec(&list).unwrap()
}
