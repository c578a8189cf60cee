//! `query_documents`: regroup retrieved chunks into whole documents, within
//! explicit character budgets.

use serde_json::{Map, Value};

use super::fusion::Hit;

/// Largest `merged_content` of one document, in characters.
pub(super) const MAX_DOCUMENT_CHARS: usize = 20_000;
/// Largest sum of `merged_content` over all documents, in characters.
pub(super) const MAX_TOTAL_CHARS: usize = 100_000;

/// One reassembled document.
#[derive(Debug, Clone, PartialEq, serde::Serialize, schemars::JsonSchema)]
pub(super) struct Document {
    /// The grouping key.
    pub document_id: String,
    /// Chunk texts in document order, joined by blank lines.
    pub merged_content: String,
    /// Metadata of the first chunk.
    pub metadata: Map<String, Value>,
    /// Chunks merged.
    pub chunk_count: usize,
    /// Best chunk score, 4 decimals.
    pub best_score: f64,
    /// Present (true) when `merged_content` was cut to fit the budgets.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub content_truncated: bool,
}

fn non_blank<'a>(metadata: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    metadata
        .get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
}

fn document_key(hit: &Hit) -> Option<String> {
    ["document_number", "url", "doc_id"]
        .iter()
        .find_map(|k| non_blank(&hit.metadata, k))
        .map(str::to_owned)
        .or_else(|| (!hit.id.trim().is_empty()).then(|| hit.id.clone()))
}

/// The position of a chunk in its document, when recorded.
fn chunk_position(metadata: &Map<String, Value>) -> Option<f64> {
    ["chunk_index", "start_index", "loc"]
        .iter()
        .find_map(|k| match metadata.get(*k) {
            Some(Value::Number(n)) => n.as_f64().filter(|f| f.is_finite()),
            Some(Value::String(s)) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
                s.parse().ok()
            }
            _ => None,
        })
}

/// Rounds to 4 decimals, half away from zero.
pub(super) fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

fn cut(text: &mut String, max_chars: usize) -> bool {
    match text.char_indices().nth(max_chars) {
        Some((byte, _)) => {
            text.truncate(byte);
            true
        }
        None => false,
    }
}

/// Groups `hits` (best first) into at most `top_k` documents, best first.
pub(super) fn reassemble(
    hits: &[Hit],
    top_k: usize,
    max_chunks_per_document: usize,
) -> Vec<Document> {
    let mut groups: Vec<(String, Vec<&Hit>)> = Vec::new();
    let mut skipped: Vec<&str> = Vec::new();
    for hit in hits {
        let Some(key) = document_key(hit) else {
            skipped.push(&hit.id);
            continue;
        };
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, chunks)) => chunks.push(hit),
            None => groups.push((key, vec![hit])),
        }
    }
    if !skipped.is_empty() {
        let sample: Vec<&str> = skipped
            .iter()
            .take(3)
            .map(|id| if id.trim().is_empty() { "<empty>" } else { id })
            .collect();
        tracing::warn!(
            skipped = skipped.len(),
            ?sample,
            "reassembly skipped hits with no document key"
        );
    }
    let mut documents: Vec<Document> = groups
        .into_iter()
        .map(|(document_id, mut chunks)| {
            // Stable: unordered chunks keep retrieval order, after ordered ones.
            chunks.sort_by(|a, b| {
                match (chunk_position(&a.metadata), chunk_position(&b.metadata)) {
                    (Some(x), Some(y)) => x.total_cmp(&y),
                    (Some(_), None) => std::cmp::Ordering::Less,
                    (None, Some(_)) => std::cmp::Ordering::Greater,
                    (None, None) => std::cmp::Ordering::Equal,
                }
            });
            chunks.truncate(max_chunks_per_document);
            let merged_content = chunks
                .iter()
                .map(|c| c.content.trim())
                .filter(|c| !c.is_empty())
                .collect::<Vec<_>>()
                .join("\n\n");
            let best = chunks
                .iter()
                .map(|c| c.score)
                .fold(f64::NEG_INFINITY, f64::max);
            Document {
                document_id,
                merged_content,
                metadata: chunks
                    .first()
                    .map(|c| c.metadata.clone())
                    .unwrap_or_default(),
                chunk_count: chunks.len(),
                best_score: round4(if best.is_finite() { best } else { 0.0 }),
                content_truncated: false,
            }
        })
        .collect();
    documents.sort_by(|a, b| b.best_score.total_cmp(&a.best_score));
    documents.truncate(top_k);
    let mut budget = MAX_TOTAL_CHARS;
    for doc in &mut documents {
        let limit = MAX_DOCUMENT_CHARS.min(budget);
        doc.content_truncated = cut(&mut doc.merged_content, limit);
        budget = budget.saturating_sub(doc.merged_content.chars().count());
    }
    documents
}
