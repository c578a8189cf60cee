//! Retrieval: hybrid search (dense + sparse, fused, optionally reranked),
//! keyword (sparse-only) search and the document count.

use std::collections::HashSet;

use serde_json::Value;

use super::client::{
    PineconeClient, PineconeError, RerankDocument, SearchInputs, SearchQuery, SearchRequest,
};
use super::fusion::{Hit, fuse};

/// Most documents sent in one rerank request (the model limit of
/// `bge-reranker-v2-m3`); larger lists are reranked in batches.
pub(super) const RERANK_BATCH: usize = 100;
/// Chunks fetched by `count`.
pub(super) const COUNT_TOP_K: u32 = 10_000;
/// Identifier fields `count` groups by, in priority order.
pub(super) const COUNT_FIELDS: [&str; 3] = ["document_number", "url", "doc_id"];
/// Reason given when reranking was asked for but the source has no model:
/// what happened, for the model reading it (how to configure one is the
/// operator's business, in the documentation).
pub(super) const NO_MODEL_REASON: &str =
    "rerank_skipped_no_model: this source has no reranking model; results are in fused order.";

/// The indexes of one source.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Indexes<'a> {
    /// Client of the source's project.
    pub client: &'a PineconeClient,
    /// Dense index.
    pub dense: &'a str,
    /// Sparse index.
    pub sparse: &'a str,
    /// Rerank model, if any.
    pub rerank_model: Option<&'a str>,
}

/// A search the tools ask for.
#[derive(Debug, Clone)]
pub(super) struct SearchSpec<'a> {
    /// Trimmed query text.
    pub text: &'a str,
    /// Hits wanted.
    pub top_k: u32,
    /// Trimmed namespace.
    pub namespace: &'a str,
    /// Validated metadata filter.
    pub filter: Option<&'a Value>,
    /// Fields to return (`None`: all).
    pub fields: Option<Vec<String>>,
}

/// A search failure.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum SearchError {
    /// One search call failed.
    #[error("Pinecone search failed for namespace \"{namespace}\": {source}")]
    Search {
        /// Namespace searched.
        namespace: String,
        /// The failure.
        source: PineconeError,
    },
    /// Both hybrid legs failed (neither timed out).
    #[error("Hybrid search failed: both dense and sparse index searches failed. Dense: {dense}")]
    BothLegs {
        /// The dense failure.
        dense: PineconeError,
        /// The sparse failure.
        sparse: PineconeError,
    },
}

impl SearchError {
    /// True when a deadline passed.
    pub(crate) fn is_timeout(&self) -> bool {
        match self {
            SearchError::Search { source, .. } => source.is_timeout(),
            SearchError::BothLegs { .. } => false,
        }
    }

    /// Whether Pinecone refused the key (401 or 403).
    pub(crate) fn key_refused(&self) -> bool {
        match self {
            SearchError::Search { source, .. } => matches!(source.status(), Some(401 | 403)),
            SearchError::BothLegs { dense, .. } => matches!(dense.status(), Some(401 | 403)),
        }
    }
}

/// Which hybrid leg failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum Leg {
    /// The dense index.
    Dense,
    /// The sparse index.
    Sparse,
}

/// What happened to reranking.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RerankOutcome {
    /// Rows carry rerank scores.
    Reranked,
    /// The caller did not ask for it.
    NotRequested,
    /// Asked for, but no model is configured.
    NoModel,
    /// Nothing was retrieved, so nothing was sent.
    NothingToRerank,
    /// The rerank call failed (redacted message); rows are fused order.
    Failed(String),
}

/// The outcome of a hybrid search.
#[derive(Debug, Clone)]
pub(super) struct HybridOutcome {
    /// Result rows, best first.
    pub hits: Vec<Hit>,
    /// Whether `hits` carry rerank scores.
    pub reranked: bool,
    /// The leg that failed, if one did.
    pub leg_failed: Option<Leg>,
    /// What happened to reranking.
    pub rerank: RerankOutcome,
    /// Low confidence: rerank failed, or a leg failed and the other found nothing.
    pub degraded: bool,
    /// Why (`rerank_failed: …`, `dense_leg_failed`, `rerank_skipped_no_model: …`).
    pub degradation_reason: Option<String>,
}

