//! Configuration of the Pinecone tools: flags, environment, the multi-source
//! file, `${VAR}` indirection and the `core`/`alliance` profiles.
//!
//! Precedence is flag > environment > profile default (clap reads the
//! environment for every flag). The Pinecone tools are enabled when an index,
//! `--sources` or `--config-file` is configured, or when the `alliance`
//! profile is chosen (it has a default index). `PINECONE_API_KEY` alone does
//! not enable them, because the Nexus tools read the same key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value};

/// Index used by the `alliance` profile when none is configured.
pub(super) const ALLIANCE_INDEX_NAME: &str = "rag-hybrid";
/// Rerank model used by the `alliance` profile when none is configured.
pub(super) const ALLIANCE_RERANK_MODEL: &str = "bge-reranker-v2-m3";
/// Default control-plane and inference host.
pub(super) const DEFAULT_CONTROLLER_HOST: &str = "https://api.pinecone.io";
/// Default namespace-cache and suggest-flow lifetime.
pub(super) const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(1800);
/// Default memory for the per-key state of HTTP callers (clients, namespace
/// lists), in MiB: room for well over 10,000 callers' namespace lists.
pub(super) const DEFAULT_CACHE_MIB: u64 = 256;
/// Default deadline of one Pinecone call (all attempts included).
pub(super) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_millis(15_000);
/// Default `top_k` of the query tools.
pub(super) const DEFAULT_TOP_K: u32 = 10;
/// Name of the only source in single-key mode.
pub(super) const DEFAULT_SOURCE_NAME: &str = "default";

/// Which defaults apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Profile {
    /// Index required, no rerank unless configured, suggest-flow gate off,
    /// no built-in URL generators.
    #[default]
    Core,
    /// Index `rag-hybrid`, rerank `bge-reranker-v2-m3`, gate on, built-in
    /// `mailing` and `slack-Cpplang` URL generators.
    Alliance,
}

