//! Typed statuses and other enumerated words of the API, and the helpers on
//! the generated types that read them.
//!
//! The API sends a turn's `status` and a task's `state` as strings whose
//! values the spec lists only as an extension (an open set). The generated
//! fields (`Query.status`, `Query.feedback.rating`, `TaskResponse.state`,
//! `TaskResponse.workflow`, `QueryRequest.workflow` and `.thinking_level`)
//! are these types: [`QueryStatus`], [`Rating`], [`TaskStatus`],
//! [`Workflow`] and [`ThinkingLevel`] name the values this version knows;
//! a value added later decodes as `Other`, never as an error, and `Other`
//! encodes the word as it was sent. The words are spelled once, in a module
//! of the generated layer below the types that carry them, so imports run
//! one way: the generated types, then this module's helpers on them.

use serde::de::DeserializeOwned;

#[cfg(feature = "local")]
pub(crate) use crate::api::words::word;
pub use crate::api::words::{QueryStatus, Rating, TaskStatus, ThinkingLevel, Workflow};
use crate::error::{Error, Result};
use crate::types;

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
