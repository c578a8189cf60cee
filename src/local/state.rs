//! What every handler shares: configuration, the store, faults, auth tokens
//! and the supervisor of background work.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::faults::Faults;
use super::store::Store;

/// Most bearer tokens remembered; the oldest is forgotten first.
const MAX_TOKENS: usize = 1024;

/// Limits and identity of one server.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Required API key, if any.
    pub(crate) api_key: Option<String>,
    /// Where state persists, if anywhere.
    pub(crate) data_dir: Option<PathBuf>,
    /// Largest accepted upload, in bytes.
    pub(crate) upload_limit: usize,
    /// Largest accepted JSON body, in bytes.
    pub(crate) json_limit: usize,
    /// Most source bytes one context may hold (archives expanded).
    pub(crate) context_bytes_limit: u64,
    /// Most events one turn's log keeps.
    pub(crate) events_per_query: usize,
    /// Chunk size used by curation, in characters.
    pub(crate) chunk_chars: usize,
}

/// Shared server state. Handlers get it as `State<Arc<AppState>>`.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) config: Config,
    pub(crate) store: Store,
    pub(crate) faults: Faults,
    /// Turn runners, imports and curations; waited for on shutdown.
    pub(crate) tracker: TaskTracker,
    /// Cancelled on shutdown; every background job holds a child of it.
    pub(crate) shutdown: CancellationToken,
    tokens: Mutex<VecDeque<String>>,
}

impl AppState {
    pub(crate) fn new(config: Config, store: Store, faults: Faults) -> Arc<Self> {
        Arc::new(AppState {
            config,
            store,
            faults,
            tracker: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            tokens: Mutex::new(VecDeque::new()),
        })
    }

    /// Runs `job` as supervised background work: it is tracked, and its
    /// token is cancelled when the server shuts down.
    pub(crate) fn spawn<F>(&self, job: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(job);
    }

    /// Issues a bearer token (remembered until `MAX_TOKENS` newer ones exist).
    pub(crate) fn issue_token(&self) -> String {
        let token = format!("nlt_{}", super::store::new_id_raw());
        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        if tokens.len() >= MAX_TOKENS {
            tokens.pop_front();
        }
        tokens.push_back(token.clone());
        token
    }

    /// Whether a bearer token was issued by this server.
    pub(crate) fn knows_token(&self, token: &str) -> bool {
        self.tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|t| t == token)
    }
}
