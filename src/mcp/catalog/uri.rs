//! The resource URIs `nexus-mcp` serves, written and parsed:
//! `nexus://contexts/{slug}`, `nexus://contexts/{slug}/knowledge/{path}`
//! and `pinecone://{index}/{namespace}` (with several Pinecone sources,
//! which may share index and namespace names,
//! `pinecone://{source}/{index}/{namespace}`).

/// The template of a context resource.
pub(crate) const CONTEXT_TEMPLATE: &str = "nexus://contexts/{slug}";
/// The template of a knowledge file resource.
pub(crate) const KNOWLEDGE_TEMPLATE: &str = "nexus://contexts/{slug}/knowledge/{path}";
/// The template of a Pinecone namespace resource.
pub(crate) const NAMESPACE_TEMPLATE: &str = "pinecone://{index}/{namespace}";
/// The template of a Pinecone namespace resource with several sources.
pub(crate) const SOURCE_NAMESPACE_TEMPLATE: &str = "pinecone://{source}/{index}/{namespace}";

const CONTEXTS_PREFIX: &str = "nexus://contexts/";
const PINECONE_PREFIX: &str = "pinecone://";
/// The longest URI parsed.
const MAX_URI_BYTES: usize = 2048;
/// The longest slug, index or namespace name accepted.
const MAX_NAME_BYTES: usize = 512;

/// A parsed resource URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ResourceUri {
    /// A Nexus context.
    Context { slug: String },
    /// A curated file of a context's knowledge.
    Knowledge { slug: String, path: String },
    /// A Pinecone namespace (of a named source, with several).
    Namespace {
        source: Option<String>,
        index: String,
        namespace: String,
    },
}

/// The URI of context `slug`.
pub(crate) fn context_uri(slug: &str) -> String {
    format!("{CONTEXTS_PREFIX}{}", encode(slug, false))
}

/// The URI of namespace `namespace` of index `index` (of `source`, when
/// several sources are served).
pub(crate) fn namespace_uri(source: Option<&str>, index: &str, namespace: &str) -> String {
    let source = source
        .map(|s| format!("{}/", encode(s, false)))
        .unwrap_or_default();
    format!(
        "{PINECONE_PREFIX}{source}{}/{}",
        encode(index, false),
        encode(namespace, false)
    )
}

/// The URI of the knowledge file `path` of context `slug`.
pub(crate) fn knowledge_uri(slug: &str, path: &str) -> String {
    format!(
        "{CONTEXTS_PREFIX}{}/knowledge/{}",
        encode(slug, false),
        encode(path, true)
    )
}

/// Parses a URI this server serves; `None` for anything else.
pub(crate) fn parse(uri: &str) -> Option<ResourceUri> {
    if uri.len() > MAX_URI_BYTES {
        return None;
    }
    if let Some(rest) = uri.strip_prefix(CONTEXTS_PREFIX) {
        return match rest.split_once('/') {
            None => Some(ResourceUri::Context { slug: name(rest)? }),
            Some((slug, rest)) => {
                let path = rest.strip_prefix("knowledge/")?;
                Some(ResourceUri::Knowledge {
                    slug: name(slug)?,
                    path: file_path(path)?,
                })
            }
        };
    }
    let rest = uri.strip_prefix(PINECONE_PREFIX)?;
    let segments: Vec<&str> = rest.split('/').collect();
    let (source, index, namespace) = match segments.as_slice() {
        [index, namespace] => (None, *index, *namespace),
        [source, index, namespace] => (Some(name(source)?), *index, *namespace),
        _ => return None,
    };
    let index = name(index)?;
    let namespace = decode(namespace)?;
    if namespace.is_empty() || namespace.len() > MAX_NAME_BYTES || namespace.contains('/') {
        return None;
    }
    Some(ResourceUri::Namespace {
        source,
        index,
        namespace,
    })
}

/// A decoded, non-empty name without `/`, control characters or space.
fn name(raw: &str) -> Option<String> {
    let value = decode(raw)?;
    let fine = !value.is_empty()
        && value.len() <= MAX_NAME_BYTES
        && value
            .chars()
            .all(|c| !c.is_control() && !c.is_whitespace() && c != '/');
    fine.then_some(value)
}

/// A decoded relative file path: no empty, `.` or `..` segment, no control
/// character.
fn file_path(raw: &str) -> Option<String> {
    let value = decode(raw)?;
    let fine = !value.is_empty()
        && value.len() <= MAX_URI_BYTES
        && !value.chars().any(char::is_control)
        && value
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    fine.then_some(value)
}

/// Whether `b` is written as itself in a URI segment.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~')
}

/// Percent-encodes `value` (keeping `/` when `keep_slash`).
pub(crate) fn encode(value: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(value.len());
    for &b in value.as_bytes() {
        if plain(b) || (keep_slash && b == b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-decodes `value`; `None` for a bad escape or invalid UTF-8.
pub(crate) fn decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_and_refuse_what_is_not_served() {
        assert_eq!(
            parse(&context_uri("docs")),
            Some(ResourceUri::Context {
                slug: "docs".into()
            })
        );
        assert_eq!(
            parse(&knowledge_uri("docs", "guides/a b.md")),
            Some(ResourceUri::Knowledge {
                slug: "docs".into(),
                path: "guides/a b.md".into()
            })
        );
        assert_eq!(
            parse(&namespace_uri(None, "idx", "ns/with slash")),
            None,
            "a namespace holding / is not addressable"
        );
        assert_eq!(
            parse(&namespace_uri(None, "idx", "news 2024")),
            Some(ResourceUri::Namespace {
                source: None,
                index: "idx".into(),
                namespace: "news 2024".into()
            })
        );
        assert_eq!(
            parse(&namespace_uri(Some("team-b"), "idx", "news")),
            Some(ResourceUri::Namespace {
                source: Some("team-b".into()),
                index: "idx".into(),
                namespace: "news".into()
            })
        );
        for bad in [
            "nexus://contexts/",
            "nexus://contexts/docs/other/x",
            "nexus://contexts/docs/knowledge/../secret",
            "nexus://contexts/docs/knowledge/",
            "nexus://contexts/a%2",
            "nexus://contexts/a%FF",
            "pinecone://idx",
            "pinecone://idx/",
            "pinecone://a/b/c/d",
            "pinecone:///idx/ns",
            "file:///etc/passwd",
            "",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
