//! The request guard: what a request must show before it costs anything.
//!
//! In order: a well-formed key header (or none); its whole body within the
//! body-read deadline, as one JSON-RPC message; a key for `initialize`
//! unless keyless callers are served; then a slot within the server's and
//! the caller's budget; then, for a session, that it is the caller's (one
//! uniform 404 otherwise) or, for `initialize`, room under the caps. Every
//! request gets a short id (`x-request-id`) and one access-log line.

pub(super) mod ledger;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::response::IntoResponse;
use axum::response::Response;
use futures::FutureExt;
use http::{HeaderValue, Method, StatusCode};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use secrecy::SecretString;
use tokio::time::Instant;

use super::answer::{coalesce_answer, prefers_json, with_deadline};
use super::budget::{Budgets, CallerId, Over, Slot, hold_until_end};
use super::cors::{self, HostOrigin};
use super::dispatch::{Dispatch, McpService};
use super::options::MAX_REQUEST_BODY_BYTES;
use super::proof::{Proofs, Standing};
use super::refusals::{Reason, Refusals};
use super::sessions::{Full, Sessions};
use crate::mcp::caller::{
    CallerKey, CallerTag, Identified, LogIdentity, REQUEST_ID_HEADER, RequestId, key_digest,
    key_from_headers, tag_of,
};
use crate::mcp::jsonrpc::{
    Message, cancelled_response, classify, classify_keeping, error_response,
};
use crate::mcp::metrics::{HttpMethod, Metrics};
use crate::serving::ForwardedClients;

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
    pub(super) running: Mutex<ledger::RunningRequests>,
    /// Proxies whose forwarding headers name the real client.
    pub(super) trusted_proxies: Arc<[super::TrustedProxy]>,
    /// The MCP service a request reaches once admitted.
    pub(super) mcp: McpService,
    /// What answers stateless requests with a JSON-RPC id.
    pub(super) stateless: Dispatch,
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

impl Guard {
    fn not_found(&self, peer: Option<SocketAddr>, method: &Method) -> Response {
        // One answer for an unknown, expired or another caller's session.
        self.refusals.refuse(
            Reason::UnknownSession,
            StatusCode::NOT_FOUND,
            peer,
            method,
            "session not found; start a new one with initialize",
        )
    }

    /// Everything after the request id: checks, then the MCP service.
    async fn handle(
        self: &Arc<Self>,
        mut request: Request,
        request_id: RequestId,
        peer: Option<SocketAddr>,
        method: &Method,
        deadline: Instant,
        rpc_method: &std::sync::OnceLock<&'static str>,
    ) -> (Response, CallerTag) {
        let asked = Asked {
            peer,
            method,
            deadline,
            rpc_method,
        };
        let key = match key_from_headers(request.headers()) {
            Ok(key) => key,
            Err(e) => {
                // 403, not 401: a key was sent and is refused. A 401 makes
                // OAuth-capable clients (mcp-remote) start an authorization
                // discovery instead of showing this text.
                let response = self.refusals.refuse(
                    Reason::BadKey,
                    StatusCode::FORBIDDEN,
                    peer,
                    method,
                    &e.to_string(),
                );
                return (response, CallerTag::Invalid);
            }
        };
        let caller = self.identify(&mut request, key, request_id, peer);
        let response = match self.check_then_serve(request, &caller, &asked).await {
            Ok(response) | Err(response) => response,
        };
        (response, caller.tag)
    }

