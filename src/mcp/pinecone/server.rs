//! [`PineconeServer`]: the MCP handler of the Pinecone tools, usable alone
//! or delegated to by a handler that serves other tool families too.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

use crate::mcp::arguments::parse;
use crate::mcp::caller::{CallKey, CallerKey, call_key};
use crate::mcp::{KeyPolicy, ToolError};

use super::args::{
    CountArgs, GenerateUrlsArgs, GuidedQueryArgs, KeywordSearchArgs, ListNamespacesArgs,
    NamespaceRouterArgs, QueryArgs, QueryDocumentsArgs, SuggestQueryParamsArgs,
};
use super::client::{PineconeError, http_client};
use super::config::PineconeConfig;
use super::gate::Gate;
use super::sources::Registry;
pub(crate) use super::tenants::State;
use super::tenants::{Held, TENANT_BASE_BYTES, Tenants};
use super::urls::{UrlGenerator, UrlRegistry};

/// Server name announced at initialize.
pub(super) const SERVER_NAME: &str = "Pinecone Read-Only MCP";

/// The tools whose `top_k` defaults to the configured `--top-k`.
const TOP_K_TOOLS: [&str; 3] = ["query", "keyword_search", "guided_query"];

/// Declares the configured `top_k` default in the input schemas of
/// [`TOP_K_TOOLS`], as the schemas declare every other default.
fn default_top_k(router: &mut ToolRouter<PineconeServer>, top_k: u32) {
    for name in TOP_K_TOOLS {
        let Some(route) = router.map.get_mut(name) else {
            continue;
        };
        let mut schema = (*route.attr.input_schema).clone();
        if let Some(serde_json::Value::Object(field)) = schema
            .get_mut("properties")
            .and_then(|p| p.get_mut("top_k"))
        {
            field.insert("default".to_owned(), top_k.into());
        }
        route.attr.input_schema = Arc::new(schema);
    }
}

impl State {
    /// Bytes this state holds, or `None` while a namespace list is being
    /// refreshed.
    pub(super) fn bytes(&self) -> Option<u64> {
        let cached = self.registry.cached_bytes()?;
        Some(
            TENANT_BASE_BYTES
                .saturating_add(cached)
                .saturating_add(self.gate.bytes()),
        )
    }

    /// Whether Pinecone has accepted the key of any of its clients.
    pub(super) fn key_accepted(&self) -> bool {
        self.registry.all().iter().any(|s| s.client.key_accepted())
    }
}

/// The states of HTTP callers ([`Tenants`]) and the HTTP client they share.
/// Each caller has its own clients, discovery caches and suggest-flow gate,
/// so nothing crosses from one key to another.
struct Callers {
    http: reqwest::Client,
    tenants: Tenants,
}

impl std::fmt::Debug for Callers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callers").finish_non_exhaustive()
    }
}

impl Callers {
    /// The state of the caller with `key`, built from `base` on first use.
    fn state_for(&self, key: &CallerKey, base: &State) -> Held {
        self.tenants.get_or_build(key, || {
            let mut config = base.config.clone();
            for source in &mut config.sources {
                source.api_key = key.key.clone();
            }
            State {
                registry: Registry::new(&config, &self.http),
                gate: Gate::new(config.suggest_flow, config.cache_ttl),
                urls: Arc::clone(&base.urls),
                config,
            }
        })
    }

    fn clear(&self) {
        self.tenants.clear();
    }
}

/// The Pinecone retrieval tools as an MCP server.
///
/// Cheap to clone; clones share caches, the suggest-flow gate and URL
/// generators. No network call happens until a tool runs.
///
/// With [`KeyPolicy::Caller`] (HTTP), each call runs with the caller's
/// `X-Pinecone-Api-Key` on every source, with clients, discovery caches and
/// a suggest-flow gate of that key's own; the configured keys serve a caller
/// only with `fallback_to_configured`.
#[derive(Clone)]
pub struct PineconeServer {
    pub(crate) state: Arc<State>,
    keys: KeyPolicy,
    callers: Arc<Callers>,
    tool_router: Arc<ToolRouter<PineconeServer>>,
}

impl std::fmt::Debug for PineconeServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PineconeServer")
            .field("config", &self.state.config)
            .finish_non_exhaustive()
    }
}

const CORE_INSTRUCTIONS: &str = "\
Read-only retrieval over Pinecone indexes (a dense and a sparse index per source, searched together).

One call: guided_query picks a namespace, a tool and fields for a question and runs it; its experimental.decision_trace says what it chose.

Step by step: list_namespaces (cached; see expires_at_iso) -> optionally namespace_router -> query (presets fast, detailed, full) or count or query_documents or keyword_search; generate_urls builds links for records without a url.

Notes: results are fused from both indexes and reranked when a model is configured; count counts distinct documents among up to 10000 matching chunks (truncated says when the limit was hit); query_documents merges the chunks of each document; metadata_filter uses Pinecone filter operators; with several sources, list_sources names them and the source argument selects one. Rows carry document_id (paper_number is a deprecated alias). Errors are JSON objects {code, message, recoverable, field?, suggestion?}.";

