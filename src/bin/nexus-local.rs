//! `nexus-local`: the embedded Nexus server as a command.
//!
//! ```text
//! nexus-local [--bind ADDR] [--api-key KEY] [--data DIR] [--context SLUG=DIR]...
//!             [--allow-host HOST]... [--allow-origin ORIGIN]...
//! nexus-local verify --data DIR
//! ```
//!
//! `verify` checks a data directory no server is using (rows against
//! files, orphans, indexes against their chunks, task and turn states),
//! prints its report, and exits with status 0 when it is consistent, 1
//! when it is not, 2 when it could not be checked.
//!
//! Requests whose `Host` is not loopback, the bound address or an allowed
//! host, and browser requests from other origins, get 403; a request that
//! changes state must come from the server's own page or an allowed
//! origin, never one a browser marks cross-site. A data directory
//! is locked: a second server on it exits with status 1 and one line on
//! stderr.
//!
//! Prints the base URL on one line on stdout once every `--context` is
//! curated and the server is ready; logs go to stderr. Stops on Ctrl-C or
//! SIGTERM. Faults for tests come from `NEXUS_LOCAL_FAULT_CUT_AFTER`,
//! `NEXUS_LOCAL_FAULT_FRAME_DELAY_MS` and `NEXUS_LOCAL_FAULT_503`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use nexus_knowql::local::{LocalNexus, verify_data_dir};
use nexus_knowql::serving::stop_signal;

/// The embedded Nexus server (API version 2026-07) on loopback.
#[derive(Debug, Parser)]
#[command(name = "nexus-local", version, args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8808", env = "NEXUS_LOCAL_BIND")]
    bind: SocketAddr,
    /// Require this API key (X-Pinecone-Api-Key or a bearer token from /auth/login).
    #[arg(long, env = "NEXUS_LOCAL_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Keep contexts, sources, indexes and sessions in this directory.
    #[arg(long = "data", value_name = "DIR", env = "NEXUS_LOCAL_DATA")]
    data: Option<PathBuf>,
    /// Create a context from a directory and curate it at start-up (repeatable).
    #[arg(long = "context", value_name = "SLUG=DIR", value_parser = parse_context)]
    contexts: Vec<(String, PathBuf)>,
    /// Let `local` connectors read directories below this one (repeatable;
    /// the first is the one the local OAuth flow connects).
    #[arg(long = "connector-root", value_name = "DIR")]
    connector_roots: Vec<PathBuf>,
    /// Also accept requests with this `Host` (`name` or `name:port`;
    /// repeatable). Loopback names and the bound address are always accepted.
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// Also accept browser requests from this origin (`scheme://host:port`,
    /// `:*` for any port; repeatable), writes included. Other local pages
    /// may always read; only the server's own page may write unless named
    /// here.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    allow_origins: Vec<String>,
    /// Largest accepted upload, in MiB.
    #[arg(long, default_value_t = 256)]
    upload_limit_mb: usize,
    /// Most query turns kept (the oldest ended ones are forgotten first).
    #[arg(long, default_value_t = 10_000)]
    max_queries: u64,
    /// Most MiB of query turns kept: documents, traces and event logs (the
    /// oldest ended turns are forgotten first).
    #[arg(long, default_value_t = 256)]
    max_query_mb: u64,
    /// Most MiB of changes waiting to be written to the state database;
    /// past it, requests that change something get 503 with Retry-After.
    #[arg(long, default_value_t = 64, env = "NEXUS_LOCAL_MAX_WRITE_BACKLOG_MB")]
    max_write_backlog_mb: u64,
    /// Most connections one peer (remote IP address) may hold of the 256
    /// kept open; past it, its new connection replaces its own idle one or
    /// is closed. Loopback clients all share 127.0.0.1.
    #[arg(long, default_value_t = 192)]
    max_connections_per_peer: usize,
    /// Simulate rate limiting: at most N API requests per SECS seconds
    /// (default 60). Past it, 429 `rate_limited` with Retry-After; every
    /// answer carries x-ratelimit-limit-requests, -remaining-requests and
    /// -reset-requests. Every answer carries an x-request-id either way.
    #[arg(long, value_name = "N[/SECS]", value_parser = parse_rate_limit)]
    rate_limit: Option<(u32, Duration)>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// Commands besides serving.
