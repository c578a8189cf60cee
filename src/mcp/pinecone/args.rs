//! Tool arguments. Field docs become the JSON Schema descriptions.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

/// A metadata filter (Pinecone filter syntax).
pub(super) type MetadataFilter = Map<String, Value>;

/// `list_namespaces` arguments.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub(super) struct ListNamespacesArgs {
    /// Source name (with several sources, `list_sources` names them); omit to list every source.
    #[serde(default)]
    pub source: Option<String>,
}

/// `namespace_router` arguments.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(super) struct NamespaceRouterArgs {
    /// The user's question.
    pub user_query: String,
    /// How many suggestions to return (1..5, default 3).
    #[serde(default)]
    #[schemars(range(min = 1, max = 5), extend("default" = 3))]
    pub top_n: Option<i64>,
    /// Source name; omit to consider every source.
    #[serde(default)]
    pub source: Option<String>,
}

/// `suggest_query_params` arguments.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(super) struct SuggestQueryParamsArgs {
    /// Namespace from `list_namespaces`.
    pub namespace: String,
    /// The user's question.
    pub user_query: String,
    /// Source name; needed only when the namespace exists on several sources.
    #[serde(default)]
    pub source: Option<String>,
}

/// `count` arguments.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(super) struct CountArgs {
    /// Namespace from `list_namespaces`.
    pub namespace: String,
    /// Text selecting which chunks are considered when more than 10 000 match.
    pub query_text: String,
    /// Metadata filter, e.g. `{"author": {"$in": ["Jane Doe"]}}`.
    #[serde(default)]
    pub metadata_filter: Option<MetadataFilter>,
    /// Source name; needed only when the namespace exists on several sources.
    #[serde(default)]
    pub source: Option<String>,
}

/// Result size and cost presets of `query`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum Preset {
    /// Identifier fields only, no rerank.
    Fast,
    /// All fields, reranked.
    Detailed,
    /// All fields, reranked (same as `detailed`).
    Full,
}

/// `query` arguments.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(super) struct QueryArgs {
    /// Search text.
    pub query_text: String,
    /// Namespace from `list_namespaces`.
    pub namespace: String,
    /// Results wanted (1..100, default 10).
    #[serde(default)]
    #[schemars(range(min = 1, max = 100))]
    pub top_k: Option<i64>,
    /// Metadata filter.
    #[serde(default)]
    pub metadata_filter: Option<MetadataFilter>,
    /// Fields to return; omit for all (or the fast set with `preset: fast`).
    #[serde(default)]
    pub fields: Option<Vec<String>>,
    /// Source name; needed only when the namespace exists on several sources.
    #[serde(default)]
    pub source: Option<String>,
    /// `fast`, `detailed` or `full` (default).
    #[serde(default)]
    #[schemars(extend("default" = "full"))]
    pub preset: Option<Preset>,
    /// Rerank the results (default: when the source has a reranking model; ignored by `fast`).
    #[serde(default)]
    pub use_reranking: Option<bool>,
}

/// `keyword_search` arguments.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(super) struct KeywordSearchArgs {
    /// Search text (matched lexically on the sparse index).
    pub query_text: String,
    /// Namespace from `list_namespaces`.
    pub namespace: String,
    /// Results wanted (1..100, default 10).
    #[serde(default)]
    #[schemars(range(min = 1, max = 100))]
    pub top_k: Option<i64>,
    /// Metadata filter.
    #[serde(default)]
    pub metadata_filter: Option<MetadataFilter>,
    /// Fields to return; omit for all.
    #[serde(default)]
    pub fields: Option<Vec<String>>,
    /// Source name; needed only when the namespace exists on several sources.
    #[serde(default)]
    pub source: Option<String>,
}

/// `query_documents` arguments.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(super) struct QueryDocumentsArgs {
    /// Search text.
    pub query_text: String,
    /// Namespace from `list_namespaces`.
    pub namespace: String,
    /// Documents wanted (1..20, default 5).
    #[serde(default)]
    #[schemars(range(min = 1, max = 20), extend("default" = 5))]
    pub top_k: Option<i64>,
    /// Metadata filter.
    #[serde(default)]
    pub metadata_filter: Option<MetadataFilter>,
    /// Most chunks merged per document (1..500, default 200).
    #[serde(default)]
    #[schemars(range(min = 1, max = 500))]
    pub max_chunks_per_document: Option<i64>,
    /// Rerank the chunks (default: when the source has a reranking model).
    #[serde(default)]
    pub use_reranking: Option<bool>,
    /// Source name; needed only when the namespace exists on several sources.
    #[serde(default)]
    pub source: Option<String>,
}

/// Tool choice of `guided_query`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum PreferredTool {
    /// Follow the suggestion.
    #[default]
    Auto,
    /// Count documents.
    Count,
    /// Fast query.
    Fast,
    /// Detailed query.
    Detailed,
    /// Full query.
    Full,
}

/// `guided_query` arguments.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(super) struct GuidedQueryArgs {
    /// The user's question.
    pub user_query: String,
    /// Namespace; omit to route automatically.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Metadata filter.
    #[serde(default)]
    pub metadata_filter: Option<MetadataFilter>,
    /// Results wanted (1..100, default 10).
    #[serde(default)]
    #[schemars(range(min = 1, max = 100))]
    pub top_k: Option<i64>,
    /// `auto` (default), `count`, `fast`, `detailed` or `full`.
    #[serde(default)]
    #[schemars(extend("default" = "auto"))]
    pub preferred_tool: Option<PreferredTool>,
    /// Fill missing `url` metadata from the namespace's URL generator (default true).
    #[serde(default)]
    #[schemars(extend("default" = true))]
    pub enrich_urls: Option<bool>,
    /// Source name.
    #[serde(default)]
    pub source: Option<String>,
}

/// `generate_urls` arguments.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub(super) struct GenerateUrlsArgs {
    /// Namespace of the records.
    pub namespace: String,
    /// Records (or their `metadata` objects), at most 500.
    #[schemars(length(max = 500))]
    pub records: Vec<Map<String, Value>>,
    /// Source name; needed only when the namespace exists on several sources.
    #[serde(default)]
    pub source: Option<String>,
}