/// Every Pinecone flag, each with its environment variable.
#[derive(Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[cfg_attr(feature = "cli", command(next_help_heading = "Pinecone tools"))]
pub struct PineconeArgs {
    /// Pinecone API key (single-key mode). Shared with the Nexus tools.
    #[cfg_attr(feature = "cli", arg(long = "pinecone-api-key", env = "PINECONE_API_KEY", hide_env_values = true, value_parser = secret))]
    pub api_key: Option<SecretString>,
    /// Dense integrated-embedding index; enables the Pinecone tools.
    #[cfg_attr(feature = "cli", arg(long, env = "PINECONE_INDEX_NAME"))]
    pub index_name: Option<String>,
    /// Sparse index (default `<index>-sparse`).
    #[cfg_attr(feature = "cli", arg(long, env = "PINECONE_SPARSE_INDEX_NAME"))]
    pub sparse_index_name: Option<String>,
    /// Rerank model; empty disables reranking.
    #[cfg_attr(feature = "cli", arg(long, env = "PINECONE_RERANK_MODEL"))]
    pub rerank_model: Option<String>,
    /// `top_k` of the query tools when the caller omits it (1..=100).
    #[cfg_attr(feature = "cli", arg(long, env = "PINECONE_TOP_K", value_parser = clap::value_parser!(u32).range(1..=100)))]
    pub top_k: Option<u32>,
    /// Lifetime of the namespace cache and of suggest-flow entries, in seconds.
    #[cfg_attr(feature = "cli", arg(long, env = "PINECONE_CACHE_TTL_SECONDS", value_parser = clap::value_parser!(u64).range(1..)))]
    pub cache_ttl_seconds: Option<u64>,
    /// Memory for HTTP callers' per-key state (clients, cached namespace
    /// lists), in MiB; the least recently used callers' state goes first.
    #[cfg_attr(feature = "cli", arg(long = "pinecone-cache-mib", env = "PINECONE_CACHE_MIB", value_parser = clap::value_parser!(u64).range(1..=1_048_576)))]
    pub cache_mib: Option<u64>,
    /// Deadline of one Pinecone call, retries included, in milliseconds.
    #[cfg_attr(feature = "cli", arg(long = "pinecone-request-timeout-ms", env = "PINECONE_REQUEST_TIMEOUT_MS", value_parser = clap::value_parser!(u64).range(1..)))]
    pub request_timeout_ms: Option<u64>,
    /// Sources `name:apiKey:indexName[;...]` (multi-source mode).
    #[cfg_attr(feature = "cli", arg(long = "sources", env = "PINECONE_SOURCES", hide_env_values = true, value_parser = secret))]
    pub sources: Option<SecretString>,
    /// JSON file with named sources (wins over `--sources`).
    #[cfg_attr(feature = "cli", arg(long, env = "PINECONE_CONFIG_FILE"))]
    pub config_file: Option<PathBuf>,
    /// Skip the `suggest_query_params` step before `query`/`count`/`query_documents`.
    #[cfg_attr(feature = "cli", arg(long, env = "PINECONE_DISABLE_SUGGEST_FLOW", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new()))]
    pub disable_suggest_flow: Option<bool>,
    /// Control-plane and inference host; index hosts come from describe-index.
    /// Must be https, except on loopback.
    #[cfg_attr(feature = "cli", arg(long = "pinecone-controller-host", env = "PINECONE_CONTROLLER_HOST", default_value = DEFAULT_CONTROLLER_HOST))]
    pub controller_host: String,
    /// Defaults to apply.
    #[cfg_attr(feature = "cli", arg(long, env = "PINECONE_MCP_PROFILE", value_enum, default_value_t = Profile::Core))]
    pub profile: Profile,
    /// Probe each source's dense and sparse index once (no retries), print one
    /// line per index to stderr and exit 0 when all answer, 1 otherwise,
    /// instead of serving.
    #[cfg_attr(feature = "cli", arg(long, env = "PINECONE_CHECK_INDEXES", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new()))]
    pub check_indexes: Option<bool>,
    /// Do not read namespace declarations from the index's `_mcp_config` manifest.
    #[cfg_attr(feature = "cli", arg(long, env = "PINECONE_DISABLE_REMOTE_SCHEMA", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new()))]
    pub disable_remote_schema: Option<bool>,
    /// Put the (redacted) cause of Pinecone failures in tool errors instead of
    /// a fixed per-tool message.
    #[cfg_attr(feature = "cli", arg(long = "pinecone-error-details", env = "PINECONE_ERROR_DETAILS", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new()))]
    pub error_details: Option<bool>,
}

/// Nothing configured, with the defaults `nexus-mcp` applies to absent flags.
impl Default for PineconeArgs {
    fn default() -> Self {
        PineconeArgs {
            api_key: None,
            index_name: None,
            sparse_index_name: None,
            rerank_model: None,
            top_k: None,
            cache_ttl_seconds: None,
            cache_mib: None,
            request_timeout_ms: None,
            sources: None,
            config_file: None,
            disable_suggest_flow: None,
            controller_host: DEFAULT_CONTROLLER_HOST.to_owned(),
            profile: Profile::Core,
            check_indexes: None,
            disable_remote_schema: None,
            error_details: None,
        }
    }
}

#[cfg(feature = "cli")]
fn secret(s: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(s.to_owned()))
}

impl std::fmt::Debug for PineconeArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PineconeArgs")
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("index_name", &self.index_name)
            .field("sparse_index_name", &self.sparse_index_name)
            .field("rerank_model", &self.rerank_model)
            .field("sources", &self.sources.as_ref().map(|_| "***"))
            .field("config_file", &self.config_file)
            .field("profile", &self.profile)
            .finish_non_exhaustive()
    }
}

/// A configuration problem found at startup. The message never contains key
/// material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    message: String,
}

