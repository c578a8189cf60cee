//! An embedded Nexus server for offline development, examples and tests.
//!
//! [`LocalNexus`] serves the 2026-07 wire contract on loopback: contexts,
//! source uploads (archives expanded), curation as a task, knowledge,
//! tasks, sessions and query turns (synchronous, streamed over SSE, or in
//! the background, with resumable event logs). Retrieval is lexical (BM25
//! with tantivy over chunks cut at Markdown headings) and answers are
//! extractive: sentences quoted from the sources, with citations, attributed
//! to the model `local-extractive`. Every one of the spec's 58 operations
//! is served; those that stand for hosted machinery (statistics, manifests,
//! fork, the curation ledger, the explore, profile and optimize workflows,
//! task files, connectors) are simulated deterministically from the local
//! state. A path outside the API answers 404, a method a path does not
//! take 405, both with the API's error envelope.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use nexus_knowql::local::LocalNexus;
//!
//! let dir = std::env::temp_dir().join(format!("nexus-local-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! std::fs::write(dir.join("tea.md"), "# Tea\n\nGreen tea steeps for two minutes.\n")?;
//!
//! let server = LocalNexus::builder().context("kitchen", &dir).start().await?;
//! let client: nexus_knowql::Client = server.client()?;
//! let session = client.session(["kitchen"]).build()?;
//! let answer = session.ask("How long does green tea steep?").send().await?;
//! assert!(answer.answer_text().contains("two minutes"));
//! assert_eq!(answer.model.as_deref(), Some("local-extractive"));
//! server.shutdown().await;
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```
//!
//! The binary `nexus-local` runs the same server from the command line.
//!
//! On a developer's machine the server refuses requests whose `Host` is not
//! loopback, the bound address or an allowed host, and browser requests from
//! other origins (403). With a data directory, files are written durably,
//! the directory is locked against a second server, and a crash loses
//! nothing that was acknowledged.
//!
//! Layout, one way from top to bottom: `routes/` has one file per
//! resource (auth, contexts, context_ops, sources, files, knowledge, tasks,
//! task_files, queries, sessions, project, connectors) and calls the
//! services: `import` (with `expand`, archive expansion), `curate`, `turn`
//! and `workflows` (explore, profile, optimize), the background work, and
//! `connectors` (the local directory connector). They call the `store`
//! (records in memory, written row by row), which calls `records`, `ledger`
//! (what curation recorded), `paths`, `migrate` and `db` (the SQLite state
//! database and its single writer thread). `durable` writes files
//! crash-safely; `serve` is the connection loop, which applies the crate's
//! Host/Origin rule.

mod answer;
mod connectors;
mod constant_time;
mod curate;
mod db;
mod durable;
mod error;
mod events;
mod expand;
mod faults;
mod import;
mod ledger;
mod manifest_bounds;
mod migrate;
mod paths;
mod records;
mod routes;
#[cfg(test)]
mod scratch_dir;
mod search;
mod seed;
mod serve;
mod state;
mod store;
mod turn;
mod verify;
mod workflows;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use faults::{
    ENV_FAILPOINTS, ENV_FAULT_503, ENV_FAULT_CUT_AFTER, ENV_FAULT_FRAME_DELAY_MS,
    ENV_FAULT_FROZEN_CLOCK_MS,
};

pub use verify::{VerifyReport, verify_data_dir};

use state::{AppState, Config};
use store::Store;

/// The model every local answer names.
pub const LOCAL_MODEL: &str = store::LOCAL_MODEL;

/// The default most bytes of changes waiting for the database writer.
const DEFAULT_WRITE_BACKLOG: u64 = 64 * 1024 * 1024;

/// How long shutdown waits for connections and background work.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why a [`LocalNexus`] could not start or seed a context.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The I/O failure.
        #[source]
        source: std::io::Error,
    },
    /// The data directory could not be opened or loaded.
    #[error("cannot use the data directory {path}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The I/O failure.
        #[source]
        source: std::io::Error,
    },
    /// Another server uses the data directory (it holds the directory's lock).
    #[error("the data directory {path} is in use by another nexus-local server (lock file {lock})", path = .path.display(), lock = .lock.display())]
    DataDirLocked {
        /// The directory.
        path: PathBuf,
        /// Its lock file.
        lock: PathBuf,
    },
    /// The directory is not a nexus-local data directory (it holds files
    /// the server did not make); nothing in it was changed.
    #[error("refusing the data directory {path}: {why}; use an empty or new directory", path = .path.display())]
    DataDirForeign {
        /// The directory.
        path: PathBuf,
        /// What makes it foreign.
        why: String,
    },
    /// Acknowledged data the data directory's state names is missing (its
    /// state database while contexts' files are there, recorded source
    /// files): the start is refused rather than forget it, and nothing was
    /// changed. `why` says what is missing and how to recover.
    #[error("refusing to start on the data directory {path}: {why}", path = .path.display())]
    DataDirDamaged {
        /// The directory.
        path: PathBuf,
        /// What is missing, and how to recover.
        why: String,
    },
    /// The files of a context could not be read or stored.
    #[error("context {slug:?}: cannot {action} {path}", path = .path.display())]
    ContextFiles {
        /// The context's slug.
        slug: String,
        /// What was being done: `read` (its directory) or `store` (its
        /// sources).
        action: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The I/O failure.
        #[source]
        source: std::io::Error,
    },
    /// A context could not be created, filled or curated.
    #[error("context {slug:?}: {message}")]
    Context {
        /// The context's slug.
        slug: String,
        /// What went wrong.
        message: String,
    },
}

/// A running local Nexus server. Stops on [`LocalNexus::shutdown`] or drop.
pub struct LocalNexus {
    addr: SocketAddr,
    base_url: String,
    state: Arc<AppState>,
    /// Stops accepting connections (graceful shutdown of the HTTP server).
    stop: CancellationToken,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for LocalNexus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalNexus")
            .field("base_url", &self.base_url)
            .field(
                "auth",
                &self.state.config.api_key.as_ref().map(|_| "[redacted]"),
            )
            .field("data_dir", &self.state.config.data_dir)
            .finish()
    }
}

impl LocalNexus {
    /// A builder with the defaults: `127.0.0.1:0`, no key, in memory.
    pub fn builder() -> LocalNexusBuilder {
        LocalNexusBuilder::default()
    }

    /// Starts a server with the defaults.
    ///
    /// # Errors
    /// [`StartError::Bind`] when loopback cannot be bound.
    pub async fn start() -> Result<LocalNexus, StartError> {
        Self::builder().start().await
    }

    /// The base URL, `http://127.0.0.1:PORT/api`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A [`Client`](crate::Client) for this server (with its API key, if any).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`](crate::Error::InvalidRequest) if the client
    /// cannot be built.
    pub fn client(&self) -> crate::Result<crate::Client> {
        let mut b = crate::Client::builder().base_url(&self.base_url);
        if let Some(key) = &self.state.config.api_key {
            b = b.api_key(key.clone());
        }
        b.build()
    }

    /// Resolves if the server stopped itself because its state could not
    /// be saved (a full disk, an I/O error, the database locked by another
    /// program for too long). It then answers every request with 503
    /// (`not_saved`) until shut down; the data directory holds everything
    /// it acknowledged, so restart it there.
    pub async fn failed(&self) {
        self.state.store.failed().await;
    }

    /// Answers the next `n` requests with 503 and `Retry-After`.
    pub fn fail_next_requests(&self, n: usize) {
        self.state.faults.fail_next(n);
    }

    /// Creates the context `slug` (kind `search`) unless it exists, stores
    /// every non-hidden file below `dir` as its sources (paths relative to
    /// `dir`), and curates it, waiting until it is queryable.
    ///
    /// # Errors
    /// [`StartError::ContextFiles`] when the directory cannot be read (or
    /// holds more than the context limit: an error of kind `FileTooLarge`)
    /// or its files cannot be stored; [`StartError::Context`] when it holds
    /// no file or curation fails.
    pub async fn add_context(&self, slug: &str, dir: impl AsRef<Path>) -> Result<(), StartError> {
        seed::seed_context(&self.state, slug, dir.as_ref()).await
    }

    /// Stops the server: running turns and jobs are cancelled, connections
    /// closed, and state written to the data directory.
    pub async fn shutdown(mut self) {
        self.stop_now().await;
    }

    async fn stop_now(&mut self) {
        self.state.shutdown.cancel();
        self.stop.cancel();
        if let Some(server) = self.server.take() {
            let abort = server.abort_handle();
            if tokio::time::timeout(SHUTDOWN_GRACE, server).await.is_err() {
                abort.abort();
            }
        }
        self.state.tracker.close();
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, self.state.tracker.wait()).await;
        // Writes what is pending and stops the database writer.
        let store = self.state.store.clone();
        let _ = tokio::task::spawn_blocking(move || store.close()).await;
    }
}

