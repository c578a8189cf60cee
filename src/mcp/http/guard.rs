//! The request guard: what a request must show before it costs anything.
//!
//! In order: a well-formed key header (or none); its whole body within the
//! body-read deadline, as one JSON-RPC message; a key for `initialize`
//! unless keyless callers are served; then a slot within the server's and
//! the caller's budget; then, for a session, that it is the caller's (one
//! uniform 404 otherwise) or, for `initialize`, room under the caps. Every
//! request gets a short id (`x-request-id`) and one access-log line.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::response::IntoResponse;
use axum::response::Response;
use bytes::Bytes;
use futures::FutureExt;
use http::{HeaderValue, Method, StatusCode};
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::answer::{coalesce_answer, prefers_json, with_deadline};
use super::budget::{Budgets, CallerId, Over, hold_until_end};
use super::cors::{self, HostOrigin};
use super::options::MAX_REQUEST_BODY_BYTES;
use super::proof::{Proofs, Standing};
use super::refusals::{Reason, Refusals};
use super::sessions::{Full, Sessions};
use super::splice::write_held;
use crate::mcp::caller::{
    CallerKey, CallerTag, Identified, LogIdentity, REQUEST_ID_HEADER, RequestId, key_digest,
    key_from_headers, tag_of,
};
use crate::mcp::edge_structured::EdgeSlot;
use crate::mcp::jsonrpc::{Message, cancelled_response, classify, error_response};
use crate::mcp::metrics::{HttpMethod, Metrics};
use crate::mcp::server::NexusMcp;

/// What the request guard checks against.
#[derive(Debug)]
pub(super) struct Guard {
    /// `None` when stateless.
    pub(super) sessions: Option<Arc<Sessions>>,
    pub(super) budgets: Arc<Budgets>,
    /// The verdicts on caller keys.
    pub(super) proofs: Arc<Proofs>,
    /// The `Host` and `Origin` values served (and CORS).
    pub(super) host_origin: HostOrigin,
    pub(super) refusals: Arc<Refusals>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) request_timeout: Duration,
    pub(super) body_read_timeout: Duration,
    /// Whether calls without a key are served (with the server's key).
    pub(super) keyless: bool,
    /// Stateless requests running, by caller and JSON-RPC id, so that a
    /// `notifications/cancelled` from the same caller can stop them (and
    /// nobody else's), whichever connection it comes on: an HTTP/1.1
    /// client sends it on another one while its request waits.
    pub(super) running: Mutex<RunningRequests>,
    /// The MCP service a request reaches once admitted.
    pub(super) mcp: McpService,
    /// Plain stateless tool calls answered in place; `None` with sessions.
    pub(super) direct: Option<super::direct::Direct>,
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
    async fn run(&self, request: Request) -> Response {
        // Boxed: rmcp's future is kilobytes, and the guard's own future
        // (moved into its box per request) should not carry it inline.
        Box::pin(self.0.handle(request)).await.into_response()
    }
}

/// [`check_request`] as the service at the MCP path: one boxed future per
/// request, where a middleware layer and a timeout layer each clone and
/// box their inner services again.
#[derive(Clone, Debug)]
pub(super) struct Guarded(pub(super) Arc<Guard>);

impl tower::Service<Request> for Guarded {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        Box::pin(check_request(Arc::clone(&self.0), request).map(Ok))
    }
}

/// The request id header's name, parsed once.
const REQUEST_ID_NAME: http::HeaderName = http::HeaderName::from_static(REQUEST_ID_HEADER);

/// Request ids: a per-process start mixed with a counter, as 8 hex digits.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn request_id() -> RequestId {
    use std::hash::{BuildHasher, Hasher};
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    });
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    // splitmix64: consecutive ids look unrelated.
    let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    RequestId(Some(z as u32))
}

fn method_label(method: &Method) -> HttpMethod {
    match *method {
        Method::GET => HttpMethod::Get,
        Method::POST => HttpMethod::Post,
        Method::DELETE => HttpMethod::Delete,
        Method::HEAD => HttpMethod::Head,
        Method::OPTIONS => HttpMethod::Options,
        Method::PUT => HttpMethod::Put,
        _ => HttpMethod::Other,
    }
}

