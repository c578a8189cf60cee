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
//! # Arguments
//!
//! The tools take their arguments as a raw JSON object and read it into
//! their typed argument structs (whose schemas are the advertised
//! `inputSchema`) with [`crate::mcp::arguments::parse`], as every tool does:
//! a wrong type or a missing field is a `VALIDATION` error with `field` set
//! and the JSON types named, like any other bad input, not rmcp's own text.
//!
//! # Layout
//! - `shapes`: the argument and result types (the advertised schemas) and
//!   how results are encoded.
//! - `checks`: the checks of ids and waits the argument types cannot say.
//! - `errors`: SDK errors as tool errors.
//! - `pool`: the HTTP and Nexus clients of callers' calls.
//! - `progress`: `get_query`'s progress notifications.
//! - `reads`: the reads behind the server's resources, prompts and completions.

mod checks;
mod errors;
mod pool;
mod progress;
pub(crate) mod reads;
mod shapes;
#[cfg(test)]
mod tests;

use std::fmt;
use std::time::Duration;

use rmcp::handler::server::common::schema_for_empty_input;
use rmcp::handler::server::tool::ToolRouter;
use rmcp::model::{CallToolResult, JsonObject, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, tool, tool_handler, tool_router};

use self::checks::{checked_id, checked_wait};
use self::errors::{Subject, nexus_error, not_queryable};
use self::pool::{CallClient, CallerHttp};
use self::progress::StepProgress;
use self::shapes::{
    GetQueryArgs, QueryContextArgs, context_list, failure, input_schema, output_schema, success,
};
use super::arguments::parse;
use super::caller::{CallKey, call_key};
use super::tool_error::{ToolError, ToolErrorCode};
use crate::Client;
use crate::client::{Poller, WaitPolicy};
use crate::mcp::notifier::Notifier;

pub use self::checks::MAX_WAIT_SECONDS;
pub(super) use self::shapes::{ContextList, ContextSummary, QueryOutcome, QueryStarted};
pub use super::caller::KeyPolicy;

/// The longest question accepted, in characters.
pub const MAX_QUESTION_CHARS: usize = 32 * 1024;

/// How long a turn's start is still awaited, in the background, after its
/// `query_context` call answered `TIMEOUT`: a turn it names is cancelled;
/// past this the start is dropped.
pub(crate) const LATE_START_LIMIT: Duration = Duration::from_secs(120);

/// A turn's start (`POST /query`), owned so that it can outlive its call.
type LateStart = std::pin::Pin<
    Box<dyn Future<Output = crate::Result<crate::query::QueryHandle>> + Send + 'static>,
>;
/// Default deadline of one Nexus call made by a tool.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// First and longest pause between two polls while `get_query` waits (the
/// pauses grow by half each time, with the jitter of [`WaitPolicy`]).
const POLL_FIRST: Duration = Duration::from_millis(200);
const POLL_MAX: Duration = Duration::from_secs(2);

