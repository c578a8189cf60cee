//! [`NexusMcp`]: the one MCP server `nexus-mcp` runs, made of tool families.
//!
//! Each family is a complete [`ServerHandler`] with its own tools, testable on
//! its own. `NexusMcp` lists the union of their tools and hands each
//! `tools/call` to the family that owns the tool's name.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CompleteRequestParams,
    CompleteResult, GetPromptRequestParams, GetPromptResponse, GetTaskParams, GetTaskResult,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

use super::ToolErrorCode;
use super::allow_list::{self, ToolAllowListError};
use super::caller::{Admission, log_identity};
use super::catalog::{self, CompletionCache, Families};
use super::logging::{self, DEFAULT_SLOW_CALL, SessionLevel};
use super::metrics::Metrics;
use super::nexus::{INSTRUCTIONS, KeyProof, NexusServer};
use super::pinecone::PineconeServer;
use super::tasks::{self, TaskSeal};
use crate::transport::for_servers::counting_retries;

pub(super) use super::implementation;

/// The protocol revisions served, oldest first: 2026-07-28 (no `initialize`
/// handshake; each request carries its own `_meta`), 2025-11-25 and
/// 2025-06-18.
pub const PROTOCOL_VERSIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

/// The combined MCP server: the Nexus tools and any other tool family.
///
/// ```
/// # fn run() -> nexus_knowql::Result<()> {
/// use nexus_knowql::Client;
/// use nexus_knowql::mcp::{NexusMcp, NexusServer};
/// let client = Client::builder().base_url("http://127.0.0.1:8080/api").build()?;
/// let server = NexusMcp::new().with_nexus(NexusServer::new(client));
/// # let _ = server; Ok(()) }
/// ```
///
/// Cloning is cheap (the families are shared): the HTTP transport makes one
/// clone per request or session.
#[derive(Debug, Clone)]
pub struct NexusMcp {
    nexus: Option<Arc<NexusServer>>,
    pinecone: Option<Arc<PineconeServer>>,
    metrics: Arc<Metrics>,
    completions: Arc<CompletionCache>,
    /// The session's `logging/setLevel`, shared by clones of one session.
    log_level: SessionLevel,
    slow_call: Duration,
    /// Seals and opens task handles (no task is kept in memory).
    tasks: Arc<TaskSeal>,
    /// What `get_info` answers, worked out once for these families: rmcp
    /// asks for it on every stateless request.
    info: Arc<OnceLock<ServerConfig>>,
    /// Whether this session answered `initialize`: a second one is refused.
    initialized: Arc<AtomicBool>,
    /// The tools whose output schema has an `experimental` member (where
    /// degradation is reported), worked out once for these families.
    degradable: Arc<OnceLock<Box<[Box<str>]>>>,
    /// The tools exposed, when an operator chose them: the others are
    /// neither listed nor called.
    exposed: Option<Arc<[Box<str>]>>,
}

impl Default for NexusMcp {
    fn default() -> Self {
        NexusMcp {
            nexus: None,
            pinecone: None,
            metrics: Arc::default(),
            completions: Arc::default(),
            log_level: SessionLevel::fresh(),
            slow_call: DEFAULT_SLOW_CALL,
            tasks: Arc::new(TaskSeal::random()),
            info: Arc::default(),
            initialized: Arc::default(),
            degradable: Arc::default(),
            exposed: None,
        }
    }
}

impl NexusMcp {
    /// A server with no tools yet.
    pub fn new() -> Self {
        NexusMcp::default()
    }

    /// Sets how long a tool call may take before the client is sent a
    /// `notice` about it (default 10 s).
    pub fn with_slow_call_threshold(mut self, threshold: Duration) -> Self {
        self.slow_call = threshold;
        self
    }

    /// Seals task handles with `seal`: replicas with the same secret serve
    /// each other's tasks (default: a random secret, this process only).
    pub fn with_task_seal(mut self, seal: TaskSeal) -> Self {
        self.tasks = Arc::new(seal);
        self
    }

    /// A clone for a new session: the families, metrics and tasks are
    /// shared; the logging level is its own.
    pub fn for_session(&self) -> Self {
        NexusMcp {
            log_level: SessionLevel::fresh(),
            initialized: Arc::default(),
            ..self.clone()
        }
    }