/// What names a running stateless request: its caller and its JSON-RPC
/// id (a caller reusing an id while the first request runs cancels both).
type RunningKey = (CallerId, String);

/// The stateless requests running: each key's requests, by a number of
/// their own.
#[derive(Debug, Default)]
pub(super) struct RunningRequests {
    by_key: HashMap<RunningKey, Vec<(u64, CancellationToken)>>,
    next: u64,
}

/// A stateless request registered for cancellation; unregistered on drop.
struct Running {
    guard: Arc<Guard>,
    key: RunningKey,
    number: u64,
    token: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.guard.running();
        if let Some(tokens) = running.by_key.get_mut(&self.key) {
            tokens.retain(|(number, _)| *number != self.number);
            if tokens.is_empty() {
                running.by_key.remove(&self.key);
            }
        }
    }
}

impl Guard {
    fn running(&self) -> std::sync::MutexGuard<'_, RunningRequests> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers a stateless request of `caller` with JSON-RPC `id`.
    fn register(self: &Arc<Self>, caller: CallerId, id: String) -> Running {
        let token = CancellationToken::new();
        let key = (caller, id);
        let mut running = self.running();
        let number = running.next;
        running.next = running.next.wrapping_add(1);
        running
            .by_key
            .entry(key.clone())
            .or_default()
            .push((number, token.clone()));
        drop(running);
        Running {
            guard: Arc::clone(self),
            key,
            number,
            token,
        }
    }

    /// Cancels `caller`'s running stateless requests with JSON-RPC `id`.
    fn cancel_running(&self, caller: CallerId, id: &str) {
        if let Some(tokens) = self.running().by_key.get(&(caller, id.to_owned())) {
            for (_, token) in tokens {
                token.cancel();
            }
        }
    }

    fn refuse(
        &self,
        reason: Reason,
        status: StatusCode,
        peer: Option<SocketAddr>,
        method: &Method,
        text: &str,
    ) -> Response {
        self.refusals.refuse(reason, status, peer, method, text)
    }

    fn not_found(&self, peer: Option<SocketAddr>, method: &Method) -> Response {
        // One answer for an unknown, expired or another caller's session.
        self.refuse(
            Reason::UnknownSession,
            StatusCode::NOT_FOUND,
            peer,
            method,
            "session not found; start a new one with initialize",
        )
    }

