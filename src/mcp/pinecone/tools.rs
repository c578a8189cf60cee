//! The Pinecone tools' MCP definitions: names, descriptions, schemas and
//! annotations, each running its work from `calls` under the request's
//! cancellation.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use tokio_util::sync::CancellationToken;

use super::args::{
    CountArgs, GenerateUrlsArgs, GuidedQueryArgs, KeywordSearchArgs, ListNamespacesArgs,
    NamespaceRouterArgs, QueryArgs, QueryDocumentsArgs, SuggestQueryParamsArgs,
};
use super::calls::{Failed, output_schema, until_cancelled};
use super::output::{
    CountOutput, GenerateUrlsOutput, GuidedQueryOutput, KeywordSearchOutput, ListNamespacesOutput,
    ListSourcesOutput, NamespaceRouterOutput, QueryDocumentsOutput, QueryOutput, SourceEntry,
    Status, SuggestQueryParamsOutput,
};
use super::server::PineconeServer;
use crate::mcp::structured::{Structured, StructuredText};
use crate::mcp::{ToolError, ToolErrorCode};

#[tool_router(router = tool_router, vis = "pub(crate)")]
impl PineconeServer {
    /// Lists the configured sources (multi-source mode only).
    #[tool(
        description = "List the configured Pinecone sources (projects) with their descriptions and the default source. Pass a name as `source` to the other tools.",
        output_schema = output_schema::<ListSourcesOutput>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_sources(&self) -> Result<Structured<ListSourcesOutput>, Failed> {
        let registry = &self.state.registry;
        if !registry.is_multi() {
            return Err(Failed(ToolError::new(
                ToolErrorCode::Lifecycle,
                "list_sources is only available in multi-source mode.",
                false,
            )));
        }
        Ok(Structured(ListSourcesOutput {
            status: Status::Success,
            sources: registry
                .all()
                .iter()
                .map(|s| SourceEntry {
                    name: s.name().to_owned(),
                    description: s.config.description.clone(),
                })
                .collect(),
            default: registry
                .default_source()
                .map(|s| s.name().to_owned())
                .unwrap_or_default(),
        }))
    }

