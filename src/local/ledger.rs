//! What curation records per context (the curation ledger): the hash, size
//! and time of every source it indexed, and the sources it has dropped
//! since, with the version (index generation) that dropped them. Also the
//! manifest curation runs with and the built-in manifest templates.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::search::Chunk;
use crate::types;

/// Most removed sources a ledger remembers (the oldest are forgotten).
const MAX_REMOVED: usize = 10_000;

/// One curated source.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LedgerEntry {
    /// `sha256:` and the hex digest of the bytes curated.
    pub(crate) hash: String,
    pub(crate) size: u64,
    pub(crate) mtime: DateTime<Utc>,
    pub(crate) curated_at: DateTime<Utc>,
}

/// One source dropped by a curation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Removed {
    pub(crate) version: u64,
    pub(crate) at: DateTime<Utc>,
}

/// The ledger of a context's latest curation.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Ledger {
    /// The index generation it describes.
    pub(crate) version: u64,
    pub(crate) entries: BTreeMap<String, LedgerEntry>,
    pub(crate) removed: BTreeMap<String, Removed>,
}

/// The digest recorded for a source's bytes.
pub(crate) fn hash(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

impl Ledger {
    /// The ledger after a curation of `version` that indexed `entries`:
    /// what the previous one held and this one lacks is recorded removed.
    pub(crate) fn next(
        prev: Option<&Ledger>,
        version: u64,
        now: DateTime<Utc>,
        entries: BTreeMap<String, LedgerEntry>,
    ) -> Ledger {
        let mut removed = prev.map(|p| p.removed.clone()).unwrap_or_default();
        if let Some(p) = prev {
            for path in p.entries.keys().filter(|k| !entries.contains_key(*k)) {
                removed.insert(path.clone(), Removed { version, at: now });
            }
        }
        removed.retain(|path, _| !entries.contains_key(path));
        while removed.len() > MAX_REMOVED {
            let oldest = removed
                .iter()
                .min_by_key(|(_, r)| (r.version, r.at))
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => removed.remove(&k),
                None => break,
            };
        }
        Ledger {
            version,
            entries,
            removed,
        }
    }

    /// The API's view: the ledger plus the chunk ids of every source
    /// (`{version}:{ordinal}`, the chunk's place in the index).
    pub(crate) fn to_state(&self, chunks: &[Chunk]) -> types::CurationState {
        let mut chunk_ids: HashMap<String, Vec<String>> = HashMap::new();
        for (i, c) in chunks.iter().enumerate() {
            chunk_ids
                .entry(c.source.clone())
                .or_default()
                .push(format!("{}:{i}", self.version));
        }
        let manifest = by_path(&self.entries, |e| types::SourceManifestEntry {
            curated_at: e.curated_at,
            hash: e.hash.clone(),
            mtime: Some(e.mtime),
            size: i64::try_from(e.size).unwrap_or(i64::MAX),
        });
        let source_removed = by_path(&self.removed, |r| types::SourceRemoved {
            removed_at: Some(r.at),
            removed_version: i64::try_from(r.version).unwrap_or(i64::MAX),
        });
        types::CurationState {
            artifact_reclaim: Vec::new(),
            chunk_ids,
            chunk_reclaim: Vec::new(),
            corpus_groups: Vec::new(),
            edges: HashMap::new(),
            live_version: i64::try_from(self.version).unwrap_or(i64::MAX),
            manifest,
            redispatch_count: 0,
            source_glossary: HashMap::new(),
            source_pointers: HashMap::new(),
            source_removed,
            versions_stamped: true,
        }
    }
}

/// The manifest local curation runs with: keyword (BM25) chunks cut at
/// Markdown headings near `chunk_chars` characters (about four characters
/// a token), no embeddings used and no artifacts.
pub(crate) fn effective_manifest(chunk_chars: usize) -> types::Manifest {
    let target = i64::try_from(chunk_chars / 4)
        .unwrap_or(4096)
        .clamp(64, 4096);
    chunked_manifest(serde_json::json!({
        "strategy": "markdown_heading",
        "target_size": target,
        "overlap": 0,
        "respect_sections": true
    }))
}