impl ConfigError {
    fn new(message: impl Into<String>) -> Self {
        ConfigError {
            message: crate::mcp::redact::redact(&message.into()),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// How the sources were configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceMode {
    /// `PINECONE_API_KEY` + index: one source named `default`, rows carry no
    /// `source`, any namespace name is accepted by the execution tools.
    SingleKey,
    /// `--sources` or `--config-file`: rows carry `source`, execution tools
    /// check the namespace against discovery.
    Sources,
}

/// What a namespace declaration says (config file).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NamespaceDecl {
    /// Hint shown by `list_namespaces`.
    pub description: Option<String>,
    /// Field name to type name; replaces sampling when the namespace is live.
    pub metadata_schema: Option<Map<String, Value>>,
}

/// One Pinecone project + dense/sparse index pair.
#[derive(Clone)]
pub struct SourceConfig {
    /// Name used by the `source` argument.
    pub name: String,
    /// API key of the project.
    pub api_key: SecretString,
    /// Dense index.
    pub index_name: String,
    /// Sparse index.
    pub sparse_index_name: String,
    /// Rerank model; `None` disables reranking for this source.
    pub rerank_model: Option<String>,
    /// Hint shown by `list_sources`.
    pub description: Option<String>,
    /// Declared namespaces, in file order.
    pub namespaces: Vec<(String, NamespaceDecl)>,
}

impl std::fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceConfig")
            .field("name", &self.name)
            .field("api_key", &"***")
            .field("index_name", &self.index_name)
            .field("sparse_index_name", &self.sparse_index_name)
            .field("rerank_model", &self.rerank_model)
            .field("description", &self.description)
            .field("namespaces", &self.namespaces)
            .finish()
    }
}

/// The resolved configuration of the Pinecone tools.
#[derive(Debug, Clone)]
pub struct PineconeConfig {
    /// Which defaults applied.
    pub profile: Profile,
    /// Single-key or sources mode.
    pub mode: SourceMode,
    /// The sources, in configuration order (one in single-key mode).
    pub sources: Vec<SourceConfig>,
    /// Source used when a call names none.
    pub default_source: String,
    /// Namespace cache and suggest-flow lifetime.
    pub cache_ttl: Duration,
    /// Bytes of per-key state kept for HTTP callers (each caller's clients
    /// and cached namespace lists), least recently used first out.
    pub cache_bytes: u64,
    /// Deadline of one Pinecone call.
    pub request_timeout: Duration,
    /// Whether `query`/`count`/`query_documents` require `suggest_query_params` first.
    pub suggest_flow: bool,
    /// Control-plane and inference base URL.
    pub controller_host: String,
    /// `top_k` when a caller omits it.
    pub default_top_k: u32,
    /// Whether the built-in `mailing`/`slack-Cpplang` URL generators are installed.
    pub builtin_url_generators: bool,
    /// Whether tool errors carry the redacted cause.
    pub error_details: bool,
    /// Whether sources without declared namespaces read the `_mcp_config` manifest.
    pub remote_schema: bool,
}

impl PineconeConfig {
    /// A single-key configuration (handy for embedding and tests).
    pub fn single(api_key: impl Into<String>, index_name: impl Into<String>) -> Self {
        let index_name = index_name.into();
        PineconeConfig {
            profile: Profile::Core,
            mode: SourceMode::SingleKey,
            sources: vec![SourceConfig {
                name: DEFAULT_SOURCE_NAME.to_owned(),
                api_key: SecretString::from(api_key.into()),
                sparse_index_name: format!("{index_name}-sparse"),
                index_name,
                rerank_model: None,
                description: None,
                namespaces: Vec::new(),
            }],
            default_source: DEFAULT_SOURCE_NAME.to_owned(),
            cache_ttl: DEFAULT_CACHE_TTL,
            cache_bytes: DEFAULT_CACHE_MIB * 1024 * 1024,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            suggest_flow: false,
            controller_host: DEFAULT_CONTROLLER_HOST.to_owned(),
            default_top_k: DEFAULT_TOP_K,
            builtin_url_generators: false,
            error_details: false,
            remote_schema: true,
        }
    }

