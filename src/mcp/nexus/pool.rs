//! The HTTP clients of callers' Nexus calls, and the Nexus clients built on
//! them per caller key.

use std::collections::HashMap;

use crate::mcp::caller::{CallerKey, CallerPool};
use crate::{Client, Error};

/// The most threads that get a connection pool of their own for callers'
/// Nexus calls; threads past it share the configured client's.
pub(super) const MAX_THREAD_POOLS: usize = 64;

/// How many callers' Nexus clients are kept built once Nexus accepted
/// their key (per serving thread and caller key); the least recently used
/// is dropped past it.
pub(super) const MAX_CALLER_CLIENTS: usize = 64;

/// How many Nexus clients of keys Nexus has not accepted yet are kept,
/// apart from the accepted ones: made-up keys push out only each other.
pub(super) const MAX_UNPROVEN_CLIENTS: usize = 16;

/// The HTTP clients of callers' Nexus calls, and the Nexus clients built on
/// them for recent caller keys.
///
/// A pooled connection is driven by the runtime that opened it, so threads
/// each running a single-threaded runtime (`nexus-mcp` serving HTTP on
/// several threads) get a pool each; a shared pool would send most calls
/// through another thread and back. Elsewhere, and for a client the caller
/// supplied, the configured client's pool serves every call.
///
/// Built clients are kept in a [`CallerPool`] by thread (where threads have
/// pools of their own) and caller key, so a call neither rebuilds one nor
/// reaches another caller's; a key's client joins the main pool once Nexus
/// answered a call made with it.
pub(super) struct CallerHttp {
    pub(super) per_thread: std::sync::Mutex<HashMap<std::thread::ThreadId, reqwest::Client>>,
    pub(super) clients: CallerPool<CallerSlot, Client>,
}

/// A built caller client's slot: the thread whose pool it uses (`None` for
/// the shared pool) and the caller key's hash.
pub(super) type CallerSlot = (Option<std::thread::ThreadId>, u64);

/// The client one call runs with and, for a caller key Nexus has not yet
/// accepted, what to promote once it has.
pub(super) struct CallClient {
    pub(super) client: Client,
    pub(super) unproven: Option<(CallerSlot, CallerKey)>,
}

impl CallerHttp {
    pub(super) fn new() -> Self {
        CallerHttp {
            per_thread: std::sync::Mutex::new(HashMap::new()),
            clients: CallerPool::new(MAX_CALLER_CLIENTS, MAX_UNPROVEN_CLIENTS),
        }
    }

    /// The Nexus client for a call made on this thread with the caller's
    /// `key` and `configured`'s other settings, built on first use.
    pub(super) fn client(&self, configured: &Client, key: CallerKey) -> Result<CallClient, Error> {
        use secrecy::ExposeSecret;
        let slot = (pool_thread(), key.hash);
        let (client, unproven) = self.clients.get_or_build(&slot, &key.key, || {
            Client::builder()
                .base_url(configured.base_url())
                .api_version(configured.api_version().clone())
                .http_client(self.get(configured))
                .api_key(key.key.expose_secret())
                .build()
        })?;
        Ok(CallClient {
            client,
            unproven: unproven.then_some((slot, key)),
        })
    }

    /// Keeps `call`'s client in the main pool: Nexus accepted its key.
    pub(super) fn accepted(&self, call: &mut CallClient) {
        if let Some((slot, key)) = call.unproven.take() {
            self.clients.promote(&slot, &key.key, call.client.clone());
        }
    }

    /// The HTTP client for a call made on this thread with `configured`'s settings.
    pub(super) fn get(&self, configured: &Client) -> reqwest::Client {
        let shared = || configured.transport().http().clone();
        let Some(thread) = pool_thread() else {
            return shared();
        };
        let Ok(mut clients) = self.per_thread.lock() else {
            return shared();
        };
        if let Some(client) = clients.get(&thread) {
            return client.clone();
        }
        if clients.len() >= MAX_THREAD_POOLS {
            return shared();
        }
        match configured.transport().new_http() {
            Some(Ok(client)) => {
                clients.insert(thread, client.clone());
                client
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "could not build a per-thread HTTP client; sharing one");
                shared()
            }
            None => shared(),
        }
    }
}

/// This thread, when it runs a single-threaded runtime (and so may have a
/// connection pool of its own).
pub(super) fn pool_thread() -> Option<std::thread::ThreadId> {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
        .then(|| std::thread::current().id())
}
