//! Streamable HTTP transport: [`NexusMcp`] at `/mcp`, served by hyper-util's
//! connection loop with tower and tower-http layers.
//!
//! Security, as the MCP specification asks of HTTP servers:
//! - a request whose `Origin` is not allowed is refused with 403 (DNS
//!   rebinding); by default only `localhost`, `127.0.0.1` and `[::1]` origins
//!   are allowed, and requests without `Origin` (non-browser clients) pass;
//! - the `Host` header must name an allowed host (loopback names, the bound
//!   address, and any added with [`HttpOptions::allowed_hosts`]);
//! - each request may carry `X-Pinecone-Api-Key`; every tool family acts
//!   with that key for that request ([`KeyPolicy::Caller`]); an empty,
//!   repeated or malformed header is refused with 401;
//! - a session belongs to the key that created it: a request naming a
//!   session with another key (or none) gets 404, as for an unknown session;
//!   sessions expire when idle and their number is capped;
//! - every connection has a header-read timeout, every request a deadline,
//!   and connections, in-flight requests and requests per connection are
//!   limited; each refused request is logged on one line (never the key);
//! - [`bind`] warns when the address is not loopback.
//!
//! With [`HttpOptions::stateless`] no session state is kept: any number of
//! processes can serve the same clients behind a plain load balancer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::{FutureExt, StreamExt};
use http::{HeaderMap, Method, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rmcp::model::Extensions;
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::{BoxError, ServiceBuilder};
use tower_http::timeout::TimeoutLayer;

use super::nexus::KeyPolicy;
use super::server::NexusMcp;
use super::{ToolError, ToolErrorCode};
use crate::client::API_KEY_HEADER;

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";

/// The default bind address (loopback only).
pub const DEFAULT_BIND: &str = "127.0.0.1:8080";

/// Origins allowed by default: local pages on any port.
pub const LOCAL_ORIGINS: &[&str] = &[
    "http://localhost:*",
    "https://localhost:*",
    "http://127.0.0.1:*",
    "https://127.0.0.1:*",
    "http://[::1]:*",
    "https://[::1]:*",
];

/// Host names always allowed in the `Host` header.
const LOOPBACK_HOSTS: &[&str] = &["localhost", "127.0.0.1", "::1"];

/// The largest JSON-RPC request body accepted.
const MAX_REQUEST_BODY_BYTES: usize = 1024 * 1024;

/// The longest `X-Pinecone-Api-Key` value accepted.
const MAX_KEY_BYTES: usize = 512;

/// How long shutdown waits for open connections to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Default [`HttpOptions::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`HttpOptions::request_timeout`]: longer than the longest
/// `get_query` wait (60 s) plus the per-call Nexus deadline.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Default [`HttpOptions::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default [`HttpOptions::max_concurrent_requests`].
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 256;
/// Default [`HttpOptions::max_requests_per_connection`].
pub const DEFAULT_MAX_REQUESTS_PER_CONNECTION: usize = 16;
/// Default [`HttpOptions::max_sessions`].
pub const DEFAULT_MAX_SESSIONS: usize = 1000;
/// Default [`HttpOptions::session_idle_timeout`].
pub const DEFAULT_SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Options of the HTTP transport.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HttpOptions {
    /// Origins allowed besides [`LOCAL_ORIGINS`], as `scheme://host:port`
    /// (`:*` for any port).
    pub allowed_origins: Vec<String>,
    /// `Host` header values allowed besides loopback names and the bound
    /// address (needed when clients reach the server by a DNS name).
    pub allowed_hosts: Vec<String>,
    /// Serve every request without server-side session state, so that
    /// several processes can serve the same clients (no `Mcp-Session-Id`,
    /// no GET stream, no DELETE). Clients on the newest MCP protocol are
    /// served statelessly either way. A [`PineconeServer`](super::pinecone::PineconeServer)
    /// served this way should have its suggest-flow gate off
    /// (`PineconeConfig::suggest_flow = false`), as `nexus-mcp --stateless`
    /// does: a replica cannot see suggestions made on another.
    pub stateless: bool,
    /// Time a connection has to send a complete request head.
    pub header_read_timeout: Duration,
    /// Time a request has from its head to the end of its response
    /// (SSE streams included).
    pub request_timeout: Duration,
    /// Open connections; more are closed at once.
    pub max_connections: usize,
    /// Requests being handled at once over all connections, counted until
    /// their response starts (an SSE stream then stays bounded by its
    /// connection and the request deadline); more get 503.
    pub max_concurrent_requests: usize,
    /// Requests being handled at once on one connection (and HTTP/2
    /// streams per connection); more get 503.
    pub max_requests_per_connection: usize,
    /// Live MCP sessions; an `initialize` past it gets 503.
    pub max_sessions: usize,
    /// A session without any message for this long is closed.
    pub session_idle_timeout: Duration,
    /// Threads accepting and serving connections, each on its own
    /// single-threaded runtime (the caller's runtime is one of them). A
    /// connection stays on the thread that accepted it, so its requests are
    /// handled without a hand-off to another thread (a session's messages
    /// still go through the thread that created the session). Default 1.
    pub threads: usize,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            stateless: false,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            max_requests_per_connection: DEFAULT_MAX_REQUESTS_PER_CONNECTION,
            max_sessions: DEFAULT_MAX_SESSIONS,
            session_idle_timeout: DEFAULT_SESSION_IDLE_TIMEOUT,
            threads: 1,
        }
    }
}

