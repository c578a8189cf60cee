//! The configured sources: clients, per-source namespace caches, aggregated
//! discovery and resolution of `source`/`namespace` arguments.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use secrecy::ExposeSecret;
use serde_json::Map;

use crate::mcp::ToolError;
use crate::mcp::redact::redact_with;
use crate::mcp::structured::EscapedSuffix;

use super::cache::TtlCell;
use super::client::{PineconeClient, PineconeError};
use super::config::{PineconeConfig, SourceConfig, SourceMode};
use super::discovery::{ALLOCATION_BYTES, Discovery, NamespaceRow, discover};
use super::failure::Failure;
use super::search::Indexes;

/// One configured source at run time.
#[derive(Debug)]
pub(crate) struct Source {
    /// Its configuration.
    pub config: SourceConfig,
    /// Its client.
    pub client: PineconeClient,
    cache: TtlCell<Arc<CachedDiscovery>>,
}

impl Source {
    /// Its indexes.
    pub(crate) fn indexes(&self) -> Indexes<'_> {
        Indexes {
            client: &self.client,
            dense: &self.config.index_name,
            sparse: &self.config.sparse_index_name,
            rerank_model: self.config.rerank_model.as_deref(),
        }
    }

    /// The name.
    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }
}

/// The most bytes of `list_namespaces` text (with its escaping) kept
/// beside a cached discovery.
const MAX_LISTING_BYTES: usize = 2 * 1024 * 1024;

/// One source's discovery as its cache holds it, shared by every call that
/// reads it until it expires, with the `list_namespaces` text written from
/// it on first use (dropped with the entry).
#[derive(Debug)]
pub(super) struct CachedDiscovery {
    /// What discovery found.
    pub(super) discovery: Discovery,
    /// The text with its escaping, or `None` when they are longer than
    /// [`MAX_LISTING_BYTES`].
    listing: OnceLock<Option<Arc<EscapedSuffix>>>,
    /// When this entry expires, as `expires_at_iso` writes it.
    expiry: OnceLock<String>,
    /// Bytes the entry holds without its text.
    bytes: u64,
}

impl CachedDiscovery {
    fn new(discovery: Discovery) -> Self {
        let bytes = discovery
            .heap_bytes()
            .saturating_add(std::mem::size_of::<Self>() + ALLOCATION_BYTES);
        CachedDiscovery {
            discovery,
            listing: OnceLock::new(),
            expiry: OnceLock::new(),
            bytes: u64::try_from(bytes).unwrap_or(u64::MAX),
        }
    }

    /// Bytes held: what discovery found, and its text once written.
    fn bytes(&self) -> u64 {
        let text = self
            .listing
            .get()
            .and_then(Option::as_ref)
            .map_or(0, |kept| {
                kept.len() + std::mem::size_of::<EscapedSuffix>() + 2 * ALLOCATION_BYTES
            });
        self.bytes
            .saturating_add(u64::try_from(text).unwrap_or(u64::MAX))
    }

    /// When this entry expires, written by `write` on the first call: the
    /// entry's expiry is one instant, whenever it is asked for.
    pub(super) fn expiry(&self, write: impl FnOnce() -> String) -> &str {
        self.expiry.get_or_init(write)
    }

    /// The text `write` makes from this discovery, written (and escaped)
    /// on the first call and kept when both are at most
    /// [`MAX_LISTING_BYTES`]; `None` when longer or `write` fails.
    pub(super) fn listing(
        &self,
        write: impl FnOnce() -> Option<String>,
    ) -> Option<&Arc<EscapedSuffix>> {
        self.listing
            .get_or_init(|| {
                let text = write().filter(|text| text.len() <= MAX_LISTING_BYTES)?;
                let kept = EscapedSuffix::new(text).ok()?;
                (kept.len() <= MAX_LISTING_BYTES).then(|| Arc::new(kept))
            })
            .as_ref()
    }
}

/// What a view found: one source's cache entry, or several merged.
#[derive(Debug, Clone)]
enum Found {
    One(Arc<CachedDiscovery>),
    Merged(Discovery),
}

/// Discovery as a tool reports it.
#[derive(Debug, Clone)]
pub(crate) struct NamespaceView {
    found: Found,
    /// True when every source answered from its cache.
    pub cache_hit: bool,
    /// Time until the first answering source's entry expires.
    pub remaining: Duration,
    /// Source name to redacted error, for sources that failed.
    pub source_errors: Map<String, serde_json::Value>,
}

impl NamespaceView {
    fn discovery(&self) -> &Discovery {
        match &self.found {
            Found::One(cached) => &cached.discovery,
            Found::Merged(discovery) => discovery,
        }
    }

