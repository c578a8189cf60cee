//! Caller identity: the key each tool call runs with, read from the HTTP
//! request that carried it; the per-caller pool every tool family keeps its
//! per-key state in; and digests and log tags that name a caller without
//! holding its key.
//!
//! Used by every tool family and by the HTTP transport; it imports neither.

use std::hash::Hash;
use std::sync::Mutex;

use http::HeaderMap;
use rmcp::model::Extensions;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

use super::recent::Recent;
use super::{ToolError, ToolErrorCode};
use crate::client::API_KEY_HEADER;

/// The longest `X-Pinecone-Api-Key` value accepted.
const MAX_KEY_BYTES: usize = 512;

/// How the tools obtain credentials for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyPolicy {
    /// Every call uses the configured client and its key (stdio: one user).
    Configured,
    /// Every call uses the API key the caller sent in its HTTP request
    /// (`X-Pinecone-Api-Key`), so each caller reaches its own project.
    Caller {
        /// Without a caller key, use the configured client's key instead of
        /// refusing the call. Off unless the operator opts in.
        fallback_to_configured: bool,
    },
}

/// Why an `X-Pinecone-Api-Key` header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyHeaderError {
    /// The header is present but empty.
    Empty,
    /// The header appears more than once.
    Repeated,
    /// Not 1 to 512 visible ASCII characters.
    Malformed,
}

impl std::fmt::Display for KeyHeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self {
            KeyHeaderError::Empty => "is empty",
            KeyHeaderError::Repeated => "is sent more than once",
            KeyHeaderError::Malformed => {
                "is malformed (expected 1 to 512 visible ASCII characters)"
            }
        };
        write!(f, "the {API_KEY_HEADER} header {what}")
    }
}

impl std::error::Error for KeyHeaderError {}

/// The caller's key in `headers`: `None` when the header is absent.
///
/// # Errors
/// An empty, repeated or malformed header: an authentication error, never
/// "no key".
pub fn key_from_headers(headers: &HeaderMap) -> Result<Option<SecretString>, KeyHeaderError> {
    let mut values = headers.get_all(API_KEY_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyHeaderError::Repeated);
    }
    let bytes = value.as_bytes().trim_ascii();
    if bytes.is_empty() {
        return Err(KeyHeaderError::Empty);
    }
    if bytes.len() > MAX_KEY_BYTES || !bytes.iter().all(u8::is_ascii_graphic) {
        return Err(KeyHeaderError::Malformed);
    }
    match std::str::from_utf8(bytes) {
        Ok(key) => Ok(Some(SecretString::from(key.to_owned()))),
        Err(_) => Err(KeyHeaderError::Malformed),
    }
}

/// The caller's API key: the valid `X-Pinecone-Api-Key` header of the HTTP
/// request that carried this MCP request, if any (never set over stdio).
pub fn caller_api_key(extensions: &Extensions) -> Option<SecretString> {
    let parts = extensions.get::<http::request::Parts>()?;
    key_from_headers(&parts.headers).ok().flatten()
}

/// A digest naming a caller key without holding it (SHA-256 with a domain
/// prefix): used to bind sessions and to key per-caller caches.
pub(crate) fn key_digest(key: &SecretString) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(b"nexus-mcp caller key\0");
    hasher.update(key.expose_secret().as_bytes());
    hasher.finalize().into()
}

/// A caller's key with its [`caller_hash`], worked out once per HTTP
/// request by the transport (a request extension) so that the tools and
/// the per-caller pools neither read the header again nor hash the key.
#[derive(Clone)]
pub(crate) struct CallerKey {
    pub(crate) key: SecretString,
    pub(crate) hash: u64,
}

impl CallerKey {
    pub(crate) fn new(key: SecretString) -> Self {
        let hash = caller_hash(&key);
        CallerKey { key, hash }
    }
}

impl std::fmt::Debug for CallerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerKey").finish_non_exhaustive()
    }
}

/// The key one tool call runs with.
#[derive(Debug)]
pub(crate) enum CallKey {
    /// The server's own configured key (stdio, or `--allow-server-key`).
    Configured,
    /// The key the caller sent.
    Caller(CallerKey),
}