impl HttpOptions {
    /// Adds allowed origins.
    pub fn allowed_origins(mut self, origins: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.allowed_origins
            .extend(origins.into_iter().map(Into::into));
        self
    }

    /// Adds allowed `Host` values.
    pub fn allowed_hosts(mut self, hosts: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.allowed_hosts.extend(hosts.into_iter().map(Into::into));
        self
    }

    /// Serves without session state (see [`HttpOptions::stateless`]).
    pub fn stateless(mut self, stateless: bool) -> Self {
        self.stateless = stateless;
        self
    }

    /// Sets the header-read timeout.
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// Sets the per-request deadline.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the limit of open connections (at least 1).
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// Sets the limit of requests handled at once (at least 1).
    pub fn max_concurrent_requests(mut self, max: usize) -> Self {
        self.max_concurrent_requests = max.max(1);
        self
    }

    /// Sets the limit of requests handled at once per connection (at least 1).
    pub fn max_requests_per_connection(mut self, max: usize) -> Self {
        self.max_requests_per_connection = max.max(1);
        self
    }

    /// Sets the limit of live sessions (at least 1).
    pub fn max_sessions(mut self, max: usize) -> Self {
        self.max_sessions = max.max(1);
        self
    }

    /// Sets the number of serving threads (at least 1).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Sets the idle time after which a session is closed.
    pub fn session_idle_timeout(mut self, timeout: Duration) -> Self {
        self.session_idle_timeout = timeout;
        self
    }
}

/// Why an `X-Pinecone-Api-Key` header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyHeaderError {
    /// The header is present but empty.
    Empty,
    /// The header appears more than once.
    Repeated,
    /// Not 1 to 512 visible ASCII characters.
    Malformed,
}

impl std::fmt::Display for KeyHeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            KeyHeaderError::Empty => "is empty",
            KeyHeaderError::Repeated => "is sent more than once",
            KeyHeaderError::Malformed => {
                "is malformed (expected 1 to 512 visible ASCII characters)"
            }
        };
        write!(f, "the {API_KEY_HEADER} header {what}")
    }
}

impl std::error::Error for KeyHeaderError {}

