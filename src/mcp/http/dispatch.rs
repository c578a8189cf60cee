//! Stateless requests of the initialize-era revisions, answered by calling
//! the server's handler directly.
//!
//! A stateless request of a revision up to 2025-11-25 (no `_meta`
//! protocol version, a known `MCP-Protocol-Version` header of such a
//! revision or none) has nothing to negotiate, so it needs no per-request
//! service loop: the guard decoded it once; [`Dispatch::answer`] runs it on a
//! fresh server (as rmcp's service factory makes one per stateless request)
//! in a task of its own, with a context whose peer belongs to one
//! long-lived placeholder loop per revision, and writes its answer as one
//! JSON body, or as an SSE stream when notifications come before it (they
//! go into the call's own bounded channel, see [`crate::mcp::notifier`]).
//! Dropping the answer (a hang-up, the request deadline, a
//! `notifications/cancelled`) cancels the call's token; the call then ends
//! on its own, holding its ledger ticket until it has.
//!
//! Every other stateless request (`initialize`, `server/discover`, a
//! request of 2026-07-28 or later, headers or media types rmcp refuses)
//! goes to rmcp's service, whose answers for them stay the authority
//! ([`legacy_revision`] decides, conservatively).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, StatusCode};
use rmcp::model::{
    ClientCapabilities, ClientJsonRpcMessage, ClientRequest, ErrorData, GetExtensions, GetMeta,
    Implementation, InitializeRequestParams, JsonRpcMessage, JsonRpcRequest, ProtocolVersion,
    RequestId, ServerJsonRpcMessage, ServerNotification, ServerResult,
};
use rmcp::service::{RequestContext, RunningService, Service, serve_directly};
use rmcp::transport::Transport;
use rmcp::transport::common::http_header::HEADER_MCP_PROTOCOL_VERSION;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use rmcp::{Peer, RoleServer};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::mcp::notifier::CallNotes;
use crate::mcp::server::NexusMcp;

/// The notifications a call may send ahead of the client reading them.
const NOTES_BUFFER: usize = 16;

/// How often an SSE answer with nothing to send writes a comment, so that
/// proxies keep it open (rmcp's default for its streams).
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The revision a stateless request is answered under by [`Dispatch`], or
/// `None` when it goes to rmcp's service: a request other than
/// `initialize` and `server/discover`, without a `_meta` protocol version,
/// whose `MCP-Protocol-Version` header is absent (2025-03-26, as rmcp takes
/// it) or names a known revision that has `initialize`, posted as JSON by a
/// client that accepts both JSON and SSE answers.
pub(super) fn legacy_revision(
    headers: &HeaderMap,
    request: &JsonRpcRequest<ClientRequest>,
) -> Option<ProtocolVersion> {
    if matches!(
        request.request,
        ClientRequest::InitializeRequest(_) | ClientRequest::DiscoverRequest(_)
    ) || request.request.get_meta().protocol_version().is_some()
        || !posted_as_json(headers)
        || !accepts_json_and_sse(headers)
    {
        return None;
    }
    let version = match headers.get(HEADER_MCP_PROTOCOL_VERSION) {
        None => ProtocolVersion::V_2025_03_26,
        Some(value) => ProtocolVersion::KNOWN_VERSIONS
            .iter()
            .find(|known| known.as_str().as_bytes() == value.as_bytes())?
            .clone(),
    };
    version.has_initialize().then_some(version)
}