const GATE_INSTRUCTIONS: &str = "

Suggest-flow: call suggest_query_params with the namespace and the user's question before query, count or query_documents, and use the tool and fields it recommends. guided_query does this by itself.";

impl PineconeServer {
    /// A server for `config`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: PineconeConfig) -> Result<Self, PineconeError> {
        Ok(Self::with_http_client(config, http_client()?))
    }

    /// A server for `config` using `http` for every Pinecone call.
    ///
    /// The client's own redirect policy applies: build it with
    /// [`same_origin_redirects`](super::same_origin_redirects) (as
    /// [`PineconeServer::new`] does) so an `Api-Key` never follows a redirect
    /// to another origin.
    pub fn with_http_client(config: PineconeConfig, http: reqwest::Client) -> Self {
        let registry = Registry::new(&config, &http);
        let config_bytes = config.cache_bytes;
        let urls = UrlRegistry::default();
        if config.builtin_url_generators {
            let names: Vec<String> = config.sources.iter().map(|s| s.name.clone()).collect();
            urls.install_builtins(&names, config.is_multi_source());
        }
        let mut tool_router = Self::tool_router();
        if !registry.is_multi() {
            tool_router.remove_route("list_sources");
        }
        crate::mcp::schema::portable_router(&mut tool_router);
        default_top_k(&mut tool_router, config.default_top_k);
        PineconeServer {
            state: Arc::new(State {
                gate: Gate::new(config.suggest_flow, config.cache_ttl),
                registry,
                urls: Arc::new(urls),
                config,
            }),
            keys: KeyPolicy::Configured,
            callers: Arc::new(Callers {
                http,
                tenants: Tenants::new(config_bytes),
            }),
            tool_router: Arc::new(tool_router),
        }
    }

    /// The key policy the tools follow.
    pub fn key_policy(&self) -> KeyPolicy {
        self.keys
    }

    /// Sets whose key each call runs with (default
    /// [`KeyPolicy::Configured`]: the configured keys, as over stdio).
    pub fn with_key_policy(mut self, keys: KeyPolicy) -> Self {
        self.keys = keys;
        self
    }

    /// The resolved configuration.
    pub fn config(&self) -> &PineconeConfig {
        &self.state.config
    }

    /// Installs a URL generator for `namespace` (on `source`, or on every
    /// source when `None`), replacing any earlier one.
    pub fn register_url_generator(
        &self,
        namespace: &str,
        source: Option<&str>,
        generator: UrlGenerator,
    ) {
        match source {
            Some(s) => self
                .state
                .urls
                .register(format!("{s}:{namespace}"), generator),
            None => {
                self.state.urls.register(namespace, generator.clone());
                if self.state.registry.is_multi() {
                    for s in self.state.registry.all() {
                        self.state
                            .urls
                            .register(format!("{}:{namespace}", s.name()), generator.clone());
                    }
                }
            }
        }
    }

    /// Drops cached namespace lists (the next call rediscovers).
    pub async fn clear_caches(&self) {
        self.state.registry.clear_caches().await;
        self.callers.clear();
    }

    /// Probes every dense and sparse index once, without retries, with
    /// describe-index-stats (`nexus-mcp --check-indexes` uses
    /// [`check_indexes`](super::check_indexes), which reports
    /// per index).
    ///
    /// # Errors
    /// One redacted line per unreachable index, e.g.
    /// `[src_b] Sparse index "kb2-sparse": describeIndexStats failed with HTTP 404: …`.
    pub async fn check_indexes(&self) -> Result<String, Vec<String>> {
        let registry = &self.state.registry;
        let tagged = self.state.config.mode == super::config::SourceMode::Sources;
        let probes = registry.all().iter().flat_map(|s| {
            [
                ("Dense", &s.config.index_name),
                ("Sparse", &s.config.sparse_index_name),
            ]
            .map(|(kind, index)| async move {
                s.client
                    .without_retries()
                    .describe_index_stats(index)
                    .await
                    .err()
                    .map(|e| {
                        let prefix = if tagged {
                            format!("[{}] ", s.name())
                        } else {
                            String::new()
                        };
                        crate::mcp::redact::redact(&format!(
                            "{prefix}{kind} index \"{index}\": {e}"
                        ))
                    })
            })
        });
        let failures: Vec<String> = futures::future::join_all(probes)
            .await
            .into_iter()
            .flatten()
            .collect();
        if !failures.is_empty() {
            return Err(failures);
        }
        Ok(match registry.all() {
            [only] if !tagged => format!(
                "dense index \"{}\" and sparse index \"{}\" reachable.",
                only.config.index_name, only.config.sparse_index_name
            ),
            all => format!("all {} source(s) reachable.", all.len()),
        })
    }

    /// The tools this server offers (`list_sources` only with two or more sources).
    pub fn tools(&self) -> Vec<Tool> {
        self.tool_router.list_all()
    }

    /// Whether `name` is one of this server's tools.
    pub fn has_tool(&self, name: &str) -> bool {
        self.tool_router.has_route(name)
    }

    /// What to tell agents at initialize.
    pub fn instructions(&self) -> String {
        let mut text = CORE_INSTRUCTIONS.to_owned();
        if self.state.gate.enabled() {
            text.push_str(GATE_INSTRUCTIONS);
        }
        text
    }

    /// Runs a tool call. Argument errors (wrong type, missing field) come
    /// back as a `VALIDATION` tool error naming the field, like every other
    /// input problem; an unknown tool name is a protocol error.
    ///
    /// A call without a usable key (see [`PineconeServer::with_key_policy`])
    /// is an `UNAUTHORIZED` tool error.
    ///
    /// # Errors
    /// `invalid_params` for an unknown tool.
    pub async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let mut caller = None;
        if self.has_tool(&request.name) {
            match call_key(self.keys, &context.extensions) {
                Ok(CallKey::Configured) => {}
                Ok(CallKey::Caller(key)) => caller = Some(key),
                Err(e) => return Ok(e.into_result().into()),
            }
            let empty = JsonObject::new();
            let args = request.arguments.as_ref().unwrap_or(&empty);
            if let Err(e) = check_arguments(&request.name, args) {
                return Ok(e.into_result().into());
            }
        }
        let scoped;
        let mut held = None;
        let server = match caller {
            None => self,
            Some(key) => {
                let tenant = self.callers.state_for(&key, &self.state);
                scoped = PineconeServer {
                    state: Arc::clone(&tenant.state),
                    ..self.clone()
                };
                held = Some((key, tenant));
                &scoped
            }
        };
        let tcc = ToolCallContext::new(server, request, context);
        let result = self.tool_router.call(tcc).await;
        if let Some((key, tenant)) = held {
            self.callers.tenants.settle(&key, &tenant);
        }
        result
    }
}