/// The caller's key in `headers`: `None` when the header is absent.
///
/// # Errors
/// An empty, repeated or malformed header: an authentication error, never
/// "no key".
pub fn key_from_headers(headers: &HeaderMap) -> Result<Option<SecretString>, KeyHeaderError> {
    let mut values = headers.get_all(API_KEY_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyHeaderError::Repeated);
    }
    let bytes = value.as_bytes().trim_ascii();
    if bytes.is_empty() {
        return Err(KeyHeaderError::Empty);
    }
    if bytes.len() > MAX_KEY_BYTES || !bytes.iter().all(u8::is_ascii_graphic) {
        return Err(KeyHeaderError::Malformed);
    }
    match std::str::from_utf8(bytes) {
        Ok(key) => Ok(Some(SecretString::from(key.to_owned()))),
        Err(_) => Err(KeyHeaderError::Malformed),
    }
}

/// The caller's API key: the valid `X-Pinecone-Api-Key` header of the HTTP
/// request that carried this MCP request, if any (never set over stdio).
pub fn caller_api_key(extensions: &Extensions) -> Option<SecretString> {
    let parts = extensions.get::<http::request::Parts>()?;
    key_from_headers(&parts.headers).ok().flatten()
}

/// A digest naming a caller key without holding it (SHA-256 with a domain
/// prefix): used to bind sessions and to key per-caller caches.
pub(crate) fn key_digest(key: &SecretString) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(b"nexus-mcp caller key\0");
    hasher.update(key.expose_secret().as_bytes());
    hasher.finalize().into()
}

/// The key one tool call runs with.
#[derive(Debug)]
pub(crate) enum CallKey {
    /// The server's own configured key (stdio, or `--allow-server-key`).
    Configured,
    /// The key the caller sent.
    Caller(SecretString),
}

/// The key a call runs with under `policy`, one rule for every tool family:
/// the caller's key when sent; the configured key over stdio or, without a
/// caller key, when the policy allows it.
///
/// # Errors
/// `UNAUTHORIZED` for a missing key (when the configured key may not serve
/// callers) and for an empty, repeated or malformed key header.
pub(crate) fn call_key(policy: KeyPolicy, extensions: &Extensions) -> Result<CallKey, ToolError> {
    let fallback = match policy {
        KeyPolicy::Configured => return Ok(CallKey::Configured),
        KeyPolicy::Caller {
            fallback_to_configured,
        } => fallback_to_configured,
    };
    let key = match extensions.get::<http::request::Parts>() {
        Some(parts) => key_from_headers(&parts.headers),
        None => Ok(None),
    };
    match key {
        Ok(Some(key)) => Ok(CallKey::Caller(key)),
        Ok(None) if fallback => Ok(CallKey::Configured),
        Ok(None) => Err(ToolError::new(
            ToolErrorCode::Unauthorized,
            format!(
                "no Pinecone API key: send yours in the {API_KEY_HEADER} header of each HTTP request"
            ),
            false,
        )
        .with_suggestion(format!(
            "configure the MCP client to send the {API_KEY_HEADER} header with your project's API key"
        ))),
        Err(e) => Err(ToolError::new(ToolErrorCode::Unauthorized, e.to_string(), false)
            .with_suggestion(format!(
                "send one {API_KEY_HEADER} header with your project's API key, or none"
            ))),
    }
}

/// Logs one refused request (never its key) and answers it.
fn refuse(status: StatusCode, peer: Option<SocketAddr>, method: &Method, reason: &str) -> Response {
    tracing::warn!(
        peer = ?peer,
        %method,
        status = status.as_u16(),
        reason,
        "refused request"
    );
    let text = match status.canonical_reason() {
        Some(name) => format!("{name}: {reason}"),
        None => reason.to_owned(),
    };
    (status, text).into_response()
}

/// The owner (key digest, or none) of each session, and the session cap.
#[derive(Debug)]
struct Sessions {
    manager: Arc<LocalSessionManager>,
    owners: Mutex<HashMap<String, Option<[u8; 32]>>>,
    /// Session creations in flight (counted against the cap).
    creating: AtomicUsize,
    max: usize,
}