    /// Everything after the request id: checks, then the MCP service.
    /// A POST's body, read within the body deadline and bounded in bytes,
    /// and the JSON-RPC message it carries; or the refusal to send.
    async fn read_message(
        &self,
        request: Request,
        peer: Option<SocketAddr>,
        method: &Method,
        rpc_method: &std::sync::OnceLock<&'static str>,
    ) -> Result<(Request, Option<Message>, Option<Bytes>), Response> {
        let (parts, body) = request.into_parts();
        let read = tokio::time::timeout(
            self.body_read_timeout,
            axum::body::to_bytes(body, MAX_REQUEST_BODY_BYTES),
        )
        .await;
        let bytes = match read {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(_)) => {
                return Err(self.refuse(
                    Reason::BodyTooLarge,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    peer,
                    method,
                    "request body too large or cut",
                ));
            }
            Err(_) => {
                return Err(self.refuse(
                    Reason::BodyTimeout,
                    StatusCode::REQUEST_TIMEOUT,
                    peer,
                    method,
                    "request body not received in time",
                ));
            }
        };
        let message = match classify(&bytes) {
            Ok((message, label)) => {
                self.metrics.rpc_request(label);
                let _ = rpc_method.set(label);
                message
            }
            Err(invalid) => {
                self.refusals
                    .refused(Reason::InvalidMessage, peer, StatusCode::BAD_REQUEST);
                return Err(error_response(&invalid));
            }
        };
        let body = bytes.clone();
        Ok((
            Request::from_parts(parts, Body::from(bytes)),
            Some(message),
            Some(body),
        ))
    }

    /// The refusal of a request over a budget: its caller's (429), or the
    /// server's (503; for keys not yet accepted upstream, their share).
    fn over_budget(
        &self,
        over: Over,
        proven: bool,
        peer: Option<SocketAddr>,
        method: &Method,
    ) -> Response {
        match over {
            Over::Caller => self.refuse(
                Reason::CallerBusy,
                StatusCode::TOO_MANY_REQUESTS,
                peer,
                method,
                "too many of your requests in flight; retry when one has finished",
            ),
            Over::Server if !proven => self.refuse(
                Reason::Quarantine,
                StatusCode::SERVICE_UNAVAILABLE,
                peer,
                method,
                "too many requests of keys not yet accepted upstream; retry later",
            ),
            Over::Server => self.refuse(
                Reason::ServerBusy,
                StatusCode::SERVICE_UNAVAILABLE,
                peer,
                method,
                "server busy: too many requests in flight; retry later",
            ),
        }
    }

    async fn handle(
        self: &Arc<Self>,
        mut request: Request,
        request_id: RequestId,
        peer: Option<SocketAddr>,
        method: &Method,
        deadline: Instant,
        rpc_method: &std::sync::OnceLock<&'static str>,
    ) -> (Response, CallerTag) {
        let key = match key_from_headers(request.headers()) {
            Ok(key) => key,
            Err(e) => {
                // 403, not 401: a key was sent and is refused. A 401 makes
                // OAuth-capable clients (mcp-remote) start an authorization
                // discovery instead of showing this text.
                let response = self.refuse(
                    Reason::BadKey,
                    StatusCode::FORBIDDEN,
                    peer,
                    method,
                    &e.to_string(),
                );
                return (response, CallerTag::Invalid);
            }
        };
        // Sessions and key proofs are bound to the key's digest; budgets,
        // logs and the tools' per-caller pools need only a cheaper
        // per-process hash, worked out here once (the tools read it from
        // the request).
        let digest = key.as_ref().map(key_digest);
        let owner = match &self.sessions {
            Some(_) => digest,
            None => None,
        };
        let key = key.map(CallerKey::new);
        let proving = key.clone();
        let hash = key.as_ref().map(|key| key.hash);
        let tag = hash.map_or(CallerTag::Keyless, tag_of);
        request.extensions_mut().insert(Identified {
            key,
            log: LogIdentity {
                request_id,
                caller: tag,
            },
        });
        let caller = match hash {
            Some(hash) => CallerId::Key(hash),
            None => CallerId::Addr(peer.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |p| p.ip())),
        };
        let (request, message, body) = if *method == Method::POST {
            match self.read_message(request, peer, method, rpc_method).await {
                Ok(read) => read,
                Err(response) => return (response, tag),
            }
        } else {
            (request, None, None)
        };
        if message == Some(Message::Initialize) && hash.is_none() && !self.keyless {
            let response = self.refuse(
                Reason::KeylessSession,
                StatusCode::UNAUTHORIZED,
                peer,
                method,
                "send your Pinecone API key in the X-Pinecone-Api-Key header: this server serves no caller without one",
            );
            return (response, tag);
        }
        let session = request
            .headers()
            .get(HEADER_SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // Where the key stands: the upstream is asked once per key, until it
        // decides (a session opened unproven is proven by a later request).
        // Keyless callers are served with the server's key by the
        // operator's choice, and limited per address.
        let proven = match (&proving, &digest) {
            (Some(key), Some(digest)) => {
                let standing = self
                    .proofs
                    .standing(key, digest, peer.map(|p| p.ip()))
                    .await;
                if standing == Standing::Refused {
                    let response = self.refuse(
                        Reason::KeyRefused,
                        StatusCode::FORBIDDEN,
                        peer,
                        method,
                        "the upstream refused this X-Pinecone-Api-Key; send a valid Pinecone API key",
                    );
                    return (response, tag);
                }
                standing == Standing::Proven
            }
            _ => true,
        };
        if let (Some(sessions), Some(id), true) = (&self.sessions, &session, proven) {
            sessions.prove(id);
        }
        if self.sessions.is_none()
            && let Some(Message::Cancelled(Some(id))) = &message
        {
            self.cancel_running(caller, id);
        }
        let slot = match self.budgets.admit(caller, proven) {
            Ok(slot) => slot,
            Err(over) => return (self.over_budget(over, proven, peer, method), tag),
        };
        let post = *method == Method::POST;
        let response = match (&self.sessions, session) {
            (Some(sessions), Some(id)) => {
                let Some(in_use) = sessions.enter(&id, owner) else {
                    return (self.not_found(peer, method), tag);
                };
                let stream = if *method == Method::GET {
                    let Ok(open) = sessions.open_stream(&id) else {
                        let response = self.refuse(
                            Reason::StreamOpen,
                            StatusCode::CONFLICT,
                            peer,
                            method,
                            "this session already has an open GET stream",
                        );
                        return (response, tag);
                    };
                    let Ok(counted) = self.budgets.admit_stream(caller) else {
                        let response = self.refuse(
                            Reason::CallerBusy,
                            StatusCode::TOO_MANY_REQUESTS,
                            peer,
                            method,
                            "too many of your requests and streams open; close one first",
                        );
                        return (response, tag);
                    };
                    Some((open, counted))
                } else {
                    None
                };
                let json_first = post && prefers_json(request.headers());
                let response = self.mcp.run(request).await;
                if response.status() == StatusCode::NOT_FOUND {
                    sessions.remove(&id);
                    return (self.not_found(peer, method), tag);
                }
                if *method == Method::DELETE && response.status().is_success() {
                    sessions.remove(&id);
                    // rmcp answers 202; clients (the Python SDK among them)
                    // take only 200 or 204 as a session ended.
                    return (StatusCode::NO_CONTENT.into_response(), tag);
                }
                let response = if json_first {
                    coalesce_answer(response, deadline).await
                } else {
                    response
                };
                if post {
                    hold_until_end(response, (slot, in_use))
                } else if let Some(stream) = stream {
                    hold_until_end(response, stream)
                } else {
                    response
                }
            }
            (Some(sessions), None) if message == Some(Message::Initialize) => {
                let reservation = match sessions.reserve(caller, proven).await {
                    Ok(reservation) => reservation,
                    Err(Full::Caller) => {
                        let text = format!(
                            "too many live MCP sessions of yours (limit {}); end one you no longer use",
                            sessions.per_caller
                        );
                        let response = self.refuse(
                            Reason::CallerSessions,
                            StatusCode::TOO_MANY_REQUESTS,
                            peer,
                            method,
                            &text,
                        );
                        return (response, tag);
                    }
                    Err(Full::Quarantine) => {
                        let text = format!(
                            "too many live MCP sessions of keys not yet accepted upstream, all busy \
                             (limit {}); retry later",
                            sessions.quarantine
                        );
                        let response = self.refuse(
                            Reason::Quarantine,
                            StatusCode::SERVICE_UNAVAILABLE,
                            peer,
                            method,
                            &text,
                        );
                        return (response, tag);
                    }
                    Err(Full::Server) => {
                        let text = format!(
                            "too many live MCP sessions, all busy (limit {}); retry later",
                            sessions.max
                        );
                        let response = self.refuse(
                            Reason::SessionsFull,
                            StatusCode::SERVICE_UNAVAILABLE,
                            peer,
                            method,
                            &text,
                        );
                        return (response, tag);
                    }
                };
                let response = self.mcp.run(request).await;
                if let Some(id) = response
                    .headers()
                    .get(HEADER_SESSION_ID)
                    .and_then(|v| v.to_str().ok())
                {
                    reservation.bind(id.to_owned(), owner);
                }
                hold_until_end(response, slot)
            }
            (None, _) if matches!(message, Some(Message::Request(Some(_)))) => {
                let Some(Message::Request(Some(id))) = message else {
                    return (self.mcp.run(request).await, tag);
                };
                // A tool call's structured content is written here from its
                // text, not built and serialized as a tree by rmcp.
                let edge = (rpc_method.get() == Some(&"tools/call")).then(EdgeSlot::default);
                let mut request = request;
                if let Some(edge) = &edge {
                    request.extensions_mut().insert(edge.clone());
                }
                let running = self.register(caller, id.clone());
                let token = running.token.clone();
                // A plain call is answered here, anything else by rmcp.
                let plain = match (&self.direct, &edge, &body) {
                    (Some(direct), Some(_), Some(body)) => direct
                        .plain(request.headers(), body)
                        .map(|call| (direct, call)),
                    _ => None,
                };
                let answer = async {
                    match plain {
                        Some((direct, call)) => {
                            let (parts, _) = request.into_parts();
                            direct.answer(parts, call).await
                        }
                        None => self.mcp.run(request).await,
                    }
                };
                let response = tokio::select! {
                    response = answer => response,
                    () = token.cancelled() => cancelled_response(&id),
                };
                let response = match &edge {
                    Some(edge) => write_held(response, edge).await,
                    None => response,
                };
                let response = cut_when_cancelled(response, token);
                // The budget slot is held until the answer's last byte, as
                // a session's is: a streamed answer counts while it runs.
                hold_until_end(response, (slot, edge, running))
            }
            _ => {
                let response = self.mcp.run(request).await;
                if post {
                    hold_until_end(response, slot)
                } else {
                    response
                }
            }
        };
        (response, tag)
    }
}