    /// Who sends the request, from the key of its header; the identity
    /// goes on the request for the tools and the logs.
    fn identify(
        &self,
        request: &mut Request,
        key: Option<SecretString>,
        request_id: RequestId,
        peer: Option<SocketAddr>,
    ) -> Caller {
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
        let id = match hash {
            Some(hash) => CallerId::Key(hash),
            None => CallerId::network(peer.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |p| p.ip())),
        };
        Caller {
            key: proving,
            digest,
            owner,
            id,
            tag,
        }
    }

    /// The checks after the key header, in the order of the module docs,
    /// then the MCP service. `Err` is an answer given early (a refusal).
    async fn check_then_serve(
        self: &Arc<Self>,
        request: Request,
        caller: &Caller,
        asked: &Asked<'_>,
    ) -> Result<Response, Response> {
        let proven = self.key_proven(caller, asked).await?;
        // Keyless callers count with unproven keys: a small anonymous
        // budget per client network, within the server's quarantine.
        let metered_proven = proven && caller.key.is_some();
        // Admitted before the body is read: the read is within the budget.
        let slot = match self.budgets.admit(caller.id, metered_proven) {
            Ok(slot) => Arc::new(slot),
            // Ending a session frees what the caller holds.
            Err(Over::Caller) if *asked.method == Method::DELETE => {
                Arc::new(self.budgets.admit_ending(caller.id))
            }
            Err(over) => {
                let refused = self.over_budget(over, metered_proven, asked);
                return Err(self
                    .cancel_when_over_budget(request, caller, asked, refused)
                    .await);
            }
        };
        let Received {
            mut request,
            message,
            decoded,
        } = self.receive(request, asked).await?;
        if message == Some(Message::Initialize) && caller.key.is_none() && !self.keyless {
            // 403, not 401: this server has no HTTP authentication scheme,
            // and MCP clients (mcp-remote) answer any 401 with an OAuth
            // discovery instead of showing this text.
            return Err(self.refusals.refuse(
                Reason::KeylessSession,
                StatusCode::FORBIDDEN,
                asked.peer,
                asked.method,
                "send your Pinecone API key in the X-Pinecone-Api-Key header: this server serves no caller without one",
            ));
        }
        let session = request
            .headers()
            .get(HEADER_SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if let (Some(sessions), Some(id), true) = (&self.sessions, &session, proven) {
            sessions.prove(id);
        }
        if self.sessions.is_none()
            && let Some(Message::Cancelled(Some(id))) = &message
        {
            self.cancel_running(caller.id, asked.client(), id);
        }
        if let Some(Message::Request(_)) = &message {
            ledger::ticket(&mut request, &slot);
        }
        match (&self.sessions, session, message) {
            (Some(sessions), Some(id), message) => {
                let call = match message {
                    Some(Message::Request(call)) => call,
                    _ => None,
                };
                self.serve_in_session(sessions, &id, request, caller, (slot, call), asked)
                    .await
            }
            (Some(sessions), None, Some(Message::Initialize)) => {
                self.open_session(sessions, request, caller, proven, slot, asked)
                    .await
            }
            (None, _, Some(Message::Request(Some(id)))) => Ok(self
                .serve_stateless((request, decoded), id, caller.id, slot, asked)
                .await),
            _ => {
                let response = self.mcp.run(request).await;
                Ok(if *asked.method == Method::POST {
                    hold_until_end(response, slot)
                } else {
                    response
                })
            }
        }
    }

    /// A request over the budget: `refused`, unless it is a
    /// `notifications/cancelled` (read up to a small bound), which reaches
    /// the request it names even then.
    async fn cancel_when_over_budget(
        self: &Arc<Self>,
        request: Request,
        caller: &Caller,
        asked: &Asked<'_>,
        refused: Response,
    ) -> Response {
        if *asked.method != Method::POST {
            return refused;
        }
        let (parts, body) = request.into_parts();
        let read = tokio::time::timeout(
            self.body_read_timeout,
            axum::body::to_bytes(body, ledger::CANCEL_PEEK_BYTES),
        )
        .await;
        let Ok(Ok(bytes)) = read else {
            return refused;
        };
        let Ok((Message::Cancelled(Some(id)), _)) = classify(&bytes) else {
            return refused;
        };
        let session = parts
            .headers
            .get(HEADER_SESSION_ID)
            .and_then(|v| v.to_str().ok());
        match (&self.sessions, session) {
            (None, _) => {
                self.cancel_running(caller.id, asked.client(), &id);
                StatusCode::ACCEPTED.into_response()
            }
            (Some(sessions), Some(session)) => match sessions.enter(session, caller.owner) {
                Some(_in_use) => {
                    self.mcp
                        .run(Request::from_parts(parts, Body::from(bytes)))
                        .await
                }
                None => self.not_found(asked.peer, asked.method),
            },
            (Some(_), None) => refused,
        }
    }

    /// A POST's whole body within the body-read deadline, as one JSON-RPC
    /// message (counted, and named for the access log); other methods'
    /// requests pass as they are.
    async fn receive(&self, request: Request, asked: &Asked<'_>) -> Result<Received, Response> {
        if *asked.method != Method::POST {
            return Ok(Received {
                request,
                message: None,
                decoded: None,
            });
        }
        let (parts, body) = request.into_parts();
        let read = tokio::time::timeout(
            self.body_read_timeout,
            axum::body::to_bytes(body, MAX_REQUEST_BODY_BYTES),
        )
        .await;
        let bytes = match read {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(_)) => {
                return Err(self.refusals.refuse(
                    Reason::BodyTooLarge,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    asked.peer,
                    asked.method,
                    "request body too large or cut",
                ));
            }
            Err(_) => {
                return Err(self.refusals.refuse(
                    Reason::BodyTimeout,
                    StatusCode::REQUEST_TIMEOUT,
                    asked.peer,
                    asked.method,
                    "request body not received in time",
                ));
            }
        };
        let (message, decoded) = match classify_keeping(&bytes) {
            Ok((message, label, decoded)) => {
                self.metrics.rpc_request(label);
                let _ = asked.rpc_method.set(label);
                (message, decoded)
            }
            Err(invalid) => {
                self.refusals
                    .refused(Reason::InvalidMessage, asked.peer, StatusCode::BAD_REQUEST);
                return Err(error_response(&invalid));
            }
        };
        Ok(Received {
            request: Request::from_parts(parts, Body::from(bytes)),
            message: Some(message),
            decoded,
        })
    }

    /// Whether the caller's key is proven (403 when the upstream refused
    /// it). The upstream is asked once per key, until it decides (a
    /// session opened unproven is proven by a later request). Keyless
    /// callers are served with the server's key by the operator's choice,
    /// and limited per address.
    async fn key_proven(&self, caller: &Caller, asked: &Asked<'_>) -> Result<bool, Response> {
        let (Some(key), Some(digest)) = (&caller.key, &caller.digest) else {
            return Ok(true);
        };
        let standing = self
            .proofs
            .standing(key, digest, asked.peer.map(|p| p.ip()))
            .await;
        if standing == Standing::Refused {
            return Err(self.refusals.refuse(
                Reason::KeyRefused,
                StatusCode::FORBIDDEN,
                asked.peer,
                asked.method,
                "the upstream refused this X-Pinecone-Api-Key; send a valid Pinecone API key",
            ));
        }
        Ok(standing == Standing::Proven)
    }

    /// The refusal of a request over the budget: 429 when the caller has
    /// too many in flight, 503 when the server (or its quarantine) is full.
    fn over_budget(&self, over: Over, proven: bool, asked: &Asked<'_>) -> Response {
        let (reason, status, text) = match over {
            Over::Caller => (
                Reason::CallerBusy,
                StatusCode::TOO_MANY_REQUESTS,
                "too many of your requests in flight; retry when one has finished",
            ),
            Over::Server if !proven => (
                Reason::Quarantine,
                StatusCode::SERVICE_UNAVAILABLE,
                "too many requests without a key or of keys not yet accepted upstream; retry later",
            ),
            Over::Server => (
                Reason::ServerBusy,
                StatusCode::SERVICE_UNAVAILABLE,
                "server busy: too many requests in flight; retry later",
            ),
        };
        self.refusals
            .refuse(reason, status, asked.peer, asked.method, text)
    }

    /// A request on session `id`: the caller's own (one uniform 404
    /// otherwise), one GET stream at a time, and the slot (or stream) held
    /// until the answer's last byte.
    async fn serve_in_session(
        self: &Arc<Self>,
        sessions: &Arc<Sessions>,
        id: &str,
        mut request: Request,
        caller: &Caller,
        (slot, call): (Arc<Slot>, Option<String>),
        asked: &Asked<'_>,
    ) -> Result<Response, Response> {
        let (peer, method) = (asked.peer, asked.method);
        let post = *method == Method::POST;
        let Some(in_use) = sessions.enter(id, caller.owner) else {
            return Err(self.not_found(peer, method));
        };
        ledger::bind_to_session(&mut request, &in_use);
        let stream = if *method == Method::GET {
            let Ok(open) = sessions.open_stream(id) else {
                return Err(self.refusals.refuse(
                    Reason::StreamOpen,
                    StatusCode::CONFLICT,
                    peer,
                    method,
                    "this session already has an open GET stream",
                ));
            };
            let Ok(counted) = self.budgets.admit_stream(caller.id) else {
                return Err(self.refusals.refuse(
                    Reason::CallerBusy,
                    StatusCode::TOO_MANY_REQUESTS,
                    peer,
                    method,
                    "too many of your requests and streams open; close one first",
                ));
            };
            Some((open, counted))
        } else {
            None
        };
        let json_first = post && prefers_json(request.headers());
        // A call whose answer is abandoned (hang-up, deadline) before its
        // end is cancelled in its session, as its client would have.
        let mut abandoned = call.map(|call| ledger::Abandoned::arm(self, &request, call));
        let response = self.mcp.run(request).await;
        if response.status() == StatusCode::NOT_FOUND {
            if let Some(abandoned) = &mut abandoned {
                abandoned.disarm();
            }
            sessions.remove(id);
            return Err(self.not_found(peer, method));
        }
        let response = match abandoned {
            Some(abandoned) => ledger::cancel_unless_delivered(response, abandoned),
            None => response,
        };
        if *method == Method::DELETE && response.status().is_success() {
            sessions.remove(id);
            // rmcp answers 202; clients (the Python SDK among them)
            // take only 200 or 204 as a session ended.
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        let response = if json_first {
            coalesce_answer(response, asked.deadline).await
        } else {
            response
        };
        Ok(if post {
            hold_until_end(response, (slot, in_use))
        } else if let Some(stream) = stream {
            hold_until_end(response, stream)
        } else {
            response
        })
    }

    /// `initialize` without a session: room under the session caps, then
    /// the service, and the session it opens bound to the caller.
    async fn open_session(
        &self,
        sessions: &Arc<Sessions>,
        request: Request,
        caller: &Caller,
        proven: bool,
        slot: Arc<Slot>,
        asked: &Asked<'_>,
    ) -> Result<Response, Response> {
        let reservation = sessions
            .reserve(caller.id, proven)
            .await
            .map_err(|full| self.sessions_full(sessions, full, asked))?;
        let response = self.mcp.run(request).await;
        if let Some(id) = response
            .headers()
            .get(HEADER_SESSION_ID)
            .and_then(|v| v.to_str().ok())
        {
            reservation.bind(id.to_owned(), caller.owner);
        }
        Ok(hold_until_end(response, slot))
    }

    /// The refusal of a session over the caller's, the quarantine's or the
    /// server's cap, naming the limit.
    fn sessions_full(&self, sessions: &Sessions, full: Full, asked: &Asked<'_>) -> Response {
        let (reason, status, text) = match full {
            Full::Caller => (
                Reason::CallerSessions,
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "too many live MCP sessions of yours (limit {}); end one you no longer use",
                    sessions.per_caller
                ),
            ),
            Full::Quarantine => (
                Reason::Quarantine,
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "too many live MCP sessions of keys not yet accepted upstream, all busy \
                     (limit {}); retry later",
                    sessions.quarantine
                ),
            ),
            Full::Server => (
                Reason::SessionsFull,
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "too many live MCP sessions, all busy (limit {}); retry later",
                    sessions.max
                ),
            ),
        };
        self.refusals
            .refuse(reason, status, asked.peer, asked.method, &text)
    }

    /// A stateless request with JSON-RPC `id`, cancellable by its caller:
    /// every one is answered by the MCP service, its slot held until the
    /// answer's last byte.
    async fn serve_stateless(
        self: &Arc<Self>,
        (request, decoded): (Request, Option<ClientJsonRpcMessage>),
        id: String,
        caller: CallerId,
        slot: Arc<Slot>,
        asked: &Asked<'_>,
    ) -> Response {
        let running = self.register(caller, asked.client(), id.clone());
        let token = running.token.clone();
        let response = tokio::select! {
            response = self.stateless.answer(request, decoded) => response,
            () = token.cancelled() => cancelled_response(&id),
        };
        let response = ledger::cut_when_cancelled(response, token);
        // The budget slot is held until the answer's last byte, as
        // a session's is: a streamed answer counts while it runs.
        hold_until_end(response, (slot, running))
    }
}

