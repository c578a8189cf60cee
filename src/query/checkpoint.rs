//! [`Checkpoint`]: where a streamed turn stands, small enough to persist,
//! so that another process continues it exactly.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// The event id that stands for "the whole turn was delivered": what
/// [`QueryTurn::last_event_id`](crate::QueryTurn::last_event_id) reports
/// once the rest of the answer came from the final Query (after a gap the
/// events could not fill). Continuing after it delivers no more text, only
/// the final Query.
pub const END_OF_TURN: u64 = u64::MAX;

/// A resume point of a streamed turn: the turn, the last event delivered,
/// and how many bytes of answer text were delivered up to it.
///
/// Persist it as you go ([`QueryTurn::checkpoint`](crate::QueryTurn::checkpoint));
/// another process continues with
/// [`QueryHandle::events_from`](crate::QueryHandle::events_from). The text
/// length lets that process check the rest against the final answer, and
/// finish from the stored turn when the event log cannot replay. Its text
/// form (`Display` / `FromStr`, also serde) is `query_id:event_id:text_len`.
///
/// ```
/// use nexus_knowql::query::Checkpoint;
/// let cp: Checkpoint = "q_123:42:1031".parse().unwrap();
/// assert_eq!((cp.query_id.as_str(), cp.event_id, cp.text_len), ("q_123", 42, 1031));
/// assert_eq!(cp.to_string(), "q_123:42:1031");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Checkpoint {
    /// The turn.
    pub query_id: String,
    /// The last event delivered (0: none; [`END_OF_TURN`]: all of the answer).
    pub event_id: u64,
    /// The bytes of answer text delivered up to `event_id`.
    pub text_len: u64,
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.query_id, self.event_id, self.text_len)
    }
}

impl FromStr for Checkpoint {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            Error::InvalidRequest(format!(
                "not a checkpoint (query_id:event_id:text_len): {s:?}"
            ))
        };
        let mut parts = s.rsplitn(3, ':');
        let text_len = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let event_id = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let query_id = parts.next().filter(|q| !q.is_empty()).ok_or_else(bad)?;
        Ok(Checkpoint {
            query_id: query_id.to_owned(),
            event_id,
            text_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips_and_rejects_garbage() {
        let cp = Checkpoint {
            query_id: "q:odd".into(),
            event_id: END_OF_TURN,
            text_len: 7,
        };
        assert_eq!(cp.to_string().parse::<Checkpoint>().unwrap(), cp);
        for bad in ["", "q", "q:1", ":1:2", "q:x:2", "q:1:-2"] {
            assert!(bad.parse::<Checkpoint>().is_err(), "{bad}");
        }
    }
}
