//! The Nexus tools' argument and result shapes (they are the advertised
//! schemas), and how a result or a failure becomes a tool result.

use chrono::{DateTime, SecondsFormat, Utc};
use rmcp::handler::server::common::{schema_for_empty_input, schema_for_input};
use rmcp::handler::server::tool::schema_for_output;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::mcp::tool_error::{ToolError, ToolErrorCode, with_error_branch};
use crate::types;

// ---------------------------------------------------------------------------
// Argument and result shapes (they are the advertised schemas).

/// Arguments of `query_context`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(super) struct QueryContextArgs {
    /// The slug of a queryable context, as `list_contexts` returns it.
    pub(super) context: String,
    /// The question, in natural language.
    #[schemars(length(min = 1))]
    pub(super) question: String,
}

/// Arguments of `get_query`.
#[derive(Debug, Deserialize, JsonSchema)]
pub(super) struct GetQueryArgs {
    /// The `query_id` returned by `query_context`.
    pub(super) query_id: String,
    /// Wait up to this many seconds (0-60, default 0) for the turn to end before answering.
    #[serde(default)]
    #[schemars(range(min = 0, max = 60), with = "Option<u64>")]
    pub(super) wait_seconds: Option<serde_json::Number>,
}

/// One context as `list_contexts` describes it.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub(crate) struct ContextSummary {
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
pub(crate) struct ContextList {
    /// Every context of the project.
    pub contexts: Vec<ContextSummary>,
}

/// The result of `query_context`.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub(crate) struct QueryStarted {
    /// Pass it to `get_query`.
    pub query_id: String,
    /// The turn's status (`in_progress` at first).
    pub status: String,
    /// The model answering, when known.
    pub model: Option<String>,
}

/// One source an answer cites.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub(crate) struct CitationSummary {
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
pub(crate) struct QueryOutcome {
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
        let completed = q.status == crate::QueryStatus::Completed;
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
            status: q.status.to_string(),
            error: q.error.clone(),
        }
    }
}

pub(super) fn iso(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// A failed call: `isError: true` and the [`ToolError`] JSON as text and as
/// `structuredContent` (every tool's `outputSchema` admits it, see
/// [`with_error_branch`]).
pub(super) fn failure(error: ToolError) -> CallToolResult {
    error.into_result()
}

/// The `outputSchema` of a tool returning `T`, admitting a [`ToolError`] too.
pub(super) fn output_schema<T: JsonSchema + 'static>() -> std::sync::Arc<JsonObject> {
    with_error_branch((*schema_for_output::<T>()).clone())
}

pub(super) fn input_schema<T: JsonSchema + 'static>() -> std::sync::Arc<JsonObject> {
    // The argument types are constants of this module and always produce an
    // object schema; the fallback only keeps a bad edit from panicking.
    schema_for_input::<T>().unwrap_or_else(|_| schema_for_empty_input())
}

/// A successful result: `value` as text and as structured content.
pub(super) fn success<T: Serialize>(text: &impl Serialize, structured: &T) -> CallToolResult {
    match (
        serde_json::to_string(text),
        serde_json::to_value(structured),
    ) {
        (Ok(text), Ok(value)) => with_structured(text, value),
        _ => encode_failure(),
    }
}

/// `list_contexts`' result: the bare array as text, wrapped in
/// [`ContextList`] as structured content.
pub(super) fn context_list(list: &ContextList) -> CallToolResult {
    success(&list.contexts, list)
}

fn with_structured(text: String, structured: Value) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(structured);
    result
}

fn encode_failure() -> CallToolResult {
    failure(ToolError::new(
        ToolErrorCode::NexusError,
        "could not encode the result",
        false,
    ))
}
