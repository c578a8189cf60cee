//! A plain stateless `tools/call` answered in place.
//!
//! Without sessions, rmcp's Streamable HTTP service decodes each message
//! again (trying each request kind in turn), then builds a service, its
//! channels and its tasks for that one request. A `tools/call` that needs
//! none of what that machinery is for is handed to the server's request
//! handler here, on the request's own task, and its answer written as rmcp
//! writes it: one JSON body, or, when the call sent log notes first, an
//! event stream of the notes and then the answer.
//!
//! A call is plain when rmcp's path would accept it without a check of
//! its own failing and without any per-request negotiation: `POST` with a
//! JSON `Content-Type`, an `Accept` naming both JSON and event streams, a
//! `Host` and no `Origin`, an `MCP-Protocol-Version` that is absent or a
//! known revision before per-request metadata and standard headers, and a
//! `params` object without `_meta` (so no progress token, task or level).
//! Anything else goes to rmcp as it is; the bytes of every answer are the
//! same either way.

use std::sync::Mutex;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use rmcp::model::{
    CallToolRequest, CallToolRequestMethod, CallToolRequestParams, ClientCapabilities,
    ClientJsonRpcMessage, ClientRequest, Extensions, GetExtensions, GetMeta, Implementation,
    InitializeRequestParams, JsonRpcVersion2_0, ProtocolVersion, RequestId as RpcId,
    RequestMetaObject, ServerJsonRpcMessage,
};
use rmcp::service::{RequestContext, RunningService, Service, serve_directly};
use rmcp::transport::Transport;
use rmcp::transport::common::http_header::HEADER_MCP_PROTOCOL_VERSION;
use rmcp::{Peer, RoleServer};
use tokio_util::sync::CancellationToken;

use super::cors::HostOrigin;
use crate::mcp::logging::NotesKept;
use crate::mcp::server::NexusMcp;

/// Answers plain stateless tool calls (see the module docs).
pub(super) struct Direct {
    server: NexusMcp,
    /// The hosts served (and origins, not used here).
    host_origin: HostOrigin,
    /// One idle service per protocol revision: its peer stands in each
    /// call's context for the client (rmcp makes peers only for services).
    peers: Mutex<Vec<Revision>>,
    /// Cancelled when sessions end at shutdown.
    shutdown: CancellationToken,
}

struct Revision {
    version: ProtocolVersion,
    peer: Peer<RoleServer>,
    /// Kept for its peer; ends at shutdown.
    _service: RunningService<RoleServer, NexusMcp>,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direct").finish_non_exhaustive()
    }
}

/// A call found plain, decoded.
pub(super) struct PlainCall {
    id: RpcId,
    params: CallToolRequestParams,
    version: ProtocolVersion,
}

/// The message as decoded here: no method-by-method attempt, since the
/// guard has read its method already.
#[derive(serde::Deserialize)]
struct Message {
    #[allow(dead_code)] // checked by decoding
    jsonrpc: JsonRpcVersion2_0,
    id: RpcId,
    #[allow(dead_code)] // checked by decoding
    method: CallToolRequestMethod,
    params: CallToolRequestParams,
}

impl Direct {
    pub(super) fn new(
        server: NexusMcp,
        host_origin: HostOrigin,
        shutdown: CancellationToken,
    ) -> Self {
        Direct {
            server,
            host_origin,
            peers: Mutex::new(Vec::new()),
            shutdown,
        }
    }

    /// `body` decoded when the request it came with is a plain call.
    pub(super) fn plain(&self, headers: &HeaderMap, body: &[u8]) -> Option<PlainCall> {
        if headers.contains_key(header::ORIGIN)
            || !self.host_origin.authority_served(headers)
            || !json_content(headers)
            || !accepts_both(headers)
        {
            return None;
        }
        let version = legacy_revision(headers)?;
        let message: Message = serde_json::from_slice(body).ok()?;
        if message.params.meta.is_some() {
            return None;
        }
        Some(PlainCall {
            id: message.id,
            params: message.params,
            version,
        })
    }

    /// The peer standing for clients of `version`.
    fn peer(&self, version: &ProtocolVersion) -> Peer<RoleServer> {
        let mut peers = self
            .peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(known) = peers.iter().find(|r| r.version == *version) {
            return known.peer.clone();
        }
        let info =
            InitializeRequestParams::new(ClientCapabilities::default(), Implementation::default())
                .with_protocol_version(version.clone());
        let service = serve_directly(
            self.server.for_session(),
            Idle(self.shutdown.clone()),
            Some(info),
        );
        let peer = service.peer().clone();
        peers.push(Revision {
            version: version.clone(),
            peer: peer.clone(),
            _service: service,
        });
        peer
    }

