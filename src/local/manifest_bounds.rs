//! The numeric and size bounds the API sets on a context's manifest.
//!
//! The generated types enforce string lengths and non-zero counts, but not an
//! integer's or a number's range, nor how many items a list holds. A manifest
//! outside these bounds is refused with 400 before anything is stored, so
//! every manifest the server hands back is one the spec allows.

use serde_json::Value;

use super::error::{LocalError, LocalResult};
use crate::types;

/// `(path, minimum, maximum)`: a `[]` segment stands for every item of a list.
const RANGES: &[(&str, f64, f64)] = &[
    ("curate.chunks.chunking.target_size", 64.0, 4096.0),
    ("curate.chunks.chunking.overlap", 0.0, 1024.0),
    ("curate.artifacts.artifact_types[].min_doc_count", 1.0, 64.0),
    ("curate.artifacts.min_doc_count", 1.0, 64.0),
    ("curate.artifacts.max_tokens", 128.0, 8192.0),
    ("curate.artifacts.max_doc_chars", 1000.0, 2_000_000.0),
    ("curate.artifacts.extraction_window_chars", 0.0, 1_000_000.0),
    ("curate.artifacts.mention_max_chars", 100.0, 4000.0),
    ("curate.artifacts.max_mentions_per_artifact", 1.0, 500.0),
    ("curate.artifacts.mention_context_chars", 1000.0, 100_000.0),
    ("curate.artifacts.max_artifacts_per_type", 1.0, 10_000.0),
    ("optimize.latency_threshold_ms", 0.0, 600_000.0),
    ("optimize.min_group_size", 1.0, 100.0),
    ("optimize.eval_pass_rate_threshold", 0.0, 1.0),
    ("optimize.max_iterations", 1.0, 100.0),
];

/// `(path, most items)` of the manifest's lists.
const MAX_ITEMS: &[(&str, usize)] = &[
    ("curate.artifacts.artifact_types", 32),
    ("curate.artifacts.artifact_types[].coverage", 32),
    ("curate.artifacts.artifact_types[].sections", 64),
    ("curate.artifacts.artifact_types[].columns", 64),
    ("curate.artifacts.artifact_types[].natural_key", 16),
    ("curate.artifacts.edge_types", 32),
    ("curate.artifacts.edge_types[].attributes", 16),
];

/// Refuses a manifest with a value outside the API's bounds (400, naming the
/// field and its range).
pub(crate) fn check(manifest: &types::Manifest) -> LocalResult<()> {
    let value = serde_json::to_value(manifest)
        .map_err(|e| LocalError::internal("reading a manifest", e))?;
    for (path, min, max) in RANGES {
        for found in values_at(&value, path) {
            // A number JSON cannot hold as f64 is out of every range here.
            let in_range = found.as_f64().is_some_and(|n| n >= *min && n <= *max);
            if !found.is_null() && !in_range {
                return Err(LocalError::bad_request(format!(
                    "manifest.{path} must be between {min} and {max}"
                )));
            }
        }
    }
    for (path, most) in MAX_ITEMS {
        for found in values_at(&value, path) {
            if found.as_array().is_some_and(|items| items.len() > *most) {
                return Err(LocalError::bad_request(format!(
                    "manifest.{path} holds at most {most} items"
                )));
            }
        }
    }
    Ok(())
}

/// Every value at `path` (dot-separated; `name[]` walks each item of a list).
fn values_at<'a>(root: &'a Value, path: &str) -> Vec<&'a Value> {
    let mut current = vec![root];
    for segment in path.split('.') {
        let (name, each) = match segment.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (segment, false),
        };
        current = current
            .into_iter()
            .filter_map(|v| v.get(name))
            .flat_map(|v| match (each, v.as_array()) {
                (true, Some(items)) => items.iter().collect::<Vec<_>>(),
                (true, None) => Vec::new(),
                (false, _) => vec![v],
            })
            .collect();
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(v: Value) -> types::Manifest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_defaults_and_the_bounds_themselves_are_accepted() {
        check(&types::Manifest::default()).unwrap();
        check(&manifest(serde_json::json!({
            "optimize": {"eval_pass_rate_threshold": 1.0, "max_iterations": 100},
            "curate": {"chunks": {"chunking": {"target_size": 64, "overlap": 0}}}
        })))
        .unwrap();
    }

    #[test]
    fn a_value_out_of_range_is_refused_by_name() {
        for (v, field) in [
            (
                serde_json::json!({"optimize": {"eval_pass_rate_threshold": -1.0}}),
                "eval_pass_rate_threshold",
            ),
            (
                serde_json::json!({"optimize": {"max_iterations": 101}}),
                "max_iterations",
            ),
            (
                serde_json::json!({"curate": {"chunks": {"chunking": {"target_size": 5000}}}}),
                "target_size",
            ),
            (
                serde_json::json!({"curate": {"artifacts": {"artifact_types": [
                    {"name": "a", "min_doc_count": 65}
                ]}}}),
                "artifact_types[].min_doc_count",
            ),
        ] {
            let err = check(&manifest(v)).unwrap_err();
            assert_eq!(err.status.as_u16(), 400);
            assert!(err.message.contains(field), "{}", err.message);
        }
    }

    #[test]
    fn a_list_past_its_size_is_refused() {
        let types: Vec<Value> = (0..33)
            .map(|i| serde_json::json!({"name": format!("t{i}")}))
            .collect();
        let err = check(&manifest(
            serde_json::json!({"curate": {"artifacts": {"artifact_types": types}}}),
        ))
        .unwrap_err();
        assert!(err.message.contains("at most 32"), "{}", err.message);
    }
}
