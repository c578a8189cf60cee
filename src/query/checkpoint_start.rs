//! Starting a job's turn at most once: the intent recorded before
//! `POST /query`, and finding the turn it started after a crash.

use std::time::Duration;

use super::checkpoint::TextDigest;
use super::checkpoint_record::{SessionMark, StartIntent};
use crate::error::CheckpointError;
use crate::error::{Error, Result};
use crate::types;

/// How often a restart looks again for the turn while the admission
/// horizon has not passed.
const LOOK_INTERVAL: Duration = Duration::from_millis(500);

/// How a job's restart decides whether the turn a dead process may have
/// posted was started: how long to look, and what to do when it is not
/// found.
///
/// ```
/// use std::time::Duration;
/// use nexus_knowql::query::{IfNotFound, StartProtocol};
/// let protocol = StartProtocol::default()
///     .admission_horizon(Duration::from_secs(30))
///     .if_not_found(IfNotFound::AtLeastOnce);
/// assert_eq!(protocol.horizon(), Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartProtocol {
    horizon: Duration,
    if_not_found: IfNotFound,
}

/// What a restart does when no session created since the intent shows the
/// job's turn once the admission horizon has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IfNotFound {
    /// Post nothing: [`CheckpointError::NotStarted`] names the key and what
    /// was looked at. The job's turn is never posted twice; it may be
    /// never posted (the caller decides, then clears the key).
    #[default]
    AtMostOnce,
    /// Post the turn again: the job's turn is always posted; it is posted
    /// twice if the server admitted the first after the horizon.
    AtLeastOnce,
}

impl StartProtocol {
    /// The default admission horizon: how long after the intent was
    /// recorded a turn may still appear in the session listing.
    pub const DEFAULT_HORIZON: Duration = Duration::from_secs(10);

    /// Sets how long after the intent was recorded a restart keeps looking
    /// for the turn before deciding that nothing was started.
    pub fn admission_horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon;
        self
    }

    /// Sets what a restart does when the turn was not found.
    pub fn if_not_found(mut self, policy: IfNotFound) -> Self {
        self.if_not_found = policy;
        self
    }

    /// The admission horizon.
    pub fn horizon(&self) -> Duration {
        self.horizon
    }

    /// What a restart does when the turn was not found.
    pub fn policy(&self) -> IfNotFound {
        self.if_not_found
    }
}

impl Default for StartProtocol {
    /// A horizon of [`StartProtocol::DEFAULT_HORIZON`], at most once.
    fn default() -> Self {
        StartProtocol {
            horizon: Self::DEFAULT_HORIZON,
            if_not_found: IfNotFound::AtMostOnce,
        }
    }
}

/// The fingerprint of a whole request body: its canonical JSON.
pub(crate) fn request_fingerprint(request: &types::QueryRequest) -> Result<TextDigest> {
    let body = serde_json::to_string(request)
        .map_err(|e| Error::InvalidRequest(format!("the request cannot be encoded: {e}")))?;
    Ok(TextDigest::of("request", &body))
}

/// The fingerprint of what a session document shows of its first turn's
/// request: the ask, the scope as a set, the system prompt, the workflow.
fn turn_fingerprint(
    ask: &str,
    scope: &[String],
    system_prompt: Option<&str>,
    workflow: Option<&str>,
) -> TextDigest {
    let mut scope: Vec<&str> = scope.iter().map(String::as_str).collect();
    scope.sort_unstable();
    scope.dedup();
    let canonical = serde_json::json!({
        "ask": ask,
        "scope": scope,
        "system_prompt": system_prompt,
        "workflow": workflow,
    });
    TextDigest::of("turn", &canonical.to_string())
}

/// The intent to record before posting `request` (a new session's first
/// turn): its fingerprints, now, and the newest session the server has.
pub(crate) async fn intent(
    client: &crate::Client,
    request: &types::QueryRequest,
) -> Result<StartIntent> {
    let newest = client.sessions().list().page_size(1).await?;
    Ok(StartIntent {
        request: request_fingerprint(request)?,
        turn: turn_fingerprint(
            &request.ask,
            &request.scope,
            request.system_prompt.as_deref(),
            request.workflow.as_ref().map(|w| w.as_str()),
        ),
        recorded_at: chrono::Utc::now(),
        after: newest.into_iter().next().map(|s| SessionMark {
            session_id: s.id,
            updated_at: s.updated_at,
        }),
    })
}