impl Drop for LocalNexus {
    fn drop(&mut self) {
        // Without an async context, stop everything at once.
        self.state.shutdown.cancel();
        self.stop.cancel();
        if let Some(server) = self.server.take() {
            server.abort();
        }
        self.state.tracker.close();
    }
}

/// Builds a [`LocalNexus`].
#[must_use]
#[derive(Debug, Clone)]
pub struct LocalNexusBuilder {
    bind: SocketAddr,
    api_key: Option<String>,
    data_dir: Option<PathBuf>,
    upload_limit: usize,
    json_limit: usize,
    context_bytes_limit: u64,
    events_per_query: usize,
    event_bytes_per_query: usize,
    query_limit: u64,
    query_bytes_limit: u64,
    write_backlog_limit: u64,
    header_read_timeout: Duration,
    max_connections_per_peer: usize,
    chunk_chars: usize,
    cut_after_frames: Option<usize>,
    frame_delay: Duration,
    fail_next: usize,
    retry_after_secs: u64,
    contexts: Vec<(String, PathBuf)>,
    connector_roots: Vec<PathBuf>,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
    rate_limit: Option<(u32, Duration)>,
}

impl Default for LocalNexusBuilder {
    fn default() -> Self {
        LocalNexusBuilder {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            api_key: None,
            data_dir: None,
            upload_limit: 256 * 1024 * 1024,
            json_limit: 1024 * 1024,
            context_bytes_limit: 1024 * 1024 * 1024,
            events_per_query: 10_000,
            event_bytes_per_query: 16 * 1024 * 1024,
            query_limit: 10_000,
            query_bytes_limit: 256 * 1024 * 1024,
            write_backlog_limit: DEFAULT_WRITE_BACKLOG,
            header_read_timeout: serve::HEADER_READ_TIMEOUT,
            max_connections_per_peer: serve::DEFAULT_MAX_PER_PEER,
            chunk_chars: search::DEFAULT_CHUNK_CHARS,
            cut_after_frames: None,
            frame_delay: Duration::ZERO,
            fail_next: 0,
            retry_after_secs: 1,
            contexts: Vec::new(),
            connector_roots: Vec::new(),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            rate_limit: None,
        }
    }
}