    /// Serves the Nexus tools.
    pub fn with_nexus(mut self, nexus: NexusServer) -> Self {
        self.nexus = Some(Arc::new(nexus));
        self.info = Arc::default();
        self.degradable = Arc::default();
        self
    }

    /// Serves the Pinecone retrieval tools.
    pub fn with_pinecone(mut self, pinecone: PineconeServer) -> Self {
        self.pinecone = Some(Arc::new(pinecone));
        self.info = Arc::default();
        self.degradable = Arc::default();
        self
    }

    /// Exposes only the tools `names` (set after the families): the others
    /// are not listed, and a call to one is answered as a call to a tool
    /// that does not exist. Blank and repeated names are ignored.
    ///
    /// ```
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use nexus_knowql::Client;
    /// use nexus_knowql::mcp::{NexusMcp, NexusServer};
    /// let client = Client::builder().base_url("http://127.0.0.1:8080/api").build()?;
    /// let server = NexusMcp::new()
    ///     .with_nexus(NexusServer::new(client))
    ///     .with_tool_allow_list(["query_context", "get_query"])?;
    /// # let _ = server; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A name no configured family serves, or no name at all.
    pub fn with_tool_allow_list<I, S>(mut self, names: I) -> Result<Self, ToolAllowListError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let served: Vec<String> = self
            .family_tools()
            .into_iter()
            .map(|t| t.name.into_owned())
            .collect();
        self.exposed = Some(allow_list::checked(names, &served)?);
        self.info = Arc::default();
        Ok(self)
    }

    /// Whether tool `name` is exposed (every tool is, without an allow-list).
    fn exposes(&self, name: &str) -> bool {
        self.exposed
            .as_ref()
            .is_none_or(|names| names.iter().any(|n| &**n == name))
    }

    /// Every tool of the configured families, exposed or not.
    fn family_tools(&self) -> Vec<Tool> {
        let mut tools = Vec::new();
        if let Some(nexus) = &self.nexus {
            tools.extend(nexus.tools());
        }
        if let Some(pinecone) = &self.pinecone {
            tools.extend(pinecone.tools());
        }
        tools
    }

    /// The Pinecone family, if served.
    pub fn pinecone(&self) -> Option<&PineconeServer> {
        self.pinecone.as_deref()
    }

    /// The Nexus family, if served.
    pub fn nexus(&self) -> Option<&NexusServer> {
        self.nexus.as_deref()
    }

    /// The server's metrics (tool calls here; the HTTP transport adds its own).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Whether any tool family serves calls that bring no key (with the
    /// configured key): over HTTP, keyless sessions are refused otherwise.
    pub fn serves_keyless(&self) -> bool {
        self.nexus
            .as_ref()
            .is_some_and(|n| n.key_policy().serves_keyless())
            || self
                .pinecone
                .as_ref()
                .is_some_and(|p| p.key_policy().serves_keyless())
    }

    /// The upstream base URLs the tools call, with a name each: what the
    /// HTTP transport's readiness check probes.
    pub(crate) fn upstreams(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(nexus) = &self.nexus {
            out.push(("nexus", nexus.configured_client().base_url().to_owned()));
        }
        if let Some(pinecone) = &self.pinecone {
            out.push(("pinecone", pinecone.state.config.controller_host.clone()));
        }
        out
    }

    /// Whether the upstream accepts caller `key`: one cheap call made with
    /// it, to Nexus when its tools are served, else to Pinecone.
    pub(crate) async fn prove_key(&self, key: super::caller::CallerKey) -> KeyProof {
        if let Some(nexus) = &self.nexus {
            return Box::pin(nexus.prove_key(key)).await;
        }
        if let Some(pinecone) = &self.pinecone {
            return Box::pin(pinecone.prove_key(&key)).await;
        }
        KeyProof::Undecided
    }

    /// The families configured, for resources, prompts and completions.
    fn families(&self) -> Families<'_> {
        Families::new(
            self.nexus.as_deref(),
            self.pinecone.as_deref(),
            self.exposed.as_deref(),
            &self.metrics,
        )
    }

    /// The family that serves tool `name`, if it is exposed.
    fn family_of(&self, name: &str) -> Option<Family<'_>> {
        if !self.exposes(name) {
            return None;
        }
        if let Some(nexus) = self.nexus.as_deref().filter(|n| n.has_tool(name)) {
            Some(Family::Nexus(nexus))
        } else {
            self.pinecone
                .as_deref()
                .filter(|p| p.has_tool(name))
                .map(Family::Pinecone)
        }
    }

    /// Hands a call to `family`, the one that serves its tool.
    async fn route_call(
        family: Option<Family<'_>>,
        _admitted: &Admission,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> (&'static str, Result<CallToolResponse, ErrorData>) {
        // Results, error results included, pass through as each family made
        // them: their structured content matches the tool's outputSchema.
        // Each family's call boxed: the future of every call is then small,
        // and moving it (as rmcp and `call_tool` do) copies a few bytes, not
        // the largest family's whole state.
        match family {
            Some(Family::Nexus(nexus)) => {
                ("nexus", Box::pin(nexus.call_tool(request, context)).await)
            }
            Some(Family::Pinecone(pinecone)) => (
                "pinecone",
                Box::pin(pinecone.call_tool(request, context)).await,
            ),
            None => (
                "none",
                Err(ErrorData::invalid_params(
                    format!("unknown tool `{}`", request.name),
                    None,
                )),
            ),
        }
    }

    /// Whether `tool`'s output can report degradation (its output schema
    /// has an `experimental` member): only those results are read for it.
    fn degradable(&self, tool: &str) -> bool {
        let names = self.degradable.get_or_init(|| {
            self.family_tools()
                .into_iter()
                .filter(|t| {
                    t.output_schema
                        .as_ref()
                        .and_then(|s| s.get("properties"))
                        .and_then(serde_json::Value::as_object)
                        .is_some_and(|p| p.contains_key("experimental"))
                })
                .map(|t| Box::from(&*t.name))
                .collect()
        });
        names.iter().any(|name| &**name == tool)
    }

    /// The capabilities, server info and instructions of these families.
    #[allow(deprecated)] // logging: see `logging`
    fn server_config(&self) -> ServerConfig {
        let builder = ServerCapabilities::builder()
            .enable_logging()
            .enable_tools();
        // Tasks are `query_context` turns: offered with that tool.
        let mut capabilities = if self.nexus.is_some() && self.exposes("query_context") {
            builder.enable_tasks().build()
        } else {
            builder.build()
        };
        catalog::declare(self.families(), &mut capabilities);
        ServerConfig::new(capabilities)
            .with_server_info(implementation())
            .with_instructions(self.instructions())
    }

    /// The instructions: the Nexus flow, then each other family's own.
    fn instructions(&self) -> String {
        let mut text = String::new();
        let any_exposed = |tools: Vec<Tool>| tools.iter().any(|t| self.exposes(&t.name));
        if self.nexus.as_ref().is_some_and(|n| any_exposed(n.tools())) {
            text.push_str(INSTRUCTIONS);
        }
        if let Some(own) = self
            .pinecone
            .as_ref()
            .filter(|p| any_exposed(p.tools()))
            .and_then(|p| p.get_info().instructions)
        {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(&own);
        }
        if text.is_empty() {
            text.push_str("No tool family is configured on this server.");
        }
        let hidden: Vec<String> = self
            .family_tools()
            .into_iter()
            .filter(|t| !self.exposes(&t.name))
            .map(|t| t.name.into_owned())
            .collect();
        allow_list::without_mentions(&text, &hidden)
    }
}

