//! A turn's identity: a [`TurnBinding`] holds what the turn must be (its id,
//! its session, the question that was sent and the session's turn before
//! it) and [`TurnBinding::check`] is the one check every frame, final
//! `query` frame, stored document, poll, cancel answer and attach result
//! passes. A misrouting proxy or cache must never hand one turn's answer to
//! another, and an identity that cannot be read is never taken for "no
//! identity".

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, Visitor};

use crate::error::{Error, Result, TurnMismatch};
use crate::types;

/// What a turn must be, fixed when its request is sent (`POST /query`) or
/// when it is attached to by id, and completed as the server names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TurnBinding {
    /// The turn's id, once known.
    query_id: Option<String>,
    /// The turn's session, once known.
    session_id: Option<String>,
    /// The question sent, when this process sent it.
    ask: Option<String>,
    /// The session's turn before this one, when known: `Some(None)` for a
    /// turn that starts its session.
    previous: Option<Option<String>>,
}

/// What one answer says about the turn it belongs to. `None` fields say
/// nothing; a field that was there but could not be read never gets here
/// (it is a mismatch).
#[derive(Debug, Default)]
pub(crate) struct Claim<'a> {
    pub(crate) query_id: Option<&'a str>,
    pub(crate) session_id: Option<&'a str>,
    /// The user's input the turn answers.
    pub(crate) input: Option<&'a str>,
    /// The `previous_query_id` of a Query document (`Some(None)`: null).
    pub(crate) previous: Option<Option<&'a str>>,
}

impl TurnBinding {
    /// The turn a request is about to start: `ask` in the session
    /// `session_id` (when it has one), after `previous` (when known).
    pub(crate) fn for_request(
        ask: &str,
        session_id: Option<&str>,
        previous: Option<Option<&str>>,
    ) -> Self {
        TurnBinding {
            query_id: None,
            session_id: non_empty(session_id).map(str::to_owned),
            ask: Some(ask.to_owned()),
            previous: previous.map(|p| non_empty(p).map(str::to_owned)),
        }
    }

    /// The turn `query_id`, known by id only (attached to, resumed).
    pub(crate) fn for_turn(query_id: &str) -> Self {
        TurnBinding {
            query_id: non_empty(Some(query_id)).map(str::to_owned),
            ..TurnBinding::default()
        }
    }

    /// The turn's id, once known.
    pub(crate) fn query_id(&self) -> Option<&str> {
        self.query_id.as_deref()
    }

    /// The turn's session, once known.
    pub(crate) fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    /// Takes `session_id` as the turn's session unless one is known.
    pub(crate) fn expect_session(&mut self, session_id: &str) {
        if self.session_id.is_none() {
            self.session_id = non_empty(Some(session_id)).map(str::to_owned);
        }
    }

    /// The one check: proves that `claim` is about this turn, learning the
    /// ids it did not know yet, or fails with [`Error::TurnMismatch`] naming
    /// `place` and what differs.
    pub(crate) fn check(&mut self, claim: &Claim<'_>, place: &'static str) -> Result<()> {
        let previous_turn = self.previous.as_ref().and_then(Option::as_deref);
        if let Some(got) = non_empty(claim.query_id) {
            if previous_turn == Some(got) && self.query_id.as_deref() != Some(got) {
                // The session's earlier turn is not this new one.
                return Err(self.mismatch(place, "query", "a new turn", got));
            }
            if let Err(expected) = learn_or_match(&mut self.query_id, got) {
                return Err(self.mismatch(place, "query", &expected, got));
            }
        }
        if let Some(got) = non_empty(claim.session_id)
            && let Err(expected) = learn_or_match(&mut self.session_id, got)
        {
            return Err(self.mismatch(place, "session", &expected, got));
        }
        if let (Some(asked), Some(got)) = (&self.ask, claim.input)
            && asked.trim() != got.trim()
        {
            let (asked, got) = (quoted(asked), quoted(got));
            return Err(self.mismatch(place, "question", &asked, &got));
        }
        if let (Some(expected), Some(Some(got))) = (&self.previous, claim.previous)
            && expected.as_deref() != Some(got)
        {
            let expected = expected.clone().unwrap_or_else(|| "none".to_owned());
            return Err(self.mismatch(place, "previous turn", &expected, got));
        }
        Ok(())
    }

    /// [`TurnBinding::check`] of a Query document (a final frame, a stored
    /// turn, a poll, the answer to cancel or to `POST /query`).
    pub(crate) fn check_query(&mut self, query: &types::Query, place: &'static str) -> Result<()> {
        let input = query
            .input
            .iter()
            .rev()
            .find(|item| item.role == "user")
            .map(|item| item.content.as_str());
        let claim = Claim {
            query_id: Some(&query.id),
            session_id: Some(&query.session_id),
            input,
            previous: Some(query.previous_query_id.as_deref()),
        };
        self.check(&claim, place).inspect_err(|e| {
            tracing::warn!(error = %e, "the server answered about another turn");
        })
    }

