//! Starting a job's turn at most once: the intent recorded before
//! `POST /query`, and finding the turn it started after a crash.

use std::time::Duration;

use super::checkpoint_record::{SessionMark, StartIntent};
use crate::error::CheckpointError;
use crate::error::{Error, Result};
use crate::types;

/// How long a restart waits before looking a second time for the turn a
/// dead process may have posted (its request may still be on its way).
pub(crate) const START_GRACE: Duration = Duration::from_secs(1);

/// The intent to record before posting `ask`: its digest and the newest
/// session the server has now.
pub(crate) async fn intent(client: &crate::Client, ask: &str) -> Result<StartIntent> {
    let newest = client.sessions().list().page_size(1).await?;
    Ok(StartIntent {
        ask: StartIntent::ask_digest(ask),
        after: newest.into_iter().next().map(|s| SessionMark {
            session_id: s.id,
            updated_at: s.updated_at,
        }),
    })
}

/// The turn that the job under `key` started after recording `intent`,
/// if the server has it: the first turn of a session created after the
/// intent's mark whose ask is the intent's. Looks twice, [`START_GRACE`]
/// apart, before saying there is none.
///
/// # Errors
/// [`CheckpointError::AmbiguousStart`] when more than one turn matches;
/// those of `GET /sessions` and `GET /sessions/{id}`.
pub(crate) async fn find_started(
    client: &crate::Client,
    key: &str,
    intent: &StartIntent,
) -> Result<Option<String>> {
    if let Some(found) = look(client, key, intent).await? {
        return Ok(Some(found));
    }
    tokio::time::sleep(START_GRACE).await;
    look(client, key, intent).await
}

async fn look(client: &crate::Client, key: &str, intent: &StartIntent) -> Result<Option<String>> {
    let sessions = client.sessions().list().await?;
    let candidates = sessions.into_iter().filter(|s| match &intent.after {
        None => true,
        Some(mark) => s.id != mark.session_id && s.created_at >= mark.updated_at,
    });
    // Every session created since the intent: a busy server may have made
    // many since, and the job's own may be any of them. The listing is
    // bounded by the API (200 sessions, one page).
    let mut matches = Vec::new();
    for session in candidates {
        let full = match client.sessions().get(&session.id).await {
            Ok(full) => full,
            // Deleted since it was listed: not the job's (it would still run).
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        if let Some(first) = first_turn(&full)
            && StartIntent::ask_digest(&ask_of(first)) == intent.ask
        {
            matches.push(first.id.clone());
        }
    }
    match matches.len() {
        0 | 1 => Ok(matches.pop()),
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

/// What the turn asked: its user input.
fn ask_of(query: &types::Query) -> String {
    query
        .input
        .iter()
        .filter(|i| i.role == "user")
        .map(|i| i.content.as_str())
        .collect()
}