/// The tool family a call goes to.
#[derive(Clone, Copy)]
enum Family<'a> {
    Nexus(&'a NexusServer),
    Pinecone(&'a PineconeServer),
}

/// Refuses a cursor on a list that has one page: no cursor this server
/// handed out names a page of it.
fn no_cursor(request: Option<&PaginatedRequestParams>) -> Result<(), ErrorData> {
    match request.and_then(|r| r.cursor.as_ref()) {
        Some(_) => Err(ErrorData::invalid_params("invalid cursor", None)),
        None => Ok(()),
    }
}

/// Lists one family's tools through its own handler.
async fn tools_of<H: ServerHandler>(
    family: &H,
    ctx: &RequestContext<RoleServer>,
) -> Result<Vec<Tool>, ErrorData> {
    let mut tools = Vec::new();
    let mut cursor = None;
    loop {
        let page = family
            .list_tools(
                cursor.map(|c| PaginatedRequestParams::default().with_cursor(Some(c))),
                ctx.clone(),
            )
            .await?;
        tools.extend(page.tools);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(tools),
        }
    }
}

impl ServerHandler for NexusMcp {
    fn get_info(&self) -> ServerConfig {
        self.info.get_or_init(|| self.server_config()).clone()
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(PROTOCOL_VERSIONS)
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        if self.initialized.swap(true, Ordering::AcqRel) {
            return Err(ErrorData::invalid_request(
                "this session is already initialized",
                None,
            ));
        }
        context.peer.set_peer_info(request.clone());
        let mut info = self.negotiate_initialize(&request)?;
        // The tasks extension is defined from 2026-07-28 on; a revision
        // without it is not offered it, whatever the client lists.
        if !tasks::revision_has_tasks(&info.protocol_version)
            && let Some(extensions) = info.capabilities.extensions.as_mut()
        {
            extensions.remove(rmcp::model::TASKS_EXTENSION_ID);
            if extensions.is_empty() {
                info.capabilities.extensions = None;
            }
        }
        Ok(info)
    }

