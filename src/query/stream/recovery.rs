//! Recovery of an event connection: reconnecting with backoff after a
//! break, and reading the stored turn when the replay cannot be trusted or
//! the final `query` frame did not come.

use std::task::Context;

use tokio::time::Instant;

use super::{EventConnection, ReplayGap, ResumeCycle, State, new_parser};
use super::{millis, open_events, stored_terminal};
use crate::error::Error;
use crate::transport::retry::Backoff;

impl EventConnection {
    /// Reads the stored turn in place of the `query` frame that did not
    /// come after the terminal event.
    pub(super) fn fetch_final(&mut self) {
        self.final_wait = None;
        self.idle = None;
        let Some(query_id) = self.binding.query_id().map(str::to_owned) else {
            self.state = State::Done;
            return;
        };
        let client = self.client.clone();
        let limit = self.time_left();
        let binding = self.binding.clone();
        self.state = State::Recovering(
            Box::pin(async move { stored_terminal(&client, &query_id, binding, limit).await }),
            None,
        );
    }

    pub(super) fn fail(&mut self, e: Error) {
        self.state = State::Done;
        self.failed = Some(match self.binding.query_id() {
            Some(id) => e.about_query(id),
            None => e,
        });
    }

    /// Stops reading and waits for the stored turn instead of the events
    /// after the last delivered one.
    pub(super) fn recover(&mut self, cause: String) {
        let Some(query_id) = self.binding.query_id().map(str::to_owned) else {
            self.fail(Error::Stream {
                query_id: None,
                message: format!("{cause}, and the server never named the turn"),
            });
            return;
        };
        tracing::warn!(
            query_id,
            last_seq = self.last_seq,
            cause,
            "the replay cannot be trusted; reading the stored turn"
        );
        self.parser = new_parser(&self.config);
        self.verify = None;
        let gap = ReplayGap {
            query_id: query_id.clone(),
            last_event_id: self.last_seq,
            cause,
        };
        let client = self.client.clone();
        let limit = self.time_left();
        let binding = self.binding.clone();
        self.state = State::Recovering(
            Box::pin(async move { stored_terminal(&client, &query_id, binding, limit).await }),
            Some(gap),
        );
    }

    /// Whether the idle limit passed; registers the timer otherwise.
    pub(super) fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(limit) = self.config.idle_timeout else {
            return false;
        };
        // A limit beyond what the clock can represent never expires.
        let Some(deadline) = self.last_activity.checked_add(limit) else {
            return false;
        };
        // The timer is re-armed lazily: bytes only move `last_activity`, so
        // the hot path never touches the timer wheel. The armed deadline is
        // never later than the real one, because activity only moves it on.
        let sleep = self
            .idle
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_pending() {
            return false;
        }
        if Instant::now() < deadline {
            sleep.as_mut().reset(deadline);
            return sleep.as_mut().poll(cx).is_ready();
        }
        true
    }

    /// Schedules a reconnection after a break, or ends the stream. After
    /// the terminal event only the final `query` frame can be missing: a
    /// resume that fails then ends the stream quietly, and the stored Query
    /// stands in for the frame.
    pub(super) fn reconnect(&mut self, cause: &str) {
        // Events held while the replay's start was unknown come again.
        if let Some(resume_seq) = self.align.broke() {
            self.last_seq = resume_seq;
        }
        // A `retry:` read with the last bytes counts for this reconnection.
        self.note_retry();
        self.state = State::Done;
        let Some(query_id) = self.binding.query_id().map(str::to_owned) else {
            self.failed = Some(Error::Stream {
                query_id: None,
                message: format!(
                    "{cause}, and the server had not named the turn yet: it cannot be resumed, \
                     and it is not sent again (that would start a second turn)"
                ),
            });
            return;
        };
        let now = Instant::now();
        let base = self
            .retry
            .unwrap_or(self.config.reconnect_delay)
            .min(self.config.reconnect_max_delay);
        let cycle = self.resume.get_or_insert_with(|| ResumeCycle {
            attempts: 0,
            started: now,
            // Up to a fifth shorter at random: spread, yet close to the
            // server's `retry:` when it gave one.
            backoff: Backoff::new(base, 2.0, self.config.reconnect_max_delay.max(base), 0.2),
        });
        let delay = cycle
            .backoff
            .next_delay()
            .min(self.config.reconnect_max_delay);
        let spent = now.duration_since(cycle.started);
        if cycle.attempts >= self.config.reconnect_attempts
            || spent.saturating_add(delay) > self.config.reconnect_max_elapsed
        {
            if self.terminal_seen {
                // The turn is over; the stored Query stands in for the
                // `query` frame that did not come.
                tracing::debug!(
                    query_id,
                    cause,
                    "no final Query frame after the terminal event"
                );
                self.fetch_final();
                return;
            }
            tracing::warn!(
                query_id,
                attempts = cycle.attempts,
                "giving up resuming the event stream"
            );
            self.failed = Some(Error::Stream {
                query_id: Some(query_id),
                message: format!("gave up after {} reconnections: {cause}", cycle.attempts),
            });
            return;
        }
        cycle.attempts += 1;
        self.resumes = self.resumes.saturating_add(1);
        tracing::debug!(
            resume = self.resumes,
            query_id,
            attempt = cycle.attempts,
            delay_ms = millis(delay),
            last_seq = self.last_seq,
            cause,
            "resuming the event stream"
        );
        self.state = State::Waiting(Box::pin(tokio::time::sleep(delay)));
    }

    /// [`EventConnection::reconnect`] without the backoff delay.
    pub(super) fn reconnect_now(&mut self, cause: &str) {
        self.reconnect(cause);
        if let State::Waiting(_) = self.state {
            self.connect();
        }
    }

    pub(super) fn connect(&mut self) {
        let Some(query_id) = self.binding.query_id().map(str::to_owned) else {
            self.state = State::Done;
            return;
        };
        let client = self.client.clone();
        let last = self.last_seq;
        self.last_activity = Instant::now();
        self.idle = None;
        self.state = State::Connecting(Box::pin(async move {
            open_events(&client, &query_id, last).await
        }));
    }
}