    /// Runs `call` with the request head `parts` and writes its answer.
    pub(super) async fn answer(&self, mut parts: Parts, call: PlainCall) -> Response {
        let PlainCall {
            id,
            params,
            version,
        } = call;
        let peer = self.peer(&version);
        let kept = NotesKept::default();
        parts.extensions.insert(kept.clone());
        let mut request = CallToolRequest::new(params);
        request.extensions.insert(parts);
        let mut request = ClientRequest::CallToolRequest(request);
        // The context as rmcp's service loop makes it.
        let mut meta = RequestMetaObject::new();
        std::mem::swap(&mut meta, request.get_meta_mut());
        let mut extensions = Extensions::new();
        std::mem::swap(&mut extensions, request.extensions_mut());
        let request_ct = CancellationToken::new();
        // The call runs on a task of its own, as rmcp runs each request:
        // when this answer is dropped (the request deadline, a client gone,
        // a `notifications/cancelled`) or shutdown ends it, the call sees
        // its token cancelled and still runs to its end, so a turn it has
        // started upstream is cancelled there rather than left running.
        let _stop = request_ct.clone().drop_guard();
        let mut context = RequestContext::new(id.clone(), peer);
        context.ct = request_ct.child_token();
        context.meta = meta;
        context.extensions = extensions;
        let server = self.server.for_session();
        let mut call = tokio::spawn(async move { server.handle_request(request, context).await });
        let handled = tokio::select! {
            joined = &mut call => joined.ok(),
            () = self.shutdown.cancelled() => None,
        };
        let Some(result) = handled else {
            tracing::error!(
                "Internal server error when empty response: no response message received from handler"
            );
            return plain_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                Body::from(
                    "Encounter an error when empty response: no response message received from handler",
                ),
            );
        };
        let message = match result {
            Ok(result) => ServerJsonRpcMessage::response(result, id),
            Err(error) => ServerJsonRpcMessage::error(error, Some(id)),
        };
        let notes = kept.take();
        if notes.is_empty() {
            return match serde_json::to_vec(&message) {
                Ok(body) => {
                    plain_response(StatusCode::OK, Some("application/json"), Body::from(body))
                }
                Err(e) => serialize_failed(&e),
            };
        }
        // A note came first: the answer is an event stream, one event per
        // message, as rmcp writes it.
        let mut frames = Vec::with_capacity(notes.len() + 1);
        for note in notes {
            match event(&ServerJsonRpcMessage::notification(note)) {
                Ok(frame) => frames.push(Ok::<_, std::convert::Infallible>(frame)),
                Err(e) => return serialize_failed(&e),
            }
        }
        match event(&message) {
            Ok(frame) => frames.push(Ok(frame)),
            Err(e) => return serialize_failed(&e),
        }
        let mut response = plain_response(
            StatusCode::OK,
            Some("text/event-stream"),
            Body::from_stream(futures::stream::iter(frames)),
        );
        let headers = response.headers_mut();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        response
    }
}

/// One server-sent event carrying `message`.
fn event(message: &ServerJsonRpcMessage) -> serde_json::Result<Bytes> {
    let mut frame = b"data: ".to_vec();
    serde_json::to_writer(&mut frame, message)?;
    frame.extend_from_slice(b"\n\n");
    Ok(Bytes::from(frame))
}

fn plain_response(status: StatusCode, content_type: Option<&'static str>, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    if let Some(content_type) = content_type {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    response
}

fn serialize_failed(error: &serde_json::Error) -> Response {
    tracing::error!("Internal server error when serialize json response: {error}");
    plain_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        None,
        Body::from(format!(
            "Encounter an error when serialize json response: {error}"
        )),
    )
}

/// A `Content-Type` whose essence is `application/json`.
fn json_content(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split_once(';')
                .map_or(v, |(essence, _)| essence)
                .trim()
                .eq_ignore_ascii_case("application/json")
        })
}

/// An `Accept` naming both `application/json` and `text/event-stream`,
/// with no parameters: a weight (`q=0` refuses a type) or a quoted value
/// is weighed by rmcp, which answers 406 when it must.
fn accepts_both(headers: &HeaderMap) -> bool {
    let (mut json, mut sse) = (false, false);
    let ranges = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for range in ranges {
        if range.contains(';') || range.contains('"') {
            return false;
        }
        let essence = range.trim();
        json |= essence.eq_ignore_ascii_case("application/json");
        sse |= essence.eq_ignore_ascii_case("text/event-stream");
    }
    json && sse
}

/// The revision a plain call is served at: the `MCP-Protocol-Version`
/// header's, or 2025-03-26 without one; `None` for an unknown revision or
/// one that negotiates per request (rmcp checks those).
fn legacy_revision(headers: &HeaderMap) -> Option<ProtocolVersion> {
    let Some(value) = headers.get(HEADER_MCP_PROTOCOL_VERSION) else {
        return Some(ProtocolVersion::V_2025_03_26);
    };
    let text = value.to_str().ok()?;
    // From 2026-07-28 on, requests carry their own metadata and standard
    // headers, which rmcp checks against the body.
    let negotiates = [
        ProtocolVersion::STANDARD_HEADERS,
        ProtocolVersion::V_2026_07_28,
    ];
    if negotiates.iter().any(|v| text >= v.as_str()) {
        return None;
    }
    ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .find(|v| v.as_str() == text)
        .cloned()
}