/// What the steps after the request id read of the request: where it comes
/// from, its method, its deadline, and where its JSON-RPC method is noted
/// for the access log.
struct Asked<'a> {
    peer: Option<SocketAddr>,
    method: &'a Method,
    deadline: Instant,
    rpc_method: &'a std::sync::OnceLock<&'static str>,
}

impl Asked<'_> {
    /// The client's address.
    fn client(&self) -> Option<IpAddr> {
        self.peer.map(|p| p.ip())
    }
}

/// Who a request comes from, worked out once from its key header.
struct Caller {
    /// The key, for asking the upstream where it stands.
    key: Option<CallerKey>,
    /// The key's digest, which key proofs are bound to.
    digest: Option<[u8; 32]>,
    /// The digest a session is bound to; `None` when stateless.
    owner: Option<[u8; 32]>,
    /// Whose budget the request counts against.
    id: CallerId,
    /// The caller as the logs name it.
    tag: CallerTag,
}

/// A request with its body read and its JSON-RPC message (POST only).
struct Received {
    request: Request,
    message: Option<Message>,
    /// The message as rmcp's type, when the checks decoded it.
    decoded: Option<ClientJsonRpcMessage>,
}

/// Whether a request a trusted proxy forwarded is over the reconnect
/// throttle of the client it names (which a cut of the proxy's connection
/// is then charged to); requests of any other peer pass, the throttle
/// having seen their connection.
fn forwarded_throttled(request: &Request, client: Option<SocketAddr>) -> bool {
    let Some(forwarded) = request.extensions().get::<ForwardedClients>() else {
        return false;
    };
    let proxy = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let client = client.map(|c| c.ip()).filter(|ip| Some(*ip) != proxy);
    !forwarded.admit(client)
}