    /// True with two or more sources (`list_sources`, `source` in responses).
    pub fn is_multi_source(&self) -> bool {
        self.sources.len() >= 2
    }
}

fn trimmed(value: Option<&str>) -> Option<String> {
    value
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

impl PineconeArgs {
    /// Resolves the configuration; `Ok(None)` when no Pinecone configuration
    /// is present (the Nexus tools then run alone).
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first problem.
    pub fn resolve(&self) -> Result<Option<PineconeConfig>, ConfigError> {
        self.resolve_with(&|name| std::env::var(name).ok())
    }

    /// Like [`resolve`](Self::resolve), reading `${VAR}` references through `env`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first problem.
    pub fn resolve_with(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<PineconeConfig>, ConfigError> {
        self.resolve_keys(env, false)
    }

    /// Like [`resolve`](Self::resolve), but without `PINECONE_API_KEY` the
    /// single source gets an empty key instead of an error: for a server
    /// whose every caller brings its own key (HTTP without
    /// `--allow-server-key`), which never uses the configured one.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first problem.
    pub fn resolve_for_callers(&self) -> Result<Option<PineconeConfig>, ConfigError> {
        self.resolve_keys(&|name| std::env::var(name).ok(), true)
    }

    fn resolve_keys(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
        key_optional: bool,
    ) -> Result<Option<PineconeConfig>, ConfigError> {
        let alliance = self.profile == Profile::Alliance;
        let index_name = trimmed(self.index_name.as_deref());
        let inline = self
            .sources
            .as_ref()
            .and_then(|s| trimmed(Some(s.expose_secret())));
        let file = self
            .config_file
            .as_ref()
            .and_then(|p| trimmed(p.to_str()))
            .map(PathBuf::from);
        if !alliance && index_name.is_none() && inline.is_none() && file.is_none() {
            return Ok(None);
        }
        let rerank_model = match trimmed(self.rerank_model.as_deref()) {
            Some(m) => Some(m),
            None if alliance && self.rerank_model.is_none() => {
                Some(ALLIANCE_RERANK_MODEL.to_owned())
            }
            None => None,
        };
        let defaults = SourceDefaults {
            index_name: index_name
                .clone()
                .or_else(|| alliance.then(|| ALLIANCE_INDEX_NAME.to_owned())),
            rerank_model: rerank_model.clone(),
        };

        let (mode, sources, default_source) = if let Some(path) = file {
            let (sources, default) = parse_config_file(&path, &defaults, env)?;
            (SourceMode::Sources, sources, default)
        } else if let Some(inline) = inline {
            let sources = parse_inline_sources(&inline, &defaults, env)?;
            let default = sources.first().map(|s| s.name.clone()).unwrap_or_default();
            (SourceMode::Sources, sources, default)
        } else {
            let source = self.single_source(&defaults, key_optional)?;
            let name = source.name.clone();
            (SourceMode::SingleKey, vec![source], name)
        };
        let controller_host = self.controller_host.trim().trim_end_matches('/').to_owned();
        super::client::base_url(&controller_host).map_err(|why| {
            ConfigError::new(format!("Invalid --pinecone-controller-host: {why}"))
        })?;
        if mode == SourceMode::Sources && self.api_key.is_some() {
            tracing::warn!("PINECONE_SOURCES / config file is active; PINECONE_API_KEY is ignored");
        }

        Ok(Some(PineconeConfig {
            profile: self.profile,
            mode,
            sources,
            default_source,
            cache_ttl: self
                .cache_ttl_seconds
                .map_or(DEFAULT_CACHE_TTL, Duration::from_secs),
            cache_bytes: self
                .cache_mib
                .unwrap_or(DEFAULT_CACHE_MIB)
                .saturating_mul(1024 * 1024),
            request_timeout: self
                .request_timeout_ms
                .map_or(DEFAULT_REQUEST_TIMEOUT, Duration::from_millis),
            suggest_flow: !self.disable_suggest_flow.unwrap_or(!alliance),
            controller_host,
            default_top_k: self.top_k.unwrap_or(DEFAULT_TOP_K),
            builtin_url_generators: alliance,
            error_details: self.error_details.unwrap_or(false),
            remote_schema: !self.disable_remote_schema.unwrap_or(false),
        }))
    }

    /// The one source of the single-key mode: the key (empty when callers
    /// bring theirs and none is configured), the index and its sparse twin.
    fn single_source(
        &self,
        defaults: &SourceDefaults,
        key_optional: bool,
    ) -> Result<SourceConfig, ConfigError> {
        let api_key = self
            .api_key
            .as_ref()
            .and_then(|k| trimmed(Some(k.expose_secret())))
            .or_else(|| key_optional.then(String::new))
            .ok_or_else(|| {
                ConfigError::new(
                    "Missing Pinecone API key: set PINECONE_API_KEY or pass --pinecone-api-key.",
                )
            })?;
        let index_name = defaults.index_name.clone().ok_or_else(|| {
            ConfigError::new(
                "Missing Pinecone index name: set PINECONE_INDEX_NAME or pass --index-name.",
            )
        })?;
        let sparse_index_name = trimmed(self.sparse_index_name.as_deref())
            .unwrap_or_else(|| format!("{index_name}-sparse"));
        Ok(SourceConfig {
            name: DEFAULT_SOURCE_NAME.to_owned(),
            api_key: SecretString::from(api_key),
            index_name,
            sparse_index_name,
            rerank_model: defaults.rerank_model.clone(),
            description: None,
            namespaces: Vec::new(),
        })
    }
}

/// Values that fill source entries that omit them.
struct SourceDefaults {
    index_name: Option<String>,
    rerank_model: Option<String>,
}

/// Replaces a whole-value `${NAME}` reference by the variable's value.
///
/// # Errors
/// When the name is invalid or the variable is unset or blank.
pub(super) fn resolve_env_ref(
    value: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let value = value.trim();
    let Some(name) = value
        .strip_prefix("${")
        .and_then(|rest| rest.strip_suffix('}'))
    else {
        return Ok(value.to_owned());
    };
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(ConfigError::new(format!(
            "Invalid environment variable reference \"${{{name}}}\": names must contain only letters, digits, and underscores (no leading digit)."
        )));
    }
    match env(name).map(|v| v.trim().to_owned()) {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(ConfigError::new(format!(
            "Environment variable {name} is not set (referenced as ${{{name}}})."
        ))),
    }
}

fn check_source_name(name: &str, origin: &str) -> Result<(), ConfigError> {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        Ok(())
    } else {
        Err(ConfigError::new(format!(
            "Invalid source name \"{name}\" in {origin}: use alphanumeric characters, hyphens, or underscores only."
        )))
    }
}

