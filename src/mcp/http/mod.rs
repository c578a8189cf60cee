//! Streamable HTTP transport: [`NexusMcp`] at `/mcp`, served by hyper-util's
//! connection loop, tower's per-connection limits and a request guard.
//!
//! Security, as the MCP specification asks of HTTP servers:
//! - a request whose `Origin` is not allowed is refused with 403 (DNS
//!   rebinding); by default only `localhost`, `127.0.0.1` and `[::1]` origins
//!   are allowed, and requests without `Origin` (non-browser clients) pass;
//! - the `Host` header must name an allowed host (loopback names, the bound
//!   address, and any added with [`HttpOptions::allowed_hosts`]);
//! - each request may carry `X-Pinecone-Api-Key`; every tool family acts
//!   with that key for that request ([`KeyPolicy::Caller`](crate::mcp::KeyPolicy::Caller)); an empty,
//!   repeated or malformed header is refused with 403 (a key the upstream
//!   refuses too; 401 only for a missing key);
//! - a session belongs to the key that created it: a request naming a
//!   session with another key (or none) gets the same 404 as an unknown
//!   session; `initialize` without a key is refused unless keyless calls
//!   are served;
//! - nothing costs before it is earned: a connection must send a complete
//!   request head in time (whatever the protocol), idle connections are
//!   closed, a body must arrive in time, and a request takes a slot only
//!   once its body is in;
//! - requests in flight and sessions are limited per caller (key, or
//!   client address without one) as well as in all; at the session cap the
//!   least recently used idle session is closed;
//! - each request gets a short id and one access-log line (a caller tag,
//!   never the key); refusals are counted and their warnings rate-limited;
//! - `GET /healthz`, `GET /readyz` and `GET /metrics` need no key;
//! - [`bind`] warns when the address is not loopback.
//!
//! Module map: [`options`](HttpOptions) (limits), `connections`
//! (accepting, connection deadlines, shutdown), `guard` (admission of each
//! request), `budget` (in-flight slots), `sessions` (ownership and caps),
//! `dispatch` (answering stateless requests), `answer` (shaping
//! responses), `refusals`, `ops` (operator endpoints).
//!
//! With [`HttpOptions::stateless`] no session state is kept: any number of
//! processes can serve the same clients behind a plain load balancer.

mod answer;
pub(in crate::mcp) mod budget;
mod call_streams;
mod connections;
mod cors;
mod dispatch;
mod guard;
mod ops;
mod options;
mod proof;
mod proof_line;
mod proxy;
mod refusals;
mod sessions;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

pub use super::caller::{KeyHeaderError, caller_api_key, key_from_headers};
use super::server::NexusMcp;
use budget::Budgets;
use dispatch::McpService;
use guard::{Guard, Guarded};
pub use ops::{HEALTH_PATH, METRICS_PATH, READY_PATH};
use options::MAX_REQUEST_BODY_BYTES;
pub use options::*;
pub use proxy::{TrustedProxy, TrustedProxyError};
use refusals::Refusals;
use sessions::Sessions;

/// The app and what shutdown needs of it.
struct Built {
    app: axum::Router,
    budgets: Arc<Budgets>,
    refusals: Arc<Refusals>,
}

/// The axum router serving `server` at [`MCP_PATH`] behind the request
/// guard (keys, bodies, budgets, sessions) and the request deadline, and
/// the operator endpoints; the connection-level limits are [`serve`]'s.
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
    build(server, local_addr, options, shutdown).app
}

