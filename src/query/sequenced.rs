//! [`SequencedTurn`]: a turn's events, each with the event id it brings the
//! turn to, so that a caller keeps its resume point without asking.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};

use super::event::QueryEvent;
use super::turn::QueryTurn;
use crate::error::Result;

/// A delivered event and the turn's event id once it was delivered.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SequencedEvent {
    /// The event.
    pub event: QueryEvent,
    /// What [`QueryTurn::last_event_id`] says once `event` is delivered:
    /// its SSE `id:`, or for a frame without one (the final `query`) the id
    /// before it; [`END_OF_TURN`](super::END_OF_TURN) for the rest of an
    /// answer taken from the stored turn. `None` while the server has sent
    /// no id. Keep the last one to resume with `Last-Event-ID`.
    pub id: Option<u64>,
}

/// The events of a [`QueryTurn`] as [`SequencedEvent`]s: the same events,
/// errors and guarantees, each carrying its id. Made by
/// [`QueryTurn::sequenced`]; [`SequencedTurn::into_turn`] gives the turn
/// back (to [`finish`](QueryTurn::finish) it, for one).
///
/// ```no_run
/// # async fn run(session: nexus_knowql::Session) -> nexus_knowql::Result<()> {
/// use futures::TryStreamExt;
/// use nexus_knowql::QueryEvent;
///
/// let mut events = session.ask("What changed in July?").stream().await?.sequenced();
/// let mut resume_at = None;
/// while let Some(sequenced) = events.try_next().await? {
///     if let QueryEvent::TextDelta { delta } = &sequenced.event {
///         print!("{delta}");
///     }
///     resume_at = sequenced.id;
/// }
/// let query = events.into_turn().finish().await?;
/// # let _ = (resume_at, query); Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a stream does nothing unless read"]
pub struct SequencedTurn {
    turn: QueryTurn,
}

impl SequencedTurn {
    /// The turn, with everything accumulated so far.
    pub fn turn(&self) -> &QueryTurn {
        &self.turn
    }

    /// The turn, to go on reading it as plain events or finish it.
    pub fn into_turn(self) -> QueryTurn {
        self.turn
    }
}

impl QueryTurn {
    /// The turn's events, each with the event id it brings the turn to
    /// (see [`SequencedEvent::id`]).
    pub fn sequenced(self) -> SequencedTurn {
        SequencedTurn { turn: self }
    }
}

impl Stream for SequencedTurn {
    type Item = Result<SequencedEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let turn = &mut self.get_mut().turn;
        let item = futures::ready!(turn.poll_next_unpin(cx));
        Poll::Ready(item.map(|event| {
            event.map(|event| SequencedEvent {
                event,
                id: turn.last_event_id(),
            })
        }))
    }
}