/// Parses `name:apiKey:indexName[;...]`. Messages name the segment by its
/// position and source name, never by its text (it holds a key).
fn parse_inline_sources(
    inline: &str,
    defaults: &SourceDefaults,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<SourceConfig>, ConfigError> {
    if inline.starts_with('{') {
        return Err(ConfigError::new(
            "PINECONE_SOURCES does not accept inline JSON. Use PINECONE_CONFIG_FILE for per-source descriptions and namespaces.",
        ));
    }
    let segments: Vec<&str> = inline
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if segments.is_empty() {
        return Err(ConfigError::new("PINECONE_SOURCES is empty."));
    }
    let mut sources: Vec<SourceConfig> = Vec::new();
    for (i, segment) in segments.iter().enumerate() {
        let parts: Vec<&str> = segment.split(':').collect();
        let position = i + 1;
        if parts.len() < 3 {
            return Err(ConfigError::new(format!(
                "Invalid PINECONE_SOURCES segment #{position}: expected name:apiKey:indexName."
            )));
        }
        let name = parts[0].trim();
        let index = parts[parts.len() - 1].trim();
        let key = parts[1..parts.len() - 1].join(":");
        if name.is_empty() || index.is_empty() || key.trim().is_empty() {
            return Err(ConfigError::new(format!(
                "Invalid PINECONE_SOURCES segment #{position}: name, apiKey, and indexName are required."
            )));
        }
        check_source_name(name, "PINECONE_SOURCES")?;
        if sources.iter().any(|s| s.name == name) {
            return Err(ConfigError::new(format!(
                "Duplicate source name \"{name}\" in PINECONE_SOURCES."
            )));
        }
        let api_key = resolve_env_ref(&key, env)?;
        let index_name = resolve_env_ref(index, env)?;
        sources.push(SourceConfig {
            name: name.to_owned(),
            api_key: SecretString::from(api_key),
            sparse_index_name: format!("{index_name}-sparse"),
            index_name,
            rerank_model: defaults.rerank_model.clone(),
            description: None,
            namespaces: Vec::new(),
        });
    }
    Ok(sources)
}

/// Reads and validates the JSON sources file.
fn parse_config_file(
    path: &Path,
    defaults: &SourceDefaults,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Vec<SourceConfig>, String), ConfigError> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(format!(
            "Failed to read PINECONE config file \"{shown}\": {e}"
        ))
    })?;
    let root: Value = serde_json::from_str(&text).map_err(|e| {
        ConfigError::new(format!(
            "Failed to read PINECONE config file \"{shown}\": {e}"
        ))
    })?;
    parse_config_value(&root, &format!("config file \"{shown}\""), defaults, env)
}

