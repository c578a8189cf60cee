//! [`HttpOptions`]: the limits and timeouts of the HTTP transport, and
//! their defaults.

use std::time::Duration;

/// The path the MCP endpoint is served at.
pub const MCP_PATH: &str = "/mcp";

/// The default bind address (loopback only).
pub const DEFAULT_BIND: &str = "127.0.0.1:8080";

/// Origins allowed by default: local pages on any port.
pub const LOCAL_ORIGINS: &[&str] = crate::host_origin::LOCAL_ORIGINS;

/// The largest JSON-RPC request body accepted.
pub(super) const MAX_REQUEST_BODY_BYTES: usize = 1024 * 1024;

/// Default [`HttpOptions::shutdown_grace`].
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Default [`HttpOptions::body_read_timeout`].
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`HttpOptions::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default [`HttpOptions::max_requests_per_caller`].
pub const DEFAULT_MAX_REQUESTS_PER_CALLER: usize = 32;
/// Default [`HttpOptions::max_sessions_per_caller`].
pub const DEFAULT_MAX_SESSIONS_PER_CALLER: usize = 100;

/// Default [`HttpOptions::header_read_timeout`].
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`HttpOptions::request_timeout`]: longer than the longest
/// `get_query` wait (60 s) plus the per-call Nexus deadline.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Default [`HttpOptions::write_stall_timeout`].
pub const DEFAULT_WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`HttpOptions::reconnect_pace`].
pub const DEFAULT_RECONNECT_PACE: Duration = Duration::from_secs(1);
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
    /// served statelessly either way. A [`PineconeServer`](crate::mcp::pinecone::PineconeServer)
    /// served this way should have its suggest-flow gate off
    /// (`PineconeConfig::suggest_flow = false`), as `nexus-mcp --stateless`
    /// does: a replica cannot see suggestions made on another.
    pub stateless: bool,
    /// Time a connection has to send a complete request head: its first
    /// (whatever the protocol, HTTP/2 included) and each later HTTP/1 one.
    pub header_read_timeout: Duration,
    /// Time a request has to send its whole body once its head is in; more
    /// gets 408. A request takes a concurrency slot only after its body.
    pub body_read_timeout: Duration,
    /// An open connection with no request in flight for this long is
    /// closed (HTTP/1 keep-alive and HTTP/2 alike; HTTP/2 peers are also
    /// pinged at this interval and cut when they do not answer).
    pub idle_timeout: Duration,
    /// Time a request has from its head to the end of its response
    /// (SSE streams included).
    pub request_timeout: Duration,
    /// How long a response may wait for its peer to take what it has to
    /// send (an HTTP/2 peer that grants no flow-control window, an HTTP/1
    /// peer that stops reading) before its connection is cut, which frees
    /// its slots. A long poll waiting for its own data is not stalled.
    pub write_stall_timeout: Duration,
    /// The reconnect throttle: a client network (an IPv4 address, an IPv6
    /// /64) whose connection was cut for making no progress (a response
    /// it did not read) may open 3 connections at once, then one per this
    /// pace, doubled by each further cut (up to 32 times), until it goes
    /// 10 minutes without a cut; faster ones are closed at once. Networks
    /// never cut are not throttled. A trusted proxy's connections are not
    /// either: behind it the client each request is forwarded for is, its
    /// requests past the pace answered 503. Zero turns the throttle off.
    pub reconnect_pace: Duration,
    /// Open connections; more are closed at once.
    pub max_connections: usize,
    /// Open connections from one client address; more are closed at once.
    /// `None`: a quarter of [`HttpOptions::max_connections`] (at least 1).
    /// Behind a reverse proxy every client has the proxy's address: raise
    /// it to [`HttpOptions::max_connections`] there.
    pub max_connections_per_peer: Option<usize>,
    /// Requests being handled at once over all connections, counted until
    /// their response starts (an SSE stream then stays bounded by its
    /// connection and the request deadline); more get 503.
    pub max_concurrent_requests: usize,
    /// Requests being handled at once on one connection (and HTTP/2
    /// streams per connection); more get 503.
    pub max_requests_per_connection: usize,
    /// Requests being handled at once for one caller (one key, or one
    /// client address for requests without a key); more get 429.
    pub max_requests_per_caller: usize,
    /// Live MCP sessions. An `initialize` past it closes the least
    /// recently used session that has no request in flight; when every
    /// session is busy, it gets 503.
    pub max_sessions: usize,
    /// Live MCP sessions of one caller (key, or client address without a
    /// key); an `initialize` past it gets 429.
    pub max_sessions_per_caller: usize,
    /// At shutdown, how long requests in flight may take to finish before
    /// sessions and connections are closed.
    pub shutdown_grace: Duration,
    /// A session without any message for this long is closed.
    pub session_idle_timeout: Duration,
    /// Threads accepting and serving connections, each on its own
    /// single-threaded runtime (the caller's runtime is one of them). A
    /// connection stays on the thread that accepted it, so its requests are
    /// handled without a hand-off to another thread (a session's messages
    /// still go through the thread that created the session). Default 1.
    pub threads: usize,
    /// Reverse proxies whose `Forwarded` / `X-Forwarded-For` headers name
    /// the real client: fairness, budgets, key checks and anonymous limits
    /// then apply per real client, and connections from these proxies are
    /// not capped per address. Headers from anyone else are ignored.
    pub trusted_proxies: Vec<super::TrustedProxy>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            stateless: false,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            write_stall_timeout: DEFAULT_WRITE_STALL_TIMEOUT,
            reconnect_pace: DEFAULT_RECONNECT_PACE,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: None,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            max_requests_per_connection: DEFAULT_MAX_REQUESTS_PER_CONNECTION,
            max_requests_per_caller: DEFAULT_MAX_REQUESTS_PER_CALLER,
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_sessions_per_caller: DEFAULT_MAX_SESSIONS_PER_CALLER,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            session_idle_timeout: DEFAULT_SESSION_IDLE_TIMEOUT,
            threads: 1,
            trusted_proxies: Vec::new(),
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

    /// Sets the body-read deadline.
    pub fn body_read_timeout(mut self, timeout: Duration) -> Self {
        self.body_read_timeout = timeout;
        self
    }

    /// Sets the idle time after which a connection is closed.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Sets the limit of requests handled at once per caller (at least 1).
    pub fn max_requests_per_caller(mut self, max: usize) -> Self {
        self.max_requests_per_caller = max.max(1);
        self
    }

    /// Sets the limit of live sessions per caller (at least 1).
    pub fn max_sessions_per_caller(mut self, max: usize) -> Self {
        self.max_sessions_per_caller = max.max(1);
        self
    }

    /// Sets the time requests in flight have to finish at shutdown.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
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

    /// Sets the limit of open connections from one client address (at
    /// least 1).
    pub fn max_connections_per_peer(mut self, max: usize) -> Self {
        self.max_connections_per_peer = Some(max.max(1));
        self
    }

    /// The limit of open connections from one client address in effect.
    pub fn effective_max_connections_per_peer(&self) -> usize {
        self.max_connections_per_peer
            .unwrap_or(self.max_connections / 4)
            .clamp(1, self.max_connections.max(1))
    }

    /// Sets how long a response may wait for its peer to read before the
    /// connection is cut (at least 1 s; see
    /// [`HttpOptions::write_stall_timeout`]).
    pub fn write_stall_timeout(mut self, timeout: Duration) -> Self {
        self.write_stall_timeout = timeout.max(Duration::from_secs(1));
        self
    }

    /// Sets the reconnect throttle's pace (see
    /// [`HttpOptions::reconnect_pace`]; zero turns it off).
    ///
    /// ```
    /// use std::time::Duration;
    /// use nexus_knowql::mcp::http::HttpOptions;
    /// let options = HttpOptions::default().reconnect_pace(Duration::ZERO);
    /// assert!(options.reconnect_pace.is_zero());
    /// ```
    pub fn reconnect_pace(mut self, pace: Duration) -> Self {
        self.reconnect_pace = pace;
        self
    }

    /// Trusts the forwarding headers of connections from `proxies` (see
    /// [`HttpOptions::trusted_proxies`]).
    ///
    /// ```
    /// use nexus_knowql::mcp::http::HttpOptions;
    /// let options = HttpOptions::default().trusted_proxies(vec!["10.0.0.0/8".parse().unwrap()]);
    /// assert_eq!(options.trusted_proxies.len(), 1);
    /// ```
    pub fn trusted_proxies(mut self, proxies: Vec<super::TrustedProxy>) -> Self {
        self.trusted_proxies = proxies;
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