/// The turn that the job under `key` started after recording `intent`,
/// if the server has it: the first turn of a session created after the
/// intent's mark whose fingerprint is the intent's. Looks again every
/// [`LOOK_INTERVAL`] until the protocol's horizon has passed since the
/// intent was recorded (never longer than the horizon from now).
///
/// # Errors
/// [`CheckpointError::AmbiguousStart`] when more than one turn matches;
/// [`CheckpointError::NotStarted`] when none does and the protocol is
/// [`IfNotFound::AtMostOnce`]; those of `GET /sessions` and
/// `GET /sessions/{id}`.
pub(crate) async fn find_started(
    client: &crate::Client,
    key: &str,
    intent: &StartIntent,
    protocol: &StartProtocol,
) -> Result<Option<String>> {
    let since = chrono::Utc::now()
        .signed_duration_since(intent.recorded_at)
        .to_std()
        .unwrap_or(Duration::ZERO);
    let left = protocol.horizon.saturating_sub(since);
    let deadline = tokio::time::Instant::now() + left.min(protocol.horizon);
    loop {
        let (found, examined) = look(client, key, intent).await?;
        if found.is_some() {
            return Ok(found);
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return match protocol.if_not_found {
                IfNotFound::AtLeastOnce => Ok(None),
                IfNotFound::AtMostOnce => Err(Error::Checkpoint(CheckpointError::NotStarted {
                    key: key.to_owned(),
                    examined,
                    horizon: protocol.horizon,
                })),
            };
        }
        tokio::time::sleep(LOOK_INTERVAL.min(deadline - now)).await;
    }
}

/// One look: the matching turn, if exactly one, and how many sessions
/// created since the intent were examined.
async fn look(
    client: &crate::Client,
    key: &str,
    intent: &StartIntent,
) -> Result<(Option<String>, usize)> {
    let sessions = client.sessions().list().await?;
    let candidates = sessions.into_iter().filter(|s| match &intent.after {
        None => true,
        Some(mark) => s.id != mark.session_id && s.created_at >= mark.updated_at,
    });
    // Every session created since the intent: a busy server may have made
    // many since, and the job's own may be any of them. The listing is
    // bounded by the API (200 sessions, one page).
    let mut matches = Vec::new();
    let mut examined = 0;
    for session in candidates {
        examined += 1;
        let full = match client.sessions().get(&session.id).await {
            Ok(full) => full,
            // Deleted since it was listed: not the job's (it would still run).
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        if let Some(first) = first_turn(&full)
            && session_fingerprint(&full, first) == intent.turn
        {
            matches.push(first.id.clone());
        }
    }
    match matches.len() {
        0 | 1 => Ok((matches.pop(), examined)),
        _ => Err(Error::Checkpoint(CheckpointError::AmbiguousStart {
            key: key.to_owned(),
            candidates: matches,
        })),
    }
}

/// The session's first turn.
fn first_turn(session: &types::GetSessionResponse) -> Option<&types::Query> {
    session
        .queries
        .iter()
        .find(|q| q.previous_query_id.is_none())
        .or_else(|| session.queries.first())
}

/// The fingerprint of the session's first turn, as [`turn_fingerprint`]
/// computes it from the request.
fn session_fingerprint(session: &types::GetSessionResponse, first: &types::Query) -> TextDigest {
    turn_fingerprint(
        &ask_of(first),
        &session.scope,
        session.system_prompt.as_deref(),
        session.workflow.as_deref(),
    )
}

/// What the turn asked: its user input.
fn ask_of(query: &types::Query) -> String {
    query
        .input
        .iter()
        .filter(|i| i.role == "user")
        .map(|i| i.content.as_str())
        .collect()
}
