//! `completion/complete`: context slugs, knowledge file paths, source,
//! index and namespace names and metadata field names, from the caller's
//! own data; listings of contexts and namespaces are kept briefly in a
//! per-caller cache bounded by entries and bytes (a knowledge directory is
//! listed for each completion: it is one small upstream call).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rmcp::model::{CompleteRequestParams, CompleteResult, CompletionInfo, Reference};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use tokio::time::Instant;

use super::Families;
use super::prompts::{ASK_CONTEXT, RESEARCH_NAMESPACE};
use super::resources::{KNOWLEDGE_DIR_PAGE, uri_source};
use super::uri::{
    CONTEXT_TEMPLATE, KNOWLEDGE_TEMPLATE, NAMESPACE_TEMPLATE, SOURCE_NAMESPACE_TEMPLATE,
};
use crate::mcp::caller::{CallKey, call_key, key_digest};

/// How long a caller's listing serves completions.
pub const COMPLETION_TTL: Duration = Duration::from_secs(30);
/// The most callers' listings kept.
const MAX_ENTRIES: usize = 256;
/// The most bytes of names kept over all callers.
const MAX_BYTES: usize = 4 * 1024 * 1024;
/// The most values in one answer (the protocol's limit).
const MAX_VALUES: usize = CompletionInfo::MAX_VALUES;

/// What one listing holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Contexts,
    Namespaces,
}

/// One namespace as completions need it.
#[derive(Debug, Clone)]
struct Namespace {
    /// The source, with several.
    source: Option<String>,
    index: String,
    name: String,
    fields: Vec<String>,
}

#[derive(Debug, Clone)]
enum Listing {
    Contexts(Vec<String>),
    Namespaces(Vec<Namespace>),
}

impl Listing {
    fn bytes(&self) -> usize {
        match self {
            Listing::Contexts(names) => names.iter().map(String::len).sum(),
            Listing::Namespaces(rows) => rows
                .iter()
                .map(|r| {
                    r.source.as_ref().map_or(0, String::len)
                        + r.index.len()
                        + r.name.len()
                        + r.fields.iter().map(String::len).sum::<usize>()
                })
                .sum(),
        }
    }
}

struct Entry {
    at: Instant,
    bytes: usize,
    listing: Listing,
}

/// Whose listing (a caller key's digest, or `None` for the configured key)
/// of what.
type Slot = (Option<[u8; 32]>, Kind);

/// Recent listings by caller key digest (or the configured key) and kind.
#[derive(Default)]
pub(crate) struct CompletionCache {
    entries: Mutex<HashMap<Slot, Entry>>,
}

impl std::fmt::Debug for CompletionCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionCache").finish_non_exhaustive()
    }
}

impl CompletionCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Slot, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn get(&self, slot: &Slot) -> Option<Listing> {
        let entries = self.lock();
        let entry = entries.get(slot)?;
        (entry.at.elapsed() < COMPLETION_TTL).then(|| entry.listing.clone())
    }

    /// Keeps `listing` unless it alone is past the byte bound; drops
    /// expired entries, then the oldest, to stay within both bounds.
    fn put(&self, slot: Slot, listing: Listing) {
        let bytes = listing.bytes();
        if bytes > MAX_BYTES / 4 {
            return;
        }
        let mut entries = self.lock();
        entries.remove(&slot);
        entries.retain(|_, e| e.at.elapsed() < COMPLETION_TTL);
        let mut total: usize = entries.values().map(|e| e.bytes).sum();
        while entries.len() >= MAX_ENTRIES || total.saturating_add(bytes) > MAX_BYTES {
            let Some(oldest) = entries.iter().min_by_key(|(_, e)| e.at).map(|(k, _)| *k) else {
                break;
            };
            if let Some(gone) = entries.remove(&oldest) {
                total = total.saturating_sub(gone.bytes);
            }
        }
        entries.insert(
            slot,
            Entry {
                at: Instant::now(),
                bytes,
                listing,
            },
        );
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// What an argument completes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Contexts,
    KnowledgePaths,
    Sources,
    Indexes,
    Namespaces,
    Fields,
    Nothing,
}