/// Whether `Content-Type` is `application/json` (parameters aside).
fn posted_as_json(headers: &HeaderMap) -> bool {
    let mut types = headers.get_all(http::header::CONTENT_TYPE).iter();
    let (Some(value), None) = (types.next(), types.next()) else {
        return false;
    };
    value.to_str().is_ok_and(|v| {
        v.split(';')
            .next()
            .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// Whether `Accept` plainly lists both `application/json` and
/// `text/event-stream` without a weight: anything less plain (weights,
/// quoted parameters, wildcards) is left to rmcp's own reading.
fn accepts_json_and_sse(headers: &HeaderMap) -> bool {
    let (mut json, mut sse) = (false, false);
    for value in headers.get_all(http::header::ACCEPT) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        if value.contains(['"', ';']) {
            return false;
        }
        for range in value.split(',') {
            let range = range.trim();
            json |= range.eq_ignore_ascii_case("application/json");
            sse |= range.eq_ignore_ascii_case("text/event-stream");
        }
    }
    json && sse
}

/// rmcp's Streamable HTTP service behind an `Arc`: rmcp's service clones
/// itself (its whole configuration, host and origin lists included) in
/// each `call`, where this calls it by reference.
#[derive(Clone)]
pub(super) struct McpService(
    pub(super) Arc<StreamableHttpService<NexusMcp, super::call_streams::CallStreams>>,
);

impl std::fmt::Debug for McpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpService").finish_non_exhaustive()
    }
}

impl McpService {
    pub(super) async fn run(&self, request: Request) -> Response {
        // Boxed: rmcp's future is kilobytes, and the guard's own future
        // (moved into its box per request) should not carry it inline.
        Box::pin(self.0.handle(request)).await.into_response()
    }
}

/// Answers stateless requests: those [`legacy_revision`] takes itself,
/// the others by rmcp's service.
pub(super) struct Dispatch {
    server: NexusMcp,
    rmcp: McpService,
    /// One placeholder service loop per revision served, for the peer a
    /// request context must carry (at most one per known revision).
    placeholders: Mutex<Vec<Placeholder>>,
}

impl std::fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatch").finish_non_exhaustive()
    }
}

/// A service loop that reads nothing: its peer tells a handler the
/// request's revision, and what is sent through it (nothing this server's
/// handlers send: their notifications go to [`CallNotes`]) is dropped.
struct Placeholder {
    version: ProtocolVersion,
    peer: Peer<RoleServer>,
    _service: RunningService<RoleServer, NexusMcp>,
}

impl Dispatch {
    /// Answers with (fresh sessions of) `server`, or else with `rmcp`.
    pub(super) fn new(server: NexusMcp, rmcp: McpService) -> Self {
        Dispatch {
            server,
            rmcp,
            placeholders: Mutex::new(Vec::new()),
        }
    }

    /// The peer for requests of revision `version`.
    fn peer(&self, version: &ProtocolVersion) -> Peer<RoleServer> {
        let mut placeholders = self
            .placeholders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(placeholder) = placeholders.iter().find(|p| p.version == *version) {
            return placeholder.peer.clone();
        }
        let info =
            InitializeRequestParams::new(ClientCapabilities::default(), Implementation::default())
                .with_protocol_version(version.clone());
        let service = serve_directly(self.server.for_session(), Silent, Some(info));
        let peer = service.peer().clone();
        placeholders.push(Placeholder {
            version: version.clone(),
            peer: peer.clone(),
            _service: service,
        });
        peer
    }

    /// The answer to stateless `request`, whose body the guard read and,
    /// for the methods it checks, `decoded`.
    pub(super) async fn answer(
        &self,
        request: Request,
        decoded: Option<ClientJsonRpcMessage>,
    ) -> Response {
        if let Some(ClientJsonRpcMessage::Request(call)) = decoded
            && let Some(version) = legacy_revision(request.headers(), &call)
        {
            let (parts, _read) = request.into_parts();
            return self.run(parts, call, &version).await;
        }
        self.rmcp.run(request).await
    }