impl Sessions {
    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<[u8; 32]>>> {
        // Plain values; a poisoned map is still consistent.
        self.owners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records `owner` for a new session, forgetting sessions that ended.
    async fn bind(&self, id: String, owner: Option<[u8; 32]>) {
        let stale = self.owners().len() >= self.max;
        if stale {
            let live = self.manager.sessions.read().await;
            self.owners().retain(|id, _| live.contains_key(id.as_str()));
        }
        self.owners().insert(id, owner);
    }
}

/// What the request guard checks.
#[derive(Debug)]
struct Guard {
    /// `None` when stateless.
    sessions: Option<Sessions>,
    request_timeout: Duration,
}

/// Releases one reserved session creation.
struct Creating<'a>(&'a AtomicUsize);

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Checks the caller key header and session ownership, caps sessions, bounds
/// SSE responses by the request deadline and logs refused requests.
async fn check_request(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let deadline = super::instant_after(Instant::now(), guard.request_timeout);
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let method = request.method().clone();
    let key = match key_from_headers(request.headers()) {
        Ok(key) => key,
        Err(e) => return refuse(StatusCode::UNAUTHORIZED, peer, &method, &e.to_string()),
    };
    // Only sessions have owners; without them the digest is not needed.
    let owner = match &guard.sessions {
        Some(_) => key.as_ref().map(key_digest),
        None => None,
    };
    drop(key);
    let session = request
        .headers()
        .get(HEADER_SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let response = match (&guard.sessions, session) {
        (Some(sessions), Some(id)) => {
            let known = sessions.owners().get(&id).copied();
            if known.is_some_and(|o| o != owner) {
                // 404, as for an unknown session: a stranger learns nothing.
                return refuse(
                    StatusCode::NOT_FOUND,
                    peer,
                    &method,
                    "session not found (it belongs to another caller key)",
                );
            }
            let json_first = method == Method::POST && prefers_json(request.headers());
            let response = next.run(request).await;
            if method == Method::DELETE && response.status().is_success() {
                sessions.owners().remove(&id);
            }
            if json_first {
                coalesce_answer(response, deadline).await
            } else {
                response
            }
        }
        (Some(sessions), None) if method == Method::POST => {
            let reserved = sessions.creating.fetch_add(1, Ordering::AcqRel);
            let _creating = Creating(&sessions.creating);
            let live = sessions.manager.sessions.read().await.len();
            let mut request = request;
            if live.saturating_add(reserved) >= sessions.max {
                // Only an `initialize` creates a session; other requests
                // without one (the newest protocol) are served statelessly.
                let (parts, body) = request.into_parts();
                let Ok(bytes) = axum::body::to_bytes(body, MAX_REQUEST_BODY_BYTES).await else {
                    return refuse(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        peer,
                        &method,
                        "request body too large or cut",
                    );
                };
                let initialize = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .is_ok_and(|m| m.get("method").and_then(|m| m.as_str()) == Some("initialize"));
                request = Request::from_parts(parts, Body::from(bytes));
                if initialize {
                    return refuse(
                        StatusCode::SERVICE_UNAVAILABLE,
                        peer,
                        &method,
                        &format!(
                            "too many live MCP sessions (limit {}); retry later or end an unused session",
                            sessions.max
                        ),
                    );
                }
            }
            let response = next.run(request).await;
            if let Some(id) = response
                .headers()
                .get(HEADER_SESSION_ID)
                .and_then(|v| v.to_str().ok())
            {
                sessions.bind(id.to_owned(), owner).await;
            }
            response
        }
        _ => next.run(request).await,
    };
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        tracing::warn!(
            peer = ?peer,
            %method,
            status = status.as_u16(),
            "refused request"
        );
    }
    with_deadline(response, deadline, peer)
}

