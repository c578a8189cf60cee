//! The schema manifest: namespace declarations stored in the index itself
//! (namespace `_mcp_config`, record `schema_manifest`, JSON in `chunk_text`),
//! used for sources that declare no namespaces in their configuration.

use serde_json::Value;

use super::client::PineconeClient;
use super::config::{NamespaceDecl, SourceConfig, parse_namespace_decls};

/// Namespace that holds the schema manifest; never offered to agents.
pub(super) const RESERVED_NAMESPACE: &str = "_mcp_config";
/// Record id of the manifest.
pub(super) const MANIFEST_ID: &str = "schema_manifest";

/// What a manifest declares.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Manifest {
    /// Source hint.
    pub description: Option<String>,
    /// Declared namespaces.
    pub namespaces: Vec<(String, NamespaceDecl)>,
}

/// Parses the manifest text of `source`.
///
/// # Errors
/// A warning text naming what is malformed.
pub(super) fn parse(source: &str, text: &str) -> Result<Manifest, String> {
    let malformed = |why: String| {
        format!(
            "Source \"{source}\": _mcp_config schema manifest in chunk_text is malformed ({why})."
        )
    };
    let root: Value =
        serde_json::from_str(text).map_err(|e| malformed(format!("invalid JSON: {e}")))?;
    let Some(root) = root.as_object() else {
        return Err(malformed("manifest must be a JSON object".to_owned()));
    };
    let namespaces = match root.get("namespaces") {
        None | Some(Value::Null) => Vec::new(),
        Some(v @ Value::Object(_)) => parse_namespace_decls(source, v).map_err(|e| {
            format!("Source \"{source}\": _mcp_config schema manifest namespaces invalid: {e}")
        })?,
        Some(_) => {
            return Err(malformed(
                "manifest \"namespaces\" must be an object".to_owned(),
            ));
        }
    };
    let description = root
        .get("description")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(str::to_owned);
    Ok(Manifest {
        description,
        namespaces,
    })
}

/// Fetches and parses the manifest of `source`; `Ok(None)` when there is none.
///
/// # Errors
/// A (redacted) warning text; the manifest is optional, so callers go on without it.
pub(super) async fn load(
    client: &PineconeClient,
    source: &SourceConfig,
) -> Result<Option<Manifest>, String> {
    let records = client
        .fetch_records(&source.index_name, RESERVED_NAMESPACE, &[MANIFEST_ID])
        .await
        .map_err(|e| {
            format!(
                "Source \"{}\": failed to fetch _mcp_config schema manifest: {e}",
                source.name
            )
        })?;
    let text = records
        .get(MANIFEST_ID)
        .and_then(|r| r.get("chunk_text"))
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|t| !t.is_empty());
    match text {
        None => Ok(None),
        Some(text) => parse(&source.name, text).map(Some),
    }
}
