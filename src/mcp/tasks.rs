//! `query_context` as an MCP task (the `io.modelcontextprotocol/tasks`
//! extension) for clients that declare task support.
//!
//! Such a client's `query_context` starts the Nexus turn as before and gets
//! a task back instead of `{query_id, ...}`: the task id is the Nexus query
//! id. `tasks/get` reads the turn from Nexus with the caller's own key
//! (`working` while it runs; `completed` with the `get_query` result — the
//! answer and its citations — as the task's `result`; `failed` with the
//! turn's error; `cancelled`), and `tasks/cancel` cancels the Nexus turn.
//! Clients without task support keep the `query_context` + `get_query` flow.
//!
//! The server keeps only which caller started which task, never a result:
//! each `tasks/get` asks Nexus. A task is known to the caller (the key) that
//! started it and to nobody else; any other caller gets the same "unknown
//! task" error as for an id that never existed. Bounded: [`TaskLimits`]
//! caps tasks per caller and in all, and how long each is remembered
//! (shorter once it was seen ended). When a caller's share is full, its
//! `query_context` answers the plain way (the turn is still started and its
//! `query_id` returned).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CreateTaskResult, DetailedTask,
    Extensions, JsonObject, Task, TaskPayload, TaskStatus,
};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::caller::{caller_api_key, key_digest};
use super::instant_after;
use super::redact::redact;
use crate::status::QueryStatus;

/// The longest query id kept as a task id, in bytes.
const MAX_ID_BYTES: usize = 256;
/// The poll interval suggested to clients.
const POLL_INTERVAL_MS: u64 = 1_000;

/// How many tasks are remembered, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    /// Tasks one caller (one key) may have at once.
    pub per_caller: usize,
    /// Tasks of all callers together.
    pub total: usize,
    /// How long a task is remembered after it started.
    pub ttl: Duration,
    /// How long a task is remembered once `tasks/get` saw it end (at most
    /// `ttl` after it started).
    pub ended_ttl: Duration,
}

impl Default for TaskLimits {
    fn default() -> Self {
        TaskLimits {
            per_caller: 32,
            total: 4096,
            ttl: Duration::from_secs(3600),
            ended_ttl: Duration::from_secs(600),
        }
    }
}

/// Who started a task: the digest of the caller's key, or `None` for calls
/// that run with the server's configured key (stdio, keyless HTTP).
type Owner = Option<[u8; 32]>;

#[derive(Debug)]
struct Entry {
    created_at: String,
    expires: Instant,
    ended: bool,
}

/// The tasks this server remembers.
#[derive(Debug, Default)]
pub(crate) struct TaskStore {
    limits: TaskLimits,
    entries: Mutex<HashMap<(Owner, String), Entry>>,
}

/// The error for a task id this caller does not have: the same whether the
/// id never existed, expired, or belongs to another caller.
pub(crate) fn unknown_task() -> ErrorData {
    ErrorData::invalid_params("unknown task", None)
}

