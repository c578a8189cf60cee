//! Reading an event connection: the next new event, in order, exactly once,
//! from whichever state the connection is in.

use std::task::{Context, Poll, ready};

use futures::StreamExt;
use tokio::time::Instant;

use super::align::Admitted;
use super::{Delivery, EventConnection, Parsed, State, millis, new_parser, resumable};
use crate::error::{Error, Result};
use crate::query::event::QueryEvent;
use crate::query::sse::SseError;
use crate::types;

impl EventConnection {
    /// The next new event, in order, exactly once.
    pub(crate) fn poll_next_event(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Delivery>>> {
        if !matches!(self.state, State::Done) && self.deadline_passed(cx) {
            let elapsed = millis(self.started.elapsed());
            tracing::warn!(
                query_id = self.binding.query_id(),
                elapsed_ms = elapsed,
                "the turn's overall deadline passed"
            );
            self.fail(Error::timeout("query_turn", self.started.elapsed(), None));
        }
        loop {
            if let Some(delivery) = self.ready.pop_front() {
                return Poll::Ready(Some(Ok(delivery)));
            }
            if let State::Open(_) = self.state
                && let Some(parsed) = self.next_parsed()
            {
                match self.on_parsed(parsed) {
                    Some(delivery) => return Poll::Ready(Some(Ok(delivery))),
                    None => continue,
                }
            }
            if self.final_frame_overdue(cx) {
                tracing::debug!(
                    query_id = self.binding.query_id(),
                    "no final Query frame in time after the terminal event"
                );
                self.fetch_final();
                continue;
            }
            match &mut self.state {
                State::Open(_) => ready!(self.poll_body(cx)),
                State::Waiting(sleep) => {
                    ready!(sleep.as_mut().poll(cx));
                    self.connect();
                }
                State::Connecting(_) => ready!(self.poll_connecting(cx)),
                State::Recovering(..) => {
                    if let Some(delivery) = ready!(self.poll_recovering(cx)) {
                        return Poll::Ready(Some(Ok(delivery)));
                    }
                }
                State::Done => return Poll::Ready(self.failed.take().map(Err)),
            }
        }
    }

    /// What a parsed frame means: `Some` is an event to deliver, `None`
    /// that the connection's state moved on (read on).
    fn on_parsed(&mut self, parsed: std::result::Result<Parsed, SseError>) -> Option<Delivery> {
        match parsed {
            Ok(Parsed::Deliver(id, event)) => return self.on_event(id, event),
            Ok(Parsed::Skip) => {}
            Ok(Parsed::Foreign(e)) => {
                // Never retried or recovered: whatever else this server
                // says about the turn cannot be trusted.
                tracing::warn!(error = %e, "the server named another turn");
                self.fail(e);
            }
            Ok(Parsed::Broken(cause)) => {
                if self.terminal_seen {
                    // Only the final Query was missing; the stored one
                    // stands in for it.
                    tracing::debug!(cause, "a broken replay after the terminal event");
                    self.fetch_final();
                } else {
                    self.recover(cause);
                }
            }
            Ok(Parsed::Jump(cause)) => self.on_jump(cause),
            Err(e) => {
                if self.terminal_seen {
                    // The turn is over; the stored Query stands in for
                    // whatever this frame was.
                    tracing::debug!(error = %e, "ignoring a bad frame after the terminal event");
                    self.fetch_final();
                } else {
                    self.fail(Error::Stream {
                        query_id: self.binding.query_id().map(str::to_owned),
                        message: e.to_string(),
                    });
                }
            }
        }
        None
    }

    /// A new event: recorded, then delivered (`None` when a final Query
    /// that is not terminal sends the connection to the stored turn).
    fn on_event(&mut self, id: Option<u64>, event: QueryEvent) -> Option<Delivery> {
        tracing::trace!(seq = id, event = event.name(), "event");
        self.delivered_any = true;
        if id.is_some() {
            self.last_seq = id;
            self.conn_last = id;
            self.idless_after_last = 0;
            // New progress: a later break starts a fresh reconnect budget.
            self.resume = None;
        } else if !matches!(event, QueryEvent::TextDelta { .. }) {
            self.idless_after_last = self.idless_after_last.saturating_add(1);
        }
        match self.align.admit(id, event) {
            Admitted::Deliver(events) => {
                for (id, event) in events {
                    if let Some(delivery) = self.settled(id, event) {
                        self.ready.push_back(delivery);
                    }
                }
                self.ready.pop_front()
            }
            Admitted::Nothing => None,
            Admitted::Broken(cause) => {
                self.recover(cause);
                None
            }
        }
    }

    /// An event settled as new (past the alignment of a replay): what it
    /// means for the connection, then the delivery (`None` when a final
    /// Query that is not terminal sends the connection to the stored turn).
    fn settled(&mut self, id: Option<u64>, event: QueryEvent) -> Option<Delivery> {
        match &event {
            QueryEvent::Query(q) if !q.is_terminal() => {
                // A final frame is the truth only when the turn has ended:
                // the stored turn, once it has, stands in for it.
                tracing::debug!(
                    query_id = self.binding.query_id(),
                    status = q.status.as_str(),
                    "the final Query frame is not terminal; reading the stored turn"
                );
                self.fetch_final();
                return None;
            }
            QueryEvent::Query(_) => {
                // The document is the last frame: close now.
                self.state = State::Done;
            }
            e if e.is_terminal() => {
                self.terminal_seen = true;
                let wait = self.config.final_query_wait;
                self.final_wait = Some(Box::pin(tokio::time::sleep(wait)));
            }
            _ => {}
        }
        Some(Delivery::Event(id, event))
    }

    /// An id beyond the next one: reconnect from the last delivered event,
    /// or read the stored turn when the replay jumped there before.
    fn on_jump(&mut self, cause: String) {
        if self.terminal_seen {
            self.fetch_final();
        } else if self.jump_at == Some(self.last_seq) {
            // The replay jumped at the same place again.
            self.recover(cause);
        } else {
            tracing::warn!(
                query_id = self.binding.query_id(),
                cause,
                "events are missing; reconnecting from the last delivered one"
            );
            self.jump_at = Some(self.last_seq);
            // At once: the events are most likely in the log.
            self.resume = None;
            self.reconnect_now(&cause);
        }
    }

    /// Whether the final `query` frame is overdue after the terminal event
    /// while the connection still reads; registers the timer otherwise.
    fn final_frame_overdue(&mut self, cx: &mut Context<'_>) -> bool {
        self.terminal_seen
            && matches!(
                self.state,
                State::Open(_) | State::Waiting(_) | State::Connecting(_)
            )
            && self
                .final_wait
                .as_mut()
                .is_some_and(|w| w.as_mut().poll(cx).is_ready())
    }

    /// Reads the open body; `Ready` once the connection moved on (bytes
    /// to parse, or a break handled).
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let State::Open(body) = &mut self.state else {
            return Poll::Ready(());
        };
        match body.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(bytes))) => {
                self.last_activity = Instant::now();
                self.parser.feed(&bytes);
                self.note_retry();
            }
            Poll::Ready(Some(Err(e))) => {
                let e = self.client.transport().map_reqwest(self.body_operation, e);
                self.reconnect(&crate::error::chain(&e));
            }
            Poll::Ready(None) => {
                if self.terminal_seen {
                    self.fetch_final();
                } else {
                    self.reconnect("the stream ended before the turn did");
                }
            }
            Poll::Pending => {
                if !self.idle_expired(cx) {
                    return Poll::Pending;
                }
                let idle = self.config.idle_timeout.unwrap_or_default();
                self.reconnect(&format!("no bytes for {} ms", millis(idle)));
            }
        }
        Poll::Ready(())
    }

    /// Waits for the answer to the events request; `Ready` once the
    /// connection moved on (open again, or the failure handled).
    fn poll_connecting(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let State::Connecting(fut) = &mut self.state else {
            return Poll::Ready(());
        };
        match fut.as_mut().poll(cx) {
            Poll::Ready(Ok(resp)) => {
                tracing::debug!(query_id = self.binding.query_id(), "reconnected");
                self.parser = new_parser(&self.config);
                self.verify = self.last_seq;
                self.conn_last = None;
                self.skip_idless = self.idless_after_last;
                self.align.resumed(self.last_seq);
                self.last_activity = Instant::now();
                self.body_operation = "stream_query_events";
                self.state = State::Open(Box::pin(resp.bytes_stream()));
            }
            Poll::Ready(Err(e)) => {
                let gone = matches!(e.status().map(|s| s.as_u16()), Some(404 | 410));
                if self.terminal_seen {
                    // Only the final Query was missing; the stored one
                    // stands in for it.
                    tracing::debug!(error = %e, "no reconnect after the terminal event");
                    self.fetch_final();
                } else if gone && self.delivered_any {
                    self.recover(format!("the event log is gone ({e})"));
                } else if resumable(&e) {
                    self.reconnect(&crate::error::chain(&e));
                } else {
                    // A 4xx (the turn is gone, access was revoked...): final.
                    self.fail(e);
                }
            }
            Poll::Pending => {
                if !self.idle_expired(cx) {
                    return Poll::Pending;
                }
                self.reconnect("the events request got no answer in time");
            }
        }
        Poll::Ready(())
    }

    /// Waits for the stored turn; `Ready(Some)` is what to deliver,
    /// `Ready(None)` that the connection is done (the error in `failed`).
    fn poll_recovering(&mut self, cx: &mut Context<'_>) -> Poll<Option<Delivery>> {
        let State::Recovering(fut, gap) = &mut self.state else {
            return Poll::Ready(None);
        };
        let result: Result<types::Query> = ready!(fut.as_mut().poll(cx));
        let gap = gap.take();
        self.state = State::Done;
        let Some(gap) = gap else {
            // The stored turn in place of the `query` frame.
            return Poll::Ready(match result {
                Ok(query) => Some(Delivery::Event(None, QueryEvent::Query(Box::new(query)))),
                Err(e) => {
                    self.fail(e);
                    None
                }
            });
        };
        match result {
            Ok(query) => {
                tracing::info!(
                    query_id = gap.query_id,
                    status = query.status.as_str(),
                    "recovered the turn from its stored state"
                );
                self.terminal_seen = true;
                return Poll::Ready(Some(Delivery::Recovered(Box::new(query), gap)));
            }
            // What the stored turn says about itself is the outcome, not a
            // detail of the gap.
            Err(e @ (Error::TurnMismatch(_) | Error::UnknownTurnStatus { .. })) => {
                self.failed = Some(e);
            }
            Err(e) => {
                let detail = format!(
                    "the stored turn could not be read: {}",
                    crate::error::chain(&e)
                );
                self.failed = Some(gap.into_error(&detail));
            }
        }
        Poll::Ready(None)
    }
}