    #[allow(deprecated)] // logging: see `logging`
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.log_level.set(request.level);
        Ok(())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let nexus = self.nexus.as_ref().ok_or_else(tasks::unknown_task)?;
        let owner = tasks::owner_of(&context.extensions);
        let handle = request.task_id;
        let sealed = tasks::open(&self.tasks, owner, &handle)?;
        let read =
            Box::pin(nexus.call_tool(tasks::get_query_params(&sealed.query_id), context)).await?;
        tasks::detailed(&handle, &sealed, read).map(GetTaskResult::new)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let nexus = self.nexus.as_ref().ok_or_else(tasks::unknown_task)?;
        let owner = tasks::owner_of(&context.extensions);
        let sealed = tasks::open(&self.tasks, owner, &request.task_id)?;
        let read =
            Box::pin(nexus.call_tool(tasks::get_query_params(&sealed.query_id), context.clone()))
                .await?;
        if tasks::ended(read)? {
            return Err(tasks::already_ended());
        }
        let outcome = Box::pin(nexus.cancel_turn(&sealed.query_id, &context)).await;
        tasks::cancelled(outcome)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        no_cursor(request.as_ref())?;
        let mut tools = Vec::new();
        if let Some(nexus) = &self.nexus {
            tools.extend(Box::pin(tools_of(nexus, &context)).await?);
        }
        if let Some(pinecone) = &self.pinecone {
            tools.extend(Box::pin(tools_of(pinecone, &context)).await?);
        }
        tools.retain(|t| self.exposes(&t.name));
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        // Boxed, as every handler that calls upstream: rmcp's request future
        // is as large as its largest handler's, and it is moved into a
        // spawned task for every request, tool calls included.
        Box::pin(catalog::list_resources(self.families(), request, &context)).await
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        no_cursor(request.as_ref())?;
        Ok(catalog::list_resource_templates(self.families()))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let _admitted = admitted(&context)?;
        Box::pin(catalog::read_resource(
            self.families(),
            &request.uri,
            &context,
        ))
        .await
        .map(Into::into)
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        no_cursor(request.as_ref())?;
        Ok(catalog::list_prompts(self.families()))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let _admitted = admitted(&context)?;
        Box::pin(catalog::get_prompt(self.families(), request, &context))
            .await
            .map(Into::into)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        Box::pin(catalog::complete(
            self.families(),
            &self.completions,
            request,
            &context,
        ))
        .await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        if !self.exposes(name) {
            return None;
        }
        self.nexus
            .as_ref()
            .and_then(|n| n.get_tool(name))
            .or_else(|| self.pinecone.as_ref().and_then(|p| p.get_tool(name)))
    }

    fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CallToolResponse, ErrorData>> + Send + '_ {
        // Boxed: rmcp moves the future of each request several times before
        // it runs (into its instrumented, spawned task) and that future is
        // as large as the largest handler's; a pointer moves cheaply.
        Box::pin(self.accounted_call(request, context))
    }
}