impl LocalNexusBuilder {
    /// The address to listen on (default `127.0.0.1:0`, a free port).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// Lets `local` connectors read directories below `dir` (repeatable;
    /// the first is the one the local OAuth flow connects). Without any,
    /// no connector can be created.
    pub fn connector_root(mut self, dir: impl Into<PathBuf>) -> Self {
        self.connector_roots.push(dir.into());
        self
    }

    /// Requires this key as `X-Pinecone-Api-Key`, or a bearer token from
    /// `POST /auth/login`. Without it every caller is accepted.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Keeps contexts, sources, indexes, sessions and turns in `dir` across
    /// restarts (default: memory only). The directory must be new, empty
    /// or one the server made (it keeps a `.nexus-local` marker there); any
    /// other folder is refused untouched with [`StartError::DataDirForeign`].
    /// The server locks the directory: a second server on it fails to
    /// start with [`StartError::DataDirLocked`].
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// Also answers requests whose `Host` is one of `hosts` (`name` or
    /// `name:port`). Loopback names and the bound address are always
    /// accepted; any other `Host` gets 403, which defeats DNS rebinding.
    pub fn allow_hosts(mut self, hosts: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.allowed_hosts.extend(hosts.into_iter().map(Into::into));
        self
    }

    /// Also answers browser requests from these origins, writes included
    /// (`scheme://host:port`, `:*` for any port). Other local pages may only
    /// read; a request with any other `Origin` gets 403.
    pub fn allow_origins(mut self, origins: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.allowed_origins
            .extend(origins.into_iter().map(Into::into));
        self
    }

    /// The largest accepted upload in bytes (default 256 MiB); larger ones get 413.
    pub fn upload_limit(mut self, bytes: usize) -> Self {
        self.upload_limit = bytes;
        self
    }

    /// The largest accepted JSON body in bytes (default 1 MiB).
    pub fn json_limit(mut self, bytes: usize) -> Self {
        self.json_limit = bytes;
        self
    }

    /// The most source bytes one context may hold (default 1 GiB).
    pub fn context_bytes_limit(mut self, bytes: u64) -> Self {
        self.context_bytes_limit = bytes;
        self
    }

    /// The most events one turn's log keeps (default 10 000).
    pub fn events_per_query(mut self, n: usize) -> Self {
        self.events_per_query = n;
        self
    }

