//! A typed client for the few Pinecone REST endpoints the tools use:
//! describe index (control plane), describe index stats, records search and
//! vector query (data plane), rerank (inference).
//!
//! Every call has one deadline that covers all its attempts; when it passes,
//! the in-flight request future is dropped, which closes the connection.
//! Retries (429, 5xx, transport errors) happen in this one layer only.
//!
//! # Where the key goes
//!
//! The `Api-Key` header is a custom header, which reqwest keeps on every
//! redirect hop. The HTTP client of [`http_client`] therefore follows only
//! same-origin redirects ([`same_origin_redirects`]); a redirect elsewhere is
//! not followed and the call fails with its 3xx status. The control-plane
//! host and every index host must be `https`, except on loopback (local
//! fakes and proxies); a plain `http` remote host is refused before any
//! request is sent. A namespace of `.` or `..`, or one containing `/`, is
//! refused too ([`check_namespace`]): it would change the request path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::mcp::redact::redact_with;
use crate::query::path_segment;
use crate::transport::for_servers::Backoff;

/// The Pinecone API version sent with every request.
pub(super) const PINECONE_API_VERSION: &str = "2026-04";

/// Retries after the first attempt.
const MAX_RETRIES: u32 = 2;
/// Most redirect hops followed (all within one origin).
const MAX_REDIRECTS: usize = 5;
/// First backoff; doubles per retry (full jitter, see [`Backoff`]).
const BASE_BACKOFF: Duration = Duration::from_millis(250);
/// Longest backoff.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Longest error body kept in a message.
const ERROR_BODY_LIMIT: usize = 300;
/// Largest response body read (a 10 000-hit count answer is a few MiB).
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// A failed Pinecone call. Messages are redacted when the error is built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PineconeError {
    /// The call's deadline passed (the request was cancelled).
    #[error("Timeout after {ms}ms while waiting for {label}")]
    Timeout {
        /// What was being waited for.
        label: String,
        /// The deadline in milliseconds.
        ms: u128,
    },
    /// Pinecone answered with a non-success status.
    #[error("{label} failed with HTTP {status}: {message}")]
    Status {
        /// The call.
        label: String,
        /// HTTP status.
        status: u16,
        /// Pinecone's message (redacted, truncated).
        message: String,
    },
    /// The request could not be sent or the connection broke.
    #[error("{label} failed: {message}")]
    Transport {
        /// The call.
        label: String,
        /// Cause (redacted).
        message: String,
    },
    /// The response body was not what the API describes.
    #[error("{label} returned an unreadable response: {message}")]
    Decode {
        /// The call.
        label: String,
        /// Cause (redacted).
        message: String,
    },
    /// The request was not sent: its target or input is not allowed
    /// (a plain `http` remote host, a namespace that changes the path).
    #[error("{label} refused: {message}")]
    Refused {
        /// The call.
        label: String,
        /// Why.
        message: String,
    },
}

impl PineconeError {
    /// True for a passed deadline.
    pub fn is_timeout(&self) -> bool {
        matches!(self, PineconeError::Timeout { .. })
    }

    /// The HTTP status, when Pinecone answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            PineconeError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            PineconeError::Status { status, .. } => *status == 429 || (500..=599).contains(status),
            PineconeError::Transport { .. } => true,
            PineconeError::Timeout { .. }
            | PineconeError::Decode { .. }
            | PineconeError::Refused { .. } => false,
        }
    }
}

/// Result of a Pinecone call.
pub(super) type PineconeResult<T> = Result<T, PineconeError>;

/// What describe-index tells us.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct IndexDescription {
    /// Data-plane host (with or without scheme).
    pub host: String,
}

/// Namespace counts of an index.
#[derive(Debug, Clone, Default)]
pub(crate) struct IndexStats {
    /// `(namespace, record count)` in the order the API listed them.
    pub namespaces: Vec<(String, u64)>,
    /// Vector dimension, when reported.
    pub dimension: Option<u32>,
}

/// A records-search request.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SearchRequest {
    /// The query part.
    pub query: SearchQuery,
    /// Fields to return; omitted means all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
}

