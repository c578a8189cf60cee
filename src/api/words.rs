//! The enumerated words of the API the generated types carry: a turn's
//! and a task's status, a rating, a workflow and a thinking level, each an
//! open set whose unknown values decode as `Other`. They sit below the
//! generated types, which name them, and below [`status`](crate::status),
//! which re-exports them and adds the helpers on the generated types. This
//! file is the only place these words are spelled.

use std::fmt;

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