fn build(
    server: NexusMcp,
    local_addr: SocketAddr,
    options: &HttpOptions,
    shutdown: CancellationToken,
) -> Built {
    let host_origin =
        cors::HostOrigin::new(local_addr, &options.allowed_hosts, &options.allowed_origins);
    // The guard applies the crate's one `Host`/`Origin` rule to every
    // request before rmcp sees it; rmcp's own (which differs on a trailing
    // dot and on ports) would only refuse some of what the rule serves.
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_max_request_body_bytes(MAX_REQUEST_BODY_BYTES)
        .with_legacy_session_mode(!options.stateless)
        // Without sessions, a call whose first message is its result is one
        // JSON body; anything sent before it (progress) switches to SSE.
        .with_json_response(true)
        .with_cancellation_token(shutdown);
    let mut manager = LocalSessionManager::default();
    manager.session_config.keep_alive = Some(options.session_idle_timeout);
    let manager = Arc::new(manager);
    let ends = call_streams::SessionEnds::default();
    let metrics = Arc::clone(server.metrics());
    let keyless = server.serves_keyless();
    let upstreams = server.upstreams();
    let proofs = Arc::new(proof::Proofs::new(server.clone()));
    let answerer = server.clone();
    let mcp = McpService(Arc::new(StreamableHttpService::new(
        move || Ok(server.for_session()),
        Arc::new(call_streams::CallStreams::new(
            Arc::clone(&manager),
            ends.clone(),
        )),
        config,
    )));
    let budgets = Arc::new(Budgets::new(
        options.max_concurrent_requests,
        options.max_requests_per_caller,
    ));
    let refusals = Arc::new(Refusals::new(Arc::clone(&metrics)));
    let sessions = (!options.stateless).then(|| {
        Arc::new(Sessions::new(
            manager,
            options.max_sessions,
            options.max_sessions_per_caller,
            Arc::clone(&metrics),
            ends,
        ))
    });
    let guard = Arc::new(Guard {
        sessions: sessions.clone(),
        budgets: Arc::clone(&budgets),
        proofs,
        host_origin: host_origin.clone(),
        refusals: Arc::clone(&refusals),
        metrics: Arc::clone(&metrics),
        request_timeout: options.request_timeout,
        body_read_timeout: options.body_read_timeout,
        keyless,
        running: Mutex::new(guard::ledger::RunningRequests::default()),
        trusted_proxies: options.trusted_proxies.clone().into(),
        stateless: dispatch::Dispatch::new(answerer, mcp.clone()),
        mcp,
    });
    let mcp = axum::Router::new().route_service(MCP_PATH, Guarded(guard));
    let ops = Arc::new(ops::Ops {
        metrics,
        readiness: ops::Readiness::new(upstreams),
        sessions,
        host_origin,
        refusals: Arc::clone(&refusals),
    });
    Built {
        app: mcp.merge(ops::routes(ops)),
        budgets,
        refusals,
    }
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

/// Serves `server` on `listener` until `shutdown` is cancelled.
///
/// Each connection is served by hyper-util (HTTP/1.1 or HTTP/2) behind the
/// connection cap, the first-head deadline, the idle timeout and a
/// per-connection concurrency limit; see [`HttpOptions`]. With
/// [`HttpOptions::threads`] above 1, that many threads accept connections
/// from `listener`, each on its own single-threaded runtime (this one
/// included); sessions, limits and tools are shared by all of them.
///
/// At shutdown, no connection is accepted any more, idle ones close, and
/// requests in flight have [`HttpOptions::shutdown_grace`] to finish; then
/// sessions end and the remaining connections are cut.
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
    let sessions_end = CancellationToken::new();
    let metrics = Arc::clone(server.metrics());
    let built = build(server, local_addr, options, sessions_end.clone());
    let threads = options.threads.max(1);
    tracing::info!(
        %local_addr,
        path = MCP_PATH,
        stateless = options.stateless,
        threads,
        "serving MCP over Streamable HTTP"
    );
    let hooks = connections::McpHooks {
        metrics,
        refusals: built.refusals,
        trusted: options.trusted_proxies.clone().into(),
    };
    let core =
        crate::serving::Server::new(built.app, connections::limits(options), Arc::new(hooks));
    // Connections close with `stop` once their requests are done; `kill`
    // cuts what is left after the grace time.
    let stop = shutdown.child_token();
    let kill = CancellationToken::new();
    let drain = tokio::spawn(drain_after(
        stop.clone(),
        Arc::clone(&built.budgets),
        options.shutdown_grace,
        sessions_end.clone(),
        kill.clone(),
    ));
    let result = core.serve(listener, stop.clone(), kill.clone()).await;
    stop.cancel();
    drain.abort();
    sessions_end.cancel();
    kill.cancel();
    result
}

/// After `stop`: waits for the requests in flight (up to `grace`), ends
/// the sessions, and cuts the connections still open a moment later.
async fn drain_after(
    stop: CancellationToken,
    budgets: Arc<Budgets>,
    grace: std::time::Duration,
    sessions_end: CancellationToken,
    kill: CancellationToken,
) {
    stop.cancelled().await;
    let finished = tokio::time::timeout(grace, budgets.until_idle()).await;
    if finished.is_err() {
        tracing::warn!(
            ?grace,
            "shutdown grace passed with requests still in flight"
        );
    }
    sessions_end.cancel();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    kill.cancel();
}
