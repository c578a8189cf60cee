//! [`CheckpointRecord`]: what a [`CheckpointStore`](super::CheckpointStore)
//! keeps under a job's key (its turn about to start, where the turn
//! stands, or the failure that ended it).

use std::fmt;
use std::str::FromStr;

use super::checkpoint::{Checkpoint, TextDigest, is_plain_id};
use crate::error::Error;

/// The longest failure reason a record keeps, in characters.
pub const MAX_REASON_CHARS: usize = 200;

/// What a [`CheckpointStore`](super::CheckpointStore) keeps under a key.
///
/// Its text form is one line: `starting <request> <turn> <recorded_at>
/// <after>`, `at <checkpoint>`
/// or `failed <query_id> <reason>`.
///
/// ```
/// use nexus_knowql::query::{Checkpoint, CheckpointRecord};
/// let at = CheckpointRecord::At(Checkpoint::after_text("q_1", 4, "Travel"));
/// assert_eq!(at.to_string().parse::<CheckpointRecord>().unwrap(), at);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckpointRecord {
    /// The job's turn is about to be started (or was, and the process died
    /// before its first checkpoint): a restart finds that turn rather than
    /// starting another.
    Starting(StartIntent),
    /// Where the job's turn stands: resume from here.
    At(Checkpoint),
    /// The job's turn failed verification (its answer is not what was
    /// delivered, or could not be checked): nothing to resume.
    Failed(FailedTurn),
}

/// What a job recorded before sending `POST /query`, to recognise the
/// turn it started: the fingerprints of its request, when it was recorded,
/// and the newest session the server had then (the job's turn starts a
/// session created after it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartIntent {
    /// The fingerprint of the whole request body (every field that changes
    /// the turn): a key is only ever continued with the same request.
    pub request: TextDigest,
    /// The fingerprint of what the server shows of the turn's session:
    /// the ask, the scope (as a set), the system prompt and the workflow.
    /// A restart compares it with each candidate session's.
    pub turn: TextDigest,
    /// When the intent was recorded (this machine's clock): the admission
    /// horizon runs from here.
    pub recorded_at: chrono::DateTime<chrono::Utc>,
    /// The newest session before the turn was posted; `None` when there
    /// was none.
    pub after: Option<SessionMark>,
}

/// A session and when it was last updated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionMark {
    /// The session.
    pub session_id: String,
    /// Its `updated_at`.
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// A turn that failed verification, as recorded under its job's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedTurn {
    /// The turn.
    pub query_id: String,
    /// Why (one line, at most [`MAX_REASON_CHARS`] characters).
    pub reason: String,
}

impl FailedTurn {
    /// The record of `query_id` failing with `error`.
    pub fn new(query_id: impl Into<String>, error: &Error) -> Self {
        let reason = error
            .to_string()
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(MAX_REASON_CHARS)
            .collect::<String>()
            .trim()
            .to_owned();
        FailedTurn {
            query_id: query_id.into(),
            reason: if reason.is_empty() {
                "failed".to_owned()
            } else {
                reason
            },
        }
    }
}

impl fmt::Display for CheckpointRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointRecord::Starting(intent) => {
                write!(
                    f,
                    "starting {} {} {}",
                    intent.request,
                    intent.turn,
                    rfc3339(intent.recorded_at)
                )?;
                match &intent.after {
                    None => write!(f, " -"),
                    Some(mark) => write!(f, " {} {}", mark.session_id, rfc3339(mark.updated_at)),
                }
            }
            CheckpointRecord::At(cp) => write!(f, "at {cp}"),
            CheckpointRecord::Failed(failed) => {
                write!(f, "failed {} {}", failed.query_id, failed.reason)
            }
        }
    }
}

fn rfc3339(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

fn parse_rfc3339(at: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(at)
        .ok()
        .map(|at| at.with_timezone(&chrono::Utc))
}

impl FromStr for CheckpointRecord {
    type Err = Error;

    /// Parses the text form; the error never repeats the text.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || Error::InvalidRequest("not a checkpoint record".to_owned());
        if s.contains(['\n', '\r']) {
            return Err(bad());
        }
        let (kind, rest) = s.split_once(' ').ok_or_else(bad)?;
        match kind {
            "at" => Ok(CheckpointRecord::At(rest.parse()?)),
            "failed" => {
                let (query_id, reason) = rest.split_once(' ').ok_or_else(bad)?;
                if !is_plain_id(query_id) || reason.chars().count() > MAX_REASON_CHARS {
                    return Err(bad());
                }
                Ok(CheckpointRecord::Failed(FailedTurn {
                    query_id: query_id.to_owned(),
                    reason: reason.to_owned(),
                }))
            }
            "starting" => {
                let mut words = rest.split(' ');
                let mut digest = || words.next().and_then(|w| w.parse().ok()).ok_or_else(bad);
                let (request, turn) = (digest()?, digest()?);
                let recorded_at = words.next().and_then(parse_rfc3339).ok_or_else(bad)?;
                let after = match (words.next(), words.next(), words.next()) {
                    (Some("-"), None, None) => None,
                    (Some(id), Some(at), None) if is_plain_id(id) => Some(SessionMark {
                        session_id: id.to_owned(),
                        updated_at: parse_rfc3339(at).ok_or_else(bad)?,
                    }),
                    _ => return Err(bad()),
                };
                Ok(CheckpointRecord::Starting(StartIntent {
                    request,
                    turn,
                    recorded_at,
                    after,
                }))
            }
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_on_one_line() {
        let at = chrono::DateTime::parse_from_rfc3339("2026-07-01T10:00:00.123456Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let records = [
            CheckpointRecord::At(Checkpoint::after_text("q_1", 7, "abc")),
            CheckpointRecord::Failed(FailedTurn::new(
                "q_2",
                &Error::InvalidRequest("bad\nthings".into()),
            )),
            CheckpointRecord::Starting(StartIntent {
                request: TextDigest::of("request", "What?"),
                turn: TextDigest::of("turn", "What?"),
                recorded_at: at,
                after: None,
            }),
            CheckpointRecord::Starting(StartIntent {
                request: TextDigest::of("request", "What?"),
                turn: TextDigest::of("turn", "What?"),
                recorded_at: at,
                after: Some(SessionMark {
                    session_id: "ses_1".into(),
                    updated_at: at,
                }),
            }),
        ];
        for r in records {
            let text = r.to_string();
            assert!(!text.contains('\n'), "{text}");
            assert_eq!(text.parse::<CheckpointRecord>().unwrap(), r);
        }
        for bad in ["", "at", "at q:1:2", "failed q", "starting x -", "other 1"] {
            assert!(bad.parse::<CheckpointRecord>().is_err(), "{bad}");
        }
    }
}
