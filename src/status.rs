//! Typed statuses and other enumerated words of the API, and the helpers on
//! the generated types that read them.
//!
//! The API sends a turn's `status` and a task's `state` as strings whose
//! values the spec lists only as an extension (an open set). The generated
//! fields (`Query.status`, `Query.feedback.rating`, `TaskResponse.state`,
//! `TaskResponse.workflow`, `QueryRequest.workflow` and `.thinking_level`)
//! are these types: [`QueryStatus`], [`Rating`], [`TaskStatus`],
//! [`Workflow`] and [`ThinkingLevel`] name the values this version knows; a value added
//! later decodes as `Other`, never as an error, and `Other` encodes the
//! word as it was sent. This file is the only place these words are spelled.

use std::fmt;

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::types;

/// Generates a string-backed status enum with an `Other` variant.
macro_rules! string_status {
    (
        $(#[$meta:meta])*
        $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A value this version of the crate does not know (kept as sent).
            Other(String),
        }

        impl $name {
            /// The status as the API spells it.
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $text,)+
                    $name::Other(s) => s.as_str(),
                }
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                match s {
                    $($text => $name::$variant,)+
                    other => $name::Other(other.to_owned()),
                }
            }
        }

        impl From<&String> for $name {
            fn from(s: &String) -> Self {
                $name::from(s.as_str())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                match $name::from(s.as_str()) {
                    $name::Other(_) => $name::Other(s),
                    known => known,
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
                String::deserialize(deserializer).map($name::from)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}

string_status! {
    /// The status of a query turn (`Query.status`).
    ///
    /// ```
    /// use nexus_knowql::QueryStatus;
    /// assert_eq!(QueryStatus::from("completed"), QueryStatus::Completed);
    /// assert!(QueryStatus::Cancelled.is_terminal());
    /// assert_eq!(QueryStatus::from("paused"), QueryStatus::Other("paused".into()));
    /// ```
    QueryStatus {
        /// The turn is running.
        InProgress = "in_progress",
        /// The turn ended with an answer.
        Completed = "completed",
        /// The turn ended with an error.
        Failed = "failed",
        /// The turn was cancelled.
        Cancelled = "cancelled",
    }
}

impl QueryStatus {
    /// Whether the turn has ended (completed, failed or cancelled).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            QueryStatus::Completed | QueryStatus::Failed | QueryStatus::Cancelled
        )
    }
}

/// The turn and task status words as the API spells them, for the local
/// server, which writes them and matches on them in patterns.
#[cfg(feature = "local")]
pub(crate) mod word {
    /// Running.
    pub(crate) const IN_PROGRESS: &str = "in_progress";
    /// Ended with a result.
    pub(crate) const COMPLETED: &str = "completed";
    /// Ended with an error.
    pub(crate) const FAILED: &str = "failed";
    /// Ended by a cancel.
    pub(crate) const CANCELLED: &str = "cancelled";
}

string_status! {
    /// The state of a task (`TaskResponse.state`).
    TaskStatus {
        /// Waiting to start.
        Scheduled = "scheduled",
        /// Starting.
        Starting = "starting",
        /// Getting resources.
        Provisioning = "provisioning",
        /// Running.
        Running = "running",
        /// Stopping after a cancel.
        Stopping = "stopping",
        /// Ended successfully.
        Completed = "completed",
        /// Cancelled.
        Cancelled = "cancelled",
        /// Ended with an error.
        Failed = "failed",
    }
}

impl TaskStatus {
    /// Whether the task has ended (completed, cancelled or failed).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            TaskStatus::Completed | TaskStatus::Cancelled | TaskStatus::Failed
        )
    }
}

string_status! {
    /// A rating of a turn's answer, for
    /// [`Queries::feedback`](crate::resources::Queries::feedback).
    Rating {
        /// A good answer.
        Up = "up",
        /// A bad answer.
        Down = "down",
    }
}

string_status! {
    /// A workflow (the spec's `Workflow`): what a task runs, and for a turn
    /// ([`TurnBuilder::workflow`](crate::TurnBuilder::workflow)) one of
    /// `search`, `search_cc` and `search_rag`.
    ///
    /// ```
    /// use nexus_knowql::Workflow;
    /// assert_eq!(Workflow::from("search_rag"), Workflow::SearchRag);
    /// assert_eq!(Workflow::SearchCc.as_str(), "search_cc");
    /// assert_eq!(Workflow::from("distill"), Workflow::Other("distill".into()));
    /// ```
    Workflow {
        /// `optimize`
        Optimize = "optimize",
        /// `curate`: curation of a context's sources.
        Curate = "curate",
        /// `search`: a turn's workflow.
        Search = "search",
        /// `search_cc`: a turn's workflow.
        SearchCc = "search_cc",
        /// `search_rag`: a turn's workflow.
        SearchRag = "search_rag",
        /// `work`
        Work = "work",
        /// `explore`
        Explore = "explore",
        /// `profile`
        Profile = "profile",
        /// `import`: an import of sources.
        Import = "import",
        /// `pack`
        Pack = "pack",
        /// `restore`
        Restore = "restore",
        /// `groom`
        Groom = "groom",
    }
}

string_status! {
    /// How much the model thinks in a turn
    /// ([`TurnBuilder::thinking_level`](crate::TurnBuilder::thinking_level)).
    ///
    /// ```
    /// use nexus_knowql::ThinkingLevel;
    /// assert_eq!(ThinkingLevel::from("high"), ThinkingLevel::High);
    /// assert_eq!(ThinkingLevel::Minimal.to_string(), "minimal");
    /// ```
    ThinkingLevel {
        /// `minimal`
        Minimal = "minimal",
        /// `low`
        Low = "low",
        /// `medium`
        Medium = "medium",
        /// `high`
        High = "high",
    }
}