async fn search_leg(
    client: &PineconeClient,
    index: &str,
    spec: &SearchSpec<'_>,
    top_k: u32,
    fields: Option<Vec<String>>,
) -> Result<Vec<Hit>, SearchError> {
    let request = SearchRequest {
        query: SearchQuery {
            top_k,
            inputs: SearchInputs {
                text: spec.text.to_owned(),
            },
            filter: spec.filter.cloned(),
        },
        fields,
    };
    client
        .search_records(index, spec.namespace, &request)
        .await
        .map(|hits| hits.into_iter().map(Hit::from).collect())
        .map_err(|source| SearchError::Search {
            namespace: if spec.namespace.is_empty() {
                "default".to_owned()
            } else {
                spec.namespace.to_owned()
            },
            source,
        })
}

/// Runs the dense and sparse searches concurrently, fuses them, and reranks
/// when `rerank` is asked for and a model is configured.
///
/// # Errors
/// When both legs fail.
pub(super) async fn hybrid(
    indexes: Indexes<'_>,
    spec: &SearchSpec<'_>,
    rerank: bool,
) -> Result<HybridOutcome, SearchError> {
    let model = indexes.rerank_model.filter(|_| rerank);
    let mut fields = spec.fields.clone().filter(|f| !f.is_empty());
    if let Some(f) = fields.as_mut()
        && model.is_some()
        && !f.iter().any(|x| x == "chunk_text")
    {
        // The reranker reads chunk_text.
        f.push("chunk_text".to_owned());
    }
    let (dense, sparse, leg_failed) = both_legs(indexes, spec, fields).await?;
    let (n_dense, n_sparse) = (dense.len(), sparse.len());
    let survivor_empty = n_dense + n_sparse == 0;
    let merged = fuse(dense, sparse);
    let top_k = spec.top_k as usize;
    let mut outcome = HybridOutcome {
        hits: Vec::new(),
        reranked: false,
        leg_failed,
        rerank: RerankOutcome::NotRequested,
        degraded: false,
        degradation_reason: None,
    };
    match model {
        Some(_) if merged.is_empty() => outcome.rerank = RerankOutcome::NothingToRerank,
        Some(model) => match rerank_batched(indexes.client, model, spec.text, &merged, top_k).await
        {
            Ok(hits) => {
                outcome.hits = hits;
                outcome.reranked = true;
                outcome.rerank = RerankOutcome::Reranked;
            }
            Err(e) => {
                tracing::error!(error = %e, "error reranking results");
                let message = e.to_string();
                outcome.hits = merged.into_iter().take(top_k).collect();
                outcome.degraded = true;
                outcome.degradation_reason = Some(format!("rerank_failed: {message}"));
                outcome.rerank = RerankOutcome::Failed(message);
            }
        },
        None => {
            outcome.hits = merged.into_iter().take(top_k).collect();
            if rerank {
                outcome.rerank = RerankOutcome::NoModel;
                outcome.degradation_reason = Some(NO_MODEL_REASON.to_owned());
            }
        }
    }
    if let Some(leg) = leg_failed
        && survivor_empty
    {
        outcome.degraded = true;
        outcome.degradation_reason = Some(
            match leg {
                Leg::Dense => "dense_leg_failed",
                Leg::Sparse => "sparse_leg_failed",
            }
            .to_owned(),
        );
    }
    tracing::info!(
        dense = n_dense,
        sparse = n_sparse,
        returned = outcome.hits.len(),
        "hybrid search"
    );
    Ok(outcome)
}

/// The dense and sparse searches, run together: both legs' hits, or one
/// leg's with the other marked failed; an error when both fail (a timeout
/// first).
async fn both_legs(
    indexes: Indexes<'_>,
    spec: &SearchSpec<'_>,
    fields: Option<Vec<String>>,
) -> Result<(Vec<Hit>, Vec<Hit>, Option<Leg>), SearchError> {
    let (dense, sparse) = tokio::join!(
        search_leg(
            indexes.client,
            indexes.dense,
            spec,
            spec.top_k,
            fields.clone()
        ),
        search_leg(indexes.client, indexes.sparse, spec, spec.top_k, fields),
    );
    match (dense, sparse) {
        (Ok(d), Ok(s)) => Ok((d, s, None)),
        (Ok(d), Err(e)) => {
            tracing::error!(error = %e, "sparse index search failed");
            Ok((d, Vec::new(), Some(Leg::Sparse)))
        }
        (Err(e), Ok(s)) => {
            tracing::error!(error = %e, "dense index search failed");
            Ok((Vec::new(), s, Some(Leg::Dense)))
        }
        (Err(d), Err(s)) => {
            if d.is_timeout() {
                return Err(d);
            }
            if s.is_timeout() {
                return Err(s);
            }
            let (
                SearchError::Search { source: dense, .. },
                SearchError::Search { source: sparse, .. },
            ) = (d.clone(), s.clone())
            else {
                return Err(d);
            };
            Err(SearchError::BothLegs { dense, sparse })
        }
    }
}