    /// Rows of every answering source.
    pub(crate) fn rows(&self) -> &[NamespaceRow] {
        &self.discovery().rows
    }

    /// Configuration warnings.
    pub(crate) fn warnings(&self) -> &[String] {
        &self.discovery().warnings
    }

    /// The one source's cache entry, when the view is of one source.
    pub(super) fn cached(&self) -> Option<&CachedDiscovery> {
        match &self.found {
            Found::One(cached) => Some(cached),
            Found::Merged(_) => None,
        }
    }
}

/// Every configured source.
#[derive(Debug)]
pub(crate) struct Registry {
    mode: SourceMode,
    sources: Vec<Source>,
    default: usize,
    ttl: Duration,
    remote_schema: bool,
}

fn validation(code_field: &str, message: String, suggestion: &str) -> Failure {
    ToolError::validation(code_field, message)
        .with_suggestion(suggestion)
        .into()
}

fn unknown_source(name: &str) -> Failure {
    validation(
        "source",
        format!("Unknown source \"{name}\". Call list_sources for configured names."),
        "Call list_sources to see configured source names.",
    )
}

impl Registry {
    /// Clients and caches for `config`'s sources.
    pub(crate) fn new(config: &PineconeConfig, http: &reqwest::Client) -> Self {
        let sources: Vec<Source> = config
            .sources
            .iter()
            .map(|s| Source {
                client: PineconeClient::new(
                    http.clone(),
                    config.controller_host.clone(),
                    s.api_key.clone(),
                    config.request_timeout,
                ),
                config: s.clone(),
                cache: TtlCell::new(config.cache_ttl),
            })
            .collect();
        let default = sources
            .iter()
            .position(|s| s.config.name == config.default_source)
            .unwrap_or(0);
        Registry {
            mode: config.mode,
            sources,
            default,
            ttl: config.cache_ttl,
            remote_schema: config.remote_schema,
        }
    }

    /// True with two or more sources.
    pub(crate) fn is_multi(&self) -> bool {
        self.sources.len() >= 2
    }

    /// Every source, in configuration order.
    pub(crate) fn all(&self) -> &[Source] {
        &self.sources
    }

    /// The default source.
    pub(crate) fn default_source(&self) -> Option<&Source> {
        self.sources.get(self.default)
    }

    /// The source named `name` (trimmed); `None` for no name.
    ///
    /// # Errors
    /// `VALIDATION` on `source` for an unknown name.
    pub(crate) fn named(&self, name: Option<&str>) -> Result<Option<&Source>, Failure> {
        let Some(name) = name.map(str::trim).filter(|n| !n.is_empty()) else {
            return Ok(None);
        };
        let found = self.sources.iter().find(|s| s.config.name == name);
        match found {
            Some(source) => Ok(Some(source)),
            // One source: `list_sources` is not served, so the error names
            // the one source instead of pointing at it.
            None if !self.is_multi() => Err(validation(
                "source",
                format!(
                    "Unknown source \"{name}\". This server has one source{}; omit source.",
                    self.sources
                        .first()
                        .map(|s| format!(" (\"{}\")", s.name()))
                        .unwrap_or_default()
                ),
                "Omit the source argument: this server has a single source.",
            )),
            None => Err(unknown_source(name)),
        }
    }

    /// The cached discovery of one source.
    async fn discover(
        &self,
        source: &Source,
    ) -> Result<(Arc<CachedDiscovery>, bool, Duration), PineconeError> {
        let tag = self.mode == SourceMode::Sources;
        let cached = source
            .cache
            .get_or_refresh(|| async {
                discover(&source.client, &source.config, tag, self.remote_schema)
                    .await
                    .map(|d| Arc::new(CachedDiscovery::new(d)))
            })
            .await?;
        Ok((cached.value, cached.hit, cached.remaining))
    }