impl NexusMcp {
    /// A tool call with its metrics, access-log line and log notes.
    async fn accounted_call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let start = std::time::Instant::now();
        // The ledger's ticket is held until this call has ended: the tool's
        // upstream work counts in its caller's budget to its end.
        let admitted = admitted(&context)?;
        // Only names this server serves become labels or log fields.
        let family = self.family_of(&request.name);
        let served = family.is_some();
        let tool = self
            .metrics
            .tool(if served { &request.name } else { "unknown" });
        let identity = log_identity(&context.extensions);
        let as_task = self.nexus.is_some()
            && request.name == "query_context"
            && tasks::asked_for(&context.meta);
        let owner = as_task.then(|| tasks::owner_of(&context.extensions));
        let long_poll = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("wait_seconds"))
            .and_then(serde_json::Value::as_f64)
            .is_some_and(|w| w > 0.0);
        // What the log notes need of the request (its `_meta` level and
        // its peer), rather than a clone of its whole context.
        let requested_level = context.meta.log_level();
        let notifier = super::notifier::Notifier::of(&context);
        let call = context.id.clone();
        let from_text = super::structured::writes_from_text(&context.extensions);
        let ct = context.ct.clone();
        let routed = Self::route_call(family, &admitted, request, context);
        let ((family, result), retries) = counting_retries(super::structured::scoped(
            from_text,
            cancelled_when_gone(routed, admitted.gone.clone(), ct),
        ))
        .await;
        let outcome = outcome(&result);
        let took = start.elapsed();
        let seconds = took.as_secs_f64();
        self.metrics.tool_call(&tool, outcome, seconds);
        if matches!(outcome, "NEXUS_ERROR" | "PINECONE_ERROR" | "TIMEOUT") {
            self.metrics.upstream_error(family, outcome);
        }
        tracing::info!(
            target: "nexus_mcp::access",
            request_id = %identity.request_id,
            caller = %identity.caller,
            tool = tool.name(),
            outcome,
            duration_ms = start.elapsed().as_millis() as u64,
            "tool call"
        );
        let Ok(response) = result else {
            return result;
        };
        // A long poll (`get_query` with `wait_seconds`) is slow on purpose.
        let slow = if long_poll {
            Duration::MAX
        } else {
            self.slow_call
        };
        let degradable = self.degradable(tool.name());
        let mut notes = logging::notes_for(tool.name(), degradable, &response, took, slow);
        notes.extend(logging::retried(tool.name(), family, retries));
        if !notes.is_empty() {
            // The session's level as it is when the notes go out: a
            // `logging/setLevel` during a long call applies to them.
            let minimum = self.log_level.minimum(requested_level);
            Box::pin(logging::send(notes, minimum, &notifier, &call)).await;
        }
        if let Some(owner) = owner
            && let Some(task) = tasks::task_for(&self.tasks, owner, &response)
        {
            return Ok(CallToolResponse::Task(task));
        }
        Ok(response)
    }
}

/// The call ledger's admission of the request in `context`: a call that
/// came over HTTP without one is refused, whatever path it took.
fn admitted(context: &RequestContext<RoleServer>) -> Result<Admission, ErrorData> {
    super::caller::admission(&context.extensions)
        .ok_or_else(|| ErrorData::internal_error("call not admitted by the call ledger", None))
}

/// `work`, whose cancellation `ct` fires when its caller is `gone` (its
/// session ended, the stdio input closed); awaited to its end all the
/// same, so that a turn it started is cancelled before its ticket frees
/// its slot.
async fn cancelled_when_gone<T>(
    work: impl Future<Output = T>,
    gone: Option<tokio_util::sync::CancellationToken>,
    ct: tokio_util::sync::CancellationToken,
) -> T {
    let Some(gone) = gone else {
        return work.await;
    };
    let mut work = std::pin::pin!(work);
    tokio::select! {
        out = &mut work => return out,
        () = gone.cancelled() => ct.cancel(),
    }
    work.await
}

/// How a call ended: `ok`, a tool error's code, `protocol_error`, or
/// `error` for an error result without a known code.
fn outcome(result: &Result<CallToolResponse, ErrorData>) -> &'static str {
    let Ok(response) = result else {
        return "protocol_error";
    };
    let CallToolResponse::Complete(result) = response else {
        return "ok";
    };
    if result.is_error != Some(true) {
        return "ok";
    }
    let code = result
        .structured_content
        .as_ref()
        .and_then(|v| v.get("code"))
        .and_then(|v| v.as_str());
    code.and_then(|c| ToolErrorCode::ALL.iter().copied().find(|k| *k == c))
        .unwrap_or("error")
}