/// Reranks `hits` in batches of at most [`RERANK_BATCH`], sending only id and
/// text, and keeps the best `top_n` by rerank score.
async fn rerank_batched(
    client: &PineconeClient,
    model: &str,
    query: &str,
    hits: &[Hit],
    top_n: usize,
) -> Result<Vec<Hit>, PineconeError> {
    let batches = hits
        .chunks(RERANK_BATCH)
        .enumerate()
        .map(|(b, batch)| async move {
            let documents: Vec<RerankDocument> = batch
                .iter()
                .map(|h| RerankDocument {
                    id: h.id.clone(),
                    chunk_text: h.content.clone(),
                })
                .collect();
            let ranked = client
                .rerank(model, query, &documents, top_n.min(batch.len()))
                .await?;
            Ok::<_, PineconeError>(
                ranked
                    .into_iter()
                    .filter(|r| r.index < batch.len())
                    .map(|r| (b * RERANK_BATCH + r.index, r.score))
                    .collect::<Vec<_>>(),
            )
        });
    let mut scored: Vec<(usize, f64)> = Vec::new();
    for batch in futures::future::join_all(batches).await {
        scored.extend(batch?);
    }
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(scored
        .into_iter()
        .take(top_n)
        .filter_map(|(i, score)| hits.get(i).map(|h| Hit { score, ..h.clone() }))
        .collect())
}

/// Searches the sparse index only.
///
/// # Errors
/// When the search fails.
pub(super) async fn keyword(
    indexes: Indexes<'_>,
    spec: &SearchSpec<'_>,
) -> Result<Vec<Hit>, SearchError> {
    let fields = spec.fields.clone().filter(|f| !f.is_empty());
    let hits = search_leg(indexes.client, indexes.sparse, spec, spec.top_k, fields).await?;
    tracing::info!(count = hits.len(), index = indexes.sparse, "keyword search");
    Ok(hits)
}

/// Distinct documents among up to [`COUNT_TOP_K`] matching chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DocumentCount {
    /// Distinct document keys.
    pub count: usize,
    /// True when the chunk limit was reached (more documents may exist).
    pub truncated: bool,
}

/// Counts distinct documents on the dense index.
///
/// # Errors
/// When the search fails.
pub(super) async fn count(
    indexes: Indexes<'_>,
    spec: &SearchSpec<'_>,
) -> Result<DocumentCount, SearchError> {
    let fields = Some(COUNT_FIELDS.iter().map(|f| (*f).to_owned()).collect());
    let hits = search_leg(indexes.client, indexes.dense, spec, COUNT_TOP_K, fields).await?;
    Ok(count_documents(&hits, spec.namespace))
}

/// Counts distinct document keys: the first identifier field holding a
/// string, else the record id.
pub(super) fn count_documents(hits: &[Hit], namespace: &str) -> DocumentCount {
    let mut keys: HashSet<String> = HashSet::new();
    let mut fallbacks = 0usize;
    for hit in hits {
        let key = COUNT_FIELDS
            .iter()
            .find_map(|f| hit.metadata.get(*f).and_then(Value::as_str));
        match key {
            Some(k) => keys.insert(format!("k:{k}")),
            None => {
                fallbacks += 1;
                keys.insert(format!("id:{}", hit.id))
            }
        };
    }
    if fallbacks > 0 {
        tracing::warn!(
            fallbacks,
            namespace,
            "count(): hits had none of the identifier fields (document_number, url, doc_id); fell back to chunk id, the result may overcount documents"
        );
    }
    DocumentCount {
        count: keys.len(),
        truncated: hits.len() >= COUNT_TOP_K as usize,
    }
}