/// A manifest that curates keyword-searchable chunks made by `chunking`,
/// and no artifacts.
fn chunked_manifest(chunking: serde_json::Value) -> types::Manifest {
    let value = serde_json::json!({
        "curate": {
            "chunks": {"enabled": true, "chunking": chunking, "keyword": {"enabled": true}},
            "artifacts": {"enabled": false}
        }
    });
    serde_json::from_value(value).unwrap_or(types::Manifest {
        curate: None,
        optimize: None,
    })
}

/// The built-in manifest templates.
pub(crate) fn templates(chunk_chars: usize) -> types::ManifestTemplateCatalog {
    let docs = effective_manifest(chunk_chars);
    let notes = chunked_manifest(serde_json::json!(
        {"strategy": "sliding_window", "target_size": 256, "overlap": 32}
    ));
    let code = chunked_manifest(serde_json::json!(
        {"strategy": "code", "target_size": 512, "overlap": 0}
    ));
    let template = |id: &str,
                    label: &str,
                    description: &str,
                    when: &str,
                    default: bool,
                    questions: &[&str],
                    manifest: types::Manifest| {
        types::ManifestTemplate {
            default,
            description: description.to_owned(),
            id: id.to_owned(),
            label: label.to_owned(),
            manifest,
            sample_questions: questions.iter().map(|q| (*q).to_owned()).collect(),
            when_to_use: when.to_owned(),
        }
    };
    types::ManifestTemplateCatalog {
        default_id: "documentation".to_owned(),
        templates: vec![
            template(
                "documentation",
                "Documentation",
                "Markdown split at headings, keyword search over sections. What local curation does.",
                "Guides, references, READMEs: text organized by headings.",
                true,
                &[
                    "How do I resume a stream?",
                    "What does the import limit mean?",
                ],
                docs,
            ),
            template(
                "notes",
                "Notes",
                "Short overlapping windows for text without headings.",
                "Plain notes, transcripts, logs.",
                false,
                &["What was decided about the release?"],
                notes,
            ),
            template(
                "code",
                "Code",
                "Code-aware chunks of source files.",
                "Repositories and code samples.",
                false,
                &["Where is the retry policy configured?"],
                code,
            ),
        ],
        version: 1,
    }
}

/// Every value of a map keyed by source path, in the API's form.
fn by_path<T, U>(map: &BTreeMap<String, T>, to_api: impl Fn(&T) -> U) -> HashMap<String, U> {
    map.iter()
        .map(|(path, value)| (path.clone(), to_api(value)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(hash: &str) -> LedgerEntry {
        LedgerEntry {
            hash: hash.to_owned(),
            size: 1,
            mtime: Utc::now(),
            curated_at: Utc::now(),
        }
    }

    #[test]
    fn a_source_missing_from_the_next_curation_is_recorded_removed() {
        let now = Utc::now();
        let first = Ledger::next(
            None,
            1,
            now,
            [("a".to_owned(), entry("h1")), ("b".to_owned(), entry("h2"))].into(),
        );
        assert!(first.removed.is_empty());
        let second = Ledger::next(Some(&first), 2, now, [("a".to_owned(), entry("h1"))].into());
        assert_eq!(second.removed["b"].version, 2);
        let third = Ledger::next(
            Some(&second),
            3,
            now,
            [("a".to_owned(), entry("h1")), ("b".to_owned(), entry("h3"))].into(),
        );
        assert!(
            third.removed.is_empty(),
            "a source back is no longer removed"
        );
        assert_eq!(hash(b"abc").len(), 71);
        assert!(hash(b"abc").starts_with("sha256:ba7816bf"));
    }

    #[test]
    fn templates_and_the_effective_manifest_are_complete() {
        let cat = templates(1200);
        assert_eq!(cat.templates.iter().filter(|t| t.default).count(), 1);
        let m = effective_manifest(1200);
        let chunking = m.curate.unwrap().chunks.unwrap().chunking.unwrap();
        assert_eq!(
            (chunking.strategy.as_str(), chunking.target_size),
            ("markdown_heading", 300)
        );
    }
}
