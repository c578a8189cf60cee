//! [`TurnView`]: one turn seen through stacked adapters, each a stream of
//! the turn's events that gives the turn back.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};

use super::event::QueryEvent;
use super::turn::QueryTurn;
use crate::error::Result;
use crate::types;

/// One streaming turn, seen through zero or more adapters.
///
/// A [`QueryTurn`] is a view of itself; [`CheckpointedTurn`](crate::CheckpointedTurn)
/// and, with the `schema` feature, `typed::TypedTurn` wrap any view and are
/// views again, so they stack in any order; [`TextStream`](crate::TextStream)
/// and [`SequencedTurn`](crate::query::SequencedTurn) end a stack (their
/// items are text and numbered events). Every adapter gives what it wraps
/// back with `into_inner()`, and the turn itself with [`TurnView::turn`]
/// and [`TurnView::into_turn`].
///
/// Read the events through the outermost view, so that every layer sees
/// each of them, then call its [`TurnView::finish`]: each layer reads what
/// is left through the one below it and adds its own part (a checkpoint
/// saved, a value decoded).
///
/// ```no_run
/// # async fn run(session: nexus_knowql::Session, store: nexus_knowql::query::FileCheckpointStore) -> nexus_knowql::Result<()> {
/// use nexus_knowql::prelude::*;
///
/// let turn = session.ask("Summarize the travel policy").stream().await?;
/// let mut events = CheckpointedTurn::new(turn, store, "job-7").sequenced();
/// while let Some(numbered) = events.next().await {
///     let numbered = numbered?;
///     println!("{:?}: {:?}", numbered.id, numbered.event);
/// }
/// let query = events.into_inner().finish().await?;
/// # drop(query); Ok(()) }
/// ```
pub trait TurnView: Stream<Item = Result<QueryEvent>> + Unpin + Send + Sized {
    /// The turn, with what it accumulated so far.
    fn turn(&self) -> &QueryTurn;

    /// The turn itself, every adapter removed (what they held is dropped:
    /// a checkpoint not saved yet stays unsaved).
    fn into_turn(self) -> QueryTurn;

    /// Reads the rest of the turn through every layer and returns the
    /// final Query, as [`QueryTurn::finish`].
    fn finish(self) -> impl Future<Output = Result<types::Query>> + Send;

    /// This view, its answer text one delta at a time.
    fn text_stream(self) -> TextStream<Self> {
        TextStream { inner: self }
    }

    /// This view, each event with the event id it brings the turn to.
    fn sequenced(self) -> SequencedTurn<Self> {
        SequencedTurn { inner: self }
    }
}

impl TurnView for QueryTurn {
    fn turn(&self) -> &QueryTurn {
        self
    }

    fn into_turn(self) -> QueryTurn {
        self
    }

    fn finish(self) -> impl Future<Output = Result<types::Query>> + Send {
        QueryTurn::finish(self)
    }
}

/// The answer text of a turn, one delta at a time: made by
/// [`TurnView::text_stream`] over any view, which
/// [`TextStream::into_inner`] gives back (to finish it, for one).
///
/// Ends with the turn; errors (a failed turn, a stream that could not be
/// reconnected) are yielded as they are.
#[derive(Debug)]
#[must_use = "a stream does nothing unless read"]
pub struct TextStream<V = QueryTurn> {
    inner: V,
}

/// The turn and the view of a stream made over a view.
macro_rules! over_a_view {
    ($stream:ident) => {
        impl<V: TurnView> $stream<V> {
            /// The turn, with everything accumulated so far.
            pub fn turn(&self) -> &QueryTurn {
                self.inner.turn()
            }

            /// The view this stream reads, to go on reading it or finish it.
            pub fn into_inner(self) -> V {
                self.inner
            }
        }
    };
}

over_a_view!(TextStream);

impl<V: TurnView> Stream for TextStream<V> {
    type Item = Result<String>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            match futures::ready!(this.inner.poll_next_unpin(cx)) {
                None => return Poll::Ready(None),
                Some(Ok(QueryEvent::TextDelta { delta })) => return Poll::Ready(Some(Ok(delta))),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
            }
        }
    }
}

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
    /// no id. Keep the last one to reconnect with `Last-Event-ID`.
    pub id: Option<u64>,
}

/// The events of a turn as [`SequencedEvent`]s: the same events, errors
/// and guarantees, each carrying its id, so that a caller keeps its resume
/// point without asking. Made by [`TurnView::sequenced`] over any view;
/// [`SequencedTurn::into_inner`] gives the view back (to finish it, for
/// one).
///
/// ```no_run
/// # async fn run(session: nexus_knowql::Session) -> nexus_knowql::Result<()> {
/// use nexus_knowql::prelude::*;
///
/// let mut events = session.ask("What changed in July?").stream().await?.sequenced();
/// let mut resume_at = None;
/// while let Some(sequenced) = events.try_next().await? {
///     if let QueryEvent::TextDelta { delta } = &sequenced.event {
///         print!("{delta}");
///     }
///     resume_at = sequenced.id;
/// }
/// let query = events.into_inner().finish().await?;
/// # let _ = (resume_at, query); Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a stream does nothing unless read"]
pub struct SequencedTurn<V = QueryTurn> {
    inner: V,
}

over_a_view!(SequencedTurn);

impl<V: TurnView> Stream for SequencedTurn<V> {
    type Item = Result<SequencedEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let inner = &mut self.get_mut().inner;
        let item = futures::ready!(inner.poll_next_unpin(cx));
        Poll::Ready(item.map(|event| {
            event.map(|event| SequencedEvent {
                event,
                id: inner.turn().last_event_id(),
            })
        }))
    }
}
