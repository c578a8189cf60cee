//! `guided_query`'s work: route the question to a namespace (or take the
//! one given), pick the tool its wording and the namespace's fields
//! suggest, run it, and trace each decision.

use serde_json::Value;

use crate::mcp::pinecone::args::{GuidedQueryArgs, MetadataFilter, PreferredTool};
use crate::mcp::pinecone::config::SourceMode;
use crate::mcp::pinecone::discovery::NamespaceRow;
use crate::mcp::pinecone::failure::Failure;
use crate::mcp::pinecone::format::{Enrich, row};
use crate::mcp::pinecone::output::{
    CountTool, DecisionTrace, Experimental, GuidedCount, GuidedExperimental, GuidedQueryOutput,
    GuidedResult, Mode, QueryOutput, RerankStatus, Status,
};
use crate::mcp::pinecone::router::{RouteSuggestion, rank, recommend};
use crate::mcp::pinecone::search::{self, SearchSpec};
use crate::mcp::pinecone::server::PineconeServer;
use crate::mcp::pinecone::sources::Source;
use crate::mcp::pinecone::suggest::{FAST_FIELDS, SuggestedTool, suggest};
use crate::mcp::{ToolError, ToolErrorCode};

use super::{checked_namespace, filter_arg, find_row, trimmed_required, user_query_arg};

/// Router rows shown in the `guided_query` trace.
const TRACE_ROWS: usize = 3;

impl PineconeServer {
    /// `guided_query`: the checks of its arguments, then each step in turn.
    pub(in crate::mcp::pinecone) async fn do_guided(
        &self,
        args: GuidedQueryArgs,
    ) -> Result<GuidedQueryOutput, Failure> {
        let text = user_query_arg(&args.user_query)?;
        let filter = filter_arg(&args.metadata_filter)?;
        let top_k = self.top_k(args.top_k)?;
        let registry = &self.state.registry;
        let named = registry.named(args.source.as_deref())?;
        let view = registry.namespaces(named).await?;
        let ranked = rank(&text, view.rows());
        let routed = recommend(&ranked).cloned();
        let (namespace, source) = match args.namespace.as_deref() {
            Some(raw) => self.guided_namespace(raw, args.source.as_deref()).await?,
            None => self.routed_namespace(routed.as_ref(), &ranked, view.rows(), named)?,
        };
        let Some(found) = find_row(view.rows(), &namespace, Some(source)) else {
            return Err(ToolError::validation(
                "namespace",
                format!("Namespace \"{namespace}\" not found in cached namespaces. Call list_namespaces and retry."),
            )
            .with_suggestion("Use a namespace name returned by list_namespaces, then call list_namespaces again if the cache is stale.")
            .into());
        };
        let suggestion = suggest(Some(&found.metadata_fields), &text);
        let selected = match args.preferred_tool.unwrap_or_default() {
            PreferredTool::Auto => suggestion.recommended_tool,
            PreferredTool::Count => SuggestedTool::Count,
            PreferredTool::Fast => SuggestedTool::Fast,
            PreferredTool::Detailed => SuggestedTool::Detailed,
            PreferredTool::Full => SuggestedTool::Full,
        };
        self.state.gate.mark(&registry.gate_key(source, &namespace));
        self.audit("guided_query", source);
        let enrich_urls = args.enrich_urls.unwrap_or(true);
        let search = GuidedSearch {
            source,
            text: &text,
            namespace: &namespace,
            filter: filter.as_ref(),
            top_k,
            enrich_urls,
        };
        let (result, rerank_status) = if selected == SuggestedTool::Count {
            self.guided_count(&search, args.metadata_filter).await?
        } else {
            let fields = &suggestion.suggested_fields;
            self.guided_search(&search, selected, fields, args.metadata_filter)
                .await?
        };
        Ok(GuidedQueryOutput {
            status: Status::Success,
            result,
            experimental: GuidedExperimental {
                decision_trace: DecisionTrace {
                    cache_hit: view.cache_hit,
                    input_namespace: args.namespace,
                    routed_namespace: routed.map(|r| r.namespace),
                    selected_namespace: namespace,
                    selected_source: (self.state.config.mode == SourceMode::Sources)
                        .then(|| source.name().to_owned()),
                    ranked_namespaces: ranked.into_iter().take(TRACE_ROWS).collect(),
                    suggested_fields: suggestion.suggested_fields,
                    suggested_tool: suggestion.recommended_tool,
                    selected_tool: selected,
                    explanation: suggestion.explanation.to_owned(),
                    enrich_urls,
                    rerank_status,
                },
            },
        })
    }

    /// The namespace `guided_query` was given (trimmed and checked), and
    /// the source holding it.
    async fn guided_namespace(
        &self,
        raw: &str,
        source: Option<&str>,
    ) -> Result<(String, &Source), Failure> {
        let namespace = checked_namespace(trimmed_required(
            raw,
            "namespace",
            "namespace cannot be empty",
        )?)?;
        let source = self.resolve(source, &namespace).await?;
        Ok((namespace, source))
    }