/// Whether the request's `Accept` prefers `application/json` to
/// `text/event-stream`: a higher `q`, or the same `q` and listed first.
fn prefers_json(headers: &HeaderMap) -> bool {
    let mut json = None;
    let mut sse = None;
    let ranges = headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for (position, range) in ranges.enumerate() {
        let mut params = range.split(';');
        let media = params.next().unwrap_or_default().trim();
        let q = params
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        let slot = if media.eq_ignore_ascii_case("application/json") {
            &mut json
        } else if media.eq_ignore_ascii_case("text/event-stream") {
            &mut sse
        } else {
            continue;
        };
        slot.get_or_insert((q, position));
    }
    match (json, sse) {
        (Some((qj, pj)), Some((qs, ps))) => qj > qs || (qj == qs && pj < ps),
        (Some((qj, _)), None) => qj > 0.0,
        _ => false,
    }
}

/// Holds back the head of a session's SSE answer while all it carries is a
/// priming event and the answer, until the stream ends or `deadline`
/// passes. A stream that ended with the answer alone is sent as that message
/// in a JSON body, in one write, as without sessions (for a client that
/// prefers JSON, see [`prefers_json`]). Anything else (progress or a request
/// before the answer) is sent at once as the events held followed by the
/// rest of the stream.
async fn coalesce_answer(response: Response, deadline: Instant) -> Response {
    if !is_event_stream(&response) {
        return response;
    }
    let (mut parts, mut body) = response.into_parts();
    let mut held: Vec<Result<hyper::body::Frame<bytes::Bytes>, axum::Error>> = Vec::new();
    // The answer, while it is all the held frames carry after the first.
    let mut answer = None;
    let mut ended = false;
    let wait = tokio::time::sleep_until(deadline);
    tokio::pin!(wait);
    loop {
        tokio::select! {
            biased;
            frame = http_body_util::BodyExt::frame(&mut body) => match frame {
                Some(Ok(frame)) => {
                    held.push(Ok(frame));
                    if held.len() >= 2 {
                        answer = lone_answer(&held);
                        if answer.is_none() {
                            break;
                        }
                    }
                }
                Some(Err(e)) => {
                    held.push(Err(e));
                    answer = None;
                    ended = true;
                    break;
                }
                None => {
                    if held.len() < 2 {
                        answer = lone_answer(&held);
                    }
                    ended = true;
                    break;
                }
            },
            () = &mut wait => break,
        }
    }
    if ended && let Some(message) = answer {
        parts.headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        return Response::from_parts(parts, Body::from(message));
    }
    let head = futures::stream::iter(held);
    let body = if ended {
        Body::new(http_body_util::StreamBody::new(head))
    } else {
        Body::new(http_body_util::StreamBody::new(
            head.chain(http_body_util::BodyStream::new(body)),
        ))
    };
    Response::from_parts(parts, body)
}

/// The JSON-RPC response (an `id` and no `method`) that `frames` carry, when
/// they are complete events making an optional priming event (an id and no
/// data) and that one message.
fn lone_answer(frames: &[Result<hyper::body::Frame<bytes::Bytes>, axum::Error>]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Probe {
        id: Option<serde::de::IgnoredAny>,
        method: Option<serde::de::IgnoredAny>,
    }
    let mut text = String::new();
    for frame in frames {
        text.push_str(std::str::from_utf8(frame.as_ref().ok()?.data_ref()?).ok()?);
    }
    if !text.ends_with("\n\n") {
        return None;
    }
    let mut message = None;
    for event in text.split("\n\n").filter(|e| !e.is_empty()) {
        let mut data = None;
        for line in event.split('\n') {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" if data.is_none() => data = Some(value),
                "id" | "retry" => {}
                "event" if value == "message" => {}
                _ => return None,
            }
        }
        match data {
            None | Some("") => {}
            Some(json) if message.is_none() => message = Some(json),
            Some(_) => return None,
        }
    }
    let message = message?;
    // Parsing the whole message also checks that it is JSON.
    let probe = serde_json::from_str::<Probe>(message).ok()?;
    (probe.id.is_some() && probe.method.is_none()).then(|| message.to_owned())
}

fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Ends an SSE response body at `deadline`.
fn with_deadline(response: Response, deadline: Instant, peer: Option<SocketAddr>) -> Response {
    if !is_event_stream(&response) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let cut = tokio::time::sleep_until(deadline).map(move |()| {
        tracing::warn!(peer = ?peer, "request deadline passed: response stream ended");
    });
    let body = Body::from_stream(body.into_data_stream().take_until(cut));
    Response::from_parts(parts, body)
}

/// Answers a request shed by a concurrency limit.
async fn overloaded(error: BoxError) -> Response {
    let (status, reason) = if error.is::<tower::load_shed::error::Overloaded>() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "server busy: too many requests in flight; retry later",
        )
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "request failed")
    };
    tracing::warn!(status = status.as_u16(), reason, "refused request");
    (status, reason).into_response()
}

/// The axum router serving `server` at [`MCP_PATH`], with the request
/// guard, request deadline and global concurrency limit (but not the
/// connection-level limits, which [`serve`] adds).
///
/// `local_addr` is the address the listener is bound to (its IP, when
/// specific, becomes an allowed `Host`). Cancelling `shutdown` ends every
/// MCP session.
pub fn router(
    server: NexusMcp,
    local_addr: SocketAddr,
    options: &HttpOptions,
    shutdown: CancellationToken,
) -> axum::Router {
    let mut hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| (*h).to_owned()).collect();
    if !local_addr.ip().is_unspecified() {
        hosts.push(local_addr.ip().to_string());
    }
    hosts.extend(options.allowed_hosts.iter().cloned());
    let origins = LOCAL_ORIGINS
        .iter()
        .map(|o| (*o).to_owned())
        .chain(options.allowed_origins.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .enforce_origin_validation()
        .with_max_request_body_bytes(MAX_REQUEST_BODY_BYTES)
        .with_legacy_session_mode(!options.stateless)
        // Without sessions, a call whose first message is its result is one
        // JSON body; anything sent before it (progress) switches to SSE.
        .with_json_response(true)
        .with_cancellation_token(shutdown);
    let mut manager = LocalSessionManager::default();
    manager.session_config.keep_alive = Some(options.session_idle_timeout);
    let manager = Arc::new(manager);
    let service =
        StreamableHttpService::new(move || Ok(server.clone()), Arc::clone(&manager), config);
    let guard = Arc::new(Guard {
        sessions: (!options.stateless).then(|| Sessions {
            manager,
            owners: Mutex::new(HashMap::new()),
            creating: AtomicUsize::new(0),
            max: options.max_sessions.max(1),
        }),
        request_timeout: options.request_timeout,
    });
    let global = Arc::new(Semaphore::new(options.max_concurrent_requests.max(1)));
    let layers = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(overloaded))
        .load_shed()
        .layer(tower::limit::GlobalConcurrencyLimitLayer::with_semaphore(
            global,
        ))
        .layer(axum::middleware::from_fn_with_state(guard, check_request))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            options.request_timeout,
        ));
    axum::Router::new()
        .route_service(MCP_PATH, service)
        .layer(layers)
}

/// Binds `addr`, warning when it is not a loopback address.
///
/// # Errors
/// The bind failure.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    if !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "serving MCP on a non-loopback address: anyone who can reach it can use the tools; \
             callers must send their own X-Pinecone-Api-Key"
        );
    }
    tokio::net::TcpListener::bind(addr).await
}

