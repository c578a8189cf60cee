//! [`QueryEvent`]: one typed value per SSE frame of a query turn.

use std::borrow::Cow;

use serde::Deserialize;

use crate::types;

/// One event of a query turn, decoded by its SSE `event:` name.
///
/// New event names, and known names whose data does not have the expected
/// shape, arrive as [`QueryEvent::Unknown`] and never end a stream. Unknown
/// JSON fields are ignored.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum QueryEvent {
    /// `response.created`: the turn exists; its id (and session id) are known from here on.
    Created {
        /// The turn's id.
        query_id: String,
        /// The session the turn belongs to.
        session_id: Option<String>,
    },
    /// `response.step`: a reasoning or tool step started, progressed or ended.
    ///
    /// The same `step_id` comes again with a later status; fields a later
    /// event leaves out (`commentary` empty, `code` absent) keep their value
    /// in [`QueryTurn::steps`](crate::QueryTurn::steps).
    Step(types::QueryStep),
    /// `response.output_text.delta`: the next piece of the answer text.
    TextDelta {
        /// The text to append.
        delta: String,
    },
    /// `response.turn_rollup`: totals of the turn's steps.
    TurnRollup(types::QueryRollup),
    /// `response.synthesis`: the answer synthesis call and its token counts.
    Synthesis(types::QuerySynthesis),
    /// `response.trace`: where the turn's trace can be read.
    Trace {
        /// The trace reference (see [`Queries::trace`](crate::resources::Queries::trace)).
        trace_ref: String,
    },
    /// `response.completed`: the turn ended with an answer.
    Completed,
    /// `response.failed`: the turn failed.
    ///
    /// A [`QueryTurn`](crate::QueryTurn) reports it as
    /// [`Error::TurnFailed`](crate::Error::TurnFailed) instead.
    Failed {
        /// The server's error text.
        error: String,
    },
    /// `response.cancelled`: the turn was cancelled.
    ///
    /// A [`QueryTurn`](crate::QueryTurn) reports it as
    /// [`Error::TurnCancelled`](crate::Error::TurnCancelled) instead.
    Cancelled {
        /// The server's text, if any.
        error: String,
    },
    /// `query`: the final stored turn, sent once after the terminal event.
    Query(Box<types::Query>),
    /// An event this version does not know, or a known one whose data did not decode.
    Unknown {
        /// The SSE `event:` name.
        event: String,
        /// The raw `data:`.
        data: String,
    },
}

/// The SSE `event:` names of the query API.
pub mod names {
    /// `response.created`
    pub const CREATED: &str = "response.created";
    /// `response.step`
    pub const STEP: &str = "response.step";
    /// `response.output_text.delta`
    pub const TEXT_DELTA: &str = "response.output_text.delta";
    /// `response.turn_rollup`
    pub const TURN_ROLLUP: &str = "response.turn_rollup";
    /// `response.synthesis`
    pub const SYNTHESIS: &str = "response.synthesis";
    /// `response.trace`
    pub const TRACE: &str = "response.trace";
    /// `response.completed`
    pub const COMPLETED: &str = "response.completed";
    /// `response.failed`
    pub const FAILED: &str = "response.failed";
    /// `response.cancelled`
    pub const CANCELLED: &str = "response.cancelled";
    /// `query`: the final Query document.
    pub const QUERY: &str = "query";
}

#[derive(Deserialize)]
struct DeltaWire<'a> {
    #[serde(borrow)]
    delta: Cow<'a, str>,
}

#[derive(Deserialize)]
struct CreatedWire {
    query_id: String,
    #[serde(default)]
    session_id: Option<String>,
}

#[derive(Deserialize)]
struct StepWire {
    step_id: String,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    commentary: Option<String>,
    #[serde(default)]
    fns: Vec<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    cum_input_tokens: Option<i64>,
    #[serde(default)]
    cum_output_tokens: Option<i64>,
}

#[derive(Deserialize)]
struct TraceWire {
    trace_ref: String,
}

#[derive(Deserialize)]
struct ErrorWire {
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct TypeWire<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

impl QueryEvent {
    /// Decodes the data of one SSE frame by its `event:` name.
    ///
    /// Never fails: what does not decode is [`QueryEvent::Unknown`]. A frame
    /// without an `event:` line (`message`) is named by its data's `type`.
    pub fn decode(event: &str, data: &str) -> QueryEvent {
        if event == "message"
            && let Ok(t) = serde_json::from_str::<TypeWire<'_>>(data)
            && t.kind != "message"
        {
            return Self::decode(&t.kind, data);
        }
        Self::decode_known(event, data).unwrap_or_else(|| QueryEvent::Unknown {
            event: event.to_owned(),
            data: data.to_owned(),
        })
    }