/// The key a call runs with under `policy`, one rule for every tool family:
/// the caller's key when sent; the configured key over stdio or, without a
/// caller key, when the policy allows it.
///
/// # Errors
/// `UNAUTHORIZED` for a missing key (when the configured key may not serve
/// callers) and for an empty, repeated or malformed key header.
pub(crate) fn call_key(policy: KeyPolicy, extensions: &Extensions) -> Result<CallKey, ToolError> {
    let fallback = match policy {
        KeyPolicy::Configured => return Ok(CallKey::Configured),
        KeyPolicy::Caller {
            fallback_to_configured,
        } => fallback_to_configured,
    };
    let key = match extensions.get::<http::request::Parts>() {
        // Read by the transport already, or (a server run without it) here.
        Some(parts) => match parts.extensions.get::<Identified>() {
            Some(identified) => Ok(identified.key.clone()),
            None => key_from_headers(&parts.headers).map(|key| key.map(CallerKey::new)),
        },
        None => Ok(None),
    };
    match key {
        Ok(Some(key)) => Ok(CallKey::Caller(key)),
        Ok(None) if fallback => Ok(CallKey::Configured),
        Ok(None) => Err(ToolError::new(
            ToolErrorCode::Unauthorized,
            format!(
                "no Pinecone API key: send yours in the {API_KEY_HEADER} header of each HTTP request"
            ),
            false,
        )
        .with_suggestion(format!(
            "configure the MCP client to send the {API_KEY_HEADER} header with your project's API key"
        ))),
        Err(e) => Err(ToolError::new(ToolErrorCode::Unauthorized, e.to_string(), false)
            .with_suggestion(format!(
                "send one {API_KEY_HEADER} header with your project's API key, or none"
            ))),
    }
}

/// Whether two keys are the same, in time that depends only on their
/// lengths.
pub(crate) fn same_key(a: &SecretString, b: &SecretString) -> bool {
    let (a, b) = (a.expose_secret().as_bytes(), b.expose_secret().as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One pooled value and the key it was built for.
struct Pooled<V> {
    key: SecretString,
    value: V,
}

/// Per-caller values of one tool family (clients, caches): built for a
/// caller key on first use and kept for the next calls with it.
///
/// A key's value starts in a small probation pool and moves to the main
/// pool only once the upstream has accepted the key ([`CallerPool::promote`]),
/// so made-up keys push out only each other, never a real caller's state.
/// Each pool drops its least recently used entry when full. Entries are
/// found by a slot the family chooses around the key's [`caller_hash`] and
/// confirmed by comparing the key itself, so two keys never share a value.
pub(crate) struct CallerPool<K, V> {
    proven: Mutex<Recent<K, Pooled<V>>>,
    unproven: Mutex<Recent<K, Pooled<V>>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain values; a poisoned map is still consistent.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<K, V> std::fmt::Debug for CallerPool<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerPool").finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone, V: Clone> CallerPool<K, V> {
    /// Room for `proven` accepted keys and `unproven` keys on probation.
    pub(crate) fn new(proven: usize, unproven: usize) -> Self {
        CallerPool {
            proven: Mutex::new(Recent::new(proven)),
            unproven: Mutex::new(Recent::new(unproven)),
        }
    }

    /// The value for `key` in `slot`, built with `build` into the probation
    /// pool on first use, and whether the key is still on probation.
    ///
    /// # Errors
    /// `build`'s error; nothing is kept then.
    pub(crate) fn get_or_build<E>(
        &self,
        slot: &K,
        key: &SecretString,
        build: impl FnOnce() -> Result<V, E>,
    ) -> Result<(V, bool), E> {
        if let Some(entry) = locked(&self.proven).get(slot)
            && same_key(&entry.key, key)
        {
            return Ok((entry.value.clone(), false));
        }
        if let Some(entry) = locked(&self.unproven).get(slot)
            && same_key(&entry.key, key)
        {
            return Ok((entry.value.clone(), true));
        }
        let value = build()?;
        locked(&self.unproven).insert(
            slot.clone(),
            Pooled {
                key: key.clone(),
                value: value.clone(),
            },
        );
        Ok((value, true))
    }

    /// Moves `key`'s `value` to the main pool once the upstream accepted the
    /// key (kept there even if probation dropped it meanwhile).
    pub(crate) fn promote(&self, slot: &K, key: &SecretString, value: V) {
        locked(&self.unproven).remove(slot);
        locked(&self.proven).insert(
            slot.clone(),
            Pooled {
                key: key.clone(),
                value,
            },
        );
    }

    /// How many values each pool holds: (accepted, on probation).
    #[cfg(test)]
    pub(crate) fn sizes(&self) -> (usize, usize) {
        (locked(&self.proven).len(), locked(&self.unproven).len())
    }
}

/// A number naming a caller key within this process: SipHash with a key
/// drawn at start, so it says nothing outside the process and no caller
/// can aim at another's. Cheaper than [`key_digest`], for per-request
/// accounting.
pub(crate) fn caller_hash(key: &SecretString) -> u64 {
    use std::hash::BuildHasher;
    static HASHER: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    HASHER
        .get_or_init(std::collections::hash_map::RandomState::new)
        .hash_one(key.expose_secret().as_bytes())
}

/// A short tag naming a caller in logs: 8 hex digits of its
/// [`caller_hash`]. The same key gets the same tag for the life of the
/// process, and the tag cannot be turned back into the key.
pub(crate) fn tag_of(hash: u64) -> CallerTag {
    CallerTag::Key((hash >> 32) as u32)
}

/// How log lines name a request's caller; formatted only when a line is
/// written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallerTag {
    /// A key, by its [`tag_of`] digits.
    Key(u32),
    /// No key was sent.
    Keyless,
    /// The key header was unusable.
    Invalid,
    /// The stdio transport's one client.
    Stdio,
    /// Not known (an HTTP request without the transport's identity).
    Unknown,
}

impl std::fmt::Display for CallerTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallerTag::Key(tag) => write!(f, "{tag:08x}"),
            CallerTag::Keyless => f.write_str("keyless"),
            CallerTag::Invalid => f.write_str("invalid"),
            CallerTag::Stdio => f.write_str("stdio"),
            CallerTag::Unknown => f.write_str("-"),
        }
    }
}