/// Logs how a connection ended when it matters (a header-read timeout is a
/// refused request).
fn log_connection_end(error: &(dyn std::error::Error + 'static), peer: SocketAddr) {
    let timed_out = error
        .downcast_ref::<hyper::Error>()
        .is_some_and(hyper::Error::is_timeout);
    if timed_out {
        tracing::warn!(%peer, "refused request: request head not received in time; connection closed");
    } else {
        tracing::debug!(%peer, error = %error, "connection ended with an error");
    }
}

/// Serves `server` on `listener` until `shutdown` is cancelled.
///
/// Each connection is served by hyper-util (HTTP/1.1 with a header-read
/// timeout, or HTTP/2 with a stream limit) behind the connection limit and
/// a per-connection concurrency limit; see [`HttpOptions`]. With
/// [`HttpOptions::threads`] above 1, that many threads accept connections
/// from `listener`, each on its own single-threaded runtime (this one
/// included); sessions, limits and tools are shared by all of them.
///
/// # Errors
/// An I/O failure of the listener, or a serving thread that cannot start.
pub async fn serve(
    listener: tokio::net::TcpListener,
    server: NexusMcp,
    options: &HttpOptions,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let local_addr = listener.local_addr()?;
    let app = router(server, local_addr, options, shutdown.clone());
    let threads = options.threads.max(1);
    tracing::info!(
        %local_addr,
        path = MCP_PATH,
        stateless = options.stateless,
        threads,
        "serving MCP over Streamable HTTP"
    );
    let acceptor = Acceptor {
        app,
        connections: Arc::new(Semaphore::new(options.max_connections.max(1))),
        max_connections: options.max_connections.max(1),
        per_connection: options.max_requests_per_connection.max(1),
        header_read_timeout: options.header_read_timeout,
    };
    if threads == 1 {
        acceptor.accept_until(listener, shutdown).await;
        return Ok(());
    }
    // The other threads stop with `shutdown`, or when this one cannot
    // start them all.
    let stop = shutdown.child_token();
    let listener = listener.into_std()?;
    let mut finished = Vec::with_capacity(threads - 1);
    for index in 1..threads {
        match spawn_acceptor(index, &listener, acceptor.clone(), stop.clone()) {
            Ok(done) => finished.push(done),
            Err(e) => {
                stop.cancel();
                for done in finished {
                    let _ = done.await;
                }
                return Err(e);
            }
        }
    }
    let listener = tokio::net::TcpListener::from_std(listener)?;
    acceptor.accept_until(listener, stop.clone()).await;
    stop.cancel();
    for done in finished {
        // A thread that ended early has logged why.
        let _ = done.await;
    }
    Ok(())
}

/// Starts serving thread `index` on its own single-threaded runtime, on a
/// clone of `listener`; the receiver resolves when the thread is done.
fn spawn_acceptor(
    index: usize,
    listener: &std::net::TcpListener,
    acceptor: Acceptor,
    stop: CancellationToken,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let listener = listener.try_clone()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (done, finished) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("nexus-mcp-http-{index}"))
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => acceptor.accept_until(listener, stop).await,
                    Err(e) => tracing::error!(error = %e, index, "serving thread cannot listen"),
                }
            });
            let _ = done.send(());
        })?;
    Ok(finished)
}

/// What every serving thread shares: the app and the connection limits.
#[derive(Clone)]
struct Acceptor {
    app: axum::Router,
    connections: Arc<Semaphore>,
    max_connections: usize,
    per_connection: usize,
    header_read_timeout: Duration,
}