    /// Runs `request` (with its HTTP `parts`) and answers it.
    async fn run(
        &self,
        parts: http::request::Parts,
        request: JsonRpcRequest<ClientRequest>,
        version: &ProtocolVersion,
    ) -> Response {
        let JsonRpcRequest {
            id, mut request, ..
        } = request;
        let (notes, mut notes_rx) = mpsc::channel(NOTES_BUFFER);
        let ct = CancellationToken::new();
        let mut context = RequestContext::new(id.clone(), self.peer(version));
        context.ct = ct.clone();
        context.meta = std::mem::take(request.get_meta_mut());
        context.extensions = std::mem::take(request.extensions_mut());
        context.extensions.insert(parts);
        context.extensions.insert(CallNotes(notes));
        let server = self.server.for_session();
        let mut call = tokio::spawn(async move { server.handle_request(request, context).await });
        // Dropped unanswered (the caller is gone): the call is cancelled.
        let cancel = ct.drop_guard();
        let first = tokio::select! {
            biased;
            Some(note) = notes_rx.recv() => note,
            ended = &mut call => {
                cancel.disarm();
                return json_answer(&answer_of(ended, id));
            }
        };
        sse_answer(Stream {
            first: Some(note_message(first)),
            notes: notes_rx,
            call: Some(call),
            id,
            cancel: Some(cancel),
        })
    }
}

/// The JSON-RPC answer of a call that `ended`.
fn answer_of(
    ended: Result<Result<ServerResult, ErrorData>, tokio::task::JoinError>,
    id: RequestId,
) -> ServerJsonRpcMessage {
    match ended {
        Ok(Ok(result)) => JsonRpcMessage::response(result, id),
        Ok(Err(error)) => JsonRpcMessage::error(error, Some(id)),
        Err(e) => {
            tracing::error!(error = %e, "a stateless call ended abnormally");
            JsonRpcMessage::error(
                ErrorData::internal_error("the call ended abnormally", None),
                Some(id),
            )
        }
    }
}

fn note_message(note: ServerNotification) -> ServerJsonRpcMessage {
    JsonRpcMessage::notification(note)
}

