//! The Nexus tools: `list_contexts`, `query_context` and `get_query`.
//!
//! They have the names, arguments and result shapes of Nexus's hosted MCP
//! server, plus `wait_seconds` on `get_query`. Every result carries the JSON
//! both as a text block and as `structuredContent` described by the tool's
//! `outputSchema`; every failure is a tool result with `isError: true` and a
//! [`ToolError`] body, which that schema also admits.
//!
//! # Deadlines and cancellation
//!
//! Every Nexus call a tool makes has a deadline ([`DEFAULT_CALL_TIMEOUT`],
//! see [`NexusServer::with_call_timeout`]); `get_query` may take that plus
//! its `wait_seconds`. A passed deadline is a `TIMEOUT` tool error. Each call
//! also races the request's cancellation token: a cancelled call stops at
//! once, and a cancelled `query_context` either sends no turn or cancels the
//! turn it started.
//!
//! # Arguments are validated here, not by serde
//!
//! The tools take their arguments as a raw JSON object and check each field
//! themselves. A typed `Parameters<T>` would turn a wrong type (a number for
//! `question`, a string for `wait_seconds`) into rmcp's own error text, which
//! names no field; here every schema-level problem becomes a `VALIDATION`
//! error with `field` set, like any other bad input. The advertised
//! `inputSchema` still comes from the typed argument structs below.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use rmcp::handler::server::common::{schema_for_empty_input, schema_for_input};
use rmcp::handler::server::tool::{ToolRouter, schema_for_output};
use rmcp::model::{
    CallToolResult, ContentBlock, JsonObject, ProgressNotificationParam, ProgressToken,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use super::recent::Recent;
use super::tool_error::{ToolError, ToolErrorCode, with_error_branch};
use crate::{Client, Error, types};

/// The longest question accepted, in characters.
pub const MAX_QUESTION_CHARS: usize = 32 * 1024;
/// The longest context slug or query id accepted, in characters.
const MAX_ID_CHARS: usize = 128;
/// The most `get_query` waits server-side.
pub const MAX_WAIT_SECONDS: u64 = 60;
/// Default deadline of one Nexus call made by a tool.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// First and longest pause between two polls while `get_query` waits.
const POLL_FIRST: Duration = Duration::from_millis(200);
const POLL_MAX: Duration = Duration::from_secs(2);

/// The guide sent as the server's MCP `instructions`.
pub const INSTRUCTIONS: &str = "Ask questions of Pinecone Nexus knowledge contexts. \
Flow: 1) call list_contexts to see the contexts and whether each is `queryable`; \
2) call query_context with a queryable context's slug and a question: it starts the \
turn and returns a query_id at once; 3) call get_query with that query_id until \
`status` is completed, failed or cancelled (pass wait_seconds, up to 60, to wait \
server-side instead of polling). The answer and its citations are in the completed result.";

pub use super::caller::KeyPolicy;

/// The most threads that get a connection pool of their own for callers'
/// Nexus calls; threads past it share the configured client's.
const MAX_THREAD_POOLS: usize = 64;

/// How many callers' Nexus clients are kept built (per serving thread and
/// caller key); the least recently used is dropped past it.
const MAX_CALLER_CLIENTS: usize = 64;

/// The HTTP clients of callers' Nexus calls, and the Nexus clients built on
/// them for recent caller keys.
///
/// A pooled connection is driven by the runtime that opened it, so threads
/// each running a single-threaded runtime (`nexus-mcp` serving HTTP on
/// several threads) get a pool each; a shared pool would send most calls
/// through another thread and back. Elsewhere, and for a client the caller
/// supplied, the configured client's pool serves every call.
///
/// Built clients are keyed by a digest of the key (never the key itself),
/// and by thread where threads have pools of their own, so a call neither
/// rebuilds one nor reaches another caller's.
struct CallerHttp {
    per_thread: std::sync::Mutex<HashMap<std::thread::ThreadId, reqwest::Client>>,
    clients: std::sync::Mutex<Recent<CallerSlot, Client>>,
}

/// A built caller client's key: the thread whose pool it uses (`None` for
/// the shared pool) and the digest of the caller's key.
type CallerSlot = (Option<std::thread::ThreadId>, [u8; 32]);

impl CallerHttp {
    fn new() -> Self {
        CallerHttp {
            per_thread: std::sync::Mutex::new(HashMap::new()),
            clients: std::sync::Mutex::new(Recent::new(MAX_CALLER_CLIENTS)),
        }
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, Recent<CallerSlot, Client>> {
        // Plain values; a poisoned map is still consistent.
        self.clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The Nexus client for a call made on this thread with the caller's
    /// `key` and `configured`'s other settings, built on first use.
    fn client(&self, configured: &Client, key: &secrecy::SecretString) -> Result<Client, Error> {
        use secrecy::ExposeSecret;
        let slot = (pool_thread(), super::caller::key_digest(key));
        if let Some(client) = self.clients().get(&slot) {
            return Ok(client.clone());
        }
        let client = Client::builder()
            .base_url(configured.base_url())
            .api_version(configured.api_version().clone())
            .http_client(self.get(configured))
            .api_key(key.expose_secret())
            .build()?;
        self.clients().insert(slot, client.clone());
        Ok(client)
    }

    /// The HTTP client for a call made on this thread with `configured`'s settings.
    fn get(&self, configured: &Client) -> reqwest::Client {
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
fn pool_thread() -> Option<std::thread::ThreadId> {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread)
        .then(|| std::thread::current().id())
}

/// The MCP server of the Nexus tools. Clones share the client.
#[derive(Clone)]
pub struct NexusServer {
    client: Client,
    caller_http: std::sync::Arc<CallerHttp>,
    keys: KeyPolicy,
    call_timeout: Duration,
    tool_router: ToolRouter<Self>,
}

impl fmt::Debug for NexusServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NexusServer")
            .field("client", &self.client)
            .field("keys", &self.keys)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------
// Argument and result shapes (they are the advertised schemas).

/// Arguments of `query_context`.
#[derive(Debug, JsonSchema)]
#[allow(dead_code)] // Only its schema is used; the fields are read by hand.
struct QueryContextArgs {
    /// The slug of a queryable context, as `list_contexts` returns it.
    context: String,
    /// The question, in natural language.
    #[schemars(length(min = 1))]
    question: String,
}

/// Arguments of `get_query`.
#[derive(Debug, JsonSchema)]
#[allow(dead_code)] // Only its schema is used; the fields are read by hand.
struct GetQueryArgs {
    /// The `query_id` returned by `query_context`.
    query_id: String,
    /// Wait up to this many seconds (0-60, default 0) for the turn to end before answering.
    #[schemars(range(min = 0, max = 60))]
    wait_seconds: Option<u64>,
}

/// One context as `list_contexts` describes it.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ContextSummary {
    /// The context's slug: what `query_context` takes.
    pub slug: String,
    /// Display name.
    pub name: String,
    /// The context's id.
    pub id: String,
    /// What the context holds.
    pub description: Option<String>,
    /// Whether `query_context` may be called on it now.
    pub queryable: bool,
    /// Whether curation is running.
    pub is_curating: bool,
    /// Whether optimization is running.
    pub is_optimizing: bool,
    /// When it was last curated (ISO 8601), if ever.
    pub last_curated_at: Option<String>,
    /// When it was last optimized (ISO 8601), if ever.
    pub last_optimized_at: Option<String>,
}

impl From<&types::ContextResponse> for ContextSummary {
    fn from(c: &types::ContextResponse) -> Self {
        ContextSummary {
            slug: c.slug.clone(),
            name: c.name.clone(),
            id: c.id.clone(),
            description: c.description.clone(),
            queryable: c.is_queryable(),
            is_curating: c.is_curating,
            is_optimizing: c.is_optimizing,
            last_curated_at: c.last_curated_at.as_ref().map(iso),
            last_optimized_at: c.last_optimized_at.as_ref().map(iso),
        }
    }
}

/// The structured result of `list_contexts`.
///
/// The text block holds the bare array (the hosted server's shape);
/// `structuredContent` wraps it in an object because MCP before 2026-07-28
/// only carries object-shaped structured content.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ContextList {
    /// Every context of the project.
    pub contexts: Vec<ContextSummary>,
}

/// The result of `query_context`.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct QueryStarted {
    /// Pass it to `get_query`.
    pub query_id: String,
    /// The turn's status (`in_progress` at first).
    pub status: String,
    /// The model answering, when known.
    pub model: Option<String>,
}

/// One source an answer cites.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct CitationSummary {
    /// The cited source file.
    pub source: String,
    /// Section paths within the source.
    pub section_paths: Vec<Vec<String>>,
    /// Cited pages.
    pub pages: Vec<i64>,
    /// How the answer is grounded in it.
    pub grounding: Option<String>,
    /// The kind of citation.
    pub kind: Option<String>,
}

