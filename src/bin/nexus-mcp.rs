//! `nexus-mcp`: the Nexus tools as an MCP server, over stdio or Streamable HTTP.
//!
//! ```text
//! NEXUS_BASE_URL=https://HOST/api PINECONE_API_KEY=... nexus-mcp
//! nexus-mcp --transport http --bind 127.0.0.1:8080
//! ```
//!
//! Over stdio, stdout carries only JSON-RPC; logs go to stderr.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use nexus_knowql::Client;
use nexus_knowql::client::{ENV_API_VERSION, ENV_BASE_URL};
use nexus_knowql::mcp::http::{self, HttpOptions};
use nexus_knowql::mcp::pinecone::{self, IndexProbe, PineconeArgs, PineconeConfig, PineconeServer};
use nexus_knowql::mcp::tasks::TaskSeal;
use nexus_knowql::mcp::{KeyPolicy, NexusMcp, NexusServer, stdio};
use nexus_knowql::serving::stop_signal;
use secrecy::ExposeSecret;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// mimalloc serves the many small allocations of a call from per-thread
/// pages and keeps freed memory for the next call, where the system
/// allocator trims and regrows its heap between calls.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// An MCP server for Claude Desktop, Cursor and other MCP clients: the Nexus
/// tools (list_contexts, query_context, get_query) and the Pinecone retrieval
/// tools, over stdio or Streamable HTTP.
#[derive(Debug, Parser)]
#[command(name = "nexus-mcp", version)]
struct Args {
    /// How MCP clients connect: `stdio` (the client starts this process) or
    /// `http` (Streamable HTTP at /mcp).
    #[arg(long, value_enum, default_value_t = Transport::Stdio, help_heading = "Transport")]
    transport: Transport,

    /// Address to listen on with `--transport http`. Loopback by default;
    /// any other address logs a warning.
    #[arg(long, default_value = http::DEFAULT_BIND, help_heading = "Transport")]
    bind: SocketAddr,

    /// Nexus API base URL, for example https://HOST/api; enables the Nexus
    /// tools. Keys follow one rule for every tool family: over stdio the
    /// configured Pinecone key serves every call; over HTTP each call uses
    /// the caller's X-Pinecone-Api-Key (see --allow-server-key).
    #[arg(long, env = ENV_BASE_URL, help_heading = "Nexus tools")]
    base_url: Option<String>,

    /// Nexus API version to request.
    #[arg(long, env = ENV_API_VERSION, default_value = "2026-07", help_heading = "Nexus tools")]
    api_version: String,

    /// Over HTTP, serve requests that carry no X-Pinecone-Api-Key with this
    /// server's own key(s), for the Nexus and the Pinecone tools alike.
    /// Without it such calls fail with UNAUTHORIZED. Anyone who can reach
    /// the server then acts as the server's project. A request whose header
    /// is present but empty or malformed is always refused (401).
    #[arg(long, help_heading = "Nexus tools")]
    allow_server_key: bool,

    /// Over HTTP, keep no session state, so that several nexus-mcp
    /// processes can serve the same clients behind a load balancer. The
    /// suggest-flow gate of the Pinecone tools is off in this mode.
    #[arg(long, help_heading = "Transport")]
    stateless: bool,

    /// Over HTTP, threads serving connections (default 1). Each thread
    /// accepts connections and serves them on its own single-threaded
    /// runtime, so a connection's requests are handled on the thread that
    /// accepted it; sessions and limits are shared by all threads. A tool
    /// call takes about 0.3 ms of a thread's CPU besides its wait for Nexus,
    /// so more threads help only past a few thousand calls a second, and
    /// hand a session's calls to the thread that created the session.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024), help_heading = "Transport")]
    worker_threads: Option<u16>,

    /// Seconds a connection has to send a complete request head.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "10", help_heading = "HTTP limits and deadlines")]
    header_read_timeout: Duration,

    /// Seconds a request has to send its whole body once its head is in
    /// (408 past it); a request takes a concurrency slot only after that.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "10", help_heading = "HTTP limits and deadlines")]
    body_read_timeout: Duration,