fn opt_string(
    entry: &Map<String, Value>,
    key: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, ConfigError> {
    let raw = match entry.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    if raw.trim().is_empty() {
        return Ok(None);
    }
    resolve_env_ref(&raw, env).map(Some)
}

fn parse_config_value(
    root: &Value,
    origin: &str,
    defaults: &SourceDefaults,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Vec<SourceConfig>, String), ConfigError> {
    let Some(map) = root.get("sources").and_then(Value::as_object) else {
        return Err(ConfigError::new(format!(
            "PINECONE {origin} must contain a \"sources\" object."
        )));
    };
    if map.is_empty() {
        return Err(ConfigError::new(format!(
            "PINECONE {origin} has no sources."
        )));
    }
    let mut sources = Vec::with_capacity(map.len());
    for (name, entry) in map {
        check_source_name(name, origin)?;
        let Some(entry) = entry.as_object() else {
            return Err(ConfigError::new(format!(
                "Source \"{name}\" in {origin} must be an object."
            )));
        };
        let key_ref = match entry.get("apiKey") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            _ => format!("${{{name}}}"),
        };
        let api_key = resolve_env_ref(&key_ref, env)?;
        if api_key.is_empty() {
            return Err(ConfigError::new(format!(
                "Source \"{name}\": apiKey is required."
            )));
        }
        let index_name = opt_string(entry, "indexName", env)?
            .or_else(|| defaults.index_name.clone())
            .ok_or_else(|| {
                ConfigError::new(format!("Source \"{name}\": indexName is required."))
            })?;
        let sparse_index_name = opt_string(entry, "sparseIndexName", env)?
            .unwrap_or_else(|| format!("{index_name}-sparse"));
        let rerank_model =
            opt_string(entry, "rerankModel", env)?.or_else(|| defaults.rerank_model.clone());
        let description = description(entry.get("description"), || {
            format!("Source \"{name}\": description")
        })?;
        let namespaces = match entry.get("namespaces") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => parse_namespace_decls(name, v)?,
        };
        sources.push(SourceConfig {
            name: name.clone(),
            api_key: SecretString::from(api_key),
            index_name,
            sparse_index_name,
            rerank_model,
            description,
            namespaces,
        });
    }
    let default = match root
        .get("defaultSource")
        .and_then(Value::as_str)
        .map(str::trim)
    {
        Some(d) if !d.is_empty() => {
            if !sources.iter().any(|s| s.name == d) {
                return Err(ConfigError::new(format!(
                    "defaultSource \"{d}\" is not a configured source name."
                )));
            }
            d.to_owned()
        }
        _ => sources[0].name.clone(),
    };
    Ok((sources, default))
}

