//! The `suggest_query_params` heuristic: which tool and fields fit a question.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

/// Fields returned by the `fast` preset when the caller names none.
pub(super) const FAST_FIELDS: [&str; 5] = ["document_number", "title", "url", "author", "doc_id"];

/// The recommended tool.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub(super) enum SuggestedTool {
    /// The `count` tool.
    Count,
    /// `query` with the `fast` preset.
    Fast,
    /// `query` with the `detailed` preset.
    Detailed,
    /// `query` with the `full` preset.
    Full,
}

/// The heuristic's answer.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Suggestion {
    /// Fields to request.
    pub suggested_fields: Vec<String>,
    /// Whether the question is a count.
    pub use_count_tool: bool,
    /// Tool to call.
    pub recommended_tool: SuggestedTool,
    /// Why.
    pub explanation: &'static str,
    /// Whether the namespace was found.
    pub namespace_found: bool,
}

// The patterns are constants; a failure is a programming error caught by the tests.
static COUNT_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b(how many|count|number of|total number|documents? count|records? count)\b")
        .unwrap_or_else(|e| panic!("count pattern: {e}"))
});
static CONTENT_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"\b(content|summarize|summarise|what does|excerpt|text|say|details?|full text|body)\b",
    )
    .unwrap_or_else(|e| panic!("content pattern: {e}"))
});

fn pick(available: &[&String], preferred: &[&str], fallback_all: bool) -> Vec<String> {
    let chosen: Vec<String> = preferred
        .iter()
        .filter(|p| available.iter().any(|a| a.as_str() == **p))
        .map(|p| (*p).to_owned())
        .collect();
    if !chosen.is_empty() {
        return chosen;
    }
    let take = if fallback_all { available.len() } else { 5 };
    available.iter().take(take).map(|s| (*s).clone()).collect()
}

/// Suggests a tool and fields for `user_query` given a namespace's fields
/// (`None` when the namespace was not found).
pub(super) fn suggest(
    metadata_fields: Option<&Map<String, Value>>,
    user_query: &str,
) -> Suggestion {
    let Some(fields) = metadata_fields else {
        return Suggestion {
            suggested_fields: Vec::new(),
            use_count_tool: false,
            recommended_tool: SuggestedTool::Fast,
            explanation: "Namespace not found or has no metadata fields. Call list_namespaces first, then pass a valid namespace.",
            namespace_found: false,
        };
    };
    let available: Vec<&String> = fields.keys().collect();
    if available.is_empty() {
        return Suggestion {
            suggested_fields: Vec::new(),
            use_count_tool: false,
            recommended_tool: SuggestedTool::Fast,
            explanation: "Namespace has no metadata fields. Use list_namespaces to verify the namespace is correct.",
            namespace_found: true,
        };
    }
    let q = user_query.trim().to_lowercase();
    if COUNT_RE.is_match(&q) {
        return Suggestion {
            suggested_fields: pick(&available, &["document_number", "url", "doc_id"], false),
            use_count_tool: true,
            recommended_tool: SuggestedTool::Count,
            explanation: "User asked for a count. Use the count tool for this. If using query instead, use minimal fields (no chunk_text).",
            namespace_found: true,
        };
    }
    if CONTENT_RE.is_match(&q) {
        return Suggestion {
            suggested_fields: pick(
                &available,
                &["document_number", "title", "url", "author", "chunk_text"],
                true,
            ),
            use_count_tool: false,
            recommended_tool: SuggestedTool::Detailed,
            explanation: "User asked for content or details; include chunk_text for snippets.",
            namespace_found: true,
        };
    }
    Suggestion {
        suggested_fields: pick(
            &available,
            &["document_number", "title", "url", "author"],
            false,
        ),
        use_count_tool: false,
        recommended_tool: SuggestedTool::Fast,
        explanation: "User asked for a list or browse; use minimal fields (no chunk_text) for smaller payload and cost.",
        namespace_found: true,
    }
}