    /// Seconds an open connection may stay without a request in flight
    /// before it is closed (HTTP/1 keep-alive and HTTP/2; HTTP/2 peers are
    /// pinged at this interval too).
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "60", help_heading = "HTTP limits and deadlines")]
    idle_timeout: Duration,

    /// Seconds requests in flight have to finish at shutdown (SIGTERM or
    /// Ctrl-C) before sessions end and connections are cut.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "30", help_heading = "HTTP limits and deadlines")]
    shutdown_grace: Duration,

    /// Seconds a request has until the end of its response (longer than
    /// get_query's longest wait).
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "120", help_heading = "HTTP limits and deadlines")]
    request_timeout: Duration,

    /// Seconds a response may wait for its peer to read what it has to
    /// send (an HTTP/2 peer granting no window, an HTTP/1 peer that stops
    /// reading) before the connection is cut and its slots freed.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "10", help_heading = "HTTP limits and deadlines")]
    write_stall_timeout: Duration,

    /// Seconds between new connections of a client network (an IPv4
    /// address, an IPv6 /64) once one of its connections was cut for making
    /// no progress (a response it did not read): 3 at once, then one per
    /// pace, doubled by each further cut (up to 32 times), forgiven after
    /// 10 minutes without a cut; faster ones are closed at once. 0 turns
    /// the throttle off.
    #[arg(long, value_name = "SECS", value_parser = seconds_or_zero, default_value = "1", help_heading = "HTTP limits and deadlines")]
    reconnect_pace: Duration,

    /// Open connections; more are closed at once.
    #[arg(long, value_name = "N", default_value_t = http::DEFAULT_MAX_CONNECTIONS, help_heading = "HTTP limits and deadlines")]
    max_connections: usize,

    /// Open connections from one client address; more are closed at once
    /// (default: a quarter of --max-connections). Behind a reverse proxy
    /// every client has the proxy's address: set it to --max-connections.
    #[arg(
        long,
        value_name = "N",
        env = "NEXUS_MCP_MAX_CONNECTIONS_PER_PEER",
        help_heading = "HTTP limits and deadlines"
    )]
    max_connections_per_peer: Option<usize>,

    /// Requests handled at once; more get 503.
    #[arg(long, value_name = "N", default_value_t = http::DEFAULT_MAX_CONCURRENT_REQUESTS, help_heading = "HTTP limits and deadlines")]
    max_concurrent_requests: usize,

    /// Requests handled at once on one connection; more get 503.
    #[arg(long, value_name = "N", default_value_t = http::DEFAULT_MAX_REQUESTS_PER_CONNECTION, help_heading = "HTTP limits and deadlines")]
    max_requests_per_connection: usize,

    /// Requests handled at once for one caller (one key, or one client
    /// address without a key); more get 429.
    #[arg(long, value_name = "N", default_value_t = http::DEFAULT_MAX_REQUESTS_PER_CALLER, help_heading = "HTTP limits and deadlines")]
    max_requests_per_caller: usize,

    /// Live MCP sessions. At the cap, an initialize closes the least
    /// recently used idle session; when all are busy it gets 503.
    #[arg(long, value_name = "N", default_value_t = http::DEFAULT_MAX_SESSIONS, help_heading = "HTTP limits and deadlines")]
    max_sessions: usize,

    /// Live MCP sessions of one caller (key, or client address without a
    /// key); an initialize past it gets 429.
    #[arg(long, value_name = "N", default_value_t = http::DEFAULT_MAX_SESSIONS_PER_CALLER, help_heading = "HTTP limits and deadlines")]
    max_sessions_per_caller: usize,

    /// Seconds without a message after which a session is closed.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "600", help_heading = "HTTP limits and deadlines")]
    session_idle_timeout: Duration,

    /// Also accept requests from this browser Origin (scheme://host:port, or
    /// :* for any port). Localhost origins are always accepted. Repeatable.
    #[arg(
        long = "allow-origin",
        value_name = "ORIGIN",
        help_heading = "HTTP access"
    )]
    allow_origins: Vec<String>,

    /// Also accept this Host header value (a DNS name clients use to reach
    /// the server). Loopback names and the bind address are always accepted.
    /// Repeatable.
    #[arg(long = "allow-host", value_name = "HOST", help_heading = "HTTP access")]
    allow_hosts: Vec<String>,

    /// A reverse proxy (an address or CIDR network) whose `Forwarded` /
    /// `X-Forwarded-For` headers name the real client: per-client limits,
    /// key checks and logs then apply to that client, and the proxy's own
    /// connections are not capped per address. Repeatable or
    /// comma-separated.
    #[arg(
        long = "trusted-proxy",
        value_name = "CIDR",
        env = "NEXUS_MCP_TRUSTED_PROXIES",
        value_delimiter = ',',
        help_heading = "HTTP access"
    )]
    trusted_proxies: Vec<http::TrustedProxy>,

    /// Deadline of each Nexus call a tool makes, in milliseconds (`get_query`
    /// may take this plus its `wait_seconds`); a passed deadline is a
    /// `TIMEOUT` tool error.
    #[arg(long, env = "NEXUS_MCP_CALL_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Nexus tools")]
    nexus_call_timeout_ms: u64,

    /// A tool call that takes this many milliseconds or longer is reported
    /// to its client as an MCP log message at `notice` (`get_query` waits
    /// excepted).
    #[arg(long, env = "NEXUS_MCP_SLOW_CALL_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Nexus tools")]
    slow_call_ms: u64,

    /// Log level (error, warn, info, debug, trace); RUST_LOG overrides it.
    #[arg(
        long,
        env = "NEXUS_MCP_LOG_LEVEL",
        default_value = "info",
        help_heading = "Logging"
    )]
    log_level: String,

    /// Secret that seals MCP task handles (at least 16 bytes). Replicas
    /// given the same secret serve each other's tasks (`tasks/get`,
    /// `tasks/cancel`), so tasks work behind a load balancer with
    /// --stateless. Without it, a random secret: this process only.
    #[arg(long, env = "NEXUS_MCP_TASK_SECRET", hide_env_values = true, value_name = "SECRET", value_parser = secret_text, help_heading = "Tasks")]
    task_secret: Option<secrecy::SecretString>,

    /// The secret being rotated out: handles it sealed are still honoured
    /// until they expire; new ones are sealed with --task-secret. To
    /// rotate, deploy with this set to the old secret and --task-secret
    /// to the new one; remove it once --task-ttl has passed.
    #[arg(long, env = "NEXUS_MCP_TASK_SECRET_PREVIOUS", hide_env_values = true, value_name = "SECRET", value_parser = secret_text, requires = "task_secret", help_heading = "Tasks")]
    task_secret_previous: Option<secrecy::SecretString>,

    /// Seconds a task handle is honoured after the task started (its
    /// `ttlMs`).
    #[arg(long, env = "NEXUS_MCP_TASK_TTL", value_name = "SECS", value_parser = seconds, default_value = "3600", help_heading = "Tasks")]
    task_ttl: Duration,

    /// Expose only these tools (comma-separated names, for example
    /// `query_context,get_query`): the others are not listed, and a call to
    /// one is answered as a call to a tool that does not exist. A name no
    /// configured tool has is refused at start. Default: every tool.
    #[arg(
        long,
        env = "NEXUS_MCP_TOOLS",
        value_name = "NAMES",
        value_delimiter = ',',
        help_heading = "Tools"
    )]
    tools: Option<Vec<String>>,

    #[command(flatten)]
    pinecone: PineconeArgs,

    /// Log format on stderr.
    #[arg(long, value_enum, env = "NEXUS_MCP_LOG_FORMAT", default_value_t = LogFormat::Text, help_heading = "Logging")]
    log_format: LogFormat,
}

