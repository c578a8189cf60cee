//! Fusion of the dense and sparse result lists.
//!
//! Dense similarities and sparse dot products live on different scales, so
//! comparing them directly lets one leg dominate. Hits are ordered by
//! reciprocal-rank fusion instead; a record found by both legs counts once.

use serde_json::{Map, Value};

use super::client::SearchHit;

/// RRF damping constant (the usual value from the literature).
pub(super) const RRF_K: f64 = 60.0;

/// One retrieved record.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Hit {
    /// Record id (may be empty).
    pub id: String,
    /// Score: raw leg score, fused score or rerank score depending on the stage.
    pub score: f64,
    /// `chunk_text`.
    pub content: String,
    /// Every other returned field.
    pub metadata: Map<String, Value>,
}

impl From<SearchHit> for Hit {
    fn from(hit: SearchHit) -> Self {
        let mut metadata = hit.fields;
        let content = match metadata.remove("chunk_text") {
            Some(Value::String(s)) => s,
            _ => String::new(),
        };
        Hit {
            id: hit.id,
            score: hit.score,
            content,
            metadata,
        }
    }
}

/// Fuses two ranked lists. The returned `score` is the RRF score scaled so
/// that a record ranked first by both legs scores 1.0 (first by one leg
/// only: 0.5). Records with an empty id are never merged with each other.
pub(super) fn fuse(dense: Vec<Hit>, sparse: Vec<Hit>) -> Vec<Hit> {
    let best = 2.0 / (RRF_K + 1.0);
    // (hit with the best raw score, fused score, first position)
    let mut merged: Vec<(Hit, f64)> = Vec::with_capacity(dense.len() + sparse.len());
    let mut by_id: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for list in [dense, sparse] {
        for (rank, hit) in list.into_iter().enumerate() {
            let contribution = 1.0 / (RRF_K + rank as f64 + 1.0);
            let existing = (!hit.id.is_empty())
                .then(|| by_id.get(&hit.id).copied())
                .flatten();
            match existing {
                Some(i) => {
                    let (kept, fused) = &mut merged[i];
                    *fused += contribution;
                    if hit.score > kept.score {
                        *kept = hit;
                    }
                }
                None => {
                    if !hit.id.is_empty() {
                        by_id.insert(hit.id.clone(), merged.len());
                    }
                    merged.push((hit, contribution));
                }
            }
        }
    }
    // Stable: equal fused scores keep first-appearance order (dense first).
    merged.sort_by(|a, b| b.1.total_cmp(&a.1));
    merged
        .into_iter()
        .map(|(mut hit, fused)| {
            hit.score = fused / best;
            hit
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(id: &str, score: f64) -> Hit {
        Hit {
            id: id.to_owned(),
            score,
            content: id.to_owned(),
            metadata: Map::new(),
        }
    }

    #[test]
    fn a_record_found_by_both_legs_counts_once_and_ranks_first() {
        let out = fuse(
            vec![hit("a", 0.9), hit("b", 0.8)],
            vec![hit("c", 14.0), hit("b", 12.0)],
        );
        let ids: Vec<&str> = out.iter().map(|h| h.id.as_str()).collect();
        assert_eq!(ids, ["b", "a", "c"]);
    }

    #[test]
    fn empty_ids_are_not_collapsed() {
        let out = fuse(vec![hit("", 0.9), hit("", 0.8)], vec![hit("", 3.0)]);
        assert_eq!(out.len(), 3);
    }
}
