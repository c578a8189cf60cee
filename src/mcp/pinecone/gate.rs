//! The suggest-flow gate: `query`, `count` and `query_documents` require a
//! recent `suggest_query_params` (or `guided_query`) for the namespace.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::mcp::{ToolError, ToolErrorCode};

/// What the last suggestion for a namespace said (kept for diagnostics).
#[derive(Debug, Clone)]
struct Entry {
    updated: Instant,
}

/// The gate of one server.
#[derive(Debug)]
pub(crate) struct Gate {
    enabled: bool,
    ttl: Duration,
    entries: Mutex<HashMap<String, Entry>>,
}

impl Gate {
    /// A gate; when `enabled` is false every check passes.
    pub(crate) fn new(enabled: bool, ttl: Duration) -> Self {
        Gate {
            enabled,
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Whether checks are enforced.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // Entries are plain values; a poisoned map is still consistent.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Bytes its entries hold (each key, its entry and the map's slot).
    pub(crate) fn bytes(&self) -> u64 {
        let entries = self.entries();
        let held: usize = entries
            .keys()
            .map(|key| key.len() + std::mem::size_of::<(String, Entry)>() + 24)
            .sum();
        u64::try_from(held).unwrap_or(u64::MAX)
    }

    /// Records a suggestion for `key` and sweeps expired entries.
    pub(crate) fn mark(&self, key: &str) {
        let now = Instant::now();
        let ttl = self.ttl;
        let mut entries = self.entries();
        entries.retain(|_, e| now.duration_since(e.updated) <= ttl);
        entries.insert(key.to_owned(), Entry { updated: now });
    }

    /// Passes when `key` was suggested within the lifetime.
    ///
    /// # Errors
    /// `FLOW_GATE` when never suggested or expired.
    pub(crate) fn check(&self, key: &str, namespace: &str) -> Result<(), ToolError> {
        if !self.enabled {
            return Ok(());
        }
        let mut entries = self.entries();
        let message = match entries.get(key) {
            None => {
                "Flow requires suggest_query_params first. Call suggest_query_params with namespace and user_query before query/count tools."
            }
            Some(e) if Instant::now().duration_since(e.updated) > self.ttl => {
                entries.remove(key);
                "Previous suggest_query_params context expired. Call suggest_query_params again before query/count tools."
            }
            Some(_) => return Ok(()),
        };
        Err(
            ToolError::new(ToolErrorCode::FlowGate, message, true).with_suggestion(format!(
                "Call suggest_query_params for namespace '{namespace}' first"
            )),
        )
    }
}
