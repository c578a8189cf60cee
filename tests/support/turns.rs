//! Reading a streamed turn to its end, as the query tests do.
#![allow(dead_code, unreachable_pub)]

use futures::StreamExt;
use nexus_knowql::{Error, QueryEvent, QueryTurn};

/// Every item of the stream: the events, then the first error (if any).
pub async fn drain(turn: &mut QueryTurn) -> (Vec<QueryEvent>, Option<Error>) {
    let mut events = Vec::new();
    let mut error = None;
    while let Some(item) = turn.next().await {
        match item {
            Ok(e) => events.push(e),
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    (events, error)
}

/// The text of the answer: the deltas, concatenated.
pub fn text(events: &[QueryEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            QueryEvent::TextDelta { delta } => Some(delta.as_str()),
            _ => None,
        })
        .collect()
}
