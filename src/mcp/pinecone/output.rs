//! Success payloads. Field order is the wire key order; optional fields are
//! omitted when empty; experimental fields live under `experimental`.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use super::args::MetadataFilter;
use super::discovery::NamespaceRow;
use super::documents::Document;
use super::format::ResultRow;
use super::router::RouteSuggestion;
use super::search::{HybridOutcome, Leg, RerankOutcome};
use super::suggest::SuggestedTool;
use super::urls::UrlMethod;

/// Always `success` in a success payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum Status {
    /// The call succeeded (possibly degraded; see `experimental`).
    #[default]
    Success,
}

/// `list_sources` payload.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct ListSourcesOutput {
    /// `success`.
    pub status: Status,
    /// Sources in configuration order.
    pub sources: Vec<SourceEntry>,
    /// The default source.
    pub default: String,
}

/// One source.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct SourceEntry {
    /// Name.
    pub name: String,
    /// Configured hint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// `list_namespaces` payload, borrowing the discovered rows.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct ListNamespacesOutput<'a> {
    /// `success`.
    pub status: Status,
    /// Whether the list came from the cache.
    pub cache_hit: bool,
    /// Seconds until the cached list expires.
    pub cache_ttl_seconds: u64,
    /// When the cached list expires (ISO-8601 UTC).
    pub expires_at_iso: String,
    /// Number of namespaces.
    pub count: usize,
    /// Sources whose discovery failed, with the (redacted) error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_errors: Option<&'a Map<String, Value>>,
    /// Configuration warnings (stale declarations).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_warnings: Option<Vec<String>>,
    /// The namespaces.
    pub namespaces: &'a [NamespaceRow],
}

/// `namespace_router` payload.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct NamespaceRouterOutput {
    /// `success`.
    pub status: Status,
    /// Whether namespaces came from the cache.
    pub cache_hit: bool,
    /// The trimmed question.
    pub user_query: String,
    /// Ranked namespaces.
    pub suggestions: Vec<RouteSuggestion>,
    /// The namespace to use, or null when none matches well enough.
    pub recommended_namespace: Option<String>,
    /// Its source (sources mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recommended_source: Option<String>,
}

/// `suggest_query_params` payload.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct SuggestQueryParamsOutput {
    /// `success`.
    pub status: Status,
    /// Whether namespaces came from the cache.
    pub cache_hit: bool,
    /// Resolved source (multi-source mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Fields to request.
    pub suggested_fields: Vec<String>,
    /// Whether the question is a count.
    pub use_count_tool: bool,
    /// `count`, `fast` or `detailed`.
    pub recommended_tool: SuggestedTool,
    /// Why.
    pub explanation: String,
    /// Whether the namespace exists.
    pub namespace_found: bool,
}

/// `count` payload.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct CountOutput {
    /// `success`.
    pub status: Status,
    /// Distinct documents among up to 10 000 matching chunks.
    pub count: usize,
    /// True when 10 000 chunks matched (more documents may exist).
    pub truncated: bool,
    /// Namespace.
    pub namespace: String,
    /// Source (multi-source mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The filter used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata_filter: Option<MetadataFilter>,
    /// Present when nothing matched because the namespace does not exist:
    /// the namespaces that do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// Which query preset ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum Mode {
    /// `full`.
    Query,
    /// `fast`.
    QueryFast,
    /// `detailed`.
    QueryDetailed,
}

/// Degradation details (experimental; omitted when there is nothing to say).
#[derive(Debug, Clone, Default, PartialEq, Serialize, JsonSchema)]
pub(super) struct Experimental {
    /// Present (true) when results are low confidence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degraded: Option<bool>,
    /// Why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degradation_reason: Option<String>,
    /// `dense` or `sparse` when one hybrid leg failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hybrid_leg_failed: Option<Leg>,
    /// `no_model` when reranking was asked for and this source has no model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerank_skipped_reason: Option<String>,
}

impl Experimental {
    /// The block for a hybrid outcome, or `None` when empty.
    pub(super) fn of(outcome: &HybridOutcome) -> Option<Experimental> {
        let e = Experimental {
            degraded: outcome.degraded.then_some(true),
            degradation_reason: outcome
                .degradation_reason
                .as_deref()
                .map(crate::mcp::redact::redact),
            hybrid_leg_failed: outcome.leg_failed,
            rerank_skipped_reason: (outcome.rerank == RerankOutcome::NoModel)
                .then(|| "no_model".to_owned()),
        };
        (e != Experimental::default()).then_some(e)
    }
}