    /// [`TurnBinding::check`] of one SSE frame, read without decoding the
    /// rest: every event carries `query_id` (and `response.created` its
    /// `session_id`); the final Query (`event: query`, or an unnamed frame
    /// of `"type":"query"`) is named by `id`. An identity that cannot be
    /// read (not JSON, a key twice, an id that is not a string) is a
    /// mismatch, unless the frame is an event this client does not know,
    /// which is delivered raw and taken for nothing of the turn's.
    pub(crate) fn check_frame(&mut self, event: &str, data: &str) -> Result<()> {
        let Ok(ids) = serde_json::from_str::<FrameIds<'_>>(data) else {
            if matches!(
                super::event::QueryEvent::decode(event, data),
                super::event::QueryEvent::Unknown { .. }
            ) {
                return Ok(());
            }
            let place = place_of(event == super::event::names::QUERY);
            return Err(self.mismatch(
                place,
                "identity",
                "a readable one",
                "none that can be read",
            ));
        };
        let is_query = event == super::event::names::QUERY
            || (event == "message" && ids.kind.as_deref() == Some(super::event::names::QUERY));
        let named = if is_query { ids.id } else { ids.query_id };
        let claim = Claim {
            query_id: named.as_deref(),
            session_id: ids.session_id.as_deref(),
            ..Claim::default()
        };
        self.check(&claim, place_of(is_query))
    }

    fn mismatch(
        &self,
        place: &'static str,
        kind: &'static str,
        expected: &str,
        got: &str,
    ) -> Error {
        Error::TurnMismatch(Box::new(TurnMismatch {
            query_id: self.query_id.clone().unwrap_or_default(),
            place,
            kind,
            expected: expected.to_owned(),
            got: got.to_owned(),
        }))
    }
}

fn place_of(is_query: bool) -> &'static str {
    if is_query {
        "the final query frame"
    } else {
        "an event"
    }
}

/// Takes `got` as the value of `known` when it has none; else `got` must be
/// it (`Err` holds the value known).
fn learn_or_match(known: &mut Option<String>, got: &str) -> std::result::Result<(), String> {
    match known {
        None => {
            *known = Some(got.to_owned());
            Ok(())
        }
        Some(expected) if expected != got => Err(expected.clone()),
        Some(_) => Ok(()),
    }
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

/// A question as an error shows it: quoted, at most 80 characters.
fn quoted(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{:?}…", &text[..at]),
        None => format!("{text:?}"),
    }
}

/// The identity keys of a frame's top-level object, read strictly: each
/// at most once and a string (or null).
#[derive(Default)]
struct FrameIds<'a> {
    kind: Option<Cow<'a, str>>,
    id: Option<Cow<'a, str>>,
    query_id: Option<Cow<'a, str>>,
    session_id: Option<Cow<'a, str>>,
}

impl<'de> serde::Deserialize<'de> for FrameIds<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(FrameIdsVisitor)
    }
}

struct FrameIdsVisitor;

impl<'de> Visitor<'de> for FrameIdsVisitor {
    type Value = FrameIds<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut ids = FrameIds::default();
        let mut seen = [false; 4];
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let (slot, index) = match &*key {
                "type" => (&mut ids.kind, 0),
                "id" => (&mut ids.id, 1),
                "query_id" => (&mut ids.query_id, 2),
                "session_id" => (&mut ids.session_id, 3),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            if std::mem::replace(&mut seen[index], true) {
                return Err(de::Error::custom(format_args!(
                    "the key {key:?} comes twice"
                )));
            }
            *slot = map
                .next_value::<Option<BorrowedOrOwned<'de>>>()?
                .map(|s| s.0);
        }
        Ok(ids)
    }
}

/// A JSON string, borrowed when it has no escapes.
struct BorrowedOrOwned<'a>(Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for BorrowedOrOwned<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = BorrowedOrOwned<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(BorrowedOrOwned(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(BorrowedOrOwned(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound() -> TurnBinding {
        TurnBinding::for_turn("qry_A")
    }

    #[test]
    fn unnamed_query_frames_are_checked_by_their_id() {
        let data = r#"{"type":"query","id":"qry_B","session_id":"s"}"#;
        assert!(bound().check_frame("message", data).is_err());
        assert!(bound().check_frame("query", data).is_err());
        let own = r#"{"type":"query","id":"qry_A"}"#;
        assert!(bound().check_frame("message", own).is_ok());
    }

    #[test]
    fn identities_that_do_not_parse_are_mismatches() {
        let delta = "response.output_text.delta";
        for data in [
            r#"{"query_id":"qry_B","delta":"x","id":7}"#,
            r#"{"query_id":"qry_B","delta":"x","session_id":7}"#,
            r#"{"query_id":"qry_A","query_id":"qry_B","delta":"x"}"#,
            r#"{"query_id":"qry_B","delta":"x","other":"\q"}"#,
            r#"["qry_B"]"#,
        ] {
            let e = bound().check_frame(delta, data).unwrap_err();
            assert!(matches!(e, Error::TurnMismatch(_)), "{data}: {e}");
        }
        // An event this client does not know is delivered raw.
        assert!(bound().check_frame("response.new", "not json").is_ok());
        assert!(
            bound()
                .check_frame(delta, r#"{"query_id":"qry_A","delta":"x"}"#)
                .is_ok()
        );
    }

    #[test]
    fn a_request_binds_its_question_and_previous_turn() {
        let mut b = TurnBinding::for_request("new?", Some("s1"), Some(Some("qry_1")));
        let claim = Claim {
            query_id: Some("qry_1"),
            ..Claim::default()
        };
        assert!(b.check(&claim, "x").is_err(), "the earlier turn is not new");
        let claim = Claim {
            query_id: Some("qry_2"),
            input: Some("old?"),
            ..Claim::default()
        };
        assert!(b.clone().check(&claim, "x").is_err());
        let claim = Claim {
            query_id: Some("qry_2"),
            previous: Some(Some("qry_0")),
            ..Claim::default()
        };
        assert!(b.clone().check(&claim, "x").is_err());
        let claim = Claim {
            query_id: Some("qry_2"),
            session_id: Some("s1"),
            input: Some(" new? "),
            previous: Some(Some("qry_1")),
        };
        assert!(b.check(&claim, "x").is_ok());
        assert_eq!(b.query_id(), Some("qry_2"));
    }
}