/// Checks a request (see the module docs), answers 408 when it has no
/// response head by the request deadline, bounds SSE responses by that
/// deadline, and logs one access line.
async fn check_request(guard: Arc<Guard>, request: Request) -> Response {
    let start = Instant::now();
    let deadline = crate::mcp::instant_after(start, guard.request_timeout);
    // The real client, when a trusted proxy forwarded the request: every
    // per-client limit and the logs are about it.
    let peer = super::proxy::real_client(
        request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0),
        request.headers(),
        &guard.trusted_proxies,
    );
    let method = request.method().clone();
    let throttled = forwarded_throttled(&request, peer);
    let id = request_id();
    let checked = guard.host_origin.check(request.uri(), request.headers());
    let preflight = cors::is_preflight(&method, request.headers());
    let rpc_method = std::sync::OnceLock::new();
    let (response, caller) = match &checked {
        Err(refused) => (
            guard.refusals.refuse(
                Reason::HostOrigin,
                StatusCode::FORBIDDEN,
                peer,
                &method,
                &refused.to_string(),
            ),
            CallerTag::Unknown,
        ),
        Ok(Some(origin)) if preflight => (cors::preflight(origin.clone()), CallerTag::Unknown),
        Ok(_) if throttled => (
            guard.refusals.refuse(
                Reason::ReconnectThrottled,
                StatusCode::SERVICE_UNAVAILABLE,
                peer,
                &method,
                "a response to this client was left unread and its connection cut; \
                 its requests are paced for a while: retry later",
            ),
            CallerTag::Unknown,
        ),
        Ok(_) => {
            let handled = tokio::time::timeout_at(
                deadline,
                guard.handle(request, id, peer, &method, deadline, &rpc_method),
            )
            .await;
            handled.unwrap_or_else(|_| {
                (
                    (
                        StatusCode::REQUEST_TIMEOUT,
                        "Request Timeout: not answered within the request deadline (--request-timeout); \
                         the call it carried is cancelled",
                    )
                        .into_response(),
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