/// The result of `get_query`.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct QueryOutcome {
    /// The turn.
    pub query_id: String,
    /// The answer text; null until the turn has completed.
    pub answer: Option<String>,
    /// The structured answer, when the turn asked for one.
    pub output_json: Option<serde_json::Map<String, Value>>,
    /// The sources the answer cites.
    pub citations: Vec<CitationSummary>,
    /// The model that answered.
    pub model: Option<String>,
    /// `in_progress`, `completed`, `failed` or `cancelled`.
    pub status: String,
    /// Why the turn failed or was cancelled.
    pub error: Option<String>,
}

impl From<&types::Query> for QueryOutcome {
    fn from(q: &types::Query) -> Self {
        let completed = q.status() == crate::QueryStatus::Completed;
        QueryOutcome {
            query_id: q.id.clone(),
            answer: completed.then(|| q.answer_text()),
            output_json: q.output_json.clone(),
            citations: q
                .citations
                .iter()
                .map(|c| CitationSummary {
                    source: c.source.clone(),
                    section_paths: c.section_paths.clone(),
                    pages: c.pages.clone(),
                    grounding: c.grounding.clone(),
                    kind: c.kind.clone(),
                })
                .collect(),
            model: q.model.clone(),
            status: q.status.clone(),
            error: q.error.clone(),
        }
    }
}

