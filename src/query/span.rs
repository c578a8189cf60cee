//! The `tracing` span of a turn ([`TurnSpan`]) and how a final Query maps
//! to a turn's outcome.

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::types;

/// The `tracing` span of one turn, `query_turn`, with the fields `mode`
/// (`send`, `stream`, `background` or `attach`), `query_id`, `session_id`
/// and `resumes` (recorded as they become known). Retries, resumes, replay
/// checks and version mismatches are events inside it.
#[derive(Debug, Clone)]
pub(crate) struct TurnSpan {
    span: tracing::Span,
    query_id_known: std::sync::Arc<std::sync::atomic::AtomicBool>,
    session_id_known: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl TurnSpan {
    pub(crate) fn new(mode: &'static str) -> Self {
        TurnSpan {
            span: tracing::info_span!(
                "query_turn",
                mode,
                query_id = tracing::field::Empty,
                session_id = tracing::field::Empty,
                resumes = tracing::field::Empty,
            ),
            query_id_known: Default::default(),
            session_id_known: Default::default(),
        }
    }

    /// Records the ids the first time they are known.
    pub(crate) fn learn(&self, query_id: Option<&str>, session_id: Option<&str>) {
        use std::sync::atomic::Ordering;
        if let Some(q) = query_id.filter(|q| !q.is_empty())
            && !self.query_id_known.swap(true, Ordering::Relaxed)
        {
            self.span.record("query_id", q);
        }
        if let Some(s) = session_id.filter(|s| !s.is_empty())
            && !self.session_id_known.swap(true, Ordering::Relaxed)
        {
            self.span.record("session_id", s);
        }
    }

    pub(crate) fn record_resumes(&self, resumes: u32) {
        self.span.record("resumes", resumes);
    }

    pub(crate) fn span(&self) -> tracing::Span {
        self.span.clone()
    }

    pub(crate) fn enter(&self) -> tracing::span::Entered<'_> {
        self.span.enter()
    }
}

/// A final Query as a turn outcome: failed and cancelled turns are errors.
pub(crate) fn into_outcome(query: types::Query) -> Result<types::Query> {
    match query.status.as_str() {
        "failed" => Err(Error::TurnFailed {
            query_id: query.id,
            message: query.error.unwrap_or_default(),
        }),
        "cancelled" => Err(Error::TurnCancelled {
            query_id: query.id,
            message: query.error.unwrap_or_default(),
        }),
        _ => Ok(query),
    }
}

impl types::Query {
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