/// A request's short id, shown as 8 hex digits (`-` when there is none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestId(pub(crate) Option<u32>);

impl RequestId {
    /// The id as 8 lowercase hex digits.
    pub(crate) fn digits(self) -> Option<[u8; 8]> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let id = self.0?;
        let mut out = [0u8; 8];
        for (i, digit) in out.iter_mut().enumerate() {
            *digit = HEX[((id >> (28 - 4 * i)) & 0xf) as usize];
        }
        Some(out)
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(id) => write!(f, "{id:08x}"),
            None => f.write_str("-"),
        }
    }
}

/// What the HTTP transport tells the tools' log lines about a request:
/// its id and its caller's tag.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogIdentity {
    pub(crate) request_id: RequestId,
    pub(crate) caller: CallerTag,
}

/// What the HTTP transport worked out about a request once, for the tools:
/// its caller's key (when sent) and its [`LogIdentity`]. One request
/// extension, as rmcp copies a request's extensions for each handler.
#[derive(Debug, Clone)]
pub(crate) struct Identified {
    pub(crate) key: Option<CallerKey>,
    pub(crate) log: LogIdentity,
}

impl KeyPolicy {
    /// Whether a call without a caller key is served (with the configured
    /// key) rather than refused.
    pub fn serves_keyless(self) -> bool {
        match self {
            KeyPolicy::Configured => true,
            KeyPolicy::Caller {
                fallback_to_configured,
            } => fallback_to_configured,
        }
    }
}

/// The request id and caller tag of the HTTP request that carried an MCP
/// message, for log lines: `("-", "stdio")` over stdio.
pub(crate) fn log_identity(extensions: &Extensions) -> LogIdentity {
    let Some(parts) = extensions.get::<http::request::Parts>() else {
        return LogIdentity {
            request_id: RequestId(None),
            caller: CallerTag::Stdio,
        };
    };
    parts
        .extensions
        .get::<Identified>()
        .map(|identified| identified.log)
        .unwrap_or(LogIdentity {
            request_id: RequestId(None),
            caller: CallerTag::Unknown,
        })
}

/// The header carrying a request's short id (set by the HTTP transport on
/// the request and on its response).
pub(super) const REQUEST_ID_HEADER: &str = "x-request-id";

/// A call's admission by the HTTP transport's call ledger: what holds its
/// slot in the server's and its caller's budget. Every clone holds it (the
/// response body one, the tool's request context another), so the slot is
/// free only once the answer has been sent or abandoned *and* the tool's
/// upstream work, a turn's cancel included, has ended.
#[derive(Clone)]
pub(crate) struct CallTicket(
    #[allow(dead_code, reason = "held for its drop, never read")]
    pub(crate)  std::sync::Arc<dyn std::any::Any + Send + Sync>,
);

impl std::fmt::Debug for CallTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallTicket")
    }
}

/// What fires when a call's caller is gone for good (its HTTP session
/// was deleted or expired, the stdio input ended): the call is cancelled
/// as if its client had sent `notifications/cancelled`.
#[derive(Debug, Clone)]
pub(crate) struct CallerGone(pub(crate) tokio_util::sync::CancellationToken);

/// How a call was admitted: its ledger ticket (none over an in-process
/// transport, whose one client is the process) and what tells it its
/// caller is gone.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    /// The ledger's ticket, held for as long as the call runs.
    #[allow(dead_code, reason = "held for its drop, never read")]
    ticket: Option<CallTicket>,
    /// Fires when the caller is gone for good.
    pub(crate) gone: Option<tokio_util::sync::CancellationToken>,
}

/// The admission of the call whose request extensions are `extensions`:
/// `None` for a call that came over HTTP without the ledger's ticket, which
/// no tool may serve.
pub(crate) fn admission(extensions: &Extensions) -> Option<Admission> {
    let (ticket, gone) = match extensions.get::<http::request::Parts>() {
        Some(parts) => (
            Some(parts.extensions.get::<CallTicket>()?.clone()),
            parts.extensions.get::<CallerGone>(),
        ),
        None => (
            extensions.get::<CallTicket>().cloned(),
            extensions.get::<CallerGone>(),
        ),
    };
    Some(Admission {
        ticket,
        gone: gone.map(|gone| gone.0.clone()),
    })
}