fn target(reference: &Reference, argument: &str) -> Target {
    match (reference, argument) {
        (Reference::Prompt(p), "context") if p.name == ASK_CONTEXT => Target::Contexts,
        (Reference::Prompt(p), "source") if p.name == RESEARCH_NAMESPACE => Target::Sources,
        (Reference::Prompt(p), "index") if p.name == RESEARCH_NAMESPACE => Target::Indexes,
        (Reference::Prompt(p), "namespace") if p.name == RESEARCH_NAMESPACE => Target::Namespaces,
        (Reference::Prompt(p), "topic") if p.name == RESEARCH_NAMESPACE => Target::Fields,
        (Reference::Resource(r), "slug")
            if r.uri == CONTEXT_TEMPLATE || r.uri == KNOWLEDGE_TEMPLATE =>
        {
            Target::Contexts
        }
        (Reference::Resource(r), "path") if r.uri == KNOWLEDGE_TEMPLATE => Target::KnowledgePaths,
        (Reference::Resource(r), "source") if r.uri == SOURCE_NAMESPACE_TEMPLATE => Target::Sources,
        (Reference::Resource(r), "index")
            if r.uri == NAMESPACE_TEMPLATE || r.uri == SOURCE_NAMESPACE_TEMPLATE =>
        {
            Target::Indexes
        }
        (Reference::Resource(r), "namespace")
            if r.uri == NAMESPACE_TEMPLATE || r.uri == SOURCE_NAMESPACE_TEMPLATE =>
        {
            Target::Namespaces
        }
        _ => Target::Nothing,
    }
}

/// Whether the prompt or template `reference` names is served (its tools
/// are exposed); a name the server does not have counts as served, and
/// completes to nothing.
fn served(families: Families<'_>, reference: &Reference) -> bool {
    match reference {
        Reference::Prompt(p) if p.name == ASK_CONTEXT => families.ask_context().is_some(),
        Reference::Prompt(p) if p.name == RESEARCH_NAMESPACE => {
            families.research_namespace().is_some()
        }
        Reference::Resource(r) if r.uri == CONTEXT_TEMPLATE || r.uri == KNOWLEDGE_TEMPLATE => {
            families.contexts().is_some()
        }
        Reference::Resource(r)
            if r.uri == NAMESPACE_TEMPLATE || r.uri == SOURCE_NAMESPACE_TEMPLATE =>
        {
            families.namespaces().is_some()
        }
        _ => true,
    }
}

/// The caller's listing of `kind`, from the cache or upstream; `None` when
/// the family is not configured or its upstream fails (nothing is cached
/// then).
async fn listing(
    families: Families<'_>,
    cache: &CompletionCache,
    kind: Kind,
    ctx: &RequestContext<RoleServer>,
) -> Option<Listing> {
    let policy = match kind {
        Kind::Contexts => families.contexts()?.key_policy(),
        Kind::Namespaces => families.namespaces()?.key_policy(),
    };
    let slot = match call_key(policy, &ctx.extensions).ok()? {
        CallKey::Configured => (None, kind),
        CallKey::Caller(key) => (Some(key_digest(&key.key)), kind),
    };
    if let Some(hit) = cache.get(&slot) {
        return Some(hit);
    }
    let fresh = match kind {
        Kind::Contexts => {
            let contexts = families
                .contexts()?
                .caller_contexts(ctx)
                .await
                .inspect_err(|e| families.count_failure("nexus", e))
                .ok()?;
            Listing::Contexts(contexts.into_iter().map(|c| c.slug).collect())
        }
        Kind::Namespaces => {
            let pinecone = families.namespaces()?;
            let rows = pinecone
                .caller_namespaces(&ctx.extensions)
                .await
                .inspect_err(|e| families.count_failure("pinecone", e))
                .ok()?;
            Listing::Namespaces(
                rows.into_iter()
                    .map(|(index, row)| Namespace {
                        source: uri_source(pinecone, &row).map(str::to_owned),
                        index,
                        fields: row.metadata_fields.keys().cloned().collect(),
                        name: row.name,
                    })
                    .collect(),
            )
        }
    };
    cache.put(slot, fresh.clone());
    Some(fresh)
}

