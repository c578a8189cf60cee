//! Streamable HTTP transport: [`NexusMcp`] at `/mcp` on axum.
//!
//! Security, as the MCP specification asks of HTTP servers:
//! - a request whose `Origin` is not allowed is refused with 403 (DNS
//!   rebinding); by default only `localhost`, `127.0.0.1` and `[::1]` origins
//!   are allowed, and requests without `Origin` (non-browser clients) pass;
//! - the `Host` header must name an allowed host (loopback names, the bound
//!   address, and any added with [`HttpOptions::allowed_hosts`]);
//! - each request may carry `X-Pinecone-Api-Key`, which
//!   [`KeyPolicy::Caller`](super::nexus::KeyPolicy::Caller) tools use for that
//!   request ([`caller_api_key`]);
//! - [`bind`] warns when the address is not loopback.

use std::net::SocketAddr;
use std::sync::Arc;

use rmcp::model::Extensions;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use super::server::NexusMcp;
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

/// Options of the HTTP transport.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct HttpOptions {
    /// Origins allowed besides [`LOCAL_ORIGINS`], as `scheme://host:port`
    /// (`:*` for any port).
    pub allowed_origins: Vec<String>,
    /// `Host` header values allowed besides loopback names and the bound
    /// address (needed when clients reach the server by a DNS name).
    pub allowed_hosts: Vec<String>,
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
}

/// The caller's API key: the `X-Pinecone-Api-Key` header of the HTTP request
/// that carried this MCP request, if any (never set over stdio).
pub fn caller_api_key(extensions: &Extensions) -> Option<SecretString> {
    let parts = extensions.get::<http::request::Parts>()?;
    let key = parts.headers.get(API_KEY_HEADER)?.to_str().ok()?.trim();
    (!key.is_empty()).then(|| SecretString::from(key.to_owned()))
}

/// The axum router serving `server` at [`MCP_PATH`].
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
        .with_cancellation_token(shutdown);
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    axum::Router::new().route_service(MCP_PATH, service)
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
/// # Errors
/// An I/O failure of the listener.
pub async fn serve(
    listener: tokio::net::TcpListener,
    server: NexusMcp,
    options: &HttpOptions,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let local_addr = listener.local_addr()?;
    let app = router(server, local_addr, options, shutdown.clone());
    tracing::info!(%local_addr, path = MCP_PATH, "serving MCP over Streamable HTTP");
    // Answers go out as several small SSE writes; without TCP_NODELAY, Nagle's
    // algorithm and the client's delayed ACK add about 40 ms to each call.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled_owned().await })
        .await
}