/// The guide sent as the server's MCP `instructions`.
pub(super) const INSTRUCTIONS: &str = "Ask questions of Pinecone Nexus knowledge contexts. \
Flow: 1) call list_contexts to see the contexts and whether each is `queryable`; \
2) call query_context with a queryable context's slug and a question: it starts the \
turn and returns a query_id at once; 3) call get_query with that query_id until \
`status` is completed, failed or cancelled (pass wait_seconds, up to 60, to wait \
server-side instead of polling). The answer and its citations are in the completed result.";

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
            Ok(list) => context_list(&list),
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
            tool_router: {
                let mut router = Self::tool_router();
                crate::mcp::schema::portable_router(&mut router);
                router
            },
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
    fn client_for(&self, ctx: &RequestContext<RoleServer>) -> Result<CallClient, ToolError> {
        match call_key(self.keys, &ctx.extensions)? {
            CallKey::Configured => Ok(CallClient {
                client: self.client.clone(),
                unproven: None,
            }),
            CallKey::Caller(key) => self
                .caller_http
                .client(&self.client, key)
                .map_err(|e| nexus_error(e, Subject::None)),
        }
    }

    /// Cancels turn `query_id` with the key of the request in `ctx` (the
    /// `tasks/cancel` of a task-mode `query_context`).
    pub(crate) async fn cancel_turn(
        &self,
        query_id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), ToolError> {
        let mut call = self.client_for(ctx)?;
        let client = call.client.clone();
        self.nexus(Subject::Query(query_id), client.queries().cancel(query_id))
            .await?;
        self.caller_http.accepted(&mut call);
        Ok(())
    }

    async fn run_list_contexts(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<ContextList, ToolError> {
        let mut call = self.client_for(ctx)?;
        let contexts = self
            .nexus(Subject::None, call.client.contexts().list())
            .await?;
        self.caller_http.accepted(&mut call);
        Ok(ContextList {
            contexts: contexts.iter().map(ContextSummary::from).collect(),
        })
    }

    async fn run_query_context(
        &self,
        args: &JsonObject,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<QueryStarted, ToolError> {
        let args: QueryContextArgs = parse(args)?;
        let slug = checked_id(&args.context, "context")?;
        let question = args.question.as_str();
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
        let mut call = self.client_for(ctx)?;
        // Until the turn is sent, cancelling simply stops here.
        let context = until_cancelled(
            &ctx.ct,
            self.nexus(Subject::Context(slug), call.client.contexts().get(slug)),
        )
        .await?;
        self.caller_http.accepted(&mut call);
        let client = call.client;
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
        let mut start: LateStart = Box::pin(session.ask(question).background());
        let handle = match tokio::time::timeout(self.call_timeout, &mut start).await {
            Ok(started) => started.map_err(|e| nexus_error(e, Subject::Context(slug)))?,
            Err(_) => return Err(self.start_timed_out(start, &client, ctx).await),
        };
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
            status: query.status.to_string(),
            model: query.model.clone(),
        })
    }

    /// A turn's start that passed the call deadline: it may have started
    /// a billed turn, so it is awaited once more (up to the call deadline)
    /// for the turn's id, and that turn is cancelled. When even that wait
    /// passes, the start goes on in the background (up to
    /// [`LATE_START_LIMIT`]) holding the call's slot, and the turn it names
    /// is cancelled. The `TIMEOUT` names the turn when it is known, and
    /// never advises another one.
    async fn start_timed_out(
        &self,
        mut start: LateStart,
        client: &Client,
        ctx: &RequestContext<RoleServer>,
    ) -> ToolError {
        let waited = self.call_timeout;
        let late = tokio::time::timeout(self.call_timeout, &mut start).await;
        let started = match late {
            Ok(Ok(started)) => started,
            // Refused: no turn was started.
            Ok(Err(e)) => return nexus_error(e, Subject::None),
            Err(_) => {
                self.cancel_when_started(start, client.clone(), ctx);
                return ToolError::new(
                    ToolErrorCode::Timeout,
                    format!(
                        "Nexus did not answer the start of the turn within {} ms; if it \
                         starts the turn later, that turn is cancelled as soon as Nexus \
                         names it",
                        waited.as_millis().saturating_mul(2)
                    ),
                    false,
                )
                .with_suggestion(
                    "do not ask again at once: a turn may be starting; raise \
                     --nexus-call-timeout-ms if Nexus is slow to start turns",
                );
            }
        };
        let query_id = started.last_seen().id.clone();
        let cancelled = self
            .nexus(
                Subject::Query(&query_id),
                client.queries().cancel(&query_id),
            )
            .await;
        let what = match &cancelled {
            Ok(_) => "it was cancelled",
            Err(e) => {
                tracing::warn!(query_id, error = %e, "could not cancel a turn whose start timed out");
                "it could not be cancelled: call get_query with this query_id for its answer"
            }
        };
        ToolError::new(
            ToolErrorCode::Timeout,
            format!(
                "Nexus started turn {query_id} only after the call deadline of {} ms; {what}",
                waited.as_millis()
            ),
            false,
        )
        .with_suggestion(format!(
            "turn {query_id} was started: do not ask again blindly; raise \
             --nexus-call-timeout-ms if Nexus is slow to start turns"
        ))
    }

    /// Awaits, in the background, a turn's start whose call has answered
    /// `TIMEOUT`, and cancels the turn it names. The call's admission (its
    /// ledger ticket) goes with it: the slot stays held until the start has
    /// answered and its turn's cancel has, or [`LATE_START_LIMIT`] passed.
    fn cancel_when_started(
        &self,
        start: LateStart,
        client: Client,
        ctx: &RequestContext<RoleServer>,
    ) {
        let held = crate::mcp::caller::admission(&ctx.extensions);
        let call_timeout = self.call_timeout;
        tokio::spawn(async move {
            let _held = held;
            let started = match tokio::time::timeout(LATE_START_LIMIT, start).await {
                Ok(Ok(started)) => started,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "a late turn start failed: no turn to cancel");
                    return;
                }
                Err(_) => {
                    tracing::warn!(
                        limit_s = LATE_START_LIMIT.as_secs(),
                        "Nexus never answered a turn's start; if it started one, it was not cancelled"
                    );
                    return;
                }
            };
            let query_id = started.last_seen().id.clone();
            match tokio::time::timeout(call_timeout, client.queries().cancel(&query_id)).await {
                Ok(Ok(_)) => tracing::info!(
                    query_id,
                    "cancelled a turn that started after its call timed out"
                ),
                Ok(Err(e)) => {
                    tracing::warn!(query_id, error = %e, "could not cancel a turn that started after its call timed out")
                }
                Err(_) => tracing::warn!(
                    query_id,
                    "the cancel of a turn that started after its call timed out was not answered in time"
                ),
            }
        });
    }

    async fn run_get_query(
        &self,
        args: &JsonObject,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<QueryOutcome, ToolError> {
        let args: GetQueryArgs = parse(args)?;
        let query_id = checked_id(&args.query_id, "query_id")?;
        let wait = checked_wait(args.wait_seconds.as_ref())?;
        let mut call = self.client_for(ctx)?;
        let client = call.client.clone();
        // The whole call ends by `wait + call_timeout`; each poll also has
        // the call deadline, shortened to what is left of the whole.
        let start = tokio::time::Instant::now();
        // Polls between the fetches; the last pause ends at `start + wait`.
        let mut poller = Poller::new(
            &WaitPolicy::default()
                .timeout(wait)
                .interval(POLL_FIRST, POLL_MAX),
        );
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
        self.caller_http.accepted(&mut call);
        if wait.is_zero() || query.is_terminal() {
            return Ok(QueryOutcome::from(&query));
        }

        let mut progress = ctx
            .meta
            .get_progress_token()
            .map(|token| StepProgress::new(token, Notifier::of(ctx)));
        loop {
            if let Some(p) = progress.as_mut() {
                p.report(&query.steps).await;
            }
            if query.is_terminal() || !poller.pause_until_timeout().await {
                break;
            }
            query = fetch().await?;
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

impl NexusServer {
    /// Whether Nexus accepts caller `key`: one cheap read (the context
    /// list) made with it.
    pub(crate) async fn prove_key(&self, key: crate::mcp::caller::CallerKey) -> KeyProof {
        use secrecy::ExposeSecret;
        // One attempt: a probe that cannot decide at once leaves the key
        // unproven rather than holding a probe slot through retries.
        let built = Client::builder()
            .base_url(self.client.base_url())
            .api_version(self.client.api_version().clone())
            .http_client(self.caller_http.get(&self.client))
            .api_key(key.key.expose_secret())
            .retry(crate::client::RetryPolicy::never())
            .build();
        let Ok(client) = built else {
            return KeyProof::Undecided;
        };
        match client.contexts().list().await {
            Ok(_) => KeyProof::Accepted,
            Err(e) if matches!(e.status().map(|s| s.as_u16()), Some(401 | 403)) => {
                KeyProof::Refused
            }
            Err(_) => KeyProof::Undecided,
        }
    }
}

/// What the upstream said of a caller's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyProof {
    /// It answered a call made with the key.
    Accepted,
    /// It refused the key (401 or 403).
    Refused,
    /// It could not tell (unreachable, slow, another error).
    Undecided,
}