#[derive(Debug, Subcommand)]
enum Command {
    /// Check a data directory that no server is using; exit 1 when it is
    /// inconsistent.
    Verify {
        /// The data directory.
        #[arg(long = "data", value_name = "DIR")]
        data: PathBuf,
    },
}

/// Runs `verify` on `dir`: the report on stdout, the exit status.
fn verify(dir: &std::path::Path) -> ExitCode {
    match verify_data_dir(dir) {
        Ok(report) => {
            println!("{report}");
            if report.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("nexus-local verify: {e}");
            ExitCode::from(2)
        }
    }
}

/// The exit status after the server stopped because its state could not
/// be saved (`EX_TEMPFAIL`: restart it).
const EXIT_NOT_SAVED: u8 = 75;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn parse_context(s: &str) -> Result<(String, PathBuf), String> {
    let (slug, dir) = s
        .split_once('=')
        .ok_or_else(|| format!("expected SLUG=DIR, got {s:?}"))?;
    if slug.is_empty() || dir.is_empty() {
        return Err(format!("expected SLUG=DIR, got {s:?}"));
    }
    Ok((slug.to_owned(), PathBuf::from(dir)))
}

fn parse_rate_limit(s: &str) -> Result<(u32, Duration), String> {
    let (requests, secs) = s.split_once('/').unwrap_or((s, "60"));
    let requests: u32 = requests
        .trim()
        .parse()
        .map_err(|_| format!("expected N[/SECS] with N a whole number from 1, got {s:?}"))?;
    let secs: u64 = secs
        .trim()
        .parse()
        .map_err(|_| format!("expected N[/SECS] with SECS a whole number from 1, got {s:?}"))?;
    if requests == 0 || secs == 0 {
        return Err(format!("N and SECS must be at least 1, got {s:?}"));
    }
    Ok((requests, Duration::from_secs(secs)))
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("nexus_knowql=info"));
    // Colour only on a terminal, and never with NO_COLOR set: a redirected
    // stderr is a log file, not a screen.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Verify { data }) = &args.command {
        return verify(data);
    }
    init_logs(args.log_format);
    let mut builder = LocalNexus::builder()
        .bind(args.bind)
        .upload_limit(args.upload_limit_mb.saturating_mul(1024 * 1024))
        .query_limit(args.max_queries)
        .query_bytes_limit(args.max_query_mb.saturating_mul(1024 * 1024))
        .write_backlog_limit(args.max_write_backlog_mb.saturating_mul(1024 * 1024))
        .max_connections_per_peer(args.max_connections_per_peer)
        .allow_hosts(args.allow_hosts)
        .allow_origins(args.allow_origins)
        .faults_from_env();
    if let Some((requests, window)) = args.rate_limit {
        builder = builder.rate_limit(requests, window);
    }
    if let Some(key) = args.api_key {
        builder = builder.api_key(key);
    }
    if let Some(dir) = args.data {
        builder = builder.data_dir(dir);
    }
    for dir in args.connector_roots {
        builder = builder.connector_root(dir);
    }
    for (slug, dir) in args.contexts {
        builder = builder.context(slug, dir);
    }
    let server = match builder.start().await {
        Ok(s) => s,
        Err(e) => {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("nexus-local: {msg}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", server.base_url());
    let _ = std::io::stdout().flush();
    let failed = tokio::select! {
        () = stop_signal() => false,
        () = server.failed() => true,
    };
    tracing::info!("stopping");
    server.shutdown().await;
    if failed {
        eprintln!(
            "nexus-local: the state could not be saved; stopped (restart on the same data directory)"
        );
        return ExitCode::from(EXIT_NOT_SAVED);
    }
    ExitCode::SUCCESS
}