    fn decode_known(event: &str, data: &str) -> Option<QueryEvent> {
        Some(match event {
            names::TEXT_DELTA => {
                // The plain shape without a JSON tree; anything else through
                // serde, with the same answer.
                let delta = match super::delta::text_delta(data) {
                    Some(delta) => delta,
                    None => serde_json::from_str::<DeltaWire<'_>>(data)
                        .ok()?
                        .delta
                        .into_owned(),
                };
                QueryEvent::TextDelta { delta }
            }
            names::CREATED => {
                let w: CreatedWire = serde_json::from_str(data).ok()?;
                QueryEvent::Created {
                    query_id: w.query_id,
                    session_id: w.session_id,
                }
            }
            names::STEP => {
                let w: StepWire = serde_json::from_str(data).ok()?;
                QueryEvent::Step(types::QueryStep {
                    step_id: w.step_id,
                    status: w.status.unwrap_or_default(),
                    commentary: w.commentary.unwrap_or_default(),
                    fns: w.fns,
                    code: w.code,
                    cum_input_tokens: w.cum_input_tokens,
                    cum_output_tokens: w.cum_output_tokens,
                })
            }
            names::TURN_ROLLUP => QueryEvent::TurnRollup(serde_json::from_str(data).ok()?),
            names::SYNTHESIS => QueryEvent::Synthesis(serde_json::from_str(data).ok()?),
            names::TRACE => {
                let w: TraceWire = serde_json::from_str(data).ok()?;
                QueryEvent::Trace {
                    trace_ref: w.trace_ref,
                }
            }
            names::COMPLETED => QueryEvent::Completed,
            names::FAILED => QueryEvent::Failed {
                error: error_text(data),
            },
            names::CANCELLED => QueryEvent::Cancelled {
                error: error_text(data),
            },
            names::QUERY => QueryEvent::Query(Box::new(serde_json::from_str(data).ok()?)),
            _ => return None,
        })
    }

    /// The SSE `event:` name of this event.
    pub fn name(&self) -> &str {
        match self {
            QueryEvent::Created { .. } => names::CREATED,
            QueryEvent::Step(_) => names::STEP,
            QueryEvent::TextDelta { .. } => names::TEXT_DELTA,
            QueryEvent::TurnRollup(_) => names::TURN_ROLLUP,
            QueryEvent::Synthesis(_) => names::SYNTHESIS,
            QueryEvent::Trace { .. } => names::TRACE,
            QueryEvent::Completed => names::COMPLETED,
            QueryEvent::Failed { .. } => names::FAILED,
            QueryEvent::Cancelled { .. } => names::CANCELLED,
            QueryEvent::Query(_) => names::QUERY,
            QueryEvent::Unknown { event, .. } => event,
        }
    }

    /// Whether this event ends the turn (`completed`, `failed` or `cancelled`).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            QueryEvent::Completed | QueryEvent::Failed { .. } | QueryEvent::Cancelled { .. }
        )
    }
}

/// A terminal event's `error`, tolerating data that is not the expected JSON.
fn error_text(data: &str) -> String {
    serde_json::from_str::<ErrorWire>(data)
        .ok()
        .and_then(|w| w.error)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_known_events_and_ignores_extra_fields() {
        let e = QueryEvent::decode(
            names::TEXT_DELTA,
            r#"{"type":"response.output_text.delta","query_id":"q1","delta":"h\u00e9\n","new":[1]}"#,
        );
        assert_eq!(
            e,
            QueryEvent::TextDelta {
                delta: "hé\n".into()
            }
        );
        let e = QueryEvent::decode(
            names::STEP,
            r#"{"step_id":"s1","status":"running","fns":["search"],"cum_input_tokens":5,"x":{}}"#,
        );
        let QueryEvent::Step(step) = e else {
            panic!("{e:?}")
        };
        assert_eq!(
            (step.step_id.as_str(), step.status.as_str()),
            ("s1", "running")
        );
        assert_eq!(step.fns, ["search"]);
        assert_eq!(
            QueryEvent::decode(names::FAILED, r#"{"error":"boom"}"#),
            QueryEvent::Failed {
                error: "boom".into()
            }
        );
        assert_eq!(
            QueryEvent::decode(names::CANCELLED, "not json"),
            QueryEvent::Cancelled {
                error: String::new()
            }
        );
    }

    #[test]
    fn unknown_names_and_bad_shapes_are_kept_raw() {
        assert_eq!(
            QueryEvent::decode("response.new_thing", r#"{"a":1}"#),
            QueryEvent::Unknown {
                event: "response.new_thing".into(),
                data: r#"{"a":1}"#.into()
            }
        );
        assert_eq!(
            QueryEvent::decode(names::TEXT_DELTA, r#"{"delta":5}"#).name(),
            names::TEXT_DELTA
        );
        assert!(matches!(
            QueryEvent::decode(names::TEXT_DELTA, r#"{"delta":5}"#),
            QueryEvent::Unknown { .. }
        ));
    }

    #[test]
    fn unnamed_frames_are_named_by_their_type() {
        assert_eq!(
            QueryEvent::decode(
                "message",
                r#"{"type":"response.output_text.delta","delta":"x"}"#
            ),
            QueryEvent::TextDelta { delta: "x".into() }
        );
    }
}