/// A secret from the command line or the environment.
fn secret_text(text: &str) -> Result<secrecy::SecretString, String> {
    Ok(secrecy::SecretString::from(text.to_owned()))
}

/// A positive number of seconds (fractions allowed).
fn seconds(text: &str) -> Result<Duration, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if value.is_nan() || value <= 0.0 {
        return Err(format!("`{text}` must be more than 0 seconds"));
    }
    Duration::try_from_secs_f64(value).map_err(|e| format!("`{text}`: {e}"))
}

/// [`seconds`], or 0 (off).
fn seconds_or_zero(text: &str) -> Result<Duration, String> {
    if text.trim().parse::<f64>().is_ok_and(|v| v == 0.0) {
        return Ok(Duration::ZERO);
    }
    seconds(text)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Transport {
    Stdio,
    Http,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_logging(args: &Args) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        let level = &args.log_level;
        // rmcp logs each error answer it sends (a keyless or refused
        // request, an unknown task) at WARN: those are answers to callers,
        // counted in the metrics, not the operator's problems.
        EnvFilter::try_new(format!(
            "nexus_knowql={level},nexus_mcp={level},rmcp=warn,rmcp::service=error"
        ))
        .unwrap_or_else(|_| {
            EnvFilter::new("nexus_knowql=info,nexus_mcp=info,rmcp=warn,rmcp::service=error")
        })
    });
    // Logs always go to stderr, without colour codes: over stdio, stdout is
    // the JSON-RPC channel, and stderr usually ends up in a client's log file.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// `--check-indexes`: one probe per index, one line each on stderr; exit 0