    /// The most bytes of events one turn's log keeps while it runs
    /// (default 16 MiB); past it the turn ends as failed, like past
    /// [`events_per_query`](Self::events_per_query).
    pub fn event_bytes_per_query(mut self, bytes: usize) -> Self {
        self.event_bytes_per_query = bytes;
        self
    }

    /// The most query turns kept (default 10 000); the oldest ended ones
    /// are forgotten first.
    pub fn query_limit(mut self, n: u64) -> Self {
        self.query_limit = n;
        self
    }

    /// The most bytes of query turns kept: documents, traces and event
    /// logs (default 256 MiB); the oldest ended turns are forgotten first.
    pub fn query_bytes_limit(mut self, bytes: u64) -> Self {
        self.query_bytes_limit = bytes;
        self
    }

    /// The most bytes of changes waiting to be written to the state
    /// database (default 64 MiB); past it, requests that change something
    /// get 503 with `Retry-After` before anything is applied.
    pub fn write_backlog_limit(mut self, bytes: u64) -> Self {
        self.write_backlog_limit = bytes;
        self
    }

    /// How long a client has to send a request's head before its
    /// connection is closed (default 10 s).
    pub fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// The most connections one peer (remote IP address) may hold of the
    /// 256 the server keeps open (default 192, clamped to 1..=256). Past
    /// it, the peer's new connection replaces its own connection idle the
    /// longest, or is closed at once when all of them have a request open;
    /// other peers keep the remaining slots. Loopback clients all share
    /// one address.
    pub fn max_connections_per_peer(mut self, n: usize) -> Self {
        self.max_connections_per_peer = n;
        self
    }

    /// The chunk size curation aims for, in characters (default 1200).
    pub fn chunk_chars(mut self, n: usize) -> Self {
        self.chunk_chars = n;
        self
    }

    /// Creates and curates a context from a directory at start-up (see
    /// [`LocalNexus::add_context`]). May be called several times.
    pub fn context(mut self, slug: impl Into<String>, dir: impl Into<PathBuf>) -> Self {
        self.contexts.push((slug.into(), dir.into()));
        self
    }

    /// Fault: closes every event stream's connection after `frames` frames.
    /// A resumed stream replays its `Last-Event-ID` frame again, so use 2 or
    /// more for a client that resumes to make progress.
    pub fn cut_streams_after(mut self, frames: usize) -> Self {
        self.cut_after_frames = Some(frames);
        self
    }

    /// Fault: pauses this long between the events of a running turn (and
    /// before an import or curation ends), so turns can be watched,
    /// cancelled or overlapped.
    pub fn frame_delay(mut self, delay: Duration) -> Self {
        self.frame_delay = delay;
        self
    }

    /// Simulates rate limiting: at most `requests` API requests in each
    /// `window` (from the first request of the window); past it, 429 with
    /// code `rate_limited` and `Retry-After`. Every API answer then carries
    /// `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests` and
    /// `x-ratelimit-reset-requests`. Off by default; `requests` or `window`
    /// of zero turns it off.
    pub fn rate_limit(mut self, requests: u32, window: Duration) -> Self {
        self.rate_limit = (requests > 0 && !window.is_zero()).then_some((requests, window));
        self
    }

    /// Fault: answers the first `n` requests with 503 and `Retry-After`.
    pub fn fail_first_requests(mut self, n: usize) -> Self {
        self.fail_next = n;
        self
    }

    /// The `Retry-After` seconds of injected 503s (default 1).
    pub fn retry_after_secs(mut self, secs: u64) -> Self {
        self.retry_after_secs = secs;
        self
    }

    /// Reads the fault settings from `NEXUS_LOCAL_FAULT_CUT_AFTER`,
    /// `NEXUS_LOCAL_FAULT_FRAME_DELAY_MS` and `NEXUS_LOCAL_FAULT_503`
    /// (unset or unparsable variables change nothing).
    pub fn faults_from_env(mut self) -> Self {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let Some(n) = var(ENV_FAULT_CUT_AFTER) {
            self.cut_after_frames = Some(n as usize);
        }
        if let Some(ms) = var(ENV_FAULT_FRAME_DELAY_MS) {
            self.frame_delay = Duration::from_millis(ms);
        }
        if let Some(n) = var(ENV_FAULT_503) {
            self.fail_next = n as usize;
        }
        self
    }

