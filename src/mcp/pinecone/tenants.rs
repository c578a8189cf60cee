//! The per-key state of HTTP callers (each key's clients, host and
//! namespace caches and suggest-flow gate), kept in a cache bounded by
//! bytes rather than by a number of keys.
//!
//! A new key's state starts on probation, in a small pool of its own, and
//! joins the main cache once Pinecone has answered one of its calls with
//! success: made-up keys push out only each other. Each pool weighs every
//! entry by the bytes it holds and drops the least recently used when over
//! its budget (`--pinecone-cache-mib` for the main cache). An entry grows
//! when its namespace lists are cached; it is weighed again after each call
//! that changed its size. Entries are found by the key's
//! [`caller_hash`](crate::mcp::caller::caller_hash) and confirmed by
//! comparing the key itself, so two keys never share state.

use std::sync::Arc;

use quick_cache::sync::Cache;
use quick_cache::{OptionsBuilder, Weighter};
use secrecy::SecretString;

use crate::mcp::caller::{CallerKey, same_key};

use super::config::PineconeConfig;
use super::gate::Gate;
use super::sources::Registry;
use super::urls::UrlRegistry;

/// State shared by every tool call made with one key: the configured
/// key's, or one caller's.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) config: PineconeConfig,
    pub(crate) registry: Registry,
    pub(crate) gate: Gate,
    /// Shared by every key.
    pub(crate) urls: Arc<UrlRegistry>,
}

/// Bytes a caller's state holds besides its cached namespace lists: its
/// configuration copy, clients with their host caches, gate and pool
/// entry, as measured (see `docs/nexus-mcp.md`, "Sizing").
pub(super) const TENANT_BASE_BYTES: u64 = 4096;

/// Bytes of state kept for keys Pinecone has not accepted yet: room for
/// about 16 of them.
const PROBATION_BYTES: u64 = 16 * TENANT_BASE_BYTES;

/// One caller's state and the weight it was stored with.
struct Tenant {
    key: SecretString,
    state: Arc<State>,
    bytes: u64,
}

/// Weighs a pool entry by the bytes it held when stored.
#[derive(Clone, Copy)]
struct ByBytes;

impl Weighter<u64, Arc<Tenant>> for ByBytes {
    fn weight(&self, _: &u64, tenant: &Arc<Tenant>) -> u64 {
        tenant.bytes.max(1)
    }
}

type Pool = Cache<u64, Arc<Tenant>, ByBytes>;

fn pool(bytes: u64, shards: Option<usize>) -> Pool {
    let mut options = OptionsBuilder::new();
    options
        .estimated_items_capacity(usize::try_from(bytes / TENANT_BASE_BYTES).unwrap_or(usize::MAX))
        .weight_capacity(bytes.max(TENANT_BASE_BYTES));
    if let Some(shards) = shards {
        options.shards(shards);
    }
    match options.build() {
        Ok(options) => {
            Cache::with_options(options, ByBytes, Default::default(), Default::default())
        }
        // Both settings are given, so building cannot fail; a cache sized
        // by its defaults is still bounded.
        Err(_) => Cache::with_weighter(1024, bytes.max(TENANT_BASE_BYTES), ByBytes),
    }
}

/// A caller's state as one call holds it.
pub(super) struct Held {
    /// The state.
    pub(super) state: Arc<State>,
    /// Whether the key is still on probation.
    pub(super) unproven: bool,
    /// The weight the pool holds it at.
    weighed: u64,
}

/// Every HTTP caller's state, bounded by bytes.
pub(super) struct Tenants {
    proven: Pool,
    probation: Pool,
}

impl std::fmt::Debug for Tenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenants")
            .field("bytes", &self.proven.weight())
            .field("callers", &self.proven.len())
            .finish_non_exhaustive()
    }
}

impl Tenants {
    /// Room for `bytes` of accepted callers' state.
    pub(super) fn new(bytes: u64) -> Self {
        Tenants {
            proven: pool(bytes, None),
            probation: pool(PROBATION_BYTES, Some(1)),
        }
    }

    /// The state of the caller with `key`, built with `build` on first use
    /// (on probation).
    pub(super) fn get_or_build(&self, key: &CallerKey, build: impl FnOnce() -> State) -> Held {
        for (pool, unproven) in [(&self.proven, false), (&self.probation, true)] {
            if let Some(tenant) = pool.get(&key.hash)
                && same_key(&tenant.key, &key.key)
            {
                return Held {
                    state: Arc::clone(&tenant.state),
                    unproven,
                    weighed: tenant.bytes,
                };
            }
        }
        let state = Arc::new(build());
        let bytes = state.bytes().unwrap_or(TENANT_BASE_BYTES);
        self.probation
            .insert(key.hash, Arc::new(tenant(key, &state, bytes)));
        Held {
            state,
            unproven: true,
            weighed: bytes,
        }
    }

    /// After a call: moves a caller on probation to the main cache once
    /// Pinecone has accepted its key, and weighs an accepted caller again
    /// when its size changed (a namespace list was cached or dropped).
    pub(super) fn settle(&self, key: &CallerKey, held: &Held) {
        if held.unproven {
            if !held.state.key_accepted() {
                return;
            }
            self.probation.remove(&key.hash);
        }
        let bytes = match held.state.bytes() {
            Some(bytes) => bytes,
            None if held.unproven => held.weighed,
            // Another call is refreshing a cache: it weighs it when done.
            None => return,
        };
        if held.unproven || bytes != held.weighed {
            self.proven
                .insert(key.hash, Arc::new(tenant(key, &held.state, bytes)));
        }
    }

    /// Drops every caller's state.
    pub(super) fn clear(&self) {
        self.proven.clear();
        self.probation.clear();
    }
}

fn tenant(key: &CallerKey, state: &Arc<State>, bytes: u64) -> Tenant {
    Tenant {
        key: key.key.clone(),
        state: Arc::clone(state),
        bytes,
    }
}