    /// The namespace the router picked for `guided_query`, and its source
    /// (the one named, else the default); an error listing the best
    /// candidates when no namespace matches well enough.
    fn routed_namespace<'a>(
        &'a self,
        routed: Option<&RouteSuggestion>,
        ranked: &[RouteSuggestion],
        rows: &[NamespaceRow],
        named: Option<&'a Source>,
    ) -> Result<(String, &'a Source), Failure> {
        let registry = &self.state.registry;
        let Some(pick) = routed else {
            if rows.is_empty() {
                return Err(ToolError::new(
                    ToolErrorCode::PineconeError,
                    "No namespace available. Please run list_namespaces and verify index data.",
                    true,
                )
                .with_suggestion(
                    "Call list_namespaces to confirm the index has namespaces, then retry.",
                )
                .into());
            }
            let candidates: Vec<&str> = ranked
                .iter()
                .take(TRACE_ROWS)
                .map(|r| r.namespace.as_str())
                .collect();
            return Err(ToolError::validation(
                "namespace",
                format!(
                    "No namespace matches the question well enough to choose one. Candidates: {}.",
                    candidates.join(", ")
                ),
            )
            .with_suggestion("Pass namespace explicitly (see namespace_router or list_namespaces).")
            .into());
        };
        let source = match pick.source.as_deref() {
            Some(s) => registry.named(Some(s))?,
            None => named,
        };
        let source = match source.or_else(|| registry.default_source()) {
            Some(s) => s,
            None => return Err(self.no_source()),
        };
        Ok((pick.namespace.trim().to_owned(), source))
    }

    /// `guided_query`'s count: the matches of the query and filter.
    async fn guided_count(
        &self,
        search: &GuidedSearch<'_>,
        metadata_filter: Option<MetadataFilter>,
    ) -> Result<(GuidedResult, RerankStatus), Failure> {
        let spec = SearchSpec {
            text: search.text,
            top_k: search::COUNT_TOP_K,
            namespace: search.namespace,
            filter: search.filter,
            fields: None,
        };
        let counted = search::count(search.source.indexes(), &spec).await?;
        let result = GuidedResult::Count(GuidedCount {
            tool: CountTool::Count,
            namespace: search.namespace.to_owned(),
            source: self.shown(search.source),
            query: search.text.to_owned(),
            metadata_filter,
            count: counted.count,
            truncated: counted.truncated,
        });
        Ok((result, RerankStatus::Skipped))
    }

    /// `guided_query`'s search with the `selected` tool: the suggested
    /// fields (a fast search's own when none), reranked unless fast, rows
    /// with links when asked.
    async fn guided_search(
        &self,
        search: &GuidedSearch<'_>,
        selected: SuggestedTool,
        suggested_fields: &[String],
        metadata_filter: Option<MetadataFilter>,
    ) -> Result<(GuidedResult, RerankStatus), Failure> {
        let (source, namespace) = (search.source, search.namespace);
        let shown = self.shown(source);
        let fast = selected == SuggestedTool::Fast;
        let fields = if !suggested_fields.is_empty() {
            Some(suggested_fields.to_vec())
        } else if fast {
            Some(FAST_FIELDS.map(str::to_owned).to_vec())
        } else {
            None
        };
        let spec = SearchSpec {
            text: search.text,
            top_k: search.top_k,
            namespace,
            filter: search.filter,
            fields: fields.clone(),
        };
        let outcome = search::hybrid(source.indexes(), &spec, !fast).await?;
        let enrich = search.enrich_urls.then_some(Enrich {
            urls: &self.state.urls,
            namespace,
            source: self.state.registry.is_multi().then(|| source.name()),
        });
        let results: Vec<_> = outcome
            .hits
            .iter()
            .map(|h| row(h, outcome.reranked, shown.as_deref(), enrich))
            .collect();
        let status = if fast {
            RerankStatus::Skipped
        } else {
            RerankStatus::of(&outcome.rerank)
        };
        let result = GuidedResult::Query(QueryOutput {
            status: Status::Success,
            mode: match selected {
                SuggestedTool::Fast => Mode::QueryFast,
                SuggestedTool::Detailed => Mode::QueryDetailed,
                _ => Mode::Query,
            },
            query: search.text.to_owned(),
            namespace: namespace.to_owned(),
            source: shown,
            metadata_filter,
            result_count: results.len(),
            fields,
            results,
            experimental: Experimental::of(&outcome),
            hint: None,
        });
        Ok((result, status))
    }
}

/// What `guided_query` searches once its namespace is chosen.
struct GuidedSearch<'a> {
    source: &'a Source,
    /// Trimmed question.
    text: &'a str,
    namespace: &'a str,
    /// Validated metadata filter.
    filter: Option<&'a Value>,
    top_k: u32,
    /// Whether result rows get links.
    enrich_urls: bool,
}