    /// Binds, loads the data directory, starts serving, then seeds the
    /// contexts given with [`LocalNexusBuilder::context`].
    ///
    /// # Errors
    /// [`StartError`] when binding, the data directory or a seed fails.
    pub async fn start(self) -> Result<LocalNexus, StartError> {
        let limits = db::QueryLimits {
            count: self.query_limit,
            bytes: self.query_bytes_limit,
        };
        let store = open_store(self.data_dir.as_ref(), limits).await?;
        // Tokens of another key are revoked before anything is served.
        store
            .bind_tokens_to_key(self.api_key.as_deref())
            .await
            .map_err(|e| StartError::DataDir {
                path: self.data_dir.clone().unwrap_or_else(std::env::temp_dir),
                source: std::io::Error::other(e.to_string()),
            })?;
        let config = Config {
            api_key: self.api_key,
            data_dir: self.data_dir,
            upload_limit: self.upload_limit,
            json_limit: self.json_limit,
            context_bytes_limit: self.context_bytes_limit,
            events_per_query: self.events_per_query,
            event_bytes_per_query: self.event_bytes_per_query,
            write_backlog_limit: self.write_backlog_limit,
            chunk_chars: self.chunk_chars,
            connector_roots: self.connector_roots,
            allowed_hosts: self.allowed_hosts,
            allowed_origins: self.allowed_origins,
            rate_limit: self.rate_limit,
        };
        let faults = faults::Faults::new(
            self.cut_after_frames,
            self.frame_delay,
            self.fail_next,
            self.retry_after_secs,
        );
        let listener = tokio::net::TcpListener::bind(self.bind)
            .await
            .map_err(|source| StartError::Bind {
                addr: self.bind,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: self.bind,
            source,
        })?;
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "serving on a non-loopback address: anyone who can reach it can use it; set an API key");
        }
        let policy = crate::host_origin::HostPolicy::new(
            addr,
            &config.allowed_hosts,
            &config.allowed_origins,
        );
        let state = AppState::new(config, store, faults, policy);
        let stop = CancellationToken::new();
        let app = routes::router(state.clone());
        let graceful = stop.clone();
        let server = tokio::spawn(serve::serve(
            listener,
            app,
            graceful,
            serve::ConnectionLimits {
                header_read_timeout: self.header_read_timeout,
                max_per_peer: self.max_connections_per_peer,
            },
        ));
        // A write that could not be saved stops the server: what is in
        // memory may be ahead of the disk from then on.
        let (watched, watch_stop) = (state.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = watched.store.failed() => {
                    tracing::error!("the state could not be saved: the server stops; restart it on its data directory");
                    watched.shutdown.cancel();
                    watch_stop.cancel();
                }
                () = watch_stop.cancelled() => {}
            }
        });
        let host = if addr.ip().is_unspecified() {
            "127.0.0.1".to_owned()
        } else if addr.is_ipv6() {
            format!("[{}]", addr.ip())
        } else {
            addr.ip().to_string()
        };
        let nexus = LocalNexus {
            addr,
            base_url: format!("http://{host}:{}/api", addr.port()),
            state,
            stop,
            server: Some(server),
        };
        tracing::info!(base_url = %nexus.base_url, "local Nexus listening");
        for (slug, dir) in &self.contexts {
            nexus.add_context(slug, dir).await?;
        }
        Ok(nexus)
    }
}

/// Opens the store: the data directory's, or a scratch one.
async fn open_store(
    data_dir: Option<&PathBuf>,
    limits: db::QueryLimits,
) -> Result<Store, StartError> {
    Ok(match data_dir {
        Some(dir) => {
            let dir_owned = dir.clone();
            tokio::task::spawn_blocking(move || Store::open(&dir_owned, limits))
                .await
                .map_err(|e| StartError::DataDir {
                    path: dir.clone(),
                    source: std::io::Error::other(e.to_string()),
                })?
                .map_err(|e| match e {
                    store::OpenError::Locked(lock) => StartError::DataDirLocked {
                        path: dir.clone(),
                        lock,
                    },
                    store::OpenError::Foreign { path, why } => {
                        StartError::DataDirForeign { path, why }
                    }
                    store::OpenError::Damaged { path, why } => {
                        StartError::DataDirDamaged { path, why }
                    }
                    store::OpenError::Io(source) => StartError::DataDir {
                        path: dir.clone(),
                        source,
                    },
                })?
        }
        None => tokio::task::spawn_blocking(move || Store::scratch(limits))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|r| r)
            .map_err(|source| StartError::DataDir {
                path: std::env::temp_dir(),
                source,
            })?,
    })
}
