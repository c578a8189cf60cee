//! What every handler shares: configuration, the store, faults, auth tokens
//! and the supervisor of background work.

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::connectors::oauth::OauthStates;
use super::error::{LocalError, LocalResult};
use super::faults::Faults;
use super::store::Store;
use crate::host_origin::HostPolicy;

/// Most bearer tokens remembered; the oldest is forgotten first.
const MAX_TOKENS: usize = 100_000;
/// Uploads staged at once.
const STAGING_SLOTS: usize = 2;
/// The prefix of every bearer token.
pub(crate) const TOKEN_PREFIX: &str = "nlt_";

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
    /// Most bytes of events one turn's log keeps.
    pub(crate) event_bytes_per_query: usize,
    /// Most bytes of writes waiting for the database writer before writes
    /// are refused at admission (503, `Retry-After`).
    pub(crate) write_backlog_limit: u64,
    /// Chunk size used by curation, in characters.
    pub(crate) chunk_chars: usize,
    /// Directories local connectors may read (a connector's directory lies
    /// below one of them); none means no connectors.
    pub(crate) connector_roots: Vec<PathBuf>,
    /// `Host` values accepted besides loopback names and the bound address.
    pub(crate) allowed_hosts: Vec<String>,
    /// `Origin` values accepted besides local pages.
    pub(crate) allowed_origins: Vec<String>,
    /// Simulated rate limit: at most this many requests per window.
    pub(crate) rate_limit: Option<(u32, std::time::Duration)>,
}

/// Shared server state. Handlers get it as `State<Arc<AppState>>`.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) config: Config,
    pub(crate) store: Arc<Store>,
    pub(crate) faults: Faults,
    /// Turn runners, imports and curations; waited for on shutdown.
    pub(crate) tracker: TaskTracker,
    /// Cancelled on shutdown; every background job holds a child of it.
    pub(crate) shutdown: CancellationToken,
    /// Which `Host` and `Origin` values are answered.
    pub(crate) policy: HostPolicy,
    /// Uploads being staged at once (each may expand to the context
    /// limit on disk and in work); past it an upload gets 503 `busy`.
    pub(crate) staging_slots: Arc<tokio::sync::Semaphore>,
    /// Woken when an import ends: uploads queued on its context look again.
    pub(crate) imports_ended: tokio::sync::Notify,
    /// Connector OAuth flows started and not yet completed.
    pub(crate) oauth: OauthStates,
    tokens: Mutex<TokenSet>,
}

impl AppState {
    pub(crate) fn new(
        config: Config,
        store: Store,
        faults: Faults,
        policy: HostPolicy,
    ) -> Arc<Self> {
        Arc::new(AppState {
            config,
            faults,
            tracker: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            policy,
            staging_slots: Arc::new(tokio::sync::Semaphore::new(STAGING_SLOTS)),
            oauth: OauthStates::default(),
            imports_ended: tokio::sync::Notify::new(),
            tokens: Mutex::new(TokenSet::restored(store.take_saved_tokens())),
            store: Arc::new(store),
        })
    }

    /// A server state for unit tests: in memory, small limits, no faults,
    /// bound to `127.0.0.1:port`.
    #[cfg(test)]
    pub(crate) fn for_tests(api_key: Option<&str>, json_limit: usize, port: u16) -> Arc<Self> {
        let config = Config {
            api_key: api_key.map(str::to_owned),
            data_dir: None,
            upload_limit: 1024,
            json_limit,
            context_bytes_limit: 1 << 20,
            events_per_query: 100,
            event_bytes_per_query: 1 << 20,
            write_backlog_limit: 1 << 20,
            chunk_chars: 1200,
            connector_roots: Vec::new(),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            rate_limit: None,
        };
        let limits = super::db::QueryLimits {
            count: 100,
            bytes: 1 << 20,
        };
        let store = Store::scratch(limits).expect("an in-memory store opens");
        let faults = Faults::new(None, std::time::Duration::ZERO, 0, 1);
        let policy = HostPolicy::new(([127, 0, 0, 1], port).into(), &[], &[]);
        AppState::new(config, store, faults, policy)
    }