impl PineconeServer {
    /// Every source's namespaces as the caller's tool calls see them (same
    /// key, same per-caller discovery cache), each with its dense index's
    /// name. Sources that fail are left out; when none answers, the first
    /// failure is the error.
    pub(crate) async fn caller_namespaces(
        &self,
        extensions: &rmcp::model::Extensions,
    ) -> Result<Vec<(String, super::discovery::NamespaceRow)>, ToolError> {
        let (state, held) = match call_key(self.keys, extensions)? {
            CallKey::Configured => (Arc::clone(&self.state), None),
            CallKey::Caller(key) => {
                let tenant = self.callers.state_for(&key, &self.state);
                (Arc::clone(&tenant.state), Some((key, tenant)))
            }
        };
        let mut rows = Vec::new();
        let mut failed = None;
        for source in state.registry.all() {
            match state.registry.namespaces(Some(source)).await {
                Ok(view) => rows.extend(
                    view.rows()
                        .iter()
                        .map(|row| (source.config.index_name.clone(), row.clone())),
                ),
                Err(failure) => {
                    failed.get_or_insert(failure.into_tool_error(
                        "list_namespaces",
                        "namespace discovery failed",
                        state.config.error_details,
                    ));
                }
            }
        }
        if let Some((key, tenant)) = held {
            self.callers.tenants.settle(&key, &tenant);
        }
        match failed {
            Some(e) if rows.is_empty() => Err(e),
            _ => Ok(rows),
        }
    }
}

/// Reads the arguments the way the tool will, to report a bad one as a
/// `VALIDATION` tool error rather than as rmcp's protocol error.
fn check_arguments(tool: &str, args: &JsonObject) -> Result<(), ToolError> {
    fn check<T: serde::de::DeserializeOwned>(args: &JsonObject) -> Result<(), ToolError> {
        parse::<T>(args).map(drop)
    }
    match tool {
        "list_namespaces" => check::<ListNamespacesArgs>(args),
        "namespace_router" => check::<NamespaceRouterArgs>(args),
        "suggest_query_params" => check::<SuggestQueryParamsArgs>(args),
        "count" => check::<CountArgs>(args),
        "query" => check::<QueryArgs>(args),
        "keyword_search" => check::<KeywordSearchArgs>(args),
        "query_documents" => check::<QueryDocumentsArgs>(args),
        "guided_query" => check::<GuidedQueryArgs>(args),
        "generate_urls" => check::<GenerateUrlsArgs>(args),
        _ => Ok(()),
    }
}

impl ServerHandler for PineconeServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION")))
            .with_instructions(self.instructions())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.call(request, context).await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tool_router.get(name).cloned()
    }
}

impl PineconeServer {
    /// Whether Pinecone accepts caller `key`: one control-plane read (the
    /// first source's index description) made with it.
    pub(crate) async fn prove_key(
        &self,
        key: &crate::mcp::caller::CallerKey,
    ) -> crate::mcp::nexus::KeyProof {
        use crate::mcp::nexus::KeyProof;
        let held = self.callers.state_for(key, &self.state);
        let Some(source) = held.state.registry.all().first() else {
            return KeyProof::Undecided;
        };
        match source
            .client
            .describe_index(&source.config.index_name)
            .await
        {
            Ok(_) => {
                self.callers.tenants.settle(key, &held);
                KeyProof::Accepted
            }
            Err(e) if matches!(e.status(), Some(401 | 403)) => KeyProof::Refused,
            Err(_) => KeyProof::Undecided,
        }
    }
}