    /// Lists namespaces with record counts and metadata fields.
    #[tool(
        description = "List the namespaces of the index with record counts and metadata field types (cached; see expires_at_iso). Call this first to learn valid namespace names and filterable fields.",
        output_schema = output_schema::<ListNamespacesOutput<'static>>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn list_namespaces(
        &self,
        Parameters(args): Parameters<ListNamespacesArgs>,
        ct: CancellationToken,
    ) -> Result<StructuredText, Failed> {
        until_cancelled(&ct, self.do_list_namespaces(args))
            .await
            .map(StructuredText)
            .map_err(|f| self.failed(f, "list_namespaces", "Failed to list namespaces"))
    }

    /// Ranks namespaces for a question.
    #[tool(
        description = "Rank namespaces by how well the question names them (namespace words and metadata field names). recommended_namespace is null when nothing matches well enough.",
        output_schema = output_schema::<NamespaceRouterOutput>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn namespace_router(
        &self,
        Parameters(args): Parameters<NamespaceRouterArgs>,
        ct: CancellationToken,
    ) -> Result<Structured<NamespaceRouterOutput>, Failed> {
        until_cancelled(&ct, self.do_namespace_router(args))
            .await
            .map(Structured)
            .map_err(|f| self.failed(f, "namespace_router", "Failed to route namespace"))
    }

    /// Suggests tool and fields for a question on a namespace.
    #[tool(
        description = "Suggest which tool (count, fast or detailed query) and which fields fit the user's question on a namespace. Required before query/count/query_documents when the suggest-flow is on.",
        output_schema = output_schema::<SuggestQueryParamsOutput>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn suggest_query_params(
        &self,
        Parameters(args): Parameters<SuggestQueryParamsArgs>,
        ct: CancellationToken,
    ) -> Result<Structured<SuggestQueryParamsOutput>, Failed> {
        until_cancelled(&ct, self.do_suggest(args))
            .await
            .map(Structured)
            .map_err(|f| self.failed(f, "suggest_query_params", "Failed to suggest query params"))
    }

    /// Counts distinct documents.
    #[tool(
        description = "Count distinct documents (by document_number, url, doc_id) among up to 10000 chunks matching the filter. truncated=true means the chunk limit was reached.",
        output_schema = output_schema::<CountOutput>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn count(
        &self,
        Parameters(args): Parameters<CountArgs>,
        ct: CancellationToken,
    ) -> Result<Structured<CountOutput>, Failed> {
        until_cancelled(&ct, self.do_count(args))
            .await
            .map(Structured)
            .map_err(|f| self.failed(f, "count", "Failed to get count"))
    }

    /// Hybrid semantic + keyword search.
    #[tool(
        description = "Hybrid search (dense + sparse, fused, reranked when a model is configured) in a namespace. Presets: fast (identifier fields, no rerank), detailed/full (all fields, rerank). Low-confidence results carry experimental.degraded.",
        output_schema = output_schema::<QueryOutput>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn query(
        &self,
        Parameters(args): Parameters<QueryArgs>,
        ct: CancellationToken,
    ) -> Result<Structured<QueryOutput>, Failed> {
        until_cancelled(&ct, self.do_query(args))
            .await
            .map(Structured)
            .map_err(|f| self.failed(f, "query", "An error occurred while processing your query"))
    }

    /// Keyword search on the sparse index.
    #[tool(
        description = "Keyword (sparse-only) search in a namespace; best for exact terms, identifiers and names.",
        output_schema = output_schema::<KeywordSearchOutput>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn keyword_search(
        &self,
        Parameters(args): Parameters<KeywordSearchArgs>,
        ct: CancellationToken,
    ) -> Result<Structured<KeywordSearchOutput>, Failed> {
        until_cancelled(&ct, self.do_keyword(args))
            .await
            .map(Structured)
            .map_err(|f| self.failed(f, "keyword_search", "Keyword search failed"))
    }

    /// Whole documents reassembled from chunks.
    #[tool(
        description = "Search and return whole documents: matching chunks are grouped by document (document_number, url, doc_id), ordered and merged. merged_content is capped; content_truncated says when.",
        output_schema = output_schema::<QueryDocumentsOutput>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn query_documents(
        &self,
        Parameters(args): Parameters<QueryDocumentsArgs>,
        ct: CancellationToken,
    ) -> Result<Structured<QueryDocumentsOutput>, Failed> {
        until_cancelled(&ct, self.do_query_documents(args))
            .await
            .map(Structured)
            .map_err(|f| {
                self.failed(
                    f,
                    "query_documents",
                    "Failed to query and reassemble documents",
                )
            })
    }

    /// One-shot: route, suggest, run.
    #[tool(
        description = "One call for a question: picks the namespace (or uses the given one), the tool and the fields, runs it and explains the choice in experimental.decision_trace.",
        output_schema = output_schema::<GuidedQueryOutput>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn guided_query(
        &self,
        Parameters(args): Parameters<GuidedQueryArgs>,
        ct: CancellationToken,
    ) -> Result<Structured<GuidedQueryOutput>, Failed> {
        until_cancelled(&ct, self.do_guided(args))
            .await
            .map(Structured)
            .map_err(|f| self.failed(f, "guided_query", "Failed to execute guided query"))
    }

    /// URLs for records.
    #[tool(
        description = "Build a URL for each record (its own url, else the namespace's URL generator); method says how, reason says why none.",
        output_schema = output_schema::<GenerateUrlsOutput>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn generate_urls(
        &self,
        Parameters(args): Parameters<GenerateUrlsArgs>,
        ct: CancellationToken,
    ) -> Result<Structured<GenerateUrlsOutput>, Failed> {
        until_cancelled(&ct, self.do_generate_urls(args))
            .await
            .map(Structured)
            .map_err(|f| self.failed(f, "generate_urls", "Failed to generate URLs"))
    }
}