    /// Runs `job` as supervised background work: it is tracked, and its
    /// token is cancelled when the server shuts down.
    pub(crate) fn spawn<F>(&self, job: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(job);
    }

    /// Issues a bearer token: `nlt_` and 128 random bits as 32 hex digits,
    /// remembered (by its digest) until `MAX_TOKENS` newer ones exist, and
    /// saved so it outlives a restart; the login answers it once it is
    /// saved.
    ///
    /// # Errors
    /// 500 when the system's random source failed; 503 or 500 when it
    /// could not be saved.
    pub(crate) async fn issue_token(&self) -> LocalResult<String> {
        let (token, digest, forgotten) = {
            let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                let mut secret = [0u8; 16];
                getrandom::fill(&mut secret)
                    .map_err(|e| LocalError::internal("no random source for a token", e))?;
                let digest = self.token_digest(&secret);
                if let Some(forgotten) = tokens.insert(digest) {
                    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
                    break (format!("{TOKEN_PREFIX}{hex}"), digest, forgotten);
                }
            }
        };
        self.store.save_token(digest, forgotten).await?;
        Ok(token)
    }

    /// Whether a bearer token was issued by this server, now or before a
    /// restart with the same API key.
    pub(crate) fn knows_token(&self, token: &str) -> bool {
        let Some(secret) = parse_token(token) else {
            return false;
        };
        let digest = self.token_digest(&secret);
        self.tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&digest)
    }

    /// What is kept of a token: SHA-256 over the API key and its secret,
    /// so the stored digests neither give the tokens away nor admit them
    /// under another key.
    fn token_digest(&self, secret: &[u8; 16]) -> [u8; 32] {
        let mut h = Sha256::new();
        let key = self
            .config
            .api_key
            .as_deref()
            .unwrap_or_default()
            .as_bytes();
        h.update((key.len() as u64).to_le_bytes());
        h.update(key);
        h.update(secret);
        h.finalize().into()
    }
}

/// The 16 secret bytes of a well-formed token.
fn parse_token(token: &str) -> Option<[u8; 16]> {
    let hex = token.strip_prefix(TOKEN_PREFIX)?.as_bytes();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

/// The digests of the tokens issued, oldest first. A digest is SHA-256 of
/// a 128-bit random secret: looking one up tells nothing about a secret.
#[derive(Debug, Default)]
struct TokenSet {
    known: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

impl TokenSet {
    /// Digests as saved (oldest first); malformed ones are skipped.
    fn restored(saved: Vec<Vec<u8>>) -> Self {
        let mut set = TokenSet::default();
        for d in saved {
            if let Ok(d) = <[u8; 32]>::try_from(d.as_slice()) {
                set.insert(d);
            }
        }
        set
    }

    /// Adds a digest: `None` when it is known (the caller draws again),
    /// else the digest forgotten to make room, if any.
    #[allow(clippy::option_option)]
    fn insert(&mut self, digest: [u8; 32]) -> Option<Option<[u8; 32]>> {
        if !self.known.insert(digest) {
            return None;
        }
        let mut forgotten = None;
        if self.order.len() >= MAX_TOKENS
            && let Some(old) = self.order.pop_front()
        {
            self.known.remove(&old);
            forgotten = Some(old);
        }
        self.order.push_back(digest);
        Some(forgotten)
    }

    fn contains(&self, digest: &[u8; 32]) -> bool {
        self.known.contains(digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_forgeries_fail() {
        let mut set = TokenSet::default();
        assert_eq!(set.insert([7; 32]), Some(None));
        assert_eq!(set.insert([7; 32]), None);
        assert!(set.contains(&[7; 32]));
        assert!(!set.contains(&[8; 32]));
        let hex = "07".repeat(16);
        assert_eq!(parse_token(&format!("nlt_{hex}")), Some([7; 16]));
        assert_eq!(parse_token(&format!("nlt_{hex}0")), None);
        assert_eq!(parse_token(&format!("xyz_{hex}")), None);
        assert_eq!(parse_token(&format!("nlt_{}", "zz".repeat(16))), None);
        assert_eq!(parse_token("nlt_\u{e9}"), None);
    }
}