/// The `query` object of a records search.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SearchQuery {
    /// Number of hits.
    pub top_k: u32,
    /// `{"text": ...}` for integrated embedding.
    pub inputs: SearchInputs,
    /// Metadata filter, forwarded verbatim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<Value>,
}

/// Text input of a records search.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SearchInputs {
    /// The query text.
    pub text: String,
}

/// One records-search hit.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SearchHit {
    /// Record id.
    #[serde(rename = "_id", default)]
    pub id: String,
    /// Similarity score.
    #[serde(rename = "_score", default)]
    pub score: f64,
    /// Returned fields.
    #[serde(default)]
    pub fields: Map<String, Value>,
}

#[derive(Deserialize)]
struct SearchResponse {
    #[serde(default)]
    result: Option<SearchResult>,
}

#[derive(Deserialize)]
struct SearchResult {
    #[serde(default)]
    hits: Vec<SearchHit>,
}

/// One vector-query match (metadata sampling).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct QueryMatch {
    /// Record metadata.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
struct QueryResponse {
    #[serde(default)]
    matches: Vec<QueryMatch>,
}

/// A document sent to rerank: only what the model reads.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RerankDocument {
    /// Record id (not ranked; helps when reading request logs).
    #[serde(rename = "_id")]
    pub id: String,
    /// The ranked text.
    pub chunk_text: String,
}

/// One reranked position.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RankedDocument {
    /// Position in the request's `documents`.
    pub index: usize,
    /// Relevance score.
    #[serde(default)]
    pub score: f64,
}

#[derive(Deserialize)]
struct RerankResponse {
    #[serde(default)]
    data: Vec<RankedDocument>,
}

#[derive(Deserialize)]
struct FetchResponse {
    #[serde(default)]
    vectors: Map<String, Value>,
}

#[derive(Deserialize)]
struct StatsResponse {
    #[serde(default)]
    namespaces: Map<String, Value>,
    #[serde(default)]
    dimension: Option<u32>,
}

/// The largest vector dimension believed from Pinecone: its dense indexes
/// allow up to 20,000. A larger figure is refused rather than allocated.
pub(super) const MAX_DIMENSION: u32 = 20_000;

/// A client for one Pinecone project (one API key). Cheap to clone.
#[derive(Clone)]
pub(crate) struct PineconeClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    /// The control-plane base URL, or why it is refused.
    controller: Result<String, String>,
    api_key: SecretString,
    deadline: Duration,
    retries: u32,
    /// Index name -> data-plane base URL, filled by describe-index.
    hosts: Mutex<HashMap<String, String>>,
    /// Whether Pinecone has accepted this client's key (answered a call
    /// with a success status).
    accepted: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for PineconeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PineconeClient")
            .field("controller", &self.inner.controller)
            .field("deadline", &self.inner.deadline)
            .finish_non_exhaustive()
    }
}

/// Builds the shared HTTP client: same-origin redirects only, TCP_NODELAY.
///
/// # Errors
/// When the TLS backend cannot be initialised.
pub fn http_client() -> PineconeResult<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("nexus-knowql/", env!("CARGO_PKG_VERSION")))
        .redirect(same_origin_redirects())
        .tcp_nodelay(true)
        .build()
        .map_err(|e| PineconeError::Transport {
            label: "client setup".to_owned(),
            message: e.to_string(),
        })
}

/// A redirect policy that follows a redirect only within the origin of the
/// request (same scheme, host and port; so never `https` to `http`), at most
/// five hops. Any other redirect is returned as the response, so custom
/// credential headers such as `Api-Key` never reach another origin.
pub fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt
            .previous()
            .last()
            .is_some_and(|from| same_origin(from, attempt.url()));
        if same && attempt.previous().len() <= MAX_REDIRECTS {
            attempt.follow()
        } else {
            if !same {
                tracing::warn!(
                    to = %attempt.url().origin().ascii_serialization(),
                    "not following a redirect to another origin"
                );
            }
            attempt.stop()
        }
    })
}

