//! `--check-indexes`: probe every configured index once and report.
//!
//! Each source's dense and sparse index is asked for its stats
//! (describe-index, then describe-index-stats) once, without retries, under
//! the configured request deadline; the probes run concurrently. The caller
//! prints [`IndexProbe::line`] for each and exits 0 only when every index
//! answered ([`IndexProbe::is_reachable`]).

use super::client::{PineconeClient, PineconeError, http_client};
use super::config::{PineconeConfig, SourceMode};
use crate::mcp::redact::redact_with;

/// Which index of a source was probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    /// The dense index.
    Dense,
    /// The sparse index.
    Sparse,
}

/// The outcome of probing one index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexProbe {
    /// The source's name (`[name]` prefixes the line in sources mode).
    pub source: Option<String>,
    /// Dense or sparse.
    pub kind: IndexKind,
    /// The index name.
    pub index: String,
    /// The number of namespaces the index reported, or the redacted error.
    pub outcome: Result<usize, String>,
}

impl IndexProbe {
    /// True when the index answered.
    pub fn is_reachable(&self) -> bool {
        self.outcome.is_ok()
    }

    /// The line to print, e.g. `--check-indexes: [src_b] Sparse index
    /// "kb2-sparse": describeIndexStats failed with HTTP 404: …` or
    /// `--check-indexes: Dense index "kb": reachable (2 namespaces)`.
    pub fn line(&self) -> String {
        let prefix = self
            .source
            .as_deref()
            .map(|s| format!("[{s}] "))
            .unwrap_or_default();
        let kind = match self.kind {
            IndexKind::Dense => "Dense",
            IndexKind::Sparse => "Sparse",
        };
        let outcome = match &self.outcome {
            Ok(1) => "reachable (1 namespace)".to_owned(),
            Ok(n) => format!("reachable ({n} namespaces)"),
            Err(e) => e.clone(),
        };
        format!(
            "--check-indexes: {prefix}{kind} index \"{}\": {outcome}",
            self.index
        )
    }
}

/// Probes the dense and sparse index of every source of `config` once each,
/// in configuration order (dense first), without retries, with the client
/// [`http_client`] builds. An unreachable index is a probe whose
/// [`IndexProbe::is_reachable`] is false, not an error.
///
/// # Errors
/// When the HTTP client cannot be built.
pub async fn check_indexes(config: &PineconeConfig) -> Result<Vec<IndexProbe>, PineconeError> {
    Ok(probe_indexes(config, &http_client()?).await)
}

/// [`check_indexes`] with `http`.
async fn probe_indexes(config: &PineconeConfig, http: &reqwest::Client) -> Vec<IndexProbe> {
    let tagged = config.mode == SourceMode::Sources;
    let probes = config.sources.iter().flat_map(|source| {
        let client = PineconeClient::new(
            http.clone(),
            config.controller_host.clone(),
            source.api_key.clone(),
            config.request_timeout,
        )
        .without_retries();
        [
            (IndexKind::Dense, source.index_name.clone()),
            (IndexKind::Sparse, source.sparse_index_name.clone()),
        ]
        .map(|(kind, index)| {
            let client = client.clone();
            let name = tagged.then(|| source.name.clone());
            let key = source.api_key.clone();
            async move {
                let outcome = match client.describe_index_stats(&index).await {
                    Ok(stats) => Ok(stats.namespaces.len()),
                    Err(e) => {
                        use secrecy::ExposeSecret;
                        Err(redact_with(&e.to_string(), &[key.expose_secret()]))
                    }
                };
                IndexProbe {
                    source: name,
                    kind,
                    index,
                    outcome,
                }
            }
        })
    });
    futures::future::join_all(probes).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_the_source_kind_and_index() {
        let ok = IndexProbe {
            source: None,
            kind: IndexKind::Dense,
            index: "kb".into(),
            outcome: Ok(2),
        };
        assert_eq!(
            ok.line(),
            "--check-indexes: Dense index \"kb\": reachable (2 namespaces)"
        );
        let failed = IndexProbe {
            source: Some("src_b".into()),
            kind: IndexKind::Sparse,
            index: "kb2-sparse".into(),
            outcome: Err("describeIndexStats failed with HTTP 404: gone".into()),
        };
        assert_eq!(
            failed.line(),
            "--check-indexes: [src_b] Sparse index \"kb2-sparse\": describeIndexStats failed with HTTP 404: gone"
        );
        assert!(ok.is_reachable());
        assert!(!failed.is_reachable());
    }
}
