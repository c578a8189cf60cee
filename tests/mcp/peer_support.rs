//! Peers and upstreams shared by the hostile-peer, hostile-caller and
//! stateless-path tests: an HTTP/2 peer that never reads its answers, a
//! Nexus whose turns can be cancelled, and stateless posts with an allowed
//! `Origin` or without.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::mcp::{context_json, query_json};
use crate::support::wait::holds_within_async;

/// An HTTP/2 connection from `ip` that grants no stream window: it sends
/// one POST per body (with `headers`) and keeps every answer unread. Its
/// connection task keeps running (answering the server's pings) until the
/// returned handle is aborted or the server cuts it. Returns the statuses
/// of the answers' heads, the unread answers and the connection task.
pub(crate) async fn unread_h2(
    addr: SocketAddr,
    ip: [u8; 4],
    headers: &[(&str, String)],
    bodies: Vec<String>,
) -> (
    Vec<u16>,
    Vec<hyper::Response<hyper::body::Incoming>>,
    tokio::task::JoinHandle<()>,
) {
    try_unread_h2(addr, ip, headers, bodies)
        .await
        .expect("the server takes the connection and answers every request")
}

/// [`unread_h2`] for a peer the server may turn away: `Err` naming what
/// failed when the connection is refused or closed before every request
/// has its answer's head.
pub(crate) async fn try_unread_h2(
    addr: SocketAddr,
    ip: [u8; 4],
    headers: &[(&str, String)],
    bodies: Vec<String>,
) -> Result<
    (
        Vec<u16>,
        Vec<hyper::Response<hyper::body::Incoming>>,
        tokio::task::JoinHandle<()>,
    ),
    String,
> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::from((ip, 0)))
        .expect("bind a loopback address");
    let tcp = socket.connect(addr).await.map_err(|e| e.to_string())?;
    let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .adaptive_window(false)
        .handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    // The connection task holds a sender: a peer that keeps its
    // connection open (a dropped sender would let it go away).
    let keep = sender.clone();
    let task = tokio::spawn(async move {
        let _keep = keep;
        let _ = connection.await;
    });
    let sends = bodies.into_iter().map(|body| {
        let mut sender = sender.clone();
        let mut request = hyper::Request::post(format!("http://127.0.0.1:{}/mcp", addr.port()))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (name, value) in headers {
            request = request.header(*name, value.as_str());
        }
        let request = request.body(Full::new(Bytes::from(body))).unwrap();
        async move {
            match tokio::time::timeout(Duration::from_secs(10), sender.send_request(request)).await
            {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("no answer's head within 10 s".to_owned()),
            }
        }
    });
    let answers = futures::future::join_all(sends)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>();
    let answers = match answers {
        Ok(answers) => answers,
        Err(e) => {
            task.abort();
            return Err(e);
        }
    };
    let statuses = answers.iter().map(|a| a.status().as_u16()).collect();
    Ok((statuses, answers, task))
}

/// `list_contexts` as a JSON-RPC request with `id`.
pub(crate) fn list_contexts(id: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "list_contexts", "arguments": {}}})
    .to_string()
}

/// A Nexus whose `POST /query` takes `query_delay` to answer (so a call can
/// end while it is in flight) and which records `POST /queries/q_1/cancel`.
pub(crate) async fn turn_nexus(query_delay: Duration) -> MockServer {
    let nexus = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .mount(&nexus)
        .await;
    Mock::given(method("GET"))
        .and(path("/contexts/docs"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(context_json("docs", "search", true, false)),
        )
        .mount(&nexus)
        .await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(
            ResponseTemplate::new(202)
                .set_body_json(query_json("q_1", "in_progress", &[], None))
                .set_delay(query_delay),
        )
        .mount(&nexus)
        .await;
    Mock::given(method("POST"))
        .and(path("/queries/q_1/cancel"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query_json(
            "q_1",
            "cancelled",
            &[],
            None,
        )))
        .mount(&nexus)
        .await;
    nexus
}

/// Whether Nexus sees a request to `wanted` (method and path) by `within`.
pub(crate) async fn seen_within(
    nexus: &MockServer,
    wanted: (&str, &str),
    within: Duration,
) -> bool {
    // A `MockServer` signals nothing: its record is looked at (see
    // `signalled_turn_nexus` for a Nexus that signals turns).
    holds_within_async(within, async || {
        let requests = nexus.received_requests().await.unwrap_or_default();
        requests
            .iter()
            .any(|r| r.method.as_str() == wanted.0 && r.url.path() == wanted.1)
    })
    .await
}

/// Posts `message` with `key` on a connection of its own; the status and
/// the body.
pub(crate) async fn post(
    url: &str,
    key: &str,
    origin: Option<&str>,
    message: &Value,
) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .header("x-pinecone-api-key", key)
        .body(message.to_string());
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

pub(crate) fn query_context(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "query_context", "arguments": {"context": "docs", "question": "Why?"}}})
}

pub(crate) fn cancelled(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
           "params": {"requestId": id, "reason": "no longer needed"}})
}

/// What the scripted Nexus of [`signalled_turn_nexus`] has seen: how many
/// turns were started and how many cancelled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TurnsSeen {
    pub(crate) started: usize,
    pub(crate) cancelled: usize,
}

/// A responder that counts what it answers on a watch channel.
struct Counting {
    seen: tokio::sync::watch::Sender<TurnsSeen>,
    count: fn(&mut TurnsSeen),
    answer: ResponseTemplate,
}

impl wiremock::Respond for Counting {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        self.seen.send_modify(self.count);
        self.answer.clone()
    }
}

/// [`turn_nexus`] whose turn starts (answered after `query_delay`) and
/// cancels are signalled as they arrive.
pub(crate) async fn signalled_turn_nexus(
    query_delay: Duration,
) -> (MockServer, tokio::sync::watch::Receiver<TurnsSeen>) {
    let nexus = turn_nexus(query_delay).await;
    let (seen, signal) = tokio::sync::watch::channel(TurnsSeen::default());
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(Counting {
            seen: seen.clone(),
            count: |s| s.started += 1,
            answer: ResponseTemplate::new(202)
                .set_body_json(query_json("q_1", "in_progress", &[], None))
                .set_delay(query_delay),
        })
        .with_priority(1)
        .mount(&nexus)
        .await;
    Mock::given(method("POST"))
        .and(path("/queries/q_1/cancel"))
        .respond_with(Counting {
            seen,
            count: |s| s.cancelled += 1,
            answer: ResponseTemplate::new(200).set_body_json(query_json(
                "q_1",
                "cancelled",
                &[],
                None,
            )),
        })
        .with_priority(1)
        .mount(&nexus)
        .await;
    (nexus, signal)
}