/// `message` as a JSON body (200, as rmcp answers a stateless request,
/// errors included).
fn json_answer(message: &ServerJsonRpcMessage) -> Response {
    match serde_json::to_vec(message) {
        Ok(body) => (
            StatusCode::OK,
            [(http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the answer could not be encoded",
        )
            .into_response(),
    }
}

/// What an SSE answer still has to send.
struct Stream {
    first: Option<ServerJsonRpcMessage>,
    notes: mpsc::Receiver<ServerNotification>,
    /// `None` once its result was sent.
    call: Option<JoinHandle<Result<ServerResult, ErrorData>>>,
    id: RequestId,
    /// Cancels the call when the stream is dropped before its result.
    cancel: Option<DropGuard>,
}

impl Stream {
    /// The next frame, or `None` after the result.
    async fn next_frame(&mut self) -> Option<Bytes> {
        if let Some(first) = self.first.take() {
            return Some(frame(&first));
        }
        let call = self.call.as_mut()?;
        let step = tokio::select! {
            biased;
            Some(note) = self.notes.recv() => Step::Note(note),
            ended = call => Step::Ended(ended),
            () = tokio::time::sleep(KEEP_ALIVE) => Step::Idle,
        };
        Some(match step {
            Step::Note(note) => frame(&note_message(note)),
            Step::Ended(ended) => {
                self.call = None;
                if let Some(cancel) = self.cancel.take() {
                    cancel.disarm();
                }
                frame(&answer_of(ended, self.id.clone()))
            }
            Step::Idle => Bytes::from_static(b": keep-alive\n\n"),
        })
    }
}

/// What an SSE answer's wait ended with.
enum Step {
    Note(ServerNotification),
    Ended(Result<Result<ServerResult, ErrorData>, tokio::task::JoinError>),
    Idle,
}

/// One SSE event carrying `message`.
fn frame(message: &ServerJsonRpcMessage) -> Bytes {
    let mut out = b"data: ".to_vec();
    if serde_json::to_writer(&mut out, message).is_err() {
        // Not reachable for these types; the client still gets an event.
        out.truncate(6);
        out.extend_from_slice(br#"{"jsonrpc":"2.0","error":{"code":-32603,"message":"the answer could not be encoded"}}"#);
    }
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// An SSE answer: `stream`'s frames, as rmcp's stateless streams are sent.
fn sse_answer(stream: Stream) -> Response {
    let body = futures::stream::unfold(stream, |mut stream| async move {
        let frame = stream.next_frame().await?;
        Some((Ok::<_, Infallible>(frame), stream))
    })
    .boxed();
    let headers = [
        (http::header::CONTENT_TYPE, "text/event-stream"),
        (http::header::CACHE_CONTROL, "no-cache"),
        (http::HeaderName::from_static("x-accel-buffering"), "no"),
    ];
    (headers, Body::from_stream(body)).into_response()
}

/// The placeholder loops' transport: reads nothing, drops what is sent.
struct Silent;

impl Transport<RoleServer> for Silent {
    type Error = Infallible;

    fn send(
        &mut self,
        _item: rmcp::service::TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        tracing::debug!("dropped a message sent outside any stateless call");
        std::future::ready(Ok(()))
    }

    fn receive(
        &mut self,
    ) -> impl Future<Output = Option<rmcp::service::RxJsonRpcMessage<RoleServer>>> + Send {
        std::future::pending()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        std::future::ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn call(body: serde_json::Value) -> JsonRpcRequest<ClientRequest> {
        match serde_json::from_value(body).unwrap() {
            rmcp::model::ClientJsonRpcMessage::Request(request) => request,
            other => panic!("not a request: {other:?}"),
        }
    }

    const PLAIN: &[(&str, &str)] = &[
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];

    fn list() -> JsonRpcRequest<ClientRequest> {
        call(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
    }

    #[test]
    fn plain_requests_of_initialize_era_revisions_are_taken() {
        assert_eq!(
            legacy_revision(&headers(PLAIN), &list()),
            Some(ProtocolVersion::V_2025_03_26)
        );
        let mut with_version = PLAIN.to_vec();
        with_version.push(("mcp-protocol-version", "2025-11-25"));
        assert_eq!(
            legacy_revision(&headers(&with_version), &list()),
            Some(ProtocolVersion::V_2025_11_25)
        );
    }

    #[test]
    fn everything_else_is_left_to_rmcp() {
        let with = |extra: (&'static str, &'static str)| {
            let mut h = PLAIN.to_vec();
            h.push(extra);
            headers(&h)
        };
        // Revisions without `initialize`, unknown ones, bad media types.
        assert_eq!(
            legacy_revision(&with(("mcp-protocol-version", "2026-07-28")), &list()),
            None
        );
        assert_eq!(
            legacy_revision(&with(("mcp-protocol-version", "1999-01-01")), &list()),
            None
        );
        let odd_accept = headers(&[
            ("content-type", "application/json"),
            ("accept", "application/json;q=0, text/event-stream"),
        ]);
        assert_eq!(legacy_revision(&odd_accept, &list()), None);
        let weighted = headers(&[
            ("content-type", "application/json"),
            ("accept", "application/json;q=1, text/event-stream;q=1"),
        ]);
        assert_eq!(legacy_revision(&weighted, &list()), None);
        let json_only = headers(&[
            ("content-type", "application/json"),
            ("accept", "application/json"),
        ]);
        assert_eq!(legacy_revision(&json_only, &list()), None);
        let text = headers(&[("content-type", "text/plain"), ("accept", PLAIN[1].1)]);
        assert_eq!(legacy_revision(&text, &list()), None);
        // Lifecycle requests and per-request negotiation.
        let init = call(
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}),
        );
        assert_eq!(legacy_revision(&headers(PLAIN), &init), None);
        let negotiated = call(
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
            "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2025-06-18"}}}),
        );
        assert_eq!(legacy_revision(&headers(PLAIN), &negotiated), None);
    }
}