impl From<ThinkingLevel> for String {
    fn from(level: ThinkingLevel) -> Self {
        match level {
            ThinkingLevel::Other(s) => s,
            known => known.as_str().to_owned(),
        }
    }
}

impl From<TaskStatus> for String {
    fn from(status: TaskStatus) -> Self {
        match status {
            TaskStatus::Other(s) => s,
            known => known.as_str().to_owned(),
        }
    }
}

impl From<Workflow> for String {
    fn from(w: Workflow) -> Self {
        match w {
            Workflow::Other(s) => s,
            known => known.as_str().to_owned(),
        }
    }
}

impl types::Query {
    /// Whether the turn has ended (`completed`, `failed` or `cancelled`).
    pub fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }

    /// The answer text: every `output[].content[].text`, concatenated.
    pub fn answer_text(&self) -> String {
        self.output
            .iter()
            .flat_map(|o| o.content.iter())
            .map(|c| c.text.as_str())
            .collect()
    }

    /// The turn as an outcome: a failed or cancelled turn is an error, any
    /// other Query (completed, or still running) is returned as it is.
    ///
    /// # Errors
    /// [`Error::TurnFailed`] / [`Error::TurnCancelled`] with the turn's id
    /// and error message.
    pub fn into_result(self) -> Result<types::Query> {
        match self.status {
            QueryStatus::Failed => Err(Error::TurnFailed {
                query_id: self.id,
                message: self.error.unwrap_or_default(),
            }),
            QueryStatus::Cancelled => Err(Error::TurnCancelled {
                query_id: self.id,
                message: self.error.unwrap_or_default(),
            }),
            _ => Ok(self),
        }
    }

    /// Deserializes `output_json` (the answer to a `shape`, or retrieval
    /// hits) into `T`.
    ///
    /// ```
    /// # let json = serde_json::json!({"id":"q1","object":"query","session_id":"s1",
    /// #   "created":0,"status":"completed","input":[],"output":[],"citations":[],"steps":[],
    /// #   "runtime_ms":1,"usage":{"input_tokens":0,"output_tokens":0,"total_tokens":0},
    /// #   "output_json":{"answer":42}});
    /// let query: nexus_knowql::types::Query = serde_json::from_value(json).unwrap();
    /// #[derive(serde::Deserialize)]
    /// struct Answer { answer: u32 }
    /// assert_eq!(query.json::<Answer>().unwrap().answer, 42);
    /// ```
    ///
    /// # Errors
    /// [`Error::Decode`] when there is no `output_json` or it does not fit `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        let Some(map) = &self.output_json else {
            return Err(Error::decode(
                "query_output_json",
                format!("query {} has no output_json", self.id),
                b"",
            ));
        };
        let value = serde_json::Value::Object(map.clone());
        serde_json::from_value(value).map_err(|e| {
            let body = serde_json::to_vec(map).unwrap_or_default();
            Error::decode("query_output_json", e, &body)
        })
    }
}

impl types::TaskResponse {
    /// Whether the task has ended (`completed`, `cancelled` or `failed`).
    pub fn is_terminal(&self) -> bool {
        self.state.is_terminal()
    }
}

impl types::ContextResponse {
    /// Whether the context can be queried now: a `work` context at once, a
    /// `search` context once it has been curated.
    ///
    /// ```
    /// # let json = serde_json::json!({"id":"1","slug":"docs","name":"Docs","kind":"search",
    /// #   "created_by":"me","description":"","is_optimizing":false,"has_sources":true,
    /// #   "is_curating":false,"is_importing":false,"is_exploring":false,"is_restoring":false,
    /// #   "is_grooming":false,"created_at":"2026-07-01T00:00:00Z","updated_at":"2026-07-01T00:00:00Z"});
    /// let ctx: nexus_knowql::types::ContextResponse = serde_json::from_value(json).unwrap();
    /// assert!(!ctx.is_queryable()); // a search context that was never curated
    /// ```
    pub fn is_queryable(&self) -> bool {
        self.kind.as_str() == "work" || self.last_curated_at.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_and_keep_unknown_values() {
        for s in ["in_progress", "completed", "failed", "cancelled"] {
            let status = QueryStatus::from(s);
            assert!(!matches!(status, QueryStatus::Other(_)), "{s}");
            assert_eq!(status.as_str(), s);
        }
        assert_eq!(
            QueryStatus::from(String::from("paused")),
            QueryStatus::Other("paused".into())
        );
        assert!(!QueryStatus::InProgress.is_terminal());
        assert!(!QueryStatus::Other("paused".into()).is_terminal());
        assert!(TaskStatus::from("failed").is_terminal());
        assert!(!TaskStatus::from("stopping").is_terminal());
        assert_eq!(Rating::Down.to_string(), "down");
    }

    #[test]
    fn workflows_and_thinking_levels_keep_every_word() {
        for w in [
            "optimize",
            "curate",
            "search",
            "search_cc",
            "search_rag",
            "work",
            "explore",
            "profile",
            "import",
            "pack",
            "restore",
            "groom",
        ] {
            let typed = Workflow::from(w);
            assert!(!matches!(typed, Workflow::Other(_)), "{w}");
            assert_eq!(String::from(typed), w);
        }
        for l in ["minimal", "low", "medium", "high"] {
            let typed = ThinkingLevel::from(l);
            assert!(!matches!(typed, ThinkingLevel::Other(_)), "{l}");
            assert_eq!(String::from(typed), l);
        }
        assert_eq!(String::from(Workflow::from("distill")), "distill");
        assert_eq!(String::from(ThinkingLevel::from(&"max".to_owned())), "max");
    }
}
