//! `query_context` as an MCP task (the `io.modelcontextprotocol/tasks`
//! extension) for requests that ask for one.
//!
//! A request asks for a task when its own `_meta` names a revision that
//! defines the extension (2026-07-28 on) and declares the extension in its
//! capabilities. Such a `query_context` starts the Nexus
//! turn as before and gets a task back instead of `{query_id, ...}`.
//! `tasks/get` reads the turn from Nexus with the caller's own key
//! (`working` while it runs; `completed` with the `get_query` result — the
//! answer and its citations — as the task's `result`; `failed` with the
//! turn's error; `cancelled`), and `tasks/cancel` cancels the Nexus turn
//! (an ended task cannot be cancelled). Every other request keeps the
//! `query_context` + `get_query` flow.
//!
//! The server keeps nothing per task: the task id is the Nexus query id
//! sealed with an HMAC-SHA-256 over the owner (the digest of the caller's
//! key) and the task's creation and expiry times, under a secret the
//! replicas share ([`TaskSeal`]). Any replica with the same secret serves
//! `tasks/get` and `tasks/cancel`; a caller with another key, an altered
//! id or an expired one gets the same "unknown task" as an id that never
//! existed. `ttlMs` is exactly how long the handle is honoured.
//!
//! A secret is rotated without losing live tasks: a seal may also hold the
//! previous secret ([`TaskSeal::with_previous`]). New handles are sealed
//! with the current secret only; a handle sealed with the previous one
//! still opens until it expires.

use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult,
    DetailedTask, Extensions, JsonObject, ProtocolVersion, RequestMetaObject, Task, TaskPayload,
    TaskStatus,
};
use secrecy::{ExposeSecret, SecretSlice};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::caller::{caller_api_key, key_digest};
use super::redact::redact;
use crate::status::QueryStatus;

/// The longest query id sealed into a task id, in bytes.
const MAX_ID_BYTES: usize = 256;
/// The poll interval suggested to clients.
const POLL_INTERVAL_MS: u64 = 1_000;
/// How long a task handle is honoured by default.
pub const DEFAULT_TASK_TTL: Duration = Duration::from_secs(3600);
/// The shortest task secret accepted, in bytes.
pub const MIN_TASK_SECRET_BYTES: usize = 16;
/// The version tag of the handle format.
const HANDLE_PREFIX: &str = "t1";
/// Bytes of the MAC kept in a handle (128 bits).
const MAC_BYTES: usize = 16;

/// Who started a task: the digest of the caller's key, or `None` for calls
/// that run with the server's configured key (stdio, keyless HTTP).
type Owner = Option<[u8; 32]>;

/// Why a task secret was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the task secret must be at least {MIN_TASK_SECRET_BYTES} bytes long")]
pub struct ShortTaskSecret;

/// Seals task handles and opens them again: the secret and the lifetime
/// shared by every replica that serves the same clients.
///
/// ```
/// use nexus_knowql::mcp::tasks::TaskSeal;
/// let seal = TaskSeal::new(b"a secret the replicas share").unwrap();
/// // During a rotation: seal with the new secret, still open the old one's.
/// let rotating = TaskSeal::new(b"the new secret, 16+ bytes")
///     .unwrap()
///     .with_previous(b"a secret the replicas share")
///     .unwrap();
/// # let _ = (seal, rotating);
/// ```
#[derive(Clone)]
pub struct TaskSeal {
    /// The HMAC key new handles are sealed with: SHA-256 of the current
    /// secret.
    key: SecretSlice<u8>,
    /// The HMAC key of the previous secret, during a rotation: handles it
    /// sealed still open; no new handle is sealed with it.
    previous: Option<SecretSlice<u8>>,
    ttl: Duration,
}

