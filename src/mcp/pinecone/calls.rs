//! The Pinecone tools' work: argument checks in the documented order, then
//! discovery, retrieval and shaping of the payload. `tools` wraps each in
//! its MCP tool definition.

use std::sync::Arc;

use rmcp::handler::server::tool::{IntoCallToolResult, schema_for_output};
use rmcp::model::{CallToolResponse, JsonObject};
use schemars::JsonSchema;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::mcp::structured::expect_suffix;
use crate::mcp::tool_error::with_error_branch;
use crate::mcp::{ToolError, ToolErrorCode};

use super::args::{
    CountArgs, GenerateUrlsArgs, KeywordSearchArgs, ListNamespacesArgs, MetadataFilter,
    NamespaceRouterArgs, Preset, QueryArgs, QueryDocumentsArgs, SuggestQueryParamsArgs,
};
use super::discovery::NamespaceRow;
use super::documents::reassemble;
use super::failure::Failure;
use super::filter::validate_filter;
use super::format::row;
use super::listing;
use super::output::{
    CountOutput, Experimental, GenerateUrlsOutput, KeywordSearchOutput, ListNamespacesOutput, Mode,
    NamespaceRouterOutput, QueryDocumentsOutput, QueryOutput, Status, SuggestQueryParamsOutput,
    UrlRow,
};
use super::router::{rank, recommend};
use super::search::{self, SearchSpec};
use super::server::PineconeServer;
use super::sources::Source;
use super::suggest::{FAST_FIELDS, suggest};

mod guided;

/// Most records `generate_urls` accepts.
const MAX_URL_RECORDS: usize = 500;
/// Chunks fetched per wanted document by `query_documents`.
const CHUNKS_PER_DOCUMENT: u32 = 50;
/// Most chunks `query_documents` fetches.
const MAX_DOCUMENT_CHUNKS: u32 = 500;

/// The most namespace names a "does not exist" hint lists.
const MAX_NAMES_IN_HINT: usize = 20;
const NAMESPACE_SUGGESTION: &str = "Use a namespace name from list_namespaces (trimmed).";

/// A failed tool call, as returned by the tool functions.
#[derive(Debug)]
pub(crate) struct Failed(pub(super) ToolError);

impl IntoCallToolResult for Failed {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        Ok(self.0.into_result().into())
    }
}

/// `value` trimmed, or a `VALIDATION` error on `field` saying `message`
/// when nothing is left.
pub(super) fn trimmed_required(value: &str, field: &str, message: &str) -> Result<String, Failure> {
    let value = value.trim();
    if value.is_empty() {
        return Err(ToolError::validation(field, message).into());
    }
    Ok(value.to_owned())
}

/// The question of `namespace_router`, `suggest_query_params` and
/// `guided_query`, trimmed.
pub(super) fn user_query_arg(value: &str) -> Result<String, Failure> {
    trimmed_required(value, "user_query", "user_query cannot be empty")
}

/// A search tool's `query_text`, trimmed; `message` when it is empty.
fn query_text_arg(value: &str, message: &str) -> Result<String, Failure> {
    trimmed_required(value, "query_text", message)
}

pub(super) fn namespace_arg(value: &str) -> Result<String, Failure> {
    let namespace = value.trim();
    if namespace.is_empty() {
        return Err(
            ToolError::validation("namespace", "namespace cannot be empty")
                .with_suggestion(NAMESPACE_SUGGESTION)
                .into(),
        );
    }
    checked_namespace(namespace.to_owned())
}

/// Refuses a namespace that would change a request path (`.`, `..`, `/`).
pub(super) fn checked_namespace(namespace: String) -> Result<String, Failure> {
    match super::client::check_namespace(&namespace) {
        Ok(()) => Ok(namespace),
        Err(why) => Err(ToolError::validation("namespace", why)
            .with_suggestion(NAMESPACE_SUGGESTION)
            .into()),
    }
}

/// The `outputSchema` of a tool returning `T`, admitting a [`ToolError`] too.
pub(super) fn output_schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    with_error_branch((*schema_for_output::<T>()).clone())
}