/// `completion/complete`: the candidates that start with the typed value,
/// sorted, at most 100, with `total` and `hasMore`. An argument or
/// reference this server does not complete gets an empty list, an unknown
/// prompt included: the official conformance scenario asks for completions
/// of a prompt the server need not have and requires an answer, not an
/// error.
pub(crate) async fn complete(
    families: Families<'_>,
    cache: &CompletionCache,
    request: CompleteRequestParams,
    ctx: &RequestContext<RoleServer>,
) -> Result<CompleteResult, ErrorData> {
    let target = match served(families, &request.r#ref) {
        true => target(&request.r#ref, &request.argument.name),
        false => Target::Nothing,
    };
    let given = |name: &str| {
        request
            .context
            .as_ref()
            .and_then(|c| c.get_argument(name))
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let candidates: Vec<String> = match target {
        Target::Nothing => Vec::new(),
        Target::Contexts => match listing(families, cache, Kind::Contexts, ctx).await {
            Some(Listing::Contexts(slugs)) => slugs,
            _ => Vec::new(),
        },
        Target::KnowledgePaths => match (families.contexts(), given("slug")) {
            (Some(nexus), Some(slug)) => {
                knowledge_paths(families, nexus, &slug, &request.argument.value, ctx).await
            }
            _ => Vec::new(),
        },
        Target::Sources | Target::Indexes | Target::Namespaces | Target::Fields => {
            let rows = match listing(families, cache, Kind::Namespaces, ctx).await {
                Some(Listing::Namespaces(rows)) => rows,
                _ => Vec::new(),
            };
            let (source, index, namespace) = (given("source"), given("index"), given("namespace"));
            let rows = rows.into_iter().filter(|r| {
                index.as_deref().is_none_or(|i| i == r.index)
                    && (target == Target::Sources
                        || source.is_none()
                        || source.as_deref() == r.source.as_deref())
            });
            match target {
                Target::Sources => rows.filter_map(|r| r.source).collect(),
                Target::Indexes => rows.map(|r| r.index).collect(),
                Target::Namespaces => rows.map(|r| r.name).collect(),
                _ => rows
                    .filter(|r| namespace.as_deref().is_none_or(|n| n == r.name))
                    .flat_map(|r| r.fields)
                    .collect(),
            }
        }
    };
    Ok(CompleteResult::new(answer(
        candidates,
        &request.argument.value,
    )))
}

/// The entries of the knowledge directory `typed` is in (up to its last
/// `/`): files by path, directories by path and `/`. Nothing when the
/// listing fails.
async fn knowledge_paths(
    families: Families<'_>,
    nexus: &crate::mcp::nexus::NexusServer,
    slug: &str,
    typed: &str,
    ctx: &RequestContext<RoleServer>,
) -> Vec<String> {
    let dir = typed.rsplit_once('/').map_or("", |(dir, _)| dir);
    if dir.split('/').any(|seg| seg == "." || seg == "..") {
        return Vec::new();
    }
    nexus
        .caller_knowledge_dir(ctx, slug, dir, KNOWLEDGE_DIR_PAGE)
        .await
        .inspect_err(|e| families.count_failure("nexus", e))
        .map(|entries| {
            entries
                .into_iter()
                .map(|e| {
                    if e.dir {
                        format!("{}/", e.path)
                    } else {
                        e.path
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The candidates starting with `typed`, sorted and deduplicated, cut to
/// the protocol's limit.
fn answer(mut candidates: Vec<String>, typed: &str) -> CompletionInfo {
    candidates.retain(|c| c.starts_with(typed));
    candidates.sort_unstable();
    candidates.dedup();
    let total = candidates.len();
    candidates.truncate(MAX_VALUES);
    let count = Some(u32::try_from(total).unwrap_or(u32::MAX));
    // At most MAX_VALUES values: always accepted.
    CompletionInfo::with_pagination(candidates, count, total > MAX_VALUES).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_prefix_matched_sorted_and_capped() {
        let many: Vec<String> = (0..150).map(|i| format!("ns-{i:03}")).collect();
        let info = answer(many.clone(), "ns-1");
        assert_eq!(info.total, Some(50));
        assert_eq!(info.values.len(), 50);
        assert_eq!(info.has_more, Some(false));
        let info = answer(many, "ns");
        assert_eq!(info.total, Some(150));
        assert_eq!(info.values.len(), 100);
        assert_eq!(info.has_more, Some(true));
        assert_eq!(info.values[0], "ns-000");
        let info = answer(vec!["b".into(), "a".into(), "a".into()], "");
        assert_eq!(info.values, ["a", "b"]);
    }

    #[test]
    fn the_cache_is_bounded_by_entries() {
        let cache = CompletionCache::default();
        for i in 0..(MAX_ENTRIES + 10) {
            let mut digest = [0u8; 32];
            digest[..8].copy_from_slice(&(i as u64).to_le_bytes());
            cache.put(
                (Some(digest), Kind::Contexts),
                Listing::Contexts(vec!["docs".into()]),
            );
        }
        assert_eq!(cache.len(), MAX_ENTRIES);
    }

    #[test]
    fn the_cache_is_bounded_by_bytes() {
        let cache = CompletionCache::default();
        let big = || Listing::Contexts(vec!["x".repeat(MAX_BYTES / 5)]);
        for i in 0..8u8 {
            cache.put((Some([i; 32]), Kind::Contexts), big());
        }
        let total: usize = cache.lock().values().map(|e| e.bytes).sum();
        assert!(total <= MAX_BYTES, "{total}");
        assert_eq!(cache.len(), 5);
        // One listing past a quarter of the bound is not kept at all.
        cache.put(
            (Some([99; 32]), Kind::Contexts),
            Listing::Contexts(vec!["x".repeat(MAX_BYTES / 3)]),
        );
        assert!(cache.get(&(Some([99; 32]), Kind::Contexts)).is_none());
    }
}