/// True when `a` and `b` have the same scheme, host and port (the SDK's
/// rule, shared so both clients agree on what an origin is).
pub(super) fn same_origin(a: &url::Url, b: &url::Url) -> bool {
    crate::transport::for_servers::same_origin(a, b)
}

/// True for `localhost`, 127.0.0.0/8 and `::1`.
fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// The base URL for a host as configured or as describe-index reports it:
/// no scheme means `https`; `http` is accepted only for loopback hosts.
///
/// # Errors
/// Why the host is refused (unparsable, another scheme, plain `http` to a
/// remote host, or carrying credentials, a query or a fragment).
pub(super) fn base_url(host: &str) -> Result<String, String> {
    let host = host.trim().trim_end_matches('/');
    let with_scheme = if host.contains("://") {
        host.to_owned()
    } else {
        format!("https://{host}")
    };
    let url = url::Url::parse(&with_scheme)
        .map_err(|e| format!("host {host:?} is not a valid URL: {e}"))?;
    if url.host().is_none() || url.query().is_some() || url.fragment().is_some() {
        return Err(format!("host {host:?} is not a plain host name"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("a host must not carry credentials".to_owned());
    }
    match url.scheme() {
        "https" => {}
        "http" if is_loopback(&url) => {}
        "http" => {
            return Err(format!(
                "host {host:?} uses plain http; only https is allowed outside loopback"
            ));
        }
        other => return Err(format!("host {host:?} has unsupported scheme {other:?}")),
    }
    Ok(with_scheme)
}

/// Checks a namespace that goes into a request path: not empty, not `.` or
/// `..`, no `/`.
///
/// # Errors
/// A message saying why the namespace is refused.
pub(super) fn check_namespace(namespace: &str) -> Result<(), String> {
    if namespace.is_empty() {
        return Err("namespace cannot be empty".to_owned());
    }
    if namespace == "." || namespace == ".." || namespace.contains('/') {
        return Err(format!(
            "namespace {namespace:?} is not valid: \".\", \"..\" and names containing \"/\" are refused"
        ));
    }
    Ok(())
}

impl PineconeClient {
    /// A client for `api_key` talking to `controller` (control plane and
    /// inference); every call gives up after `deadline`.
    pub(crate) fn new(
        http: reqwest::Client,
        controller: impl Into<String>,
        api_key: SecretString,
        deadline: Duration,
    ) -> Self {
        PineconeClient {
            inner: Arc::new(Inner {
                http,
                controller: base_url(&controller.into()),
                api_key,
                deadline,
                retries: MAX_RETRIES,
                hosts: Mutex::new(HashMap::new()),
                accepted: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// A client for the same project that tries each call once (no
    /// retries), with its own host cache: what a startup probe wants.
    pub(crate) fn without_retries(&self) -> Self {
        PineconeClient {
            inner: Arc::new(Inner {
                http: self.inner.http.clone(),
                controller: self.inner.controller.clone(),
                api_key: self.inner.api_key.clone(),
                deadline: self.inner.deadline,
                retries: 0,
                hosts: Mutex::new(HashMap::new()),
                accepted: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// Whether Pinecone has answered one of this client's calls with a
    /// success status: its key is real.
    pub(crate) fn key_accepted(&self) -> bool {
        self.inner
            .accepted
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The control-plane base URL.
    fn controller(&self, label: &str) -> PineconeResult<&str> {
        self.inner
            .controller
            .as_deref()
            .map_err(|why| PineconeError::Refused {
                label: label.to_owned(),
                message: why.clone(),
            })
    }

    fn redact(&self, text: &str) -> String {
        redact_with(text, &[self.inner.api_key.expose_secret()])
    }

    /// Sends one JSON request with the deadline and retries, and decodes the answer.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        label: &str,
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> PineconeResult<T> {
        let attempts = async {
            let mut attempt = 0;
            let mut backoff = Backoff::new(BASE_BACKOFF, 2.0, MAX_BACKOFF, 1.0);
            loop {
                match self.attempt(label, build()).await {
                    Ok(v) => return Ok(v),
                    Err(e) if e.is_retryable() && attempt < self.inner.retries => {
                        tracing::warn!(label, attempt = attempt + 1, error = %e, "retrying Pinecone call");
                        tokio::time::sleep(backoff.next_delay()).await;
                        attempt += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        // Dropping `attempts` on expiry drops the in-flight request: reqwest
        // closes the connection, so nothing keeps running in the background.
        match tokio::time::timeout(self.inner.deadline, attempts).await {
            Ok(result) => result,
            Err(_) => Err(PineconeError::Timeout {
                label: label.to_owned(),
                ms: self.inner.deadline.as_millis(),
            }),
        }
    }

    async fn attempt<T: serde::de::DeserializeOwned>(
        &self,
        label: &str,
        request: reqwest::RequestBuilder,
    ) -> PineconeResult<T> {
        let transport = |e: reqwest::Error| PineconeError::Transport {
            label: label.to_owned(),
            message: self.redact(&e.without_url().to_string()),
        };
        let response = request
            .header("Api-Key", self.inner.api_key.expose_secret())
            .header("X-Pinecone-Api-Version", PINECONE_API_VERSION)
            .send()
            .await
            .map_err(transport)?;
        let status = response.status();
        let mut response = response;
        let mut body: Vec<u8> = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(PineconeError::Decode {
                    label: label.to_owned(),
                    message: format!("response larger than {MAX_RESPONSE_BYTES} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        if status.is_success() {
            self.inner
                .accepted
                .store(true, std::sync::atomic::Ordering::Relaxed);
        } else {
            return Err(PineconeError::Status {
                label: label.to_owned(),
                status: status.as_u16(),
                message: self.redact(&error_message(&body)),
            });
        }
        serde_json::from_slice(&body).map_err(|e| PineconeError::Decode {
            label: label.to_owned(),
            message: self.redact(&e.to_string()),
        })
    }

    /// `GET /indexes/{name}` on the control plane.
    ///
    /// # Errors
    /// Any [`PineconeError`].
    pub(crate) async fn describe_index(&self, index: &str) -> PineconeResult<IndexDescription> {
        let url = format!(
            "{}/indexes/{}",
            self.controller("describeIndex")?,
            path_segment(index)
        );
        self.call("describeIndex", || self.inner.http.get(&url))
            .await
    }

    /// The data-plane base URL of `index` (describe-index once, then cached).
    async fn index_url(&self, index: &str) -> PineconeResult<String> {
        if let Some(url) = self.hosts().get(index) {
            return Ok(url.clone());
        }
        let host = self.describe_index(index).await?.host;
        let url = base_url(&host).map_err(|why| PineconeError::Refused {
            label: "describeIndex".to_owned(),
            message: format!("index {index:?}: {why}"),
        })?;
        self.hosts().insert(index.to_owned(), url.clone());
        Ok(url)
    }

    fn hosts(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        // A poisoned map only ever holds complete entries; keep using it.
        self.inner
            .hosts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `POST /describe_index_stats`.
    ///
    /// # Errors
    /// Any [`PineconeError`].
    pub(crate) async fn describe_index_stats(&self, index: &str) -> PineconeResult<IndexStats> {
        let url = format!("{}/describe_index_stats", self.index_url(index).await?);
        let raw: StatsResponse = self
            .call("describeIndexStats", || {
                self.inner.http.post(&url).json(&serde_json::json!({}))
            })
            .await?;
        let namespaces = raw
            .namespaces
            .into_iter()
            .map(|(name, summary)| {
                let count = summary
                    .get("vectorCount")
                    .or_else(|| summary.get("recordCount"))
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                (name, count)
            })
            .collect();
        if let Some(dimension) = raw.dimension.filter(|d| *d > MAX_DIMENSION) {
            return Err(PineconeError::Decode {
                label: "describeIndexStats".to_owned(),
                message: format!(
                    "the index reports vector dimension {dimension}, more than the {MAX_DIMENSION} this server accepts"
                ),
            });
        }
        Ok(IndexStats {
            namespaces,
            dimension: raw.dimension,
        })
    }

    /// `POST /records/namespaces/{namespace}/search`.
    ///
    /// # Errors
    /// Any [`PineconeError`].
    pub(crate) async fn search_records(
        &self,
        index: &str,
        namespace: &str,
        request: &SearchRequest,
    ) -> PineconeResult<Vec<SearchHit>> {
        check_namespace(namespace).map_err(|message| PineconeError::Refused {
            label: "search".to_owned(),
            message,
        })?;
        let url = format!(
            "{}/records/namespaces/{}/search",
            self.index_url(index).await?,
            path_segment(namespace)
        );
        let raw: SearchResponse = self
            .call("search", || self.inner.http.post(&url).json(request))
            .await?;
        Ok(raw.result.map(|r| r.hits).unwrap_or_default())
    }

    /// `POST /query` with a zero vector, returning metadata (sampling).
    ///
    /// # Errors
    /// Any [`PineconeError`].
    pub(crate) async fn sample_metadata(
        &self,
        index: &str,
        namespace: &str,
        dimension: u32,
        top_k: u32,
    ) -> PineconeResult<Vec<QueryMatch>> {
        if dimension == 0 || dimension > MAX_DIMENSION {
            return Err(PineconeError::Decode {
                label: "sampleNamespaceMetadata".to_owned(),
                message: format!(
                    "the index reports vector dimension {dimension}, outside 1 to {MAX_DIMENSION}"
                ),
            });
        }
        let url = format!("{}/query", self.index_url(index).await?);
        let body = serde_json::json!({
            "namespace": namespace,
            "topK": top_k,
            "vector": vec![0.0_f32; dimension as usize],
            "includeMetadata": true,
            "includeValues": false,
        });
        let raw: QueryResponse = self
            .call("sampleNamespaceMetadata", || {
                self.inner.http.post(&url).json(&body)
            })
            .await?;
        Ok(raw.matches)
    }

    /// `GET /vectors/fetch`: records of `namespace` by id, each flattened to
    /// one field map (top-level fields, then metadata, which wins).
    ///
    /// # Errors
    /// Any [`PineconeError`].
    pub(crate) async fn fetch_records(
        &self,
        index: &str,
        namespace: &str,
        ids: &[&str],
    ) -> PineconeResult<Map<String, Value>> {
        let url = format!("{}/vectors/fetch", self.index_url(index).await?);
        let mut query: Vec<(&str, &str)> = ids.iter().map(|id| ("ids", *id)).collect();
        query.push(("namespace", namespace));
        let raw: FetchResponse = self
            .call("fetchRecordFields", || {
                self.inner.http.get(&url).query(&query)
            })
            .await?;
        Ok(raw
            .vectors
            .into_iter()
            .map(|(id, record)| {
                let mut fields = Map::new();
                if let Value::Object(record) = record {
                    let metadata = record.get("metadata").and_then(Value::as_object).cloned();
                    for (k, v) in record {
                        if !matches!(k.as_str(), "metadata" | "values" | "sparseValues") {
                            fields.insert(k, v);
                        }
                    }
                    fields.extend(metadata.unwrap_or_default());
                }
                (id, Value::Object(fields))
            })
            .collect())
    }

    /// `POST /rerank` on the inference host.
    ///
    /// # Errors
    /// Any [`PineconeError`].
    pub(crate) async fn rerank(
        &self,
        model: &str,
        query: &str,
        documents: &[RerankDocument],
        top_n: usize,
    ) -> PineconeResult<Vec<RankedDocument>> {
        let url = format!("{}/rerank", self.controller("rerank")?);
        let body = serde_json::json!({
            "model": model,
            "query": query,
            "documents": documents,
            "top_n": top_n,
            "return_documents": false,
            "rank_fields": ["chunk_text"],
            "parameters": {"truncate": "END"},
        });
        let raw: RerankResponse = self
            .call("rerank", || self.inner.http.post(&url).json(&body))
            .await?;
        Ok(raw.data)
    }
}

/// Pinecone's error message from either error envelope, else the body start.
fn error_message(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.get("error")
            .and_then(|e| e.get("message"))
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let text = message.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    text.chars().take(ERROR_BODY_LIMIT).collect()
}

#[cfg(test)]
mod tests;
