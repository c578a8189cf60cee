//! URL generators: turn a record's metadata into a link to the original.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde_json::{Map, Value};

/// How a URL was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub enum UrlMethod {
    /// The record's own `url`.
    #[serde(rename = "metadata.url")]
    MetadataUrl,
    /// The record's `source` field (Slack).
    #[serde(rename = "metadata.source")]
    MetadataSource,
    /// Built-in mailing-list generator.
    #[serde(rename = "generated.mailing")]
    GeneratedMailing,
    /// Built-in Slack generator.
    #[serde(rename = "generated.slack")]
    GeneratedSlack,
    /// A generator registered by the embedder.
    #[serde(rename = "generated.custom")]
    GeneratedCustom,
    /// No URL could be made.
    #[serde(rename = "unavailable")]
    Unavailable,
}

/// A generator's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct UrlResolution {
    /// The URL, if any.
    pub url: Option<String>,
    /// How it was made.
    pub method: UrlMethod,
    /// Why there is none.
    pub reason: Option<String>,
}

impl UrlResolution {
    /// A generated URL.
    pub fn found(url: impl Into<String>, method: UrlMethod) -> Self {
        UrlResolution {
            url: Some(url.into()),
            method,
            reason: None,
        }
    }

    /// No URL, with the reason.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        UrlResolution {
            url: None,
            method: UrlMethod::Unavailable,
            reason: Some(reason.into()),
        }
    }
}

/// A URL generator for one namespace.
pub type UrlGenerator = Arc<dyn Fn(&Map<String, Value>) -> UrlResolution + Send + Sync>;

/// Generators keyed by `namespace` or `source:namespace`.
#[derive(Default)]
pub(crate) struct UrlRegistry {
    generators: RwLock<HashMap<String, UrlGenerator>>,
}

impl std::fmt::Debug for UrlRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<String> = self.read().keys().cloned().collect();
        f.debug_struct("UrlRegistry").field("keys", &keys).finish()
    }
}

/// A non-blank string field, trimmed.
fn str_field<'a>(metadata: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    metadata
        .get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

impl UrlRegistry {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, UrlGenerator>> {
        // Entries are whole values; a poisoned map is still consistent.
        self.generators
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Installs `generator` under `key` (`namespace` or `source:namespace`),
    /// replacing any earlier one.
    pub(crate) fn register(&self, key: impl Into<String>, generator: UrlGenerator) {
        self.generators
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key.into(), generator);
    }

    /// Installs the built-in `mailing` and `slack-Cpplang` generators.
    pub(crate) fn install_builtins(&self, sources: &[String], multi: bool) {
        let builtins: [(&str, UrlGenerator); 2] = [
            ("mailing", Arc::new(mailing_url)),
            ("slack-Cpplang", Arc::new(slack_url)),
        ];
        for (namespace, generator) in builtins {
            self.register(namespace, generator.clone());
            if multi {
                for source in sources {
                    self.register(format!("{source}:{namespace}"), generator.clone());
                }
            }
        }
    }

    /// The URL of one record: its own `url`, else the namespace's generator.
    pub(crate) fn resolve(
        &self,
        namespace: &str,
        metadata: &Map<String, Value>,
        source: Option<&str>,
    ) -> UrlResolution {
        if let Some(url) = str_field(metadata, "url") {
            return UrlResolution::found(url, UrlMethod::MetadataUrl);
        }
        let generator = {
            let generators = self.read();
            source
                .and_then(|s| generators.get(&format!("{s}:{namespace}")))
                .or_else(|| generators.get(namespace))
                .cloned()
        };
        match generator {
            Some(generate) => generate(metadata),
            None => UrlResolution::unavailable(format!(
                "URL generation is not supported for namespace \"{namespace}\""
            )),
        }
    }
}

/// Mailing-list archive URL from `list_name` + `doc_id`/`msg_id`, or a thread id.
pub(super) fn mailing_url(metadata: &Map<String, Value>) -> UrlResolution {
    let list = str_field(metadata, "list_name");
    let doc = str_field(metadata, "doc_id").or_else(|| str_field(metadata, "msg_id"));
    if let (Some(list), Some(doc)) = (list, doc)
        && !doc.contains(list)
    {
        return UrlResolution::found(
            format!("https://lists.boost.org/archives/list/{list}/message/{doc}/"),
            UrlMethod::GeneratedMailing,
        );
    }
    match doc.or_else(|| str_field(metadata, "thread_id")) {
        Some(id) => UrlResolution::found(
            format!("https://lists.boost.org/archives/list/{id}/"),
            UrlMethod::GeneratedMailing,
        ),
        None => UrlResolution::unavailable(
            "mailing requires doc_id, msg_id, or thread_id to generate URL",
        ),
    }
}

/// Slack message URL from `team_id`, `channel_id` and `doc_id`, or `source`.
pub(super) fn slack_url(metadata: &Map<String, Value>) -> UrlResolution {
    if let Some(source) = str_field(metadata, "source") {
        return UrlResolution::found(source, UrlMethod::MetadataSource);
    }
    match (
        str_field(metadata, "team_id"),
        str_field(metadata, "channel_id"),
        str_field(metadata, "doc_id"),
    ) {
        (Some(team), Some(channel), Some(doc)) => UrlResolution::found(
            format!(
                "https://app.slack.com/client/{team}/{channel}/p{}",
                doc.replace('.', "")
            ),
            UrlMethod::GeneratedSlack,
        ),
        _ => UrlResolution::unavailable(
            "slack-Cpplang requires team_id, channel_id, and doc_id (or source)",
        ),
    }
}
