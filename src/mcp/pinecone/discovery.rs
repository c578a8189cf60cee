//! Namespace discovery: names and counts from the dense index, metadata
//! fields from declarations or from a small sample of records.

use futures::StreamExt;
use serde_json::{Map, Value};

use super::client::{PineconeClient, PineconeResult};
use super::config::{NamespaceDecl, SourceConfig};
use super::manifest;

pub(super) use super::manifest::RESERVED_NAMESPACE;
/// Records sampled per namespace to infer metadata fields.
const SAMPLE_SIZE: u32 = 5;
/// Dimension used when the stats omit it.
const FALLBACK_DIMENSION: u32 = 1536;
/// Namespaces sampled at the same time.
const SAMPLE_CONCURRENCY: usize = 4;

/// Where a namespace's metadata fields came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum SchemaSource {
    /// From the configuration.
    Declared,
    /// Inferred from sampled records.
    Sampled,
}

/// One namespace, as discovered and as `list_namespaces` writes it (the
/// doc comments below are the output schema's descriptions).
#[derive(Debug, Clone, PartialEq, serde::Serialize, schemars::JsonSchema)]
#[schemars(rename = "NamespaceEntry", description = "One namespace.")]
pub(crate) struct NamespaceRow {
    /// Name.
    pub name: String,
    /// Source (sources mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Records.
    pub record_count: u64,
    /// Field name to type name.
    pub metadata_fields: Map<String, Value>,
    /// `declared` or `sampled`.
    pub schema_source: SchemaSource,
    /// Declared hint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// What discovery found for one source.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Discovery {
    /// Live namespaces, in API order.
    pub rows: Vec<NamespaceRow>,
    /// Non-fatal configuration warnings (stale declarations).
    pub warnings: Vec<String>,
}

/// What the allocator adds to each allocation, on average.
pub(super) const ALLOCATION_BYTES: usize = 16;

impl Discovery {
    /// Bytes the rows and warnings hold on the heap (an estimate that counts
    /// every allocation at its length plus the allocator's share).
    pub(super) fn heap_bytes(&self) -> usize {
        let text = |s: &str| s.len() + ALLOCATION_BYTES;
        let rows = self.rows.iter().map(|row| {
            let fields = row.metadata_fields.iter().map(|(name, value)| {
                // An index map entry: its key, its value, its hash and slot.
                let value = match value {
                    Value::String(s) => text(s),
                    _ => 0,
                };
                std::mem::size_of::<(String, Value)>() + 16 + text(name) + value
            });
            std::mem::size_of::<NamespaceRow>()
                + text(&row.name)
                + row.source.as_deref().map_or(0, text)
                + row.description.as_deref().map_or(0, text)
                + fields.sum::<usize>()
                + ALLOCATION_BYTES
        });
        let warnings = self
            .warnings
            .iter()
            .map(|w| std::mem::size_of::<String>() + text(w));
        rows.sum::<usize>() + warnings.sum::<usize>() + 2 * ALLOCATION_BYTES
    }
}

/// Lists the namespaces of `source`'s dense index. A failing stats call is
/// an error (never an empty list); a failing sample only empties that
/// namespace's fields. Without declarations in the configuration, the
/// index's schema manifest is read (when `remote_schema`); its problems
/// become warnings.
///
/// # Errors
/// When describe-index or describe-index-stats fails.
pub(super) async fn discover(
    client: &PineconeClient,
    source: &SourceConfig,
    tag_rows: bool,
    remote_schema: bool,
) -> PineconeResult<Discovery> {
    let use_manifest = remote_schema && source.namespaces.is_empty();
    let (stats, manifest) = tokio::join!(client.describe_index_stats(&source.index_name), async {
        if use_manifest {
            manifest::load(client, source).await
        } else {
            Ok(None)
        }
    });
    let stats = stats?;
    let mut warnings = Vec::new();
    let declared: Vec<(String, NamespaceDecl)> = match manifest {
        _ if !use_manifest => source.namespaces.clone(),
        Ok(m) => m.map(|m| m.namespaces).unwrap_or_default(),
        Err(warning) => {
            let warning = crate::mcp::redact::redact(&warning);
            tracing::warn!(%warning, "schema manifest ignored");
            warnings.push(warning);
            Vec::new()
        }
    };
    let live: Vec<(String, u64)> = stats
        .namespaces
        .into_iter()
        .filter(|(name, _)| name != RESERVED_NAMESPACE)
        .collect();
    tracing::info!(count = live.len(), index = %source.index_name, "found namespaces");
    warnings.extend(
        declared
            .iter()
            .filter(|(name, _)| !live.iter().any(|(n, _)| n == name))
            .map(|(name, _)| {
                format!(
                    "Declared namespace \"{name}\" not found in Pinecone index \"{}\" — schema declaration is stale.",
                    source.index_name
                )
            }),
    );
    let declared = &declared;
    let dimension = stats.dimension.unwrap_or(FALLBACK_DIMENSION);
    let rows = futures::stream::iter(live)
        .map(|(name, record_count)| async move {
            let decl = declared
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, d)| d);
            let (metadata_fields, schema_source) =
                match decl.and_then(|d| d.metadata_schema.clone()) {
                    Some(schema) => (schema, SchemaSource::Declared),
                    None if record_count > 0 => {
                        match client
                            .sample_metadata(&source.index_name, &name, dimension, SAMPLE_SIZE)
                            .await
                        {
                            Ok(matches) => (
                                infer_fields(matches.iter().filter_map(|m| m.metadata.as_ref())),
                                SchemaSource::Sampled,
                            ),
                            Err(e) => {
                                tracing::error!(namespace = %name, error = %e, "error sampling records");
                                (Map::new(), SchemaSource::Sampled)
                            }
                        }
                    }
                    None => (Map::new(), SchemaSource::Sampled),
                };
            NamespaceRow {
                source: tag_rows.then(|| source.name.clone()),
                record_count,
                metadata_fields,
                schema_source,
                description: decl.and_then(|d| d.description.clone()),
                name,
            }
        })
        .buffered(SAMPLE_CONCURRENCY)
        .collect()
        .await;
    Ok(Discovery { rows, warnings })
}

/// The type name of a metadata value.
pub(super) fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "unknown",
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "boolean",
        Value::Array(items) if items.is_empty() => "array",
        Value::Array(items) if items.iter().all(Value::is_string) => "string[]",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Merges the field types of sampled records: first seen wins, except that
/// `array`/`object` become `string[]` once a string array is seen.
pub(super) fn infer_fields<'a>(
    samples: impl Iterator<Item = &'a Map<String, Value>>,
) -> Map<String, Value> {
    let mut fields = Map::new();
    for metadata in samples {
        for (key, value) in metadata {
            let ty = type_name(value);
            match fields.get(key).and_then(Value::as_str) {
                None => {
                    fields.insert(key.clone(), Value::from(ty));
                }
                Some("array" | "object") if ty == "string[]" => {
                    fields.insert(key.clone(), Value::from(ty));
                }
                Some(_) => {}
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn inference_upgrades_arrays_to_string_arrays() {
        let a = json!({"tags": [], "n": 1, "o": {"x": 1}, "z": null});
        let b = json!({"tags": ["x"], "n": "s", "o": ["y"]});
        let f = infer_fields([a.as_object().unwrap(), b.as_object().unwrap()].into_iter());
        assert_eq!(
            Value::Object(f),
            json!({"tags": "string[]", "n": "number", "o": "string[]", "z": "unknown"})
        );
    }
}
