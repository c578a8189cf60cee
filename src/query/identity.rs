//! A turn's identity: every frame, final `query` frame, stored document and
//! poll of a turn must name that turn (and its session, once known). A
//! misrouting proxy or cache must never hand one turn's answer to another.

use crate::error::{Error, Result, TurnMismatch};
use crate::types;

/// The turn and session a frame names, read without decoding the rest:
/// every event carries `query_id` (and `response.created` its
/// `session_id`); the final `query` frame is the Query, named by `id`.
fn identity_of(event: &str, data: &str) -> (Option<String>, Option<String>) {
    #[derive(serde::Deserialize)]
    struct Wire {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        query_id: Option<String>,
        #[serde(default)]
        session_id: Option<String>,
    }
    let Ok(wire) = serde_json::from_str::<Wire>(data) else {
        return (None, None);
    };
    let query_id = if event == super::event::names::QUERY {
        wire.id
    } else {
        wire.query_id
    };
    let non_empty = |s: Option<String>| s.filter(|s| !s.is_empty());
    (non_empty(query_id), non_empty(wire.session_id))
}

/// Learns the turn and session a frame names into `known_query` and
/// `known_session`, or the error when they are not the ones known.
pub(crate) fn check_frame_identity(
    known_query: &mut Option<String>,
    known_session: &mut Option<String>,
    event: &str,
    data: &str,
) -> Result<()> {
    let (query_id, session_id) = identity_of(event, data);
    let place = if event == super::event::names::QUERY {
        "the final query frame"
    } else {
        "an event"
    };
    if let Some(got) = query_id {
        match &*known_query {
            None => *known_query = Some(got),
            Some(expected) if *expected != got => {
                return Err(turn_mismatch(expected, place, &got));
            }
            Some(_) => {}
        }
    }
    if let Some(got) = session_id {
        match &*known_session {
            None => *known_session = Some(got),
            Some(expected) if *expected != got => {
                let query_id = known_query.as_deref().unwrap_or_default();
                return Err(mismatch(query_id, place, "session", expected, &got));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The error for a frame or document that names the turn `got` in place
/// of `query_id`.
pub(crate) fn turn_mismatch(query_id: &str, place: &'static str, got: &str) -> Error {
    mismatch(query_id, place, "query", query_id, got)
}

/// [`Error::TurnMismatch`] with its parts.
fn mismatch(
    query_id: &str,
    place: &'static str,
    kind: &'static str,
    expected: &str,
    got: &str,
) -> Error {
    Error::TurnMismatch(Box::new(TurnMismatch {
        query_id: query_id.to_owned(),
        place,
        kind,
        expected: expected.to_owned(),
        got: got.to_owned(),
    }))
}

/// Checks that `query` (a final frame, a stored turn, a poll) is the turn
/// `query_id` of the session `session_id` (when known).
pub(crate) fn check_identity(
    query: &types::Query,
    query_id: &str,
    session_id: Option<&str>,
    place: &'static str,
) -> Result<()> {
    if !query_id.is_empty() && query.id != query_id {
        return Err(turn_mismatch(query_id, place, &query.id));
    }
    if let Some(expected) = session_id.filter(|s| !s.is_empty())
        && !query.session_id.is_empty()
        && query.session_id != expected
    {
        return Err(mismatch(
            query_id,
            place,
            "session",
            expected,
            &query.session_id,
        ));
    }
    Ok(())
}