/// Ends a streamed answer when its request is cancelled.
fn cut_when_cancelled(response: Response, token: CancellationToken) -> Response {
    use futures::StreamExt;
    let streamed = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !streamed {
        return response;
    }
    let (parts, body) = response.into_parts();
    let body = Body::from_stream(body.into_data_stream().take_until(token.cancelled_owned()));
    Response::from_parts(parts, body)
}

/// Checks a request (see the module docs), answers 408 when it has no
/// response head by the request deadline, bounds SSE responses by that
/// deadline, and logs one access line.
async fn check_request(guard: Arc<Guard>, request: Request) -> Response {
    let start = Instant::now();
    let deadline = crate::mcp::instant_after(start, guard.request_timeout);
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let method = request.method().clone();
    let id = request_id();
    let checked = guard.host_origin.check(request.uri(), request.headers());
    let preflight = cors::is_preflight(&method, request.headers());
    let rpc_method = std::sync::OnceLock::new();
    let (response, caller) = match &checked {
        Err(refused) => (
            guard.refuse(
                Reason::HostOrigin,
                StatusCode::FORBIDDEN,
                peer,
                &method,
                &refused.to_string(),
            ),
            CallerTag::Unknown,
        ),
        Ok(Some(origin)) if preflight => (cors::preflight(origin.clone()), CallerTag::Unknown),
        Ok(_) => {
            let handled = tokio::time::timeout_at(
                deadline,
                guard.handle(request, id, peer, &method, deadline, &rpc_method),
            )
            .await;
            handled.unwrap_or_else(|_| {
                (
                    StatusCode::REQUEST_TIMEOUT.into_response(),
                    CallerTag::Unknown,
                )
            })
        }
    };
    let status = response.status();
    let elapsed = start.elapsed();
    let label = method_label(&method);
    guard
        .metrics
        .request(label, status.as_u16(), elapsed.as_secs_f64());
    tracing::info!(
        target: "nexus_mcp::access",
        request_id = %id,
        method = label.label(),
        rpc_method = rpc_method.get().copied().unwrap_or("-"),
        status = status.as_u16(),
        duration_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
        caller = %caller,
        peer = %super::refusals::shown_peer(peer),
        "request"
    );
    let mut response = with_deadline(response, deadline, peer);
    if let Ok(Some(origin)) = checked
        && !preflight
    {
        cors::allow(&mut response, origin);
    }
    let id_value = id
        .digits()
        .and_then(|digits| HeaderValue::from_bytes(&digits).ok())
        .unwrap_or(HeaderValue::from_static("-"));
    response.headers_mut().insert(REQUEST_ID_NAME, id_value);
    response
}