impl std::fmt::Debug for TaskSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskSeal")
            .field("ttl", &self.ttl)
            .field("rotating", &self.previous.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for TaskSeal {
    fn default() -> Self {
        TaskSeal::random()
    }
}

impl TaskSeal {
    /// A seal with `secret` (at least [`MIN_TASK_SECRET_BYTES`]) and the
    /// default lifetime.
    ///
    /// # Errors
    /// A secret shorter than [`MIN_TASK_SECRET_BYTES`].
    pub fn new(secret: &[u8]) -> Result<Self, ShortTaskSecret> {
        Ok(TaskSeal {
            key: hmac_key(secret)?,
            previous: None,
            ttl: DEFAULT_TASK_TTL,
        })
    }

    /// The same seal that also opens handles sealed with `previous` (at
    /// least [`MIN_TASK_SECRET_BYTES`]): the secret being rotated out. New
    /// handles are still sealed with the current secret only.
    ///
    /// # Errors
    /// A secret shorter than [`MIN_TASK_SECRET_BYTES`].
    pub fn with_previous(mut self, previous: &[u8]) -> Result<Self, ShortTaskSecret> {
        self.previous = Some(hmac_key(previous)?);
        Ok(self)
    }

    /// A seal with a random secret: handles are honoured by this process
    /// only.
    pub fn random() -> Self {
        let mut secret = [0u8; 32];
        if getrandom::fill(&mut secret).is_err() {
            // No system randomness: a per-process hash seed is the next best.
            use std::hash::{BuildHasher, Hasher};
            for chunk in secret.chunks_mut(8) {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u128(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos()),
                );
                chunk.copy_from_slice(&h.finish().to_le_bytes()[..chunk.len()]);
            }
        }
        TaskSeal::new(&secret).unwrap_or_else(|_| unreachable_short())
    }

    /// The same secret with handles honoured for `ttl` after they are made.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a handle is honoured.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    fn mac(
        key: &SecretSlice<u8>,
        owner: Owner,
        created_ms: u64,
        expires_ms: u64,
        query_id: &str,
    ) -> String {
        let mut message = Vec::with_capacity(64 + query_id.len());
        message.extend_from_slice(b"nexus-mcp task v1\0");
        match owner {
            Some(digest) => {
                message.push(1);
                message.extend_from_slice(&digest);
            }
            None => message.push(0),
        }
        message.extend_from_slice(&created_ms.to_be_bytes());
        message.extend_from_slice(&expires_ms.to_be_bytes());
        message.extend_from_slice(query_id.as_bytes());
        let tag = hmac_sha256(key.expose_secret(), &message);
        hex(&tag[..MAC_BYTES])
    }

    /// The handle of `owner`'s task on Nexus query `query_id`.
    fn seal(&self, owner: Owner, query_id: &str, created_ms: u64) -> Option<String> {
        if query_id.is_empty() || query_id.len() > MAX_ID_BYTES {
            return None;
        }
        let expires_ms = created_ms.checked_add(self.ttl_ms())?;
        let mac = Self::mac(&self.key, owner, created_ms, expires_ms, query_id);
        Some(format!(
            "{HANDLE_PREFIX}.{created_ms}.{expires_ms}.{mac}.{query_id}"
        ))
    }

    /// The task `handle` names, if it is `owner`'s and still honoured.
    fn open(&self, owner: Owner, handle: &str, now_ms: u64) -> Option<Sealed> {
        let mut parts = handle.splitn(5, '.');
        if parts.next()? != HANDLE_PREFIX {
            return None;
        }
        let created_ms: u64 = parts.next()?.parse().ok()?;
        let expires_ms: u64 = parts.next()?.parse().ok()?;
        let mac = parts.next()?;
        let query_id = parts.next()?;
        if query_id.is_empty() || query_id.len() > MAX_ID_BYTES {
            return None;
        }
        if now_ms >= expires_ms {
            return None;
        }
        let sealed_by = |key: &SecretSlice<u8>| {
            let expected = Self::mac(key, owner, created_ms, expires_ms, query_id);
            same_bytes(expected.as_bytes(), mac.as_bytes())
        };
        if !sealed_by(&self.key) && !self.previous.as_ref().is_some_and(sealed_by) {
            return None;
        }
        Some(Sealed {
            query_id: query_id.to_owned(),
            created_ms,
            expires_ms,
        })
    }
}

fn unreachable_short() -> TaskSeal {
    // 32 random bytes are never too short; keep a usable seal regardless.
    TaskSeal {
        key: SecretSlice::from(vec![0u8; 32]),
        previous: None,
        ttl: DEFAULT_TASK_TTL,
    }
}