    /// Namespaces of `source`, or of every source (aggregated: failing
    /// sources are reported in `source_errors` when others answer).
    ///
    /// # Errors
    /// When the only source asked fails.
    pub(crate) async fn namespaces(
        &self,
        source: Option<&Source>,
    ) -> Result<NamespaceView, Failure> {
        // One source (the common case) is read without gathering targets.
        let only = match (source, self.sources.as_slice()) {
            (Some(s), _) | (None, [s]) => Some(s),
            _ => None,
        };
        if let Some(only) = only {
            let (d, hit, remaining) = self.discover(only).await?;
            return Ok(NamespaceView {
                found: Found::One(d),
                cache_hit: hit,
                remaining,
                source_errors: Map::new(),
            });
        }
        let targets = &self.sources;
        let results = futures::future::join_all(targets.iter().map(|s| self.discover(s))).await;
        let mut merged = Discovery::default();
        let mut view = NamespaceView {
            found: Found::Merged(Discovery::default()),
            cache_hit: true,
            remaining: self.ttl,
            source_errors: Map::new(),
        };
        let mut answered = false;
        for (s, result) in targets.iter().zip(results) {
            match result {
                Ok((d, hit, remaining)) => {
                    merged.rows.extend_from_slice(&d.discovery.rows);
                    merged.warnings.extend_from_slice(&d.discovery.warnings);
                    view.cache_hit &= hit;
                    view.remaining = if answered {
                        view.remaining.max(remaining)
                    } else {
                        remaining
                    };
                    answered = true;
                }
                Err(e) => {
                    view.cache_hit = false;
                    let message = redact_with(&e.to_string(), &[s.config.api_key.expose_secret()]);
                    view.source_errors
                        .insert(s.config.name.clone(), message.into());
                }
            }
        }
        view.found = Found::Merged(merged);
        Ok(view)
    }

    /// The source an execution tool runs on, checking in sources mode that
    /// the namespace exists there.
    ///
    /// # Errors
    /// `VALIDATION` for an unknown source, an unknown or ambiguous namespace,
    /// or incomplete discovery; a Pinecone failure of discovery.
    pub(crate) async fn resolve(
        &self,
        source: Option<&str>,
        namespace: &str,
    ) -> Result<&Source, Failure> {
        let named = self.named(source)?;
        let Some(fallback) = self.default_source() else {
            return Err(unknown_source(source.unwrap_or("default")));
        };
        if self.mode == SourceMode::SingleKey {
            return Ok(named.unwrap_or(fallback));
        }
        if let Some(s) = named {
            let (d, _, _) = self.discover(s).await?;
            if d.discovery.rows.iter().any(|r| r.name.trim() == namespace) {
                return Ok(s);
            }
            return Err(validation(
                "namespace",
                format!(
                    "Namespace \"{namespace}\" not found on source \"{}\".",
                    s.name()
                ),
                "Use list_namespaces to discover valid namespace and source pairs.",
            ));
        }
        let view = self.namespaces(None).await?;
        if !view.source_errors.is_empty() {
            return Err(validation(
                "source",
                "Namespace discovery is incomplete because one or more sources failed. Pass source explicitly or retry after resolving source_errors.".to_owned(),
                "Pass source explicitly, or fix failing sources listed in list_namespaces source_errors and retry.",
            ));
        }
        let matches: Vec<&NamespaceRow> = view
            .rows()
            .iter()
            .filter(|r| r.name.trim() == namespace)
            .collect();
        match matches.as_slice() {
            [one] => {
                let name = one.source.as_deref().unwrap_or(fallback.name());
                Ok(self.named(Some(name))?.unwrap_or(fallback))
            }
            [] => Err(validation(
                "namespace",
                format!("Namespace \"{namespace}\" not found. Call list_namespaces first."),
                "Use list_namespaces to discover valid namespace and source pairs.",
            )),
            _ => Err(validation(
                "namespace",
                format!(
                    "Namespace \"{namespace}\" exists on multiple sources. Pass source explicitly."
                ),
                "Call list_namespaces and pass source explicitly when the namespace exists on multiple projects.",
            )),
        }
    }

    /// The suggest-flow key of a namespace on a source.
    pub(crate) fn gate_key(&self, source: &Source, namespace: &str) -> String {
        if self.is_multi() {
            format!("{}:{namespace}", source.name())
        } else {
            namespace.to_owned()
        }
    }

    /// The source name shown in execution responses (multi-source only).
    pub(crate) fn shown<'a>(&self, source: &'a Source) -> Option<&'a str> {
        self.is_multi().then(|| source.name())
    }

    /// Bytes held by every source's cached discovery, or `None` while one
    /// is being refreshed.
    pub(crate) fn cached_bytes(&self) -> Option<u64> {
        self.sources.iter().try_fold(0u64, |sum, s| {
            let held = s.cache.weigh(|cached| cached.bytes())?;
            Some(sum.saturating_add(held))
        })
    }

    /// Clears every namespace cache.
    pub(crate) async fn clear_caches(&self) {
        for s in &self.sources {
            s.cache.clear().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_writes_its_expiry_once() {
        let entry = CachedDiscovery::new(Discovery::default());
        assert_eq!(
            entry.expiry(|| "2026-12-02T17:00:00.000Z".to_owned()),
            "2026-12-02T17:00:00.000Z"
        );
        let later = entry.expiry(|| unreachable!("written once"));
        assert_eq!(later, "2026-12-02T17:00:00.000Z");
    }
}