impl Acceptor {
    /// Accepts and serves connections on the current runtime until `stop`
    /// is cancelled, then lets open connections finish (up to a grace time).
    async fn accept_until(&self, listener: tokio::net::TcpListener, stop: CancellationToken) {
        let per_connection = self.per_connection;
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(u32::try_from(per_connection).unwrap_or(u32::MAX));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: wait, then go on.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = stop.cancelled() => break,
            };
            let Ok(permit) = Arc::clone(&self.connections).try_acquire_owned() else {
                tracing::warn!(%peer, limit = self.max_connections, "refused connection: too many open connections");
                drop(tcp);
                continue;
            };
            // Answers go out as several small SSE writes; without TCP_NODELAY,
            // Nagle's algorithm and the client's delayed ACK add about 40 ms.
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "could not set TCP_NODELAY");
            }
            let service = ServiceBuilder::new()
                .layer(HandleErrorLayer::new(overloaded))
                .load_shed()
                .concurrency_limit(per_connection)
                .map_request(move |mut request: Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(ConnectInfo(peer));
                    request
                })
                .service(self.app.clone());
            let connection = builder
                .serve_connection_with_upgrades(
                    TokioIo::new(tcp),
                    TowerToHyperService::new(service),
                )
                .into_owned();
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    log_connection_end(&*e, peer);
                }
                drop(permit);
            });
        }
        tokio::select! {
            () = graceful.shutdown() => {}
            () = tokio::time::sleep(SHUTDOWN_GRACE) => {
                tracing::debug!("connections still open at shutdown");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(chunks: &[&str]) -> Vec<Result<hyper::body::Frame<bytes::Bytes>, axum::Error>> {
        chunks
            .iter()
            .map(|c| Ok(hyper::body::Frame::data(bytes::Bytes::from(c.to_string()))))
            .collect()
    }

    #[test]
    fn one_message_after_a_priming_event_becomes_a_json_body() {
        let answer = r#"{"jsonrpc":"2.0","id":7,"result":{}}"#;
        let held = frames(&[
            "data: \nid: 0/3\nretry: 3000\n\n",
            &format!("data: {answer}\nid: 0/4\n\n"),
        ]);
        assert_eq!(lone_answer(&held).as_deref(), Some(answer));
        // One event split across frames is read whole.
        let held = frames(&["data: {\"jsonrpc\":\"2.0\",", "\"id\":7}\n", "id: 1\n\n"]);
        assert_eq!(
            lone_answer(&held).as_deref(),
            Some(r#"{"jsonrpc":"2.0","id":7}"#)
        );
    }

    #[test]
    fn anything_else_stays_an_event_stream() {
        for chunks in [
            // Two messages (a notification before the answer).
            &["data: {\"method\":\"x\"}\n\n", "data: {\"id\":1}\n\n"][..],
            // An unfinished event.
            &["data: {\"id\":1}\n"][..],
            // A field this reader does not expect, or another event type.
            &["data: {\"id\":1}\nfoo: bar\n\n"][..],
            &["event: ping\ndata: {\"id\":1}\n\n"][..],
            // Data that is not JSON, or split over two data lines.
            &["data: {\"id\":\n\n"][..],
            &["data: {\"id\":\ndata: 1}\n\n"][..],
            // Nothing but a priming event.
            &["data: \nid: 0/1\n\n"][..],
        ] {
            assert_eq!(lone_answer(&frames(chunks)), None, "{chunks:?}");
        }
    }

    #[test]
    fn the_head_is_held_only_while_the_answer_may_come_alone() {
        let priming = "data: \nid: 0/1\nretry: 3000\n\n";
        let answer = "data: {\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{}}\nid: 0/2\n\n";
        let progress = "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\nid: 0/2\n\n";
        let request = "data: {\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"ping\"}\nid: 0/2\n\n";
        // The head waits past the first frame only while the frames held
        // are the answer alone.
        assert!(lone_answer(&frames(&[priming, answer])).is_some());
        assert!(lone_answer(&frames(&[priming, progress])).is_none());
        assert!(lone_answer(&frames(&[priming, request])).is_none());
        assert!(lone_answer(&frames(&[priming, answer, progress])).is_none());
    }

    #[test]
    fn json_is_preferred_by_q_then_by_order() {
        let prefers = |accept: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::ACCEPT, accept.parse().unwrap());
            prefers_json(&headers)
        };
        assert!(prefers("application/json, text/event-stream"));
        assert!(!prefers("text/event-stream, application/json"));
        assert!(prefers("text/event-stream;q=0.5, application/json"));
        assert!(!prefers("application/json;q=0.2, text/event-stream"));
        assert!(prefers("Application/JSON"));
        assert!(!prefers("application/json;q=0"));
        assert!(!prefers("text/event-stream"));
        assert!(!prefers(""));
    }
}
