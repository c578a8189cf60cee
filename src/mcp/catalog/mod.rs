//! What `nexus-mcp` serves besides tools: resources (Nexus contexts, their
//! knowledge files, Pinecone namespaces), prompts and completions.
//!
//! Every read runs with the key the caller's tool calls run with (the same
//! per-caller clients and discovery caches), so a caller sees only what its
//! key sees. The completion cache is kept per caller key.
//!
//! # Layout
//! - `uri`: the resource URIs, written and parsed.
//! - `resources`: `resources/list`, `resources/templates/list`, `resources/read`.
//! - `prompts`: `prompts/list`, `prompts/get`.
//! - `completions`: `completion/complete` and its per-caller cache.

mod completions;
mod prompts;
mod resources;
mod uri;

use rmcp::ErrorData;
use rmcp::model::{PromptsCapability, ResourcesCapability, ServerCapabilities};

use super::metrics::Metrics;
use super::nexus::NexusServer;
use super::pinecone::PineconeServer;
use super::tool_error::{ToolError, ToolErrorCode};

pub use self::completions::COMPLETION_TTL;
pub(crate) use self::completions::{CompletionCache, complete};
pub(crate) use self::prompts::{get as get_prompt, list as list_prompts};
pub(crate) use self::resources::{
    list as list_resources, read as read_resource, templates as list_resource_templates,
};

/// The most bytes of a knowledge file a `resources/read` returns.
pub const MAX_KNOWLEDGE_READ_BYTES: usize = 256 * 1024;
/// The most resources in one `resources/list` page.
pub const RESOURCE_PAGE_SIZE: usize = 50;

/// The tool families a request may reach, the tools the operator exposes
/// (`None`: every tool), and where their upstream failures are counted.
///
/// Resources, prompts and completions stand for tools, and are served only
/// when those tools are exposed: read them through the methods below, never
/// through the families themselves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Families<'a> {
    nexus: Option<&'a NexusServer>,
    pinecone: Option<&'a PineconeServer>,
    exposed: Option<&'a [Box<str>]>,
    metrics: &'a Metrics,
}

/// The tools the prompt `ask_context` tells a model to call.
const ASK_CONTEXT_TOOLS: [&str; 2] = ["query_context", "get_query"];
/// The tools the prompt `research_namespace` tells a model to call.
const RESEARCH_NAMESPACE_TOOLS: [&str; 3] = ["suggest_query_params", "query", "keyword_search"];

impl<'a> Families<'a> {
    /// The families configured, with the tools exposed (`None`: every tool).
    pub(crate) fn new(
        nexus: Option<&'a NexusServer>,
        pinecone: Option<&'a PineconeServer>,
        exposed: Option<&'a [Box<str>]>,
        metrics: &'a Metrics,
    ) -> Self {
        Families {
            nexus,
            pinecone,
            exposed,
            metrics,
        }
    }

    /// Whether any family is configured.
    fn any(&self) -> bool {
        self.nexus.is_some() || self.pinecone.is_some()
    }

    fn exposes(&self, tool: &str) -> bool {
        self.exposed
            .is_none_or(|names| names.iter().any(|n| &**n == tool))
    }

    /// The Nexus family when its contexts are served (`list_contexts` is
    /// exposed): context and knowledge resources, slug and path completions.
    fn contexts(&self) -> Option<&'a NexusServer> {
        self.nexus.filter(|_| self.exposes("list_contexts"))
    }

    /// The Nexus family when the prompt `ask_context` is served.
    fn ask_context(&self) -> Option<&'a NexusServer> {
        self.nexus
            .filter(|_| ASK_CONTEXT_TOOLS.iter().all(|t| self.exposes(t)))
    }

    /// The Pinecone family when its namespaces are served (`list_namespaces`
    /// is exposed): namespace resources, source, index, namespace and field
    /// completions.
    fn namespaces(&self) -> Option<&'a PineconeServer> {
        self.pinecone.filter(|_| self.exposes("list_namespaces"))
    }

    /// The Pinecone family when the prompt `research_namespace` is served.
    fn research_namespace(&self) -> Option<&'a PineconeServer> {
        self.pinecone
            .filter(|_| RESEARCH_NAMESPACE_TOOLS.iter().all(|t| self.exposes(t)))
    }

    /// Counts `e` in `upstream_errors_total` when the upstream of `family`
    /// (`nexus` or `pinecone`) failed or timed out, as a tool call's
    /// failure is counted; a refused key or a missing name is not one.
    fn count_failure(&self, family: &'static str, e: &ToolError) {
        let code = match e.code {
            ToolErrorCode::NexusError => "NEXUS_ERROR",
            ToolErrorCode::PineconeError => "PINECONE_ERROR",
            ToolErrorCode::Timeout => "TIMEOUT",
            _ => return,
        };
        self.metrics.upstream_error(family, code);
    }
}

/// Adds resources, prompts and completions to `caps` when a family serving
/// them is configured.
pub(crate) fn declare(families: Families<'_>, caps: &mut ServerCapabilities) {
    if families.any() {
        caps.resources = Some(ResourcesCapability::default());
        caps.prompts = Some(PromptsCapability::default());
        caps.completions = Some(rmcp::model::JsonObject::new());
    }
}

/// A failed upstream read as a protocol error: the kind of failure only,
/// never the upstream's own words.
fn upstream_error(e: &ToolError, uri: Option<&str>) -> ErrorData {
    let data = uri.map(|uri| serde_json::json!({ "uri": uri }));
    match e.code {
        ToolErrorCode::NotFound => ErrorData::resource_not_found("resource not found", data),
        ToolErrorCode::Unauthorized => ErrorData::invalid_request(
            format!(
                "no usable API key: send yours in the {} header",
                crate::client::API_KEY_HEADER
            ),
            data,
        ),
        ToolErrorCode::Timeout => ErrorData::internal_error("the upstream call timed out", data),
        ToolErrorCode::Cancelled => ErrorData::internal_error("the request was cancelled", data),
        _ => ErrorData::internal_error("the upstream call failed", data),
    }
}

/// The -32002 error of a URI this server does not serve.
fn not_found(uri: &str) -> ErrorData {
    ErrorData::resource_not_found(
        "resource not found",
        Some(serde_json::json!({ "uri": truncate(uri, 256) })),
    )
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