/// The HMAC key of a configured secret.
fn hmac_key(secret: &[u8]) -> Result<SecretSlice<u8>, ShortTaskSecret> {
    if secret.len() < MIN_TASK_SECRET_BYTES {
        return Err(ShortTaskSecret);
    }
    let mut hasher = Sha256::new();
    hasher.update(b"nexus-mcp task secret\0");
    hasher.update(secret);
    let key: [u8; 32] = hasher.finalize().into();
    Ok(SecretSlice::from(key.to_vec()))
}

/// A task handle opened: its Nexus query and times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sealed {
    pub(crate) query_id: String,
    created_ms: u64,
    expires_ms: u64,
}

/// HMAC-SHA-256 (RFC 2104).
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(message);
    let inner = inner.finalize();
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner);
    outer.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// Whether two byte strings are equal, in time that depends only on their
/// lengths.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn now_ms() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0)
}

fn rfc3339(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Whether revision `version` defines the tasks extension (2026-07-28 on).
pub(crate) fn revision_has_tasks(version: &ProtocolVersion) -> bool {
    // ISO dates compare as strings.
    version.as_str() >= ProtocolVersion::V_2026_07_28.as_str()
}

/// Whether a request asks for a task: its own `_meta` names a revision with
/// the tasks extension and declares the extension in its capabilities.
/// What a client listed at `initialize` does not count: a 2025-11-25
/// client that lists it there does not handle a task handle.
pub(crate) fn asked_for(meta: &RequestMetaObject) -> bool {
    meta.protocol_version()
        .is_some_and(|v| revision_has_tasks(&v))
        && meta
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks())
}

/// The error for a task id this caller does not have: the same whether the
/// id never existed, expired, was altered or belongs to another caller.
pub(crate) fn unknown_task() -> ErrorData {
    ErrorData::invalid_params("unknown task", None)
}

/// The owner of the request whose extensions are `ext`.
pub(crate) fn owner_of(ext: &Extensions) -> Owner {
    caller_api_key(ext).map(|k| key_digest(&k))
}

/// `owner`'s task `handle`, or the uniform "unknown task".
pub(crate) fn open(seal: &TaskSeal, owner: Owner, handle: &str) -> Result<Sealed, ErrorData> {
    seal.open(owner, handle, now_ms()).ok_or_else(unknown_task)
}

/// The task for a `query_context` result that started a turn: its handle
/// seals the turn's query id for `owner`.
pub(crate) fn task_for(
    seal: &TaskSeal,
    owner: Owner,
    response: &CallToolResponse,
) -> Option<CreateTaskResult> {
    let CallToolResponse::Complete(result) = response else {
        return None;
    };
    if result.is_error == Some(true) {
        return None;
    }
    let id = result
        .structured_content
        .as_ref()
        .and_then(|v| v.get("query_id"))
        .and_then(Value::as_str)?;
    let created_ms = now_ms();
    let Some(handle) = seal.seal(owner, id, created_ms) else {
        tracing::debug!("query id too long for a task handle: query_context answers the plain way");
        return None;
    };
    let created_at = rfc3339(created_ms);
    Some(CreateTaskResult::new(
        Task::new(handle, TaskStatus::Working, created_at.clone(), created_at)
            .with_ttl_ms(seal.ttl_ms())
            .with_poll_interval_ms(POLL_INTERVAL_MS),
    ))
}

/// The `get_query` call that reads task `id`'s turn.
pub(crate) fn get_query_params(id: &str) -> CallToolRequestParams {
    let mut args = JsonObject::new();
    args.insert("query_id".to_owned(), Value::String(id.to_owned()));
    CallToolRequestParams::new("get_query").with_arguments(args)
}