/// `work`, or `CANCELLED` as soon as the request is cancelled: dropping
/// `work` drops its in-flight Pinecone requests.
pub(super) async fn until_cancelled<T>(
    ct: &CancellationToken,
    work: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    tokio::select! {
        biased;
        _ = ct.cancelled() => Err(ToolError::cancelled().into()),
        result = work => result,
    }
}

pub(super) fn in_range(
    field: &str,
    value: Option<i64>,
    default: u32,
    min: u32,
    max: u32,
) -> Result<u32, Failure> {
    match value {
        None => Ok(default),
        Some(v) if v >= i64::from(min) && v <= i64::from(max) => Ok(v as u32),
        Some(_) => Err(ToolError::validation(
            field,
            format!("{field} must be an integer between {min} and {max}."),
        )
        .into()),
    }
}

pub(super) fn filter_arg(filter: &Option<MetadataFilter>) -> Result<Option<Value>, Failure> {
    match filter {
        None => Ok(None),
        Some(f) => {
            validate_filter(f)
                .map_err(|e| Failure::from(ToolError::validation(e.field, e.message)))?;
            tracing::debug!(filter = ?f, "applying metadata filter");
            Ok(Some(Value::Object(f.clone())))
        }
    }
}

pub(super) fn non_empty(fields: &Option<Vec<String>>) -> Option<Vec<String>> {
    fields.clone().filter(|f| !f.is_empty())
}