fn iso(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// A failed call: `isError: true` and the [`ToolError`] JSON as text and as
/// `structuredContent` (every tool's `outputSchema` admits it, see
/// [`with_error_branch`]).
pub(crate) fn failure(error: ToolError) -> CallToolResult {
    error.into_result()
}

/// The `outputSchema` of a tool returning `T`, admitting a [`ToolError`] too.
fn output_schema<T: JsonSchema + 'static>() -> std::sync::Arc<JsonObject> {
    with_error_branch((*schema_for_output::<T>()).clone())
}

fn input_schema<T: JsonSchema + 'static>() -> std::sync::Arc<JsonObject> {
    // The argument types are constants of this module and always produce an
    // object schema; the fallback only keeps a bad edit from panicking.
    schema_for_input::<T>().unwrap_or_else(|_| schema_for_empty_input())
}

/// A successful result: `value` as text and as structured content.
fn success<T: Serialize>(text: &impl Serialize, structured: &T) -> CallToolResult {
    match (
        serde_json::to_string(text),
        serde_json::to_value(structured),
    ) {
        (Ok(text), Ok(value)) => {
            let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
            result.structured_content = Some(value);
            result
        }
        _ => failure(ToolError::new(
            ToolErrorCode::NexusError,
            "could not encode the result",
            false,
        )),
    }
}

// ---------------------------------------------------------------------------
// The tools.