/// when every index answered, 1 otherwise. Nothing is served.
async fn check_indexes(config: &PineconeConfig) -> Result<ExitCode, String> {
    let probes = pinecone::check_indexes(config)
        .await
        .map_err(|e| e.to_string())?;
    for probe in &probes {
        eprintln!("{}", probe.line());
    }
    Ok(if probes.iter().all(IndexProbe::is_reachable) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn run(args: Args) -> Result<ExitCode, String> {
    // Over HTTP without --allow-server-key every caller brings a key: the
    // server needs none of its own.
    let callers_bring_keys = args.transport == Transport::Http && !args.allow_server_key;
    let pinecone_config = if callers_bring_keys && args.pinecone.check_indexes != Some(true) {
        args.pinecone.resolve_for_callers()
    } else {
        args.pinecone.resolve()
    }
    .map_err(|e| e.to_string())?;
    if args.pinecone.check_indexes == Some(true) {
        return match &pinecone_config {
            Some(config) => check_indexes(config).await,
            None => Err(
                "--check-indexes: no Pinecone index is configured (set an index, --sources or --config-file)"
                    .to_owned(),
            ),
        };
    }
    let server = build_server(&args, pinecone_config)?;
    match args.transport {
        Transport::Stdio => {
            tracing::info!("serving MCP over stdio");
            let (input, output) = stdio_ends();
            stdio::serve(server, input, output)
                .await
                .map_err(|e| format!("MCP server stopped: {e}"))?;
            Ok(ExitCode::SUCCESS)
        }
        Transport::Http => serve_http(args, server).await,
    }
}

/// The MCP server `args` describe: the Nexus tools when a base URL is
/// set, the Pinecone tools when `pinecone_config` is.
fn build_server(args: &Args, pinecone_config: Option<PineconeConfig>) -> Result<NexusMcp, String> {
    let client = match args.base_url.as_deref().filter(|u| !u.trim().is_empty()) {
        Some(url) => {
            let mut builder = Client::builder()
                .base_url(url)
                .api_version(args.api_version.as_str());
            if let Some(key) = &args.pinecone.api_key {
                builder = builder.api_key(key.expose_secret());
            }
            Some(builder.build().map_err(|e| e.to_string())?)
        }
        None => None,
    };
    let stateless = args.transport == Transport::Http && args.stateless;
    let pinecone = match pinecone_config {
        Some(mut config) => {
            if stateless && config.suggest_flow {
                // A replica cannot see suggestions made on another: enforcing
                // the gate would refuse valid calls depending on routing.
                tracing::info!("--stateless: the suggest-flow gate is off");
                config.suggest_flow = false;
            }
            Some(PineconeServer::new(config).map_err(|e| e.to_string())?)
        }
        None => None,
    };
    if client.is_none() && pinecone.is_none() {
        return Err(format!(
            "nothing to serve: set {ENV_BASE_URL} (Nexus tools) or a Pinecone index (Pinecone tools)"
        ));
    }
    let keys = match args.transport {
        Transport::Stdio => KeyPolicy::Configured,
        Transport::Http => KeyPolicy::Caller {
            fallback_to_configured: args.allow_server_key,
        },
    };
    let mut seal = match &args.task_secret {
        Some(secret) => TaskSeal::new(secret.expose_secret().as_bytes())
            .map_err(|e| format!("--task-secret: {e}"))?,
        None => TaskSeal::random(),
    };
    if let Some(previous) = &args.task_secret_previous {
        seal = seal
            .with_previous(previous.expose_secret().as_bytes())
            .map_err(|e| format!("--task-secret-previous: {e}"))?;
    }
    let mut server = NexusMcp::new()
        .with_slow_call_threshold(Duration::from_millis(args.slow_call_ms))
        .with_task_seal(seal.with_ttl(args.task_ttl));
    if let Some(client) = client {
        server = server.with_nexus(
            NexusServer::new(client)
                .with_key_policy(keys)
                .with_call_timeout(Duration::from_millis(args.nexus_call_timeout_ms)),
        );
    }
    if let Some(pinecone) = pinecone {
        server = server.with_pinecone(pinecone.with_key_policy(keys));
    }
    if let Some(names) = &args.tools {
        server = server
            .with_tool_allow_list(names)
            .map_err(|e| format!("--tools: {e}"))?;
    }
    Ok(server)
}

/// Serves `server` over Streamable HTTP as `args` say, until Ctrl-C or
/// SIGTERM.
async fn serve_http(args: Args, server: NexusMcp) -> Result<ExitCode, String> {
    if args.allow_server_key {
        tracing::warn!(
            "--allow-server-key: requests without X-Pinecone-Api-Key use this server's key"
        );
    }
    if args.session_idle_timeout <= args.request_timeout {
        tracing::warn!(
            "--session-idle-timeout is not longer than --request-timeout: a session may \
             expire while one of its requests is still running"
        );
    }
    let mut options = HttpOptions::default()
        .allowed_origins(args.allow_origins)
        .allowed_hosts(args.allow_hosts)
        .trusted_proxies(args.trusted_proxies)
        .stateless(args.stateless)
        .header_read_timeout(args.header_read_timeout)
        .body_read_timeout(args.body_read_timeout)
        .idle_timeout(args.idle_timeout)
        .shutdown_grace(args.shutdown_grace)
        .max_requests_per_caller(args.max_requests_per_caller)
        .max_sessions_per_caller(args.max_sessions_per_caller)
        .request_timeout(args.request_timeout)
        .write_stall_timeout(args.write_stall_timeout)
        .reconnect_pace(args.reconnect_pace)
        .max_connections(args.max_connections)
        .max_concurrent_requests(args.max_concurrent_requests)
        .max_requests_per_connection(args.max_requests_per_connection)
        .max_sessions(args.max_sessions)
        .session_idle_timeout(args.session_idle_timeout)
        .threads(args.worker_threads.map_or(1, usize::from));
    if let Some(per_peer) = args.max_connections_per_peer {
        options = options.max_connections_per_peer(per_peer);
    }
    let options = options.max_connections(fitting_open_files(args.max_connections));
    let listener = http::bind(args.bind)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.bind))?;
    let shutdown = CancellationToken::new();
    let signalled = shutdown.clone();
    tokio::spawn(async move {
        stop_signal().await;
        tracing::info!("shutting down");
        signalled.cancel();
    });
    http::serve(listener, server, &options, shutdown)
        .await
        .map_err(|e| format!("HTTP server failed: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

/// File descriptors kept for everything but client connections: the
/// listener, upstream connections, logs.
const RESERVED_FILES: usize = 64;

/// `max_connections`, or less when the process's open-file limit cannot
/// hold that many connections (with a warning saying so): past the limit,
/// `accept` fails instead of the connection cap answering.
fn fitting_open_files(max_connections: usize) -> usize {
    let Some(limit) = open_file_limit() else {
        return max_connections;
    };
    let room = limit.saturating_sub(RESERVED_FILES).max(1);
    if max_connections > room {
        tracing::warn!(
            open_file_limit = limit,
            max_connections,
            capped_at = room,
            "the open-file limit cannot hold --max-connections connections: capping them; \
             raise `ulimit -n` or lower --max-connections"
        );
        return room;
    }
    max_connections
}

/// The soft limit of open files (Linux: `/proc/self/limits`).
fn open_file_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The reading end of stdio.
type StdinEnd = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
/// The writing end of stdio.
type StdoutEnd = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

/// Stdin and stdout, each read or written on the runtime's own thread when
/// it is a pipe (as when a client starts this process with pipes) or a Unix
/// socket (as Node-based clients, whose child stdio is a socket pair):
/// each message then costs no hand-off to a blocking thread and back.
/// Anything else (a terminal, a file) goes through tokio's thread-backed
/// stdio.
fn stdio_ends() -> (StdinEnd, StdoutEnd) {
    let (input, output) = reactor_ends();
    (
        input.unwrap_or_else(|| Box::new(tokio::io::stdin())),
        output.unwrap_or_else(|| Box::new(tokio::io::stdout())),
    )
}

/// What kind of stream a standard descriptor is.
#[cfg(unix)]
enum StdioKind {
    Pipe,
    UnixSocket,
}

/// A non-blocking copy of `fd` with its kind, when it is a pipe or a Unix
/// stream socket.
#[cfg(unix)]
fn reactor_fd(fd: std::os::fd::BorrowedFd<'_>) -> Option<(std::os::fd::OwnedFd, StdioKind)> {
    use std::os::unix::fs::FileTypeExt;
    let owned = fd.try_clone_to_owned().ok()?;
    let file_type = std::fs::File::from(owned.try_clone().ok()?)
        .metadata()
        .ok()?
        .file_type();
    if file_type.is_fifo() {
        return Some((owned, StdioKind::Pipe));
    }
    if file_type.is_socket() {
        // `local_addr` fails for a socket that is not a Unix one.
        let socket = std::os::unix::net::UnixStream::from(owned);
        socket.local_addr().ok()?;
        socket.set_nonblocking(true).ok()?;
        return Some((socket.into(), StdioKind::UnixSocket));
    }
    None
}

/// `fd` served on the runtime's own thread: opened by `pipe` when it is a
/// pipe, wrapped by `socket` when it is a Unix stream socket. `None` when
/// it is neither, or when that fails (it is then put back in blocking
/// mode).
#[cfg(unix)]
fn reactor_end<E>(
    fd: std::os::fd::BorrowedFd<'_>,
    pipe: impl FnOnce(std::os::fd::OwnedFd) -> std::io::Result<E>,
    socket: impl FnOnce(tokio::net::UnixStream) -> E,
) -> Option<E> {
    let end = match reactor_fd(fd)? {
        (owned, StdioKind::Pipe) => pipe(owned).ok(),
        (owned, StdioKind::UnixSocket) => tokio::net::UnixStream::from_std(owned.into())
            .ok()
            .map(socket),
    };
    if end.is_none() {
        blocking_again(fd);
    }
    end
}

/// Stdin and stdout on the runtime's own thread, each when it can be.
#[cfg(unix)]
fn reactor_ends() -> (Option<StdinEnd>, Option<StdoutEnd>) {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe::{Receiver, Sender};
    let input = reactor_end(
        std::io::stdin().as_fd(),
        |fd| Ok(Box::new(Receiver::from_owned_fd(fd)?) as StdinEnd),
        |s| Box::new(s) as StdinEnd,
    );
    let output = reactor_end(
        std::io::stdout().as_fd(),
        |fd| Ok(Box::new(Sender::from_owned_fd(fd)?) as StdoutEnd),
        |s| Box::new(s) as StdoutEnd,
    );
    (input, output)
}

/// Puts `fd` back in blocking mode, for tokio's thread-backed stdio, when
/// it could not be served on the reactor after all.
#[cfg(unix)]
fn blocking_again(fd: std::os::fd::BorrowedFd<'_>) {
    if let Ok(copy) = fd.try_clone_to_owned() {
        // Sets the mode of the shared open file, whatever its type.
        let _ = std::os::unix::net::UnixStream::from(copy).set_nonblocking(false);
    }
}

#[cfg(not(unix))]
fn reactor_ends() -> (Option<StdinEnd>, Option<StdoutEnd>) {
    (None, None)
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(&args);
    if args.transport == Transport::Stdio && args.worker_threads.is_some() {
        tracing::warn!(
            "--worker-threads applies to --transport http; stdio is served on one thread"
        );
    }
    // Over stdio there is one client on one connection, and over HTTP each
    // serving thread runs its own single-threaded runtime (see
    // `HttpOptions::threads`): a request is handled on the thread that read
    // it, without handing it to another.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nexus-mcp: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nexus-mcp: {e}");
            ExitCode::FAILURE
        }
    }
}
