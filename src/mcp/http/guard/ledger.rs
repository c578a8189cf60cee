//! The call ledger: the one place a call's slot, its cancellation and its
//! caller's absence are kept, whatever the mode.
//!
//! - A request is admitted (a slot in the server's and its caller's budget)
//!   before its body is read, so the read happens within the budget; a
//!   request over the budget is read only far enough to see whether it is a
//!   `notifications/cancelled`, which must reach its request even then.
//! - A call (any request but `initialize`) carries a [`CallTicket`] sharing
//!   its slot: the tool dispatch refuses a call without one, and the slot is
//!   free only when both the answer has been sent (or abandoned) and the
//!   tool has ended, which includes cancelling a Nexus turn it started.
//! - A session call whose answer is abandoned before its end (the client
//!   hung up, the request deadline passed) is cancelled in its session with
//!   a `notifications/cancelled`, as the client would have sent it; a
//!   stateless call is cancelled through its own token (the request
//!   registry below), which a `notifications/cancelled` from the same
//!   caller and client address also fires.
//! - A session's end (`DELETE`, idle expiry) cancels the calls running in
//!   it, which keep their slots until their turns' cancels are answered.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Method};
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use tokio_util::sync::CancellationToken;

use crate::mcp::caller::{CallTicket, CallerGone};
use crate::mcp::http::budget::{CallerId, Slot, hold_and_finish};
use crate::mcp::http::guard::Guard;
use crate::mcp::http::sessions::InUse;

/// The header naming a request's protocol revision, copied onto the
/// cancellation of an abandoned session call.
const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";

/// The most of an over-budget request's body read to see whether it is a
/// `notifications/cancelled`.
pub(in crate::mcp::http) const CANCEL_PEEK_BYTES: usize = 1024;

/// Gives `request` the ticket of `slot`: its tool holds the slot until it
/// has ended.
pub(in crate::mcp::http) fn ticket(request: &mut Request, slot: &Arc<Slot>) {
    let held: Arc<dyn std::any::Any + Send + Sync> = Arc::clone(slot) as _;
    request.extensions_mut().insert(CallTicket(held));
}

/// Binds a request on a session to the session's end: a call it carries
/// is cancelled when the session ends (see `sessions`), and the owner's
/// `DELETE` ends the session's running calls before the session itself.
pub(in crate::mcp::http) fn bind_to_session(request: &mut Request, in_use: &InUse) {
    if *request.method() == Method::DELETE {
        in_use.ended().cancel();
    }
    request.extensions_mut().insert(CallerGone(in_use.ended()));
}

/// What names a running stateless request: its caller, its client's
/// address and its JSON-RPC id. Two clients sharing a key (from other
/// addresses) cannot cancel each other's calls; two clients sharing a key
/// and an address, or one client reusing an id, cannot be told apart.
type RunningKey = (CallerId, Option<IpAddr>, String);

/// The stateless requests running: each key's requests, by a number of
/// their own.
#[derive(Debug, Default)]
pub(in crate::mcp::http) struct RunningRequests {
    by_key: HashMap<RunningKey, Vec<(u64, CancellationToken)>>,
    next: u64,
}

/// A stateless request registered for cancellation; unregistered on drop.
pub(in crate::mcp::http) struct Running {
    guard: Arc<Guard>,
    key: RunningKey,
    number: u64,
    pub(in crate::mcp::http) token: CancellationToken,
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
    pub(in crate::mcp::http) fn running(&self) -> std::sync::MutexGuard<'_, RunningRequests> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers a stateless request of `caller` from `client` with
    /// JSON-RPC `id`.
    pub(in crate::mcp::http) fn register(
        self: &Arc<Self>,
        caller: CallerId,
        client: Option<IpAddr>,
        id: String,
    ) -> Running {
        let token = CancellationToken::new();
        let key = (caller, client, id);
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

    /// Cancels the running stateless requests of `caller` from `client`
    /// with JSON-RPC `id`.
    pub(in crate::mcp::http) fn cancel_running(
        &self,
        caller: CallerId,
        client: Option<IpAddr>,
        id: &str,
    ) {
        if let Some(tokens) = self.running().by_key.get(&(caller, client, id.to_owned())) {
            for (_, token) in tokens {
                token.cancel();
            }
        }
    }
}

/// Ends a streamed answer when its request is cancelled.
pub(in crate::mcp::http) fn cut_when_cancelled(
    response: Response,
    token: CancellationToken,
) -> Response {
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

/// A session call's cancellation, sent into its session when dropped armed:
/// its answer was abandoned before its end.
pub(in crate::mcp::http) struct Abandoned {
    armed: Option<(Arc<Guard>, HeaderMap, String)>,
}

impl Abandoned {
    /// Armed for the call with JSON-RPC `id` on the session `request`
    /// names.
    pub(in crate::mcp::http) fn arm(guard: &Arc<Guard>, request: &Request, id: String) -> Self {
        let headers = request.headers();
        let mut kept = HeaderMap::new();
        for name in [HEADER_SESSION_ID, PROTOCOL_VERSION_HEADER] {
            if let Some(value) = headers.get(name) {
                kept.insert(name, value.clone());
            }
        }
        // rmcp wants a `Host`: HTTP/2 names it as the target's authority.
        let host = headers.get(http::header::HOST).cloned().or_else(|| {
            let authority = request.uri().authority()?;
            HeaderValue::from_str(authority.as_str()).ok()
        });
        if let Some(host) = host {
            kept.insert(http::header::HOST, host);
        }
        Abandoned {
            armed: Some((Arc::clone(guard), kept, id)),
        }
    }

    /// The call's answer has been delivered whole: nothing to cancel.
    pub(in crate::mcp::http) fn disarm(&mut self) {
        self.armed = None;
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some((guard, headers, id)) = self.armed.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        tracing::debug!(request = %id, "answer abandoned: cancelling the call in its session");
        runtime.spawn(async move {
            let _ = guard.mcp.run(cancel_in_session(headers, &id)).await;
        });
    }
}

/// The `notifications/cancelled` of request `id` in the session `headers`
/// name.
fn cancel_in_session(headers: HeaderMap, id: &str) -> Request {
    let body = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{id},"reason":"the client is gone"}}}}"#
    );
    let mut request = Request::new(Body::from(body));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = http::Uri::from_static(crate::mcp::http::MCP_PATH);
    *request.headers_mut() = headers;
    let headers = request.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    request
}

/// `response` whose body cancels its call (through `abandoned`) unless it
/// is read to its end.
pub(in crate::mcp::http) fn cancel_unless_delivered(
    response: Response,
    abandoned: Abandoned,
) -> Response {
    hold_and_finish(response, abandoned, Abandoned::disarm)
}
