//! Reading a [`QueryTurn`]: the next event from the stored turn or the
//! connection, checked against the final answer and the turn's bounds,
//! then taken in.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

use super::QueryTurn;
use crate::error::{Error, Result};
use crate::query::accumulated::Over;
use crate::query::event::QueryEvent;
use crate::query::stream::Delivery;
use crate::status::QueryStatus;

/// Where the next event comes from, or what ends the read.
enum Source {
    /// An event (its id, when the frame had one).
    Event(Option<u64>, QueryEvent),
    /// What to yield instead: the end, or an error.
    Yield(Option<Result<QueryEvent>>),
}

impl QueryTurn {
    /// The next event: one made up from the stored turn, or the
    /// connection's.
    fn poll_source(&mut self, cx: &mut Context<'_>) -> Poll<Source> {
        if let Some(event) = self.pending.pop_front() {
            return Poll::Ready(Source::Event(None, event));
        }
        let Some(item) = std::task::ready!(self.conn.poll_next_event(cx)) else {
            self.end();
            return Poll::Ready(Source::Yield(None));
        };
        Poll::Ready(match item {
            Ok(Delivery::Event(id, event)) => Source::Event(id, event),
            Ok(Delivery::Recovered(query, gap)) => {
                if let Some(e) = self.recovered(*query, gap) {
                    return Poll::Ready(Source::Yield(Some(Err(e))));
                }
                self.reconciled = true;
                match self.pending.pop_front() {
                    Some(event) => Source::Event(None, event),
                    None => Source::Yield(None),
                }
            }
            Err(e) => Source::Yield(Some(Err(e))),
        })
    }

    /// Checks the final Query against the text delivered (the rest of the
    /// answer goes first, as one delta) and notes the terminal status.
    fn settle(&mut self, event: QueryEvent) -> Result<QueryEvent> {
        Ok(match event {
            QueryEvent::Query(query) => match self.check_final(&query) {
                Ok(None) => QueryEvent::Query(query),
                Ok(Some(rest)) => {
                    // The answer goes on past what was delivered: the rest
                    // first, as one delta.
                    tracing::debug!(rest = rest.len(), "delivering the rest of the final answer");
                    self.pending.push_front(QueryEvent::Query(query));
                    self.reconciled = true;
                    QueryEvent::TextDelta { delta: rest }
                }
                Err(m) => {
                    tracing::warn!(
                        query_id = m.query_id,
                        delivered = m.delivered_len,
                        final_len = m.final_len,
                        at = m.first_difference,
                        "the streamed text is not the final answer"
                    );
                    let e = m.to_error();
                    self.mismatch = Some(m);
                    return Err(e);
                }
            },
            QueryEvent::Completed if self.terminal_status.is_none() => {
                self.terminal_status = Some(QueryStatus::Completed);
                QueryEvent::Completed
            }
            e @ QueryEvent::Failed { .. } if self.terminal_status.is_none() => {
                self.terminal_status = Some(QueryStatus::Failed);
                e
            }
            e @ QueryEvent::Cancelled { .. } if self.terminal_status.is_none() => {
                self.terminal_status = Some(QueryStatus::Cancelled);
                e
            }
            e => e,
        })
    }

    /// The error when `event` would take the turn past its bounds; reading
    /// then stops.
    fn past_bound(&mut self, event: &QueryEvent) -> Option<Error> {
        let config = &self.stream_config;
        let over = self
            .acc
            .would_pass(event, config.max_text_bytes, config.max_step_bytes)?;
        let (part, limit) = match over {
            Over::Text => ("text", config.max_text_bytes),
            Over::Steps => ("steps", config.max_step_bytes),
        };
        tracing::warn!(
            query_id = self.conn.query_id(),
            part,
            limit,
            "the turn passed its bound; reading stopped"
        );
        self.conn.close();
        self.pending.clear();
        self.end();
        Some(Error::TurnTooLarge {
            query_id: self.conn.query_id().map(str::to_owned),
            part,
            limit: u64::try_from(limit).unwrap_or(u64::MAX),
        })
    }

    /// Takes `event` (its id `id`) in and yields it: a failed or cancelled
    /// turn as its error.
    fn deliver(&mut self, id: Option<u64>, event: QueryEvent) -> Result<QueryEvent> {
        self.acc.apply(&event);
        self.conn.note_delivered(id, &event);
        if let (
            Some(slot),
            QueryEvent::Created {
                session_id,
                query_id,
            },
        ) = (&self.slot, &event)
        {
            slot.learn(session_id.as_deref(), Some(query_id));
        }
        self.span
            .learn(self.conn.query_id(), self.acc.session_id.as_deref());
        let query_id = || self.conn.query_id().unwrap_or_default().to_owned();
        match event {
            QueryEvent::Failed { error } => Err(Error::TurnFailed {
                query_id: query_id(),
                message: error,
            }),
            QueryEvent::Cancelled { error } => Err(Error::TurnCancelled {
                query_id: query_id(),
                message: error,
            }),
            event => Ok(event),
        }
    }
}

impl Stream for QueryTurn {
    type Item = Result<QueryEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let span = this.span.span();
        let _enter = span.enter();
        let (id, event) = match std::task::ready!(this.poll_source(cx)) {
            Source::Event(id, event) => (id, event),
            Source::Yield(item) => return Poll::Ready(item),
        };
        let event = match this.settle(event) {
            Ok(event) => event,
            Err(e) => return Poll::Ready(Some(Err(e))),
        };
        if let Some(e) = this.past_bound(&event) {
            return Poll::Ready(Some(Err(e)));
        }
        Poll::Ready(Some(this.deliver(id, event)))
    }
}