#[tool_router]
impl NexusServer {
    /// `list_contexts`: every context with whether it can be queried now.
    #[tool(
        name = "list_contexts",
        description = "List the Nexus contexts of this project. Returns an array of \
            {slug, name, id, description, queryable, is_curating, is_optimizing, \
            last_curated_at, last_optimized_at}. Only contexts with queryable=true can be \
            passed to query_context; a search context becomes queryable once it has been curated.",
        input_schema = schema_for_empty_input(),
        output_schema = output_schema::<ContextList>(),
        annotations(
            title = "List Nexus contexts",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn list_contexts(&self, ctx: RequestContext<RoleServer>) -> CallToolResult {
        match until_cancelled(&ctx.ct, self.run_list_contexts(&ctx)).await {
            Ok(list) => success(&list.contexts, &list),
            Err(e) => failure(e),
        }
    }

    /// `query_context`: starts a background turn.
    #[tool(
        name = "query_context",
        description = "Ask a question of one Nexus context. Starts the query turn in the \
            background and returns at once {query_id, status, model}; the answer is not in \
            this result. Then call get_query with the query_id (optionally with wait_seconds) \
            until status is completed, failed or cancelled. `context` is a slug from \
            list_contexts whose queryable is true; `question` must not be empty.",
        input_schema = input_schema::<QueryContextArgs>(),
        output_schema = output_schema::<QueryStarted>(),
        // Each call starts a new, billed turn: not read-only, not idempotent.
        annotations(
            title = "Ask a Nexus context",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = true
        )
    )]
    async fn query_context(
        &self,
        args: JsonObject,
        ctx: RequestContext<RoleServer>,
    ) -> CallToolResult {
        match self.run_query_context(&args, &ctx).await {
            Ok(started) => success(&started, &started),
            Err(e) => failure(e),
        }
    }

    /// `get_query`: the state of a turn, optionally after waiting for it to end.
    #[tool(
        name = "get_query",
        description = "Get the result of a query turn started by query_context. Returns \
            {query_id, answer, output_json, citations, model, status, error}. answer is null \
            until status is completed; while status is in_progress call again (or pass \
            wait_seconds from 0 to 60 to wait server-side; progress notifications then carry \
            the turn's step commentary). failed and cancelled turns explain why in error.",
        input_schema = input_schema::<GetQueryArgs>(),
        output_schema = output_schema::<QueryOutcome>(),
        annotations(
            title = "Get a Nexus query result",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn get_query(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> CallToolResult {
        match until_cancelled(&ctx.ct, self.run_get_query(&args, &ctx)).await {
            Ok(outcome) => success(&outcome, &outcome),
            Err(e) => failure(e),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for NexusServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(super::implementation())
            .with_instructions(INSTRUCTIONS)
    }
}

impl NexusServer {
    /// Tools that call Nexus with `client`, using its key for every call.
    pub fn new(client: Client) -> Self {
        NexusServer {
            client,
            caller_http: std::sync::Arc::new(CallerHttp::new()),
            keys: KeyPolicy::Configured,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            tool_router: Self::tool_router(),
        }
    }

    /// Sets the deadline of each Nexus call a tool makes (default
    /// [`DEFAULT_CALL_TIMEOUT`]); `get_query` may wait this plus its
    /// `wait_seconds`. A zero duration is raised to 1 ms.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The deadline of each Nexus call a tool makes.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// Runs one Nexus call under the call deadline.
    fn nexus<'a, T: 'a>(
        &'a self,
        subject: Subject<'a>,
        call: impl Future<Output = crate::Result<T>> + 'a,
    ) -> impl Future<Output = Result<T, ToolError>> + 'a {
        self.nexus_within(self.call_timeout, subject, call)
    }

    /// Runs one Nexus call under `deadline`.
    ///
    /// The call is boxed here, once: an SDK call's future is kilobytes, and
    /// each future awaiting it by value (this one, the tool's, rmcp's boxed
    /// handler) would hold, and move, a copy of it otherwise.
    fn nexus_within<'a, T: 'a>(
        &'a self,
        deadline: Duration,
        subject: Subject<'a>,
        call: impl Future<Output = crate::Result<T>> + 'a,
    ) -> impl Future<Output = Result<T, ToolError>> + 'a {
        let call = Box::pin(call);
        async move {
            match tokio::time::timeout(deadline, call).await {
                Ok(result) => result.map_err(|e| nexus_error(e, subject)),
                Err(_) => Err(ToolError::timeout("Nexus", deadline)),
            }
        }
    }

    /// The key policy the tools follow.
    pub fn key_policy(&self) -> KeyPolicy {
        self.keys
    }

    /// The configured client (its base URL and connection pool).
    pub(crate) fn configured_client(&self) -> &Client {
        &self.client
    }

    /// Sets where each call's credentials come from (default
    /// [`KeyPolicy::Configured`]).
    pub fn with_key_policy(mut self, keys: KeyPolicy) -> Self {
        self.keys = keys;
        self
    }

    /// The definitions of the tools this server serves.
    pub fn tools(&self) -> Vec<rmcp::model::Tool> {
        self.tool_router.list_all()
    }

    /// Whether this server serves a tool named `name`.
    pub fn has_tool(&self, name: &str) -> bool {
        self.tool_router.has_route(name)
    }

    /// The client for one call, following the key policy.
    fn client_for(&self, ctx: &RequestContext<RoleServer>) -> Result<Client, ToolError> {
        match super::caller::call_key(self.keys, &ctx.extensions)? {
            super::caller::CallKey::Configured => Ok(self.client.clone()),
            super::caller::CallKey::Caller(key) => self
                .caller_http
                .client(&self.client, &key)
                .map_err(|e| nexus_error(e, Subject::None)),
        }
    }

    async fn run_list_contexts(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<ContextList, ToolError> {
        let client = self.client_for(ctx)?;
        let contexts = self.nexus(Subject::None, client.contexts().list()).await?;
        Ok(ContextList {
            contexts: contexts.iter().map(ContextSummary::from).collect(),
        })
    }

    async fn run_query_context(
        &self,
        args: &JsonObject,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<QueryStarted, ToolError> {
        let slug = required_id(args, "context")?;
        let question = required_str(args, "question")?;
        if question.trim().is_empty() {
            return Err(ToolError::validation(
                "question",
                "question must not be empty",
            ));
        }
        if question.chars().count() > MAX_QUESTION_CHARS {
            return Err(ToolError::validation(
                "question",
                format!("question is longer than {MAX_QUESTION_CHARS} characters"),
            ));
        }
        let client = self.client_for(ctx)?;
        // Until the turn is sent, cancelling simply stops here.
        let context = until_cancelled(
            &ctx.ct,
            self.nexus(Subject::Context(slug), client.contexts().get(slug)),
        )
        .await?;
        if !context.is_queryable() {
            return Err(not_queryable(&context));
        }
        let session = client
            .session([context.slug.as_str()])
            .build()
            .map_err(|e| nexus_error(e, Subject::Context(slug)))?;
        if ctx.ct.is_cancelled() {
            return Err(ToolError::cancelled());
        }
        // Once sent, the request is not abandoned on cancellation (its query
        // id would be lost with a turn running); it finishes, and the turn is
        // then cancelled.
        let handle = self
            .nexus(Subject::Context(slug), session.ask(question).background())
            .await?;
        let query = handle.last_seen();
        if ctx.ct.is_cancelled() {
            tracing::debug!(query_id = %query.id, "request cancelled: cancelling the turn it started");
            if let Err(e) = self
                .nexus(
                    Subject::Query(&query.id),
                    client.queries().cancel(&query.id),
                )
                .await
            {
                tracing::warn!(query_id = %query.id, error = %e, "could not cancel the turn of a cancelled request");
            }
            return Err(ToolError::cancelled());
        }
        tracing::debug!(query_id = %query.id, context = slug, "query turn started");
        Ok(QueryStarted {
            query_id: query.id.clone(),
            status: query.status.clone(),
            model: query.model.clone(),
        })
    }

    async fn run_get_query(
        &self,
        args: &JsonObject,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<QueryOutcome, ToolError> {
        let query_id = required_id(args, "query_id")?;
        let wait = optional_wait(args)?;
        let client = self.client_for(ctx)?;
        // The whole call ends by `wait + call_timeout`; each poll also has
        // the call deadline, shortened to what is left of the whole.
        let start = tokio::time::Instant::now();
        let give_up = super::instant_after(start, wait.saturating_add(self.call_timeout));
        let fetch = || async {
            let left = give_up
                .saturating_duration_since(tokio::time::Instant::now())
                .min(self.call_timeout)
                .max(Duration::from_millis(1));
            self.nexus_within(
                left,
                Subject::Query(query_id),
                client.queries().get(query_id),
            )
            .await
        };
        let mut query = fetch().await?;
        if wait.is_zero() || query.is_terminal() {
            return Ok(QueryOutcome::from(&query));
        }

        let mut progress = ctx
            .meta
            .get_progress_token()
            .map(|token| StepProgress::new(token, ctx.peer.clone()));
        let deadline = start + wait;
        let mut pause = POLL_FIRST;
        loop {
            if let Some(p) = progress.as_mut() {
                p.report(&query.steps).await;
            }
            let now = tokio::time::Instant::now();
            if query.is_terminal() || now >= deadline {
                break;
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            query = fetch().await?;
            pause = (pause * 3 / 2).min(POLL_MAX);
        }
        Ok(QueryOutcome::from(&query))
    }
}

/// `work`, or `CANCELLED` as soon as `ct` is cancelled (dropping `work`).
async fn until_cancelled<T>(
    ct: &tokio_util::sync::CancellationToken,
    work: impl Future<Output = Result<T, ToolError>>,
) -> Result<T, ToolError> {
    tokio::select! {
        biased;
        _ = ct.cancelled() => Err(ToolError::cancelled()),
        result = work => result,
    }
}

/// Sends one progress notification per new or changed step commentary.
struct StepProgress {
    token: ProgressToken,
    peer: rmcp::Peer<RoleServer>,
    /// The commentary last reported per step id.
    seen: HashMap<String, String>,
    sent: u32,
}

impl StepProgress {
    fn new(token: ProgressToken, peer: rmcp::Peer<RoleServer>) -> Self {
        StepProgress {
            token,
            peer,
            seen: HashMap::new(),
            sent: 0,
        }
    }

    async fn report(&mut self, steps: &[types::QueryStep]) {
        for step in steps {
            let commentary = step.commentary.trim();
            if commentary.is_empty()
                || self.seen.get(&step.step_id).map(String::as_str) == Some(commentary)
            {
                continue;
            }
            self.seen
                .insert(step.step_id.clone(), commentary.to_owned());
            self.sent += 1;
            let note = ProgressNotificationParam::new(self.token.clone(), f64::from(self.sent))
                .with_message(commentary);
            // A client that went away cannot be told; the result still goes back.
            if let Err(e) = self.peer.notify_progress(note).await {
                tracing::debug!(error = %e, "could not send a progress notification");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Argument checks.

fn required_str<'a>(args: &'a JsonObject, field: &str) -> Result<&'a str, ToolError> {
    match args.get(field) {
        None | Some(Value::Null) => {
            Err(ToolError::validation(field, format!("{field} is required")))
        }
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(ToolError::validation(
            field,
            format!("{field} must be a string, not {}", json_kind(other)),
        )),
    }
}

/// A context slug or a query id: 1 to 128 letters, digits, `-`, `_` or `.`.
fn required_id<'a>(args: &'a JsonObject, field: &str) -> Result<&'a str, ToolError> {
    let id = required_str(args, field)?.trim();
    if id.is_empty() {
        return Err(ToolError::validation(
            field,
            format!("{field} must not be empty"),
        ));
    }
    let well_formed = id.len() <= MAX_ID_CHARS
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && id != "."
        && id != "..";
    if !well_formed {
        let hint = match field {
            "context" => "a context slug from list_contexts",
            _ => "the query_id returned by query_context",
        };
        return Err(ToolError::validation(
            field,
            format!("{field} is not a valid id: expected {hint}"),
        ));
    }
    Ok(id)
}

fn optional_wait(args: &JsonObject) -> Result<Duration, ToolError> {
    const FIELD: &str = "wait_seconds";
    let out_of_range = || {
        ToolError::validation(
            FIELD,
            format!("{FIELD} must be an integer from 0 to {MAX_WAIT_SECONDS}"),
        )
    };
    let seconds = match args.get(FIELD) {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(s), _) => s,
            // 5.0 is an integer in JSON Schema's sense.
            (None, Some(f)) if f.fract() == 0.0 && (0.0..=MAX_WAIT_SECONDS as f64).contains(&f) => {
                f as u64
            }
            _ => return Err(out_of_range()),
        },
        Some(other) => {
            return Err(ToolError::validation(
                FIELD,
                format!(
                    "{FIELD} must be an integer from 0 to {MAX_WAIT_SECONDS}, not {}",
                    json_kind(other)
                ),
            ));
        }
    };
    if seconds > MAX_WAIT_SECONDS {
        return Err(out_of_range());
    }
    Ok(Duration::from_secs(seconds))
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

// ---------------------------------------------------------------------------
// Error mapping.

/// What a failed call was about, for NOT_FOUND messages.
#[derive(Debug, Clone, Copy)]
enum Subject<'a> {
    None,
    Context(&'a str),
    Query(&'a str),
}

fn not_queryable(context: &types::ContextResponse) -> ToolError {
    let slug = &context.slug;
    let (message, suggestion) = if context.is_curating {
        (
            format!(
                "context `{slug}` is not queryable yet: it is being curated for the first time"
            ),
            "wait for curation to finish (list_contexts shows is_curating and queryable), then call query_context again".to_owned(),
        )
    } else {
        (
            format!(
                "context `{slug}` is not queryable: it is a {} context that has never been curated",
                context.kind.as_str()
            ),
            format!(
                "curate it first (POST /contexts/{slug}/curate), then call query_context again once list_contexts shows queryable=true"
            ),
        )
    };
    ToolError {
        field: Some("context".into()),
        ..ToolError::new(ToolErrorCode::Validation, message, true)
    }
    .with_suggestion(suggestion)
}

/// Maps an SDK error to what the agent reads.
fn nexus_error(err: Error, subject: Subject<'_>) -> ToolError {
    if err.is_not_found() {
        return match subject {
            Subject::Context(slug) => ToolError::new(
                ToolErrorCode::NotFound,
                format!("no context `{slug}` in this project"),
                true,
            )
            .with_suggestion("call list_contexts to see the available slugs"),
            Subject::Query(id) => {
                ToolError::new(ToolErrorCode::NotFound, format!("no query `{id}`"), true)
                    .with_suggestion("pass the query_id returned by query_context")
            }
            Subject::None => ToolError::new(ToolErrorCode::NotFound, err.to_string(), false),
        };
    }
    match &err {
        Error::Unauthorized { .. } => ToolError::new(
            ToolErrorCode::Unauthorized,
            format!("Nexus refused the credentials: {err}"),
            false,
        )
        .with_suggestion("check the Pinecone API key the server or the HTTP request provides"),
        Error::Timeout { .. } => ToolError::new(
            ToolErrorCode::Timeout,
            format!("Nexus did not answer in time: {err}"),
            true,
        )
        .with_suggestion("call the tool again"),
        Error::Transport { .. } => ToolError::new(
            ToolErrorCode::NexusError,
            format!("could not reach Nexus: {}", error_chain(&err)),
            true,
        )
        .with_suggestion("check that Nexus is running and reachable, then call the tool again"),
        Error::InvalidRequest(_) => {
            ToolError::new(ToolErrorCode::NexusError, err.to_string(), false)
        }
        _ if err.is_conflict() => ToolError::new(ToolErrorCode::NexusError, err.to_string(), true)
            .with_suggestion("another turn is in flight; wait for it, then try again"),
        _ => ToolError::new(
            ToolErrorCode::NexusError,
            err.to_string(),
            err.is_retryable(),
        ),
    }
}

/// The error and its sources, joined (the top level alone says "transport error").
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> JsonObject {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    /// Which caller labels each connection served, by connection.
    type Served = std::sync::Arc<std::sync::Mutex<Vec<Vec<String>>>>;

    /// An HTTP/1.1 server on loopback that answers every request with `[]`
    /// and records, per connection, the `x-caller` header of each request.
    fn recording_server() -> (String, Served) {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let served: Served = std::sync::Arc::default();
        let record = std::sync::Arc::clone(&served);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let record = std::sync::Arc::clone(&record);
                let connection = {
                    let mut all = record.lock().unwrap();
                    all.push(Vec::new());
                    all.len() - 1
                };
                std::thread::spawn(move || {
                    let mut writer = stream.try_clone().unwrap();
                    let mut reader = BufReader::new(stream);
                    let mut line = String::new();
                    loop {
                        line.clear();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => {
                                let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n[]";
                                if writer.write_all(answer.as_bytes()).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {
                                if let Some(caller) = line.strip_prefix("x-caller: ") {
                                    record.lock().unwrap()[connection]
                                        .push(caller.trim().to_owned());
                                }
                            }
                        }
                    }
                });
            }
        });
        (url, served)
    }

    /// Sends `calls` requests labelled `caller` with the client `server`
    /// picks on this thread.
    async fn call_through(server: &NexusServer, url: &str, caller: &str, calls: usize) {
        for _ in 0..calls {
            let http = server.caller_http.get(&server.client);
            let call = async {
                let request = http
                    .get(format!("{url}/contexts"))
                    .header("x-caller", caller);
                request.send().await?.text().await
            };
            let answer = tokio::time::timeout(Duration::from_secs(5), call)
                .await
                .expect("answered in time (not through another runtime's connection)");
            assert_eq!(answer.unwrap(), "[]");
        }
    }

    #[test]
    fn a_tools_nexus_call_is_a_small_future() {
        // The SDK call is boxed once by `nexus`: the futures above it (the
        // tool's, rmcp's boxed handler) then hold and move a pointer, not
        // kilobytes of request state (about 25 KiB unboxed in a debug build).
        let client = Client::builder()
            .base_url("http://127.0.0.1:9")
            .build()
            .unwrap();
        let server = NexusServer::new(client.clone());
        let contexts = client.contexts();
        let call = server.nexus(Subject::None, contexts.list());
        assert!(
            std::mem::size_of_val(&call) <= 1024,
            "{} bytes",
            std::mem::size_of_val(&call)
        );
        let ct = tokio_util::sync::CancellationToken::new();
        let tool = until_cancelled(&ct, server.nexus(Subject::None, contexts.list()));
        assert!(
            std::mem::size_of_val(&tool) <= 2048,
            "{} bytes",
            std::mem::size_of_val(&tool)
        );
    }

    #[test]
    fn callers_get_a_connection_pool_per_single_threaded_runtime() {
        let (url, served) = recording_server();
        let client = Client::builder().base_url(&url).build().unwrap();
        let server = NexusServer::new(client);
        let on_own_thread = |server: NexusServer, caller: &'static str| {
            let url = url.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(call_through(&server, &url, caller, 3));
                // The runtime stays up while the next thread runs: its
                // connections stay open, and would be reused if pools were shared.
                rt
            })
            .join()
            .unwrap()
        };
        let first = on_own_thread(server.clone(), "a");
        let second = on_own_thread(server.clone(), "b");
        drop((first, second));
        let served = served.lock().unwrap().clone();
        assert_eq!(served.concat().len(), 6, "{served:?}");
        for callers in &served {
            assert!(
                callers.iter().all(|c| c == &callers[0]),
                "one connection served two serving threads: {served:?}"
            );
        }

        // A multi-threaded runtime shares the configured client's pool.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(call_through(&server, &url, "m", 2));
        assert_eq!(server.caller_http.per_thread.lock().unwrap().len(), 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn callers_clients_are_built_once_per_key_and_bounded() {
        let nexus = wiremock::MockServer::start().await;
        wiremock::Mock::given(wiremock::matchers::any())
            .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({})))
            .mount(&nexus)
            .await;
        let configured = Client::builder()
            .base_url(nexus.uri())
            .api_key("operator")
            .build()
            .unwrap();
        let server = NexusServer::new(configured);
        let caller = |key: &str| {
            server
                .caller_http
                .client(&server.client, &secrecy::SecretString::from(key.to_owned()))
                .unwrap()
        };
        for key in ["key-a", "key-b", "key-a", "key-b"] {
            // The answer does not matter here; the key the request carried does.
            let _ = caller(key).contexts().list().await;
        }
        let sent: Vec<String> = nexus
            .received_requests()
            .await
            .unwrap()
            .iter()
            .map(|r| {
                r.headers
                    .get(crate::client::API_KEY_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("<none>")
                    .to_owned()
            })
            .collect();
        assert_eq!(sent, ["key-a", "key-b", "key-a", "key-b"]);
        assert_eq!(server.caller_http.clients().len(), 2);

        for i in 0..MAX_CALLER_CLIENTS + 5 {
            caller(&format!("key-{i}"));
        }
        assert_eq!(server.caller_http.clients().len(), MAX_CALLER_CLIENTS);
        // The most recently used survive; the cache still answers per key.
        let _ = caller("key-a").contexts().list().await;
        let last = nexus.received_requests().await.unwrap().pop().unwrap();
        assert_eq!(
            last.headers.get(crate::client::API_KEY_HEADER).unwrap(),
            "key-a"
        );
    }

    #[test]
    fn ids_are_checked_field_by_field() {
        let e = required_id(&args(serde_json::json!({"context": 5})), "context").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("context"));
        assert!(e.message.contains("must be a string"), "{}", e.message);
        let e = required_id(&args(serde_json::json!({})), "query_id").unwrap_err();
        assert!(e.message.contains("required"));
        let e =
            required_id(&args(serde_json::json!({"query_id": "../x"})), "query_id").unwrap_err();
        assert!(e.message.contains("not a valid id"));
        assert_eq!(
            required_id(&args(serde_json::json!({"context": " docs "})), "context").unwrap(),
            "docs"
        );
    }

    #[test]
    fn wait_seconds_accepts_only_0_to_60() {
        let w = |v: Value| optional_wait(&args(serde_json::json!({ "wait_seconds": v })));
        assert_eq!(w(Value::Null).unwrap(), Duration::ZERO);
        assert_eq!(w(serde_json::json!(60)).unwrap(), Duration::from_secs(60));
        assert_eq!(w(serde_json::json!(5.0)).unwrap(), Duration::from_secs(5));
        for bad in [
            serde_json::json!(61),
            serde_json::json!(-1),
            serde_json::json!(1.5),
            serde_json::json!("5"),
        ] {
            let e = w(bad.clone()).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("wait_seconds"), "{bad}");
        }
    }

    #[test]
    fn a_pending_turn_has_no_answer_yet() {
        let q: types::Query = serde_json::from_value(serde_json::json!({
            "id": "q1", "object": "query", "session_id": "s1", "created": 0,
            "status": crate::QueryStatus::InProgress.as_str(), "input": [], "runtime_ms": 0, "steps": [],
            "citations": [], "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
            "output": [{"role": "assistant", "content": [{"type": "output_text", "text": "partial"}]}]
        }))
        .unwrap();
        let out = QueryOutcome::from(&q);
        assert_eq!(out.answer, None);
        assert_eq!(out.status, crate::QueryStatus::InProgress.as_str());
    }
}