/// An optional `description` (config file): absent, null or blank is
/// none; anything but a string is refused, naming it as `what` says.
fn description(
    value: Option<&Value>,
    what: impl FnOnce() -> String,
) -> Result<Option<String>, ConfigError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(trimmed(Some(s))),
        Some(_) => Err(ConfigError::new(format!("{} must be a string.", what()))),
    }
}

/// Validates a `namespaces` map (config file).
///
/// # Errors
/// The first malformed entry.
pub(super) fn parse_namespace_decls(
    source: &str,
    value: &Value,
) -> Result<Vec<(String, NamespaceDecl)>, ConfigError> {
    let Some(map) = value.as_object() else {
        return Err(ConfigError::new(format!(
            "Source \"{source}\": namespaces must be an object."
        )));
    };
    let mut out = Vec::with_capacity(map.len());
    for (ns, decl) in map {
        let Some(decl) = decl.as_object() else {
            return Err(ConfigError::new(format!(
                "Source \"{source}\": namespaces[\"{ns}\"] must be an object."
            )));
        };
        let description = description(decl.get("description"), || {
            format!("Source \"{source}\": namespaces[\"{ns}\"].description")
        })?;
        let metadata_schema = match decl.get("metadata_schema") {
            None | Some(Value::Null) => None,
            Some(Value::Object(fields)) => {
                let mut schema = Map::new();
                for (field, ty) in fields {
                    match ty.as_str().map(str::trim) {
                        Some(t) if !t.is_empty() => {
                            schema.insert(field.clone(), Value::String(t.to_owned()));
                        }
                        _ => {
                            return Err(ConfigError::new(format!(
                                "Source \"{source}\": namespaces[\"{ns}\"].metadata_schema[\"{field}\"] must be a non-empty string type."
                            )));
                        }
                    }
                }
                (!schema.is_empty()).then_some(schema)
            }
            Some(_) => {
                return Err(ConfigError::new(format!(
                    "Source \"{source}\": namespaces[\"{ns}\"].metadata_schema must be a flat object."
                )));
            }
        };
        out.push((
            ns.clone(),
            NamespaceDecl {
                description,
                metadata_schema,
            },
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn env_reference_resolves_whole_values_only() {
        let env = |n: &str| (n == "KEY_A").then(|| " k1 ".to_owned());
        assert_eq!(resolve_env_ref("${KEY_A}", &env).unwrap(), "k1");
        assert_eq!(
            resolve_env_ref("pre-${KEY_A}", &env).unwrap(),
            "pre-${KEY_A}"
        );
        let err = resolve_env_ref("${MISSING}", &env).unwrap_err();
        assert_eq!(
            err.message(),
            "Environment variable MISSING is not set (referenced as ${MISSING})."
        );
        let err = resolve_env_ref("${1BAD}", &env).unwrap_err();
        assert!(
            err.message()
                .starts_with("Invalid environment variable reference")
        );
    }

    #[test]
    fn inline_sources_keep_colons_in_keys() {
        let d = SourceDefaults {
            index_name: None,
            rerank_model: None,
        };
        let s = parse_inline_sources("a:k:e:y:idx; b:k2:idx2", &d, &no_env).unwrap();
        assert_eq!(s[0].api_key.expose_secret(), "k:e:y");
        assert_eq!(s[0].sparse_index_name, "idx-sparse");
        assert_eq!(s[1].name, "b");
    }
}