/// The code and message of a tool error result.
fn tool_error(result: &CallToolResult) -> (String, String) {
    let body = result.structured_content.as_ref();
    let text = |k: &str| {
        body.and_then(|b| b.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    (text("code"), redact(&text("message")))
}

/// The status of a `get_query` result: a tool error's code and message,
/// or the turn's status.
fn read_status(result: &CallToolResult) -> Result<QueryStatus, ErrorData> {
    if result.is_error == Some(true) {
        let (code, message) = tool_error(result);
        if code == "NOT_FOUND" {
            return Err(unknown_task());
        }
        return Err(ErrorData::internal_error(
            format!("could not read the task's turn: {message}"),
            Some(json!({"code": code})),
        ));
    }
    Ok(result
        .structured_content
        .as_ref()
        .and_then(|v| v.get("status"))
        .and_then(Value::as_str)
        .map_or(QueryStatus::Other(String::new()), QueryStatus::from))
}

fn complete(response: CallToolResponse) -> Result<CallToolResult, ErrorData> {
    match response {
        CallToolResponse::Complete(result) => Ok(result),
        _ => Err(ErrorData::internal_error(
            "unexpected get_query answer",
            None,
        )),
    }
}

/// `result` as the JSON object a completed task carries, the same as its
/// serialization: its structured content and texts are moved into the
/// object, not copied into a second tree.
fn result_object(mut result: CallToolResult) -> Option<JsonObject> {
    // Stand-ins keep each member's place; the values go in afterwards.
    let structured = result
        .structured_content
        .as_mut()
        .map(|v| std::mem::replace(v, Value::Null));
    let texts: Vec<Option<String>> = result
        .content
        .iter_mut()
        .map(|block| match block {
            ContentBlock::Text(text) => Some(std::mem::take(&mut text.text)),
            _ => None,
        })
        .collect();
    let Ok(Value::Object(mut map)) = serde_json::to_value(&result) else {
        return None;
    };
    if let Some(structured) = structured {
        *map.get_mut("structuredContent")? = structured;
    }
    if texts.iter().any(Option::is_some) {
        let blocks = map.get_mut("content")?.as_array_mut()?;
        for (block, text) in blocks.iter_mut().zip(texts) {
            if let Some(text) = text {
                *block.get_mut("text")? = Value::String(text);
            }
        }
    }
    Some(map)
}

/// `tasks/get`'s answer for task `sealed` from `get_query`'s result.
pub(crate) fn detailed(
    handle: &str,
    sealed: &Sealed,
    response: CallToolResponse,
) -> Result<DetailedTask, ErrorData> {
    let result = complete(response)?;
    let status = read_status(&result)?;
    let payload = match status {
        QueryStatus::Completed => {
            let Some(result) = result_object(result) else {
                return Err(ErrorData::internal_error("unencodable result", None));
            };
            TaskPayload::Completed { result }
        }
        QueryStatus::Failed => {
            let why = result
                .structured_content
                .as_ref()
                .and_then(|v| v.get("error"))
                .cloned()
                .unwrap_or(Value::Null);
            let mut error = JsonObject::new();
            error.insert("code".to_owned(), json!(-32603));
            error.insert("message".to_owned(), json!("the query turn failed"));
            error.insert("data".to_owned(), why);
            TaskPayload::Failed { error }
        }
        QueryStatus::Cancelled => TaskPayload::Cancelled,
        _ => TaskPayload::Working,
    };
    let ended = payload.status().is_terminal();
    // What is left of the handle's lifetime.
    let ttl_ms = sealed.expires_ms.saturating_sub(sealed.created_ms);
    let mut task = Task::new(
        handle,
        TaskStatus::Working,
        rfc3339(sealed.created_ms),
        rfc3339(now_ms()),
    )
    .with_ttl_ms(ttl_ms);
    if !ended {
        task = task
            .with_poll_interval_ms(POLL_INTERVAL_MS)
            .with_status_message(format!("query turn {status}"));
    }
    Ok(DetailedTask::new(task, payload))
}

/// Whether the turn `get_query` read has ended: `tasks/cancel` refuses an
/// ended task.
pub(crate) fn ended(response: CallToolResponse) -> Result<bool, ErrorData> {
    let result = complete(response)?;
    let status = read_status(&result)?;
    Ok(matches!(
        status,
        QueryStatus::Completed | QueryStatus::Failed | QueryStatus::Cancelled
    ))
}

/// The error for `tasks/cancel` on a task that has already ended.
pub(crate) fn already_ended() -> ErrorData {
    ErrorData::invalid_params("the task has already ended and cannot be cancelled", None)
}

/// After `tasks/cancel`: a turn Nexus no longer knows is an unknown task.
pub(crate) fn cancelled(outcome: Result<(), super::ToolError>) -> Result<(), ErrorData> {
    match outcome {
        Ok(()) => Ok(()),
        Err(e) if e.code == super::ToolErrorCode::NotFound => Err(unknown_task()),
        Err(e) if e.code == super::ToolErrorCode::Lifecycle => Err(already_ended()),
        Err(e) => Err(ErrorData::internal_error(
            format!("could not cancel the task's turn: {}", redact(&e.message)),
            None,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_opens_for_its_owner_only_until_it_expires() {
        let seal = TaskSeal::new(b"0123456789abcdef-shared").unwrap();
        let a = Some([1u8; 32]);
        let b = Some([2u8; 32]);
        let handle = seal.seal(a, "qry_1.x", 1_000).unwrap();
        let opened = seal.open(a, &handle, 2_000).expect("the owner opens it");
        assert_eq!(opened.query_id, "qry_1.x");
        assert!(seal.open(b, &handle, 2_000).is_none(), "another key");
        assert!(seal.open(None, &handle, 2_000).is_none(), "no key");
        let ttl = seal.ttl_ms();
        assert!(seal.open(a, &handle, 1_000 + ttl).is_none(), "expired");
        // Another replica with the same secret opens it; another secret does not.
        let replica = TaskSeal::new(b"0123456789abcdef-shared").unwrap();
        assert!(replica.open(a, &handle, 2_000).is_some());
        let stranger = TaskSeal::new(b"0123456789abcdef-other!").unwrap();
        assert!(stranger.open(a, &handle, 2_000).is_none());
        // Altered handles are unknown.
        let longer = handle.replacen(".1000.", ".999.", 1);
        assert!(seal.open(a, &longer, 2_000).is_none());
        let other_query = format!("{}y", handle);
        assert!(seal.open(a, &other_query, 2_000).is_none());
        assert!(seal.open(a, "qry_1", 2_000).is_none());
        assert!(TaskSeal::new(b"short").is_err());
    }

    #[test]
    fn a_rotated_seal_opens_the_previous_secrets_handles_and_seals_with_the_new_one() {
        let old = TaskSeal::new(b"the old secret, rotated out").unwrap();
        let owner = Some([1u8; 32]);
        let from_old = old.seal(owner, "qry_old", 1_000).unwrap();
        let new_only = TaskSeal::new(b"the new secret, rotated in").unwrap();
        assert!(new_only.open(owner, &from_old, 2_000).is_none());
        let rotating = TaskSeal::new(b"the new secret, rotated in")
            .unwrap()
            .with_previous(b"the old secret, rotated out")
            .unwrap();
        let opened = rotating.open(owner, &from_old, 2_000).expect("previous");
        assert_eq!(opened.query_id, "qry_old");
        assert!(rotating.open(Some([2u8; 32]), &from_old, 2_000).is_none());
        let ttl = rotating.ttl_ms();
        assert!(rotating.open(owner, &from_old, 1_000 + ttl).is_none());
        // New handles carry the current secret: the new-only fleet opens
        // them, the old one does not.
        let from_rotating = rotating.seal(owner, "qry_new", 3_000).unwrap();
        assert!(new_only.open(owner, &from_rotating, 4_000).is_some());
        assert!(old.open(owner, &from_rotating, 4_000).is_none());
        assert!(rotating.clone().with_previous(b"short").is_err());
    }

    #[test]
    fn a_completed_result_is_the_object_of_its_serialization() {
        let body = json!({"status": "completed", "answer": "a \"quoted\" answer", "n": 2});
        let mut plain = CallToolResult::success(vec![
            ContentBlock::text(body.to_string()),
            ContentBlock::text("second"),
        ]);
        plain.structured_content = Some(body.clone());
        let mut bare = CallToolResult::success(vec![ContentBlock::text("only text")]);
        bare.is_error = None;
        bare.result_type = None;
        let mut with_meta = plain.clone();
        with_meta.meta = Some(rmcp::model::MetaObject(JsonObject::from_iter([(
            "k".to_owned(),
            json!(1),
        )])));
        let mut null_structured = bare.clone();
        null_structured.structured_content = Some(Value::Null);
        let empty = CallToolResult::success(Vec::new());
        for result in [plain, bare, with_meta, null_structured, empty] {
            let expected = serde_json::to_string(&result).unwrap();
            let object = result_object(result).expect("an object");
            assert_eq!(serde_json::to_string(&object).unwrap(), expected);
        }
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let tag = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex(&tag),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
