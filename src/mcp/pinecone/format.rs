//! Result rows of `query`, `keyword_search` and `guided_query`.

use serde_json::{Map, Value};

use super::documents::round4;
use super::fusion::Hit;
use super::urls::UrlRegistry;

/// Longest `content` of one row, in characters.
pub(super) const MAX_ROW_CHARS: usize = 2_000;

/// One result row.
#[derive(Debug, Clone, PartialEq, serde::Serialize, schemars::JsonSchema)]
pub(super) struct ResultRow {
    /// `document_number`, else the upper-cased `filename` without `.md`.
    pub document_id: Option<String>,
    /// Deprecated alias of `document_id`.
    pub paper_number: Option<String>,
    /// `title` as text.
    pub title: String,
    /// `author` as text (arrays joined with commas).
    pub author: String,
    /// `url` as text.
    pub url: String,
    /// The chunk text, at most 2000 characters.
    pub content: String,
    /// Score, 4 decimals.
    pub score: f64,
    /// Whether `score` is a rerank score.
    pub reranked: bool,
    /// Every returned field except `chunk_text`.
    pub metadata: Map<String, Value>,
    /// Source of the record (multi-source mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// `String(x)` as JavaScript would print a metadata value.
fn text(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| text(Some(v)))
            .collect::<Vec<_>>()
            .join(","),
        Some(other) => other.to_string(),
    }
}

fn document_id(metadata: &Map<String, Value>) -> Option<String> {
    if let Some(n) = metadata.get("document_number").and_then(Value::as_str)
        && !n.is_empty()
    {
        return Some(n.to_owned());
    }
    let name = metadata
        .get("filename")
        .and_then(Value::as_str)
        .filter(|f| !f.is_empty())?;
    let stem = match name.len().checked_sub(3) {
        Some(i)
            if name
                .get(i..)
                .is_some_and(|ext| ext.eq_ignore_ascii_case(".md")) =>
        {
            &name[..i]
        }
        _ => name,
    };
    Some(stem.to_uppercase())
}

/// URL enrichment for `guided_query`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Enrich<'a> {
    /// The generators.
    pub urls: &'a UrlRegistry,
    /// Namespace of the rows.
    pub namespace: &'a str,
    /// Selected source (for `source:namespace` generators).
    pub source: Option<&'a str>,
}

/// Formats one hit.
pub(super) fn row(
    hit: &Hit,
    reranked: bool,
    source: Option<&str>,
    enrich: Option<Enrich<'_>>,
) -> ResultRow {
    let mut metadata = hit.metadata.clone();
    if let Some(e) = enrich {
        let has_url = metadata
            .get("url")
            .and_then(Value::as_str)
            .is_some_and(|u| !u.trim().is_empty());
        if !has_url && let Some(url) = e.urls.resolve(e.namespace, &metadata, e.source).url {
            metadata.insert("url".to_owned(), Value::String(url));
        }
    }
    let id = document_id(&metadata);
    ResultRow {
        paper_number: id.clone(),
        document_id: id,
        title: text(metadata.get("title")),
        author: text(metadata.get("author")),
        url: text(metadata.get("url")),
        content: hit.content.chars().take(MAX_ROW_CHARS).collect(),
        score: round4(hit.score),
        reranked,
        metadata,
        source: source.map(str::to_owned),
    }
}