/// The transport of a revision's idle service: nothing arrives, and its
/// peer is never meant to send (a plain call's notes are kept with it).
/// Anything it is given all the same (say, after an rmcp change) cannot
/// reach the client: it is logged as an error, not dropped unseen.
struct Idle(CancellationToken);

impl Transport<RoleServer> for Idle {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let kind = match &item {
            ServerJsonRpcMessage::Request(_) => "request",
            ServerJsonRpcMessage::Notification(_) => "notification",
            ServerJsonRpcMessage::Response(_) => "response",
            ServerJsonRpcMessage::Error(_) => "error",
        };
        tracing::error!(
            kind,
            "a plain stateless call's message went to no client; its answer may lack it"
        );
        std::future::ready(Ok(()))
    }

    fn receive(&mut self) -> impl Future<Output = Option<ClientJsonRpcMessage>> + Send {
        let stop = self.0.clone();
        async move {
            stop.cancelled().await;
            None
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        std::future::ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, value.parse().unwrap());
        }
        headers
    }

    const PLAIN: &[(&str, &str)] = &[
        ("host", "127.0.0.1:9000"),
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2025-06-18"),
    ];

    fn direct() -> Direct {
        Direct::new(
            NexusMcp::default(),
            HostOrigin::new(([127, 0, 0, 1], 9000).into(), &[], &[]),
            CancellationToken::new(),
        )
    }

    #[test]
    fn a_plain_call_is_decoded() {
        let body = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"list_contexts","arguments":{}}}"#;
        let call = direct().plain(&headers(PLAIN), body).unwrap();
        assert_eq!(call.id, RpcId::Number(7));
        assert_eq!(call.params.name, "list_contexts");
        assert_eq!(call.version, ProtocolVersion::V_2025_06_18);
        let without: Vec<_> = PLAIN[..3].to_vec();
        let call = direct().plain(&headers(&without), body).unwrap();
        assert_eq!(call.version, ProtocolVersion::V_2025_03_26);
    }

    #[test]
    fn anything_rmcp_would_check_goes_to_rmcp() {
        let body = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}"#;
        let d = direct();
        let with = |name: &'static str, value: &str| {
            let mut pairs: Vec<(&'static str, &str)> =
                PLAIN.iter().filter(|(n, _)| *n != name).copied().collect();
            pairs.push((name, value));
            headers(&pairs)
        };
        for refused in [
            with("host", "evil.example"),
            with("host", "[::2]:9000"),
            with("content-type", "text/plain"),
            with("accept", "application/json"),
            with("accept", "text/event-stream"),
            with("accept", "application/json;q=0, text/event-stream"),
            with("accept", "application/json, text/event-stream;q=0"),
            with("accept", "application/json, text/event-stream; x=\"a,b\""),
            with("mcp-protocol-version", "2026-07-28"),
            with("mcp-protocol-version", "2099-01-01"),
            with("mcp-protocol-version", "1999-01-01"),
            with("origin", "http://localhost:3000"),
        ] {
            assert!(d.plain(&refused, body).is_none(), "{refused:?}");
        }
        for body in [
            &br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":1}}}"#[..],
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"name":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#,
            br#"{"jsonrpc":"1.0","id":7,"method":"tools/call","params":{"name":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":7,"id":8,"method":"tools/call","params":{"name":"x"}}"#,
            br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"x"}}"#,
        ] {
            assert!(d.plain(&headers(PLAIN), body).is_none(), "{}", String::from_utf8_lossy(body));
        }
    }

    #[tokio::test]
    async fn a_plain_call_is_answered_in_place() {
        let d = direct();
        let body = br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"nope"}}"#;
        let call = d.plain(&headers(PLAIN), body).unwrap();
        let (mut parts, ()) = http::Request::new(()).into_parts();
        // Admitted by the call ledger, as the guard admits every call.
        let ticket = crate::mcp::caller::CallTicket(std::sync::Arc::new(()));
        parts.extensions.insert(ticket.clone());
        let response = d.answer(parts, call).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers().get(header::CONTENT_TYPE).unwrap(),
            "application/json"
        );
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer["id"], "a");
        assert_eq!(
            answer["error"]["message"], "unknown tool `nope`",
            "{answer}"
        );
        // One idle service per revision, made once.
        let again = d.plain(&headers(PLAIN), &body_of("b")).unwrap();
        let (mut parts, ()) = http::Request::new(()).into_parts();
        parts.extensions.insert(ticket);
        let _ = d.answer(parts, again).await;
        assert_eq!(d.peers.lock().unwrap().len(), 1);
    }

    fn body_of(id: &str) -> Vec<u8> {
        format!(
            r#"{{"jsonrpc":"2.0","id":"{id}","method":"tools/call","params":{{"name":"nope"}}}}"#
        )
        .into_bytes()
    }
}
