//! The `list_namespaces` text in two parts: the fields that change from
//! call to call (cache state and expiry), written per call, and the rest,
//! which depends only on one source's cache entry and is written once per
//! entry (see `sources::CachedDiscovery::listing`).

use serde::Serialize;

use crate::mcp::redact::redact;

use super::output::{ListNamespacesOutput, Status};

/// Where the part that depends only on the discovery starts (the comma
/// before it): the fields before it are fixed keys with a status, a
/// boolean, a number and a timestamp, so this is its first match.
const TAIL_START: &str = ",\"count\":";

/// The fields of a `list_namespaces` output before [`TAIL_START`], in the
/// same order and shape.
#[derive(Serialize)]
struct Head<'a> {
    status: Status,
    cache_hit: bool,
    cache_ttl_seconds: u64,
    expires_at_iso: &'a str,
}

/// The redacted configuration warnings, or `None` when there are none.
pub(super) fn config_warnings(warnings: &[String]) -> Option<Vec<String>> {
    (!warnings.is_empty()).then(|| warnings.iter().map(|w| redact(w)).collect())
}

/// `output`'s text from `"count"` on (its closing brace included).
pub(super) fn tail(output: &ListNamespacesOutput<'_>) -> Option<String> {
    let text = serde_json::to_string(output).ok()?;
    let at = text.find(TAIL_START)?;
    text.get(at + 1..).map(str::to_owned)
}

/// `output`'s text, with `tail` (from [`tail`] of an output that differs
/// at most in the fields before it) in place of what follows the expiry.
///
/// # Errors
/// The head does not serialize.
pub(super) fn text(output: &ListNamespacesOutput<'_>, tail: &str) -> serde_json::Result<String> {
    let head = Head {
        status: output.status,
        cache_hit: output.cache_hit,
        cache_ttl_seconds: output.cache_ttl_seconds,
        expires_at_iso: &output.expires_at_iso,
    };
    let head = serde_json::to_string(&head)?;
    // `{...}` becomes `{...,` followed by the tail, in one buffer sized
    // for both: no regrowth.
    let head = head.strip_suffix('}').unwrap_or(&head);
    let mut text = String::with_capacity(head.len().saturating_add(1).saturating_add(tail.len()));
    text.push_str(head);
    text.push(',');
    text.push_str(tail);
    Ok(text)
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value, json};

    use super::*;
    use crate::mcp::pinecone::discovery::{NamespaceRow, SchemaSource};

    fn rows() -> Vec<NamespaceRow> {
        let fields = json!({"author": "string[]", "count": "number"});
        vec![
            NamespaceRow {
                name: "papers \"quoted\", \"count\":".into(),
                source: Some("east".into()),
                record_count: 4,
                metadata_fields: fields.as_object().cloned().unwrap_or_default(),
                schema_source: SchemaSource::Sampled,
                description: Some("Pap\u{e9}rs".into()),
            },
            NamespaceRow {
                name: "mailing".into(),
                source: None,
                record_count: 0,
                metadata_fields: Map::new(),
                schema_source: SchemaSource::Declared,
                description: None,
            },
        ]
    }

    fn output<'a>(
        rows: &'a [NamespaceRow],
        errors: Option<&'a Map<String, Value>>,
        hit: bool,
        ttl: u64,
    ) -> ListNamespacesOutput<'a> {
        ListNamespacesOutput {
            status: Status::Success,
            cache_hit: hit,
            cache_ttl_seconds: ttl,
            expires_at_iso: format!("2026-12-02T15:{ttl:02}:00.000Z"),
            count: rows.len(),
            source_errors: errors,
            config_warnings: config_warnings(&["stale \"count\": declaration".to_owned()]),
            namespaces: rows,
        }
    }

    #[test]
    fn a_kept_tail_gives_the_text_of_the_whole_output() {
        let rows = rows();
        let mut errors = Map::new();
        errors.insert("west".into(), "unreachable".into());
        for errors in [None, Some(&errors)] {
            let first = output(&rows, errors, false, 59);
            let kept = tail(&first).expect("a tail");
            for (hit, ttl) in [(false, 59), (true, 7), (true, 0)] {
                let later = output(&rows, errors, hit, ttl);
                assert_eq!(
                    text(&later, &kept).expect("a text"),
                    serde_json::to_string(&later).expect("the whole text")
                );
            }
        }
    }
}