/// `query` payload (also the query-shaped `guided_query` result).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct QueryOutput {
    /// `success`.
    pub status: Status,
    /// Preset that ran.
    pub mode: Mode,
    /// The query text as given.
    pub query: String,
    /// Namespace.
    pub namespace: String,
    /// Source (multi-source mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The filter used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata_filter: Option<MetadataFilter>,
    /// Number of results.
    pub result_count: usize,
    /// Fields requested.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
    /// Results, best first.
    pub results: Vec<ResultRow>,
    /// Degradation details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experimental: Option<Experimental>,
    /// Present when nothing matched because the namespace does not exist:
    /// the namespaces that do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// `keyword_search` payload.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct KeywordSearchOutput {
    /// `success`.
    pub status: Status,
    /// Trimmed query text.
    pub query: String,
    /// Namespace.
    pub namespace: String,
    /// Source (multi-source mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Sparse index searched.
    pub index: String,
    /// The filter used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata_filter: Option<MetadataFilter>,
    /// Number of results.
    pub result_count: usize,
    /// Results in index order.
    pub results: Vec<ResultRow>,
    /// Fields requested.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
}

/// `query_documents` payload.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct QueryDocumentsOutput {
    /// `success`.
    pub status: Status,
    /// Trimmed query text.
    pub query: String,
    /// Namespace.
    pub namespace: String,
    /// Source (multi-source mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The filter used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata_filter: Option<MetadataFilter>,
    /// Number of documents.
    pub result_count: usize,
    /// Documents, best first.
    pub documents: Vec<Document>,
    /// Degradation details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experimental: Option<Experimental>,
}

/// Marks the count-shaped `guided_query` result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum CountTool {
    /// `count`.
    Count,
}

/// Count-shaped `guided_query` result.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct GuidedCount {
    /// `count`.
    pub tool: CountTool,
    /// Namespace.
    pub namespace: String,
    /// Source (multi-source mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Trimmed question.
    pub query: String,
    /// The filter used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata_filter: Option<MetadataFilter>,
    /// Distinct documents.
    pub count: usize,
    /// True when 10 000 chunks matched.
    pub truncated: bool,
}

/// The `guided_query` result: a count or a query.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub(super) enum GuidedResult {
    /// Count path.
    Count(GuidedCount),
    /// Query path.
    Query(QueryOutput),
}

/// How `guided_query` decided.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct DecisionTrace {
    /// Whether namespaces came from the cache.
    pub cache_hit: bool,
    /// Namespace argument as given.
    pub input_namespace: Option<String>,
    /// Router's recommendation.
    pub routed_namespace: Option<String>,
    /// Namespace used.
    pub selected_namespace: String,
    /// Source used (sources mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selected_source: Option<String>,
    /// Top router rows.
    pub ranked_namespaces: Vec<RouteSuggestion>,
    /// Suggested fields.
    pub suggested_fields: Vec<String>,
    /// Suggested tool.
    pub suggested_tool: SuggestedTool,
    /// Tool used.
    pub selected_tool: SuggestedTool,
    /// Suggestion explanation.
    pub explanation: String,
    /// Whether URLs were enriched.
    pub enrich_urls: bool,
    /// `success`, `skipped`, `skipped_no_model` or `failed`.
    pub rerank_status: RerankStatus,
}

/// Rerank result as reported by `guided_query`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum RerankStatus {
    /// Reranked.
    Success,
    /// Not attempted (fast/count path, or nothing retrieved).
    Skipped,
    /// No model configured.
    SkippedNoModel,
    /// The rerank call failed.
    Failed,
}

impl RerankStatus {
    /// The status of a hybrid outcome.
    pub(super) fn of(outcome: &RerankOutcome) -> RerankStatus {
        match outcome {
            RerankOutcome::Reranked => RerankStatus::Success,
            RerankOutcome::NoModel => RerankStatus::SkippedNoModel,
            RerankOutcome::Failed(_) => RerankStatus::Failed,
            RerankOutcome::NotRequested | RerankOutcome::NothingToRerank => RerankStatus::Skipped,
        }
    }
}

/// Experimental part of `guided_query`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct GuidedExperimental {
    /// How it decided.
    pub decision_trace: DecisionTrace,
}

/// `guided_query` payload.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct GuidedQueryOutput {
    /// `success`.
    pub status: Status,
    /// Count or query result.
    pub result: GuidedResult,
    /// Decision trace.
    pub experimental: GuidedExperimental,
}

/// `generate_urls` payload.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct GenerateUrlsOutput {
    /// `success`.
    pub status: Status,
    /// Namespace.
    pub namespace: String,
    /// Number of records.
    pub count: usize,
    /// One row per record, in input order.
    pub results: Vec<UrlRow>,
}

/// URL of one record.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(super) struct UrlRow {
    /// Position in `records`.
    pub index: usize,
    /// The URL or null.
    pub url: Option<String>,
    /// How it was made.
    pub method: UrlMethod,
    /// Why there is none, else null.
    pub reason: Option<String>,
    /// The metadata used.
    pub metadata: Map<String, Value>,
}