/// The owner of the request whose extensions are `ext`.
pub(crate) fn owner_of(ext: &Extensions) -> Owner {
    caller_api_key(ext).map(|k| key_digest(&k))
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl TaskStore {
    pub(crate) fn new(limits: TaskLimits) -> Self {
        TaskStore {
            limits,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn locked(&self) -> MutexGuard<'_, HashMap<(Owner, String), Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers `id` as `owner`'s task; `None` when there is no room (or
    /// the id is too long to keep).
    pub(crate) fn register(&self, owner: Owner, id: &str) -> Option<Task> {
        if id.is_empty() || id.len() > MAX_ID_BYTES {
            return None;
        }
        let now = Instant::now();
        let mut entries = self.locked();
        entries.retain(|_, e| e.expires > now);
        let mine = entries.keys().filter(|(o, _)| *o == owner).count();
        if mine >= self.limits.per_caller {
            // Room is made by forgetting this caller's oldest ended task.
            let oldest = entries
                .iter()
                .filter(|((o, _), e)| *o == owner && e.ended)
                .min_by_key(|(_, e)| e.expires)
                .map(|(k, _)| k.clone());
            entries.remove(&oldest?);
        }
        if entries.len() >= self.limits.total {
            return None;
        }
        let created_at = now_rfc3339();
        let ttl_ms = u64::try_from(self.limits.ttl.as_millis()).unwrap_or(u64::MAX);
        entries.insert(
            (owner, id.to_owned()),
            Entry {
                created_at: created_at.clone(),
                expires: instant_after(now, self.limits.ttl),
                ended: false,
            },
        );
        Some(
            Task::new(id, TaskStatus::Working, created_at.clone(), created_at)
                .with_ttl_ms(ttl_ms)
                .with_poll_interval_ms(POLL_INTERVAL_MS),
        )
    }

    /// When `owner`'s task `id` was created, if it has one.
    fn created_at(&self, owner: Owner, id: &str) -> Option<String> {
        let now = Instant::now();
        let entries = self.locked();
        entries
            .get(&(owner, id.to_owned()))
            .filter(|e| e.expires > now)
            .map(|e| e.created_at.clone())
    }

    /// Notes that `owner`'s task `id` ended: it is remembered a shorter time.
    fn ended(&self, owner: Owner, id: &str) {
        let mut entries = self.locked();
        if let Some(e) = entries.get_mut(&(owner, id.to_owned()))
            && !e.ended
        {
            e.ended = true;
            e.expires = e
                .expires
                .min(instant_after(Instant::now(), self.limits.ended_ttl));
        }
    }

    fn forget(&self, owner: Owner, id: &str) {
        self.locked().remove(&(owner, id.to_owned()));
    }

    /// How many tasks are remembered (expired ones included until the next
    /// registration).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.locked().len()
    }
}

/// The task for a `query_context` result, if it started a turn and there is
/// room: the turn's query id becomes the task id.
pub(crate) fn task_for(
    store: &TaskStore,
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
    let task = store.register(owner, id);
    if task.is_none() {
        tracing::debug!("no room for another task: query_context answers the plain way");
    }
    task.map(CreateTaskResult::new)
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

/// `tasks/get`'s answer from `get_query`'s result for owner's task `id`.
pub(crate) fn detailed(
    store: &TaskStore,
    owner: Owner,
    id: &str,
    created_at: String,
    response: CallToolResponse,
) -> Result<DetailedTask, ErrorData> {
    let CallToolResponse::Complete(result) = response else {
        return Err(ErrorData::internal_error(
            "unexpected get_query answer",
            None,
        ));
    };
    if result.is_error == Some(true) {
        let (code, message) = tool_error(&result);
        if code == "NOT_FOUND" {
            store.forget(owner, id);
            return Err(unknown_task());
        }
        return Err(ErrorData::internal_error(
            format!("could not read the task's turn: {message}"),
            Some(json!({"code": code})),
        ));
    }
    let status = result
        .structured_content
        .as_ref()
        .and_then(|v| v.get("status"))
        .and_then(Value::as_str)
        .map_or(QueryStatus::Other(String::new()), QueryStatus::from);
    let payload = match status {
        QueryStatus::Completed => {
            let result = match serde_json::to_value(&result) {
                Ok(Value::Object(map)) => map,
                _ => return Err(ErrorData::internal_error("unencodable result", None)),
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
    if ended {
        store.ended(owner, id);
    }
    let mut task = Task::new(id, TaskStatus::Working, created_at, now_rfc3339())
        .with_ttl_ms(u64::try_from(store.limits.ttl.as_millis()).unwrap_or(u64::MAX));
    if !ended {
        task = task
            .with_poll_interval_ms(POLL_INTERVAL_MS)
            .with_status_message(format!("query turn {status}"));
    }
    Ok(DetailedTask::new(task, payload))
}

/// The creation time of `owner`'s task `id`, or the uniform "unknown task".
pub(crate) fn known(store: &TaskStore, owner: Owner, id: &str) -> Result<String, ErrorData> {
    store.created_at(owner, id).ok_or_else(unknown_task)
}

/// After `tasks/cancel`: a turn Nexus no longer knows is an unknown task.
pub(crate) fn cancelled(
    store: &TaskStore,
    owner: Owner,
    id: &str,
    outcome: Result<(), super::ToolError>,
) -> Result<(), ErrorData> {
    match outcome {
        Ok(()) => Ok(()),
        Err(e) if e.code == super::ToolErrorCode::NotFound => {
            store.forget(owner, id);
            Err(unknown_task())
        }
        Err(e) => Err(ErrorData::internal_error(
            format!("could not cancel the task's turn: {}", redact(&e.message)),
            None,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_are_bounded_per_caller_and_isolated() {
        let store = TaskStore::new(TaskLimits {
            per_caller: 2,
            total: 3,
            ..TaskLimits::default()
        });
        let a = Some([1u8; 32]);
        let b = Some([2u8; 32]);
        assert!(store.register(a, "q1").is_some());
        assert!(store.register(a, "q2").is_some());
        assert!(store.register(a, "q3").is_none(), "a's share is full");
        assert!(known(&store, b, "q1").is_err(), "b does not see a's task");
        assert!(known(&store, a, "q1").is_ok());
        store.ended(a, "q1");
        assert!(
            store.register(a, "q3").is_some(),
            "an ended task makes room"
        );
        assert!(known(&store, a, "q1").is_err());
        assert!(store.register(b, "q1").is_some());
        assert!(store.register(None, "q9").is_none(), "the total is full");
        assert!(store.register(b, &"x".repeat(MAX_ID_BYTES + 1)).is_none());
        assert_eq!(store.len(), 3);
    }
}