pub(super) fn expires_at_iso(remaining: std::time::Duration) -> String {
    let delta = chrono::Duration::from_std(remaining).unwrap_or_else(|_| chrono::Duration::zero());
    (chrono::Utc::now() + delta).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl PineconeServer {
    pub(super) fn failed(&self, failure: Failure, tool: &str, fallback: &str) -> Failed {
        Failed(failure.into_tool_error(tool, fallback, self.state.config.error_details))
    }

    fn audit(&self, tool: &str, source: &Source) {
        if self.state.registry.is_multi() {
            tracing::info!(
                tool,
                source = source.name(),
                "{tool} [source={}]",
                source.name()
            );
        }
    }

    async fn resolve(&self, source: Option<&str>, namespace: &str) -> Result<&Source, Failure> {
        self.state.registry.resolve(source, namespace).await
    }

    /// The source of a gated tool's call on `namespace`, once the gate
    /// lets it through; the call is audited.
    async fn scope(
        &self,
        tool: &str,
        source: Option<&str>,
        namespace: &str,
    ) -> Result<&Source, Failure> {
        let source = self.resolve(source, namespace).await?;
        let key = self.state.registry.gate_key(source, namespace);
        self.state.gate.check(&key, namespace)?;
        self.audit(tool, source);
        Ok(source)
    }

    /// `top_k`: 1 to 100, the configured default when omitted.
    pub(super) fn top_k(&self, top_k: Option<i64>) -> Result<u32, Failure> {
        in_range("top_k", top_k, self.state.config.default_top_k, 1, 100)
    }

    /// [`Self::missing_namespace`] when `nothing` matched.
    async fn hint(&self, nothing: bool, source: &Source, namespace: &str) -> Option<String> {
        if nothing {
            self.missing_namespace(source, namespace).await
        } else {
            None
        }
    }

    /// When nothing matched: a hint if `namespace` is not one discovery
    /// knows on `source` (with one key any name is accepted and simply
    /// finds nothing), naming the namespaces that exist.
    async fn missing_namespace(&self, source: &Source, namespace: &str) -> Option<String> {
        let view = self.state.registry.namespaces(Some(source)).await.ok()?;
        if view.rows().iter().any(|r| r.name.trim() == namespace) {
            return None;
        }
        let mut names: Vec<&str> = view.rows().iter().map(|r| r.name.trim()).collect();
        names.sort_unstable();
        names.dedup();
        let shown = names.len().min(MAX_NAMES_IN_HINT);
        let more = if names.len() > shown {
            format!(" (and {} more; see list_namespaces)", names.len() - shown)
        } else {
            String::new()
        };
        Some(if names.is_empty() {
            format!("Namespace \"{namespace}\" does not exist: this index has no namespaces.")
        } else {
            format!(
                "Namespace \"{namespace}\" does not exist, so nothing matched. Existing namespaces: {}{more}.",
                names[..shown].join(", ")
            )
        })
    }

    fn shown(&self, source: &Source) -> Option<String> {
        self.state.registry.shown(source).map(str::to_owned)
    }

    /// The `list_namespaces` output as its JSON text. Of one source, what
    /// follows the expiry (`"count"` on) depends only on the cache entry:
    /// it is written once per entry and reused while the entry lives.
    pub(super) async fn do_list_namespaces(
        &self,
        args: ListNamespacesArgs,
    ) -> Result<serde_json::Result<String>, Failure> {
        let source = self.state.registry.named(args.source.as_deref())?;
        if let Some(s) = source {
            tracing::info!("list_namespaces [source={}]", s.name());
        }
        let view = self.state.registry.namespaces(source).await?;
        let output = ListNamespacesOutput {
            status: Status::Success,
            cache_hit: view.cache_hit,
            cache_ttl_seconds: view.remaining.as_secs(),
            // Of one cache entry, its expiry is written once.
            expires_at_iso: match view.cached() {
                Some(cached) => cached.expiry(|| expires_at_iso(view.remaining)).to_owned(),
                None => expires_at_iso(view.remaining),
            },
            count: view.rows().len(),
            source_errors: (!view.source_errors.is_empty()).then_some(&view.source_errors),
            config_warnings: listing::config_warnings(view.warnings()),
            namespaces: view.rows(),
        };
        let tail = view
            .cached()
            .and_then(|cached| cached.listing(|| listing::tail(&output)));
        Ok(match tail {
            Some(tail) => {
                // Over stdio the kept part is written with its kept escaping.
                expect_suffix(tail);
                listing::text(&output, tail.raw())
            }
            None => serde_json::to_string(&output),
        })
    }

    pub(super) async fn do_namespace_router(
        &self,
        args: NamespaceRouterArgs,
    ) -> Result<NamespaceRouterOutput, Failure> {
        let user_query = user_query_arg(&args.user_query)?;
        let top_n = in_range("top_n", args.top_n, 3, 1, 5)? as usize;
        let source = self.state.registry.named(args.source.as_deref())?;
        if let Some(s) = source {
            tracing::info!("namespace_router [source={}]", s.name());
        }
        let view = self.state.registry.namespaces(source).await?;
        let mut ranked = rank(&user_query, view.rows());
        let recommended = recommend(&ranked).cloned();
        ranked.truncate(top_n);
        Ok(NamespaceRouterOutput {
            status: Status::Success,
            cache_hit: view.cache_hit,
            user_query,
            suggestions: ranked,
            recommended_namespace: recommended.as_ref().map(|r| r.namespace.clone()),
            recommended_source: recommended.and_then(|r| r.source),
        })
    }

    pub(super) async fn do_suggest(
        &self,
        args: SuggestQueryParamsArgs,
    ) -> Result<SuggestQueryParamsOutput, Failure> {
        let user_query = user_query_arg(&args.user_query)?;
        let namespace = namespace_arg(&args.namespace)?;
        let registry = &self.state.registry;
        let resolved = if registry.is_multi() {
            Some(self.resolve(args.source.as_deref(), &namespace).await?)
        } else {
            registry.named(args.source.as_deref())?
        };
        let view = registry.namespaces(resolved).await?;
        let row = find_row(view.rows(), &namespace, resolved);
        let suggestion = suggest(row.map(|r| &r.metadata_fields), &user_query);
        if suggestion.namespace_found
            && let Some(source) = resolved.or_else(|| registry.default_source())
        {
            self.state.gate.mark(&registry.gate_key(source, &namespace));
        }
        Ok(SuggestQueryParamsOutput {
            status: Status::Success,
            cache_hit: view.cache_hit,
            source: resolved.and_then(|s| self.shown(s)),
            suggested_fields: suggestion.suggested_fields,
            use_count_tool: suggestion.use_count_tool,
            recommended_tool: suggestion.recommended_tool,
            explanation: suggestion.explanation.to_owned(),
            namespace_found: suggestion.namespace_found,
        })
    }

    pub(super) async fn do_count(&self, args: CountArgs) -> Result<CountOutput, Failure> {
        let namespace = namespace_arg(&args.namespace)?;
        let text = query_text_arg(&args.query_text, "query_text cannot be empty")?;
        let filter = filter_arg(&args.metadata_filter)?;
        let source = self
            .scope("count", args.source.as_deref(), &namespace)
            .await?;
        let spec = SearchSpec {
            text: &text,
            top_k: search::COUNT_TOP_K,
            namespace: &namespace,
            filter: filter.as_ref(),
            fields: None,
        };
        let counted = search::count(source.indexes(), &spec).await?;
        let hint = self.hint(counted.count == 0, source, &namespace).await;
        Ok(CountOutput {
            status: Status::Success,
            count: counted.count,
            truncated: counted.truncated,
            namespace,
            source: self.shown(source),
            metadata_filter: args.metadata_filter,
            hint,
        })
    }

    pub(super) async fn do_query(&self, args: QueryArgs) -> Result<QueryOutput, Failure> {
        let text = query_text_arg(&args.query_text, "Query text cannot be empty")?;
        let filter = filter_arg(&args.metadata_filter)?;
        let namespace = namespace_arg(&args.namespace)?;
        let top_k = self.top_k(args.top_k)?;
        let source = self
            .scope("query", args.source.as_deref(), &namespace)
            .await?;
        let preset = args.preset.unwrap_or(Preset::Full);
        // Reranked by default only where the source has a model: a call
        // that did not ask is not told about a model nobody configured.
        let rerank_default = source.indexes().rerank_model.is_some();
        let (mode, fields, rerank) = match preset {
            Preset::Fast => (
                Mode::QueryFast,
                Some(
                    non_empty(&args.fields)
                        .unwrap_or_else(|| FAST_FIELDS.map(str::to_owned).to_vec()),
                ),
                false,
            ),
            Preset::Detailed => (
                Mode::QueryDetailed,
                non_empty(&args.fields),
                args.use_reranking.unwrap_or(rerank_default),
            ),
            Preset::Full => (
                Mode::Query,
                non_empty(&args.fields),
                args.use_reranking.unwrap_or(rerank_default),
            ),
        };
        let spec = SearchSpec {
            text: &text,
            top_k,
            namespace: &namespace,
            filter: filter.as_ref(),
            fields: fields.clone(),
        };
        let outcome = search::hybrid(source.indexes(), &spec, rerank).await?;
        let shown = self.shown(source);
        let results: Vec<_> = outcome
            .hits
            .iter()
            .map(|h| row(h, outcome.reranked, shown.as_deref(), None))
            .collect();
        let hint = self.hint(results.is_empty(), source, &namespace).await;
        Ok(QueryOutput {
            status: Status::Success,
            mode,
            query: args.query_text,
            namespace,
            source: shown,
            metadata_filter: args.metadata_filter,
            result_count: results.len(),
            fields,
            results,
            experimental: Experimental::of(&outcome),
            hint,
        })
    }

    pub(super) async fn do_keyword(
        &self,
        args: KeywordSearchArgs,
    ) -> Result<KeywordSearchOutput, Failure> {
        let text = query_text_arg(&args.query_text, "Query text cannot be empty")?;
        let namespace = checked_namespace(trimmed_required(
            &args.namespace,
            "namespace",
            "Namespace cannot be empty",
        )?)?;
        let filter = filter_arg(&args.metadata_filter)?;
        let top_k = self.top_k(args.top_k)?;
        let source = self.resolve(args.source.as_deref(), &namespace).await?;
        self.audit("keyword_search", source);
        let fields = non_empty(&args.fields);
        let spec = SearchSpec {
            text: &text,
            top_k,
            namespace: &namespace,
            filter: filter.as_ref(),
            fields: fields.clone(),
        };
        let hits = search::keyword(source.indexes(), &spec).await?;
        let shown = self.shown(source);
        let results: Vec<_> = hits
            .iter()
            .map(|h| row(h, false, shown.as_deref(), None))
            .collect();
        Ok(KeywordSearchOutput {
            status: Status::Success,
            query: text,
            namespace,
            source: shown,
            index: source.config.sparse_index_name.clone(),
            metadata_filter: args.metadata_filter,
            result_count: results.len(),
            results,
            fields,
        })
    }

    pub(super) async fn do_query_documents(
        &self,
        args: QueryDocumentsArgs,
    ) -> Result<QueryDocumentsOutput, Failure> {
        let text = query_text_arg(&args.query_text, "query_text cannot be empty")?;
        let filter = filter_arg(&args.metadata_filter)?;
        let namespace = namespace_arg(&args.namespace)?;
        let top_k = in_range("top_k", args.top_k, 5, 1, 20)?;
        let max_chunks = in_range(
            "max_chunks_per_document",
            args.max_chunks_per_document,
            200,
            1,
            500,
        )?;
        let source = self
            .scope("query_documents", args.source.as_deref(), &namespace)
            .await?;
        let spec = SearchSpec {
            text: &text,
            top_k: (top_k * CHUNKS_PER_DOCUMENT).min(MAX_DOCUMENT_CHUNKS),
            namespace: &namespace,
            filter: filter.as_ref(),
            fields: None,
        };
        // Reranked when asked, or by default when the source has a model:
        // a source without one is not told so on every call.
        let rerank = args
            .use_reranking
            .unwrap_or(source.indexes().rerank_model.is_some());
        let outcome = search::hybrid(source.indexes(), &spec, rerank).await?;
        let documents = reassemble(&outcome.hits, top_k as usize, max_chunks as usize);
        Ok(QueryDocumentsOutput {
            status: Status::Success,
            query: text,
            namespace,
            source: self.shown(source),
            metadata_filter: args.metadata_filter,
            result_count: documents.len(),
            documents,
            experimental: Experimental::of(&outcome),
        })
    }

    fn no_source(&self) -> Failure {
        ToolError::new(
            ToolErrorCode::Lifecycle,
            "No Pinecone source is configured.",
            false,
        )
        .into()
    }

    pub(super) async fn do_generate_urls(
        &self,
        args: GenerateUrlsArgs,
    ) -> Result<GenerateUrlsOutput, Failure> {
        let namespace = namespace_arg(&args.namespace)?;
        if args.records.len() > MAX_URL_RECORDS {
            return Err(ToolError::validation(
                "records",
                format!("records must contain at most {MAX_URL_RECORDS} items."),
            )
            .into());
        }
        let source = self.resolve(args.source.as_deref(), &namespace).await?;
        let multi = self.state.registry.is_multi().then(|| source.name());
        let results = args
            .records
            .into_iter()
            .enumerate()
            .map(|(index, record)| {
                let metadata = match record.get("metadata") {
                    Some(Value::Object(m)) => m.clone(),
                    _ => record,
                };
                let resolution = self.state.urls.resolve(&namespace, &metadata, multi);
                UrlRow {
                    index,
                    url: resolution.url,
                    method: resolution.method,
                    reason: resolution.reason,
                    metadata,
                }
            })
            .collect::<Vec<_>>();
        Ok(GenerateUrlsOutput {
            status: Status::Success,
            namespace,
            count: results.len(),
            results,
        })
    }
}

/// The discovered row for `namespace`; in single-key mode rows carry no
/// source and belong to the only source.
pub(super) fn find_row<'a>(
    rows: &'a [NamespaceRow],
    namespace: &str,
    source: Option<&Source>,
) -> Option<&'a NamespaceRow> {
    rows.iter().find(|r| {
        r.name.trim() == namespace
            && match (&r.source, source) {
                (Some(row_source), Some(s)) => row_source == s.name(),
                _ => true,
            }
    })
}
