//! [`StreamConfig`]: how a turn's event stream reads, limits and reconnects.

use std::time::Duration;

use super::sse::DEFAULT_MAX_FRAME_BYTES;

/// How a turn's event stream reads, limits and reconnects: the expert
/// knobs under the one bound on a turn,
/// [`ClientBuilder::turn_timeout`](crate::ClientBuilder::turn_timeout).
/// None of them can make a turn last longer than that bound: the idle
/// timeout and the reconnect budget only decide when a quiet or broken
/// connection is given up on sooner.
///
/// ```
/// use std::time::Duration;
/// use nexus_knowql::StreamConfig;
/// let config = StreamConfig::default()
///     .idle_timeout(Some(Duration::from_secs(30)))
///     .max_frame_bytes(1 << 20)
///     .reconnect_attempts(5);
/// # let _ = config;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct StreamConfig {
    pub(super) idle_timeout: Option<Duration>,
    pub(super) max_frame_bytes: usize,
    pub(super) max_query_frame_bytes: usize,
    pub(super) reconnect_attempts: u32,
    pub(super) reconnect_max_elapsed: Duration,
    pub(super) reconnect_delay: Duration,
    pub(super) reconnect_max_delay: Duration,
    pub(super) cancel_on_drop: bool,
    pub(super) final_query_wait: Duration,
    pub(super) max_text_bytes: usize,
    pub(super) max_step_bytes: usize,
    pub(super) keep_text: bool,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            idle_timeout: Some(Duration::from_secs(60)),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_query_frame_bytes: MAX_QUERY_BODY_BYTES,
            reconnect_attempts: 8,
            reconnect_max_elapsed: Duration::from_secs(120),
            reconnect_delay: Duration::from_millis(250),
            reconnect_max_delay: Duration::from_secs(10),
            cancel_on_drop: false,
            final_query_wait: DEFAULT_FINAL_QUERY_WAIT,
            max_text_bytes: DEFAULT_MAX_TEXT_BYTES,
            max_step_bytes: DEFAULT_MAX_STEP_BYTES,
            keep_text: true,
        }
    }
}

impl StreamConfig {
    /// Reconnect when no byte (SSE comments included) arrives for this long
    /// (default 60 s); `None` waits forever.
    pub fn idle_timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.idle_timeout = timeout.into();
        self
    }

    /// The most bytes one progress frame may have (default 4 MiB); a larger
    /// frame before the terminal event ends the stream with [`Error::Stream`](crate::Error::Stream).
    pub fn max_frame_bytes(mut self, limit: usize) -> Self {
        self.max_frame_bytes = limit.max(1);
        self
    }

    /// The most bytes of the final `query` frame (default 64 MiB, the same
    /// limit as a JSON Query body). A larger one is not an error: the turn
    /// has ended, and [`QueryTurn::finish`](crate::QueryTurn::finish) reads
    /// the stored Query instead.
    pub fn max_query_frame_bytes(mut self, limit: usize) -> Self {
        self.max_query_frame_bytes = limit.max(1);
        self
    }

    /// Whether dropping the [`QueryTurn`](crate::QueryTurn) before the turn
    /// ended cancels it on the server (default `false`: the turn goes on and
    /// its session remembers it). Best effort: the cancel
    /// (`POST /queries/{id}/cancel`) runs as a task on the current Tokio
    /// runtime, since a drop cannot wait, and is lost if that runtime shuts
    /// down first; await [`Client::finish_cancels`](crate::Client::finish_cancels)
    /// before exiting, or call [`QueryTurn::cancel`](crate::QueryTurn::cancel)
    /// to cancel for sure. A turn dropped before the server named it cannot
    /// be cancelled. [`QueryTurn::detach`](crate::QueryTurn::detach) never cancels.
    pub fn cancel_on_drop(mut self, on: bool) -> Self {
        self.cancel_on_drop = on;
        self
    }

    pub(crate) fn cancel_on_drop_enabled(&self) -> bool {
        self.cancel_on_drop
    }

    /// How long the final `query` frame is awaited after the terminal event
    /// (default 5 s); after that, or when the stream ends or breaks first,
    /// the turn is read with `GET /queries/{id}` instead. SSE comments
    /// (keep-alives) do not extend this wait.
    pub fn final_query_wait(mut self, wait: Duration) -> Self {
        self.final_query_wait = wait;
        self
    }

    /// The most bytes of answer text a turn delivers (default 16 MiB),
    /// counted whether or not it is kept ([`StreamConfig::keep_text`]). A
    /// turn that goes past it ends with
    /// [`Error::TurnTooLarge`](crate::Error::TurnTooLarge) (part `text`);
    /// the turn is not cancelled.
    pub fn max_text_bytes(mut self, limit: usize) -> Self {
        self.max_text_bytes = limit.max(1);
        self
    }

    /// The most bytes of steps a turn holds (default 4 MiB): the steps
    /// merged by `step_id`, each counted by its text fields. A turn that
    /// goes past it ends with [`Error::TurnTooLarge`](crate::Error::TurnTooLarge)
    /// (part `steps`).
    pub fn max_step_bytes(mut self, limit: usize) -> Self {
        self.max_step_bytes = limit.max(1);
        self
    }

    /// Whether the turn keeps the answer text it delivers for
    /// [`QueryTurn::text`](crate::QueryTurn::text) (default `true`). A
    /// caller that only prints the deltas can turn it off: the turn then
    /// holds a keyed hash and the length of the text instead, and still
    /// checks it against the final answer (the answer text is in the final
    /// Query either way).
    pub fn keep_text(mut self, keep: bool) -> Self {
        self.keep_text = keep;
        self
    }

    /// Reconnections tried after one break before giving up (default 8).
    /// The count starts again once a reconnection delivers a new event.
    pub fn reconnect_attempts(mut self, attempts: u32) -> Self {
        self.reconnect_attempts = attempts;
        self
    }

    /// Total time spent reconnecting after one break before giving up
    /// (default 120 s); `None` leaves only [`StreamConfig::reconnect_attempts`].
    pub fn reconnect_max_elapsed(mut self, limit: impl Into<Option<Duration>>) -> Self {
        self.reconnect_max_elapsed = limit.into().unwrap_or(Duration::MAX);
        self
    }

    /// The first delay before reconnecting (default 250 ms) when the stream
    /// sent no `retry:` field, and the cap delays grow to (default 10 s).
    pub fn reconnect_delay(mut self, first: Duration, max: Duration) -> Self {
        self.reconnect_delay = first;
        self.reconnect_max_delay = max.max(first);
        self
    }
}

impl StreamConfig {
    /// The most bytes the final `query` frame may grow to while it is
    /// buffered: [`StreamConfig::max_query_frame_bytes`], but never more
    /// than a Query within the turn's own bounds can take (its answer text
    /// twice, as `output` and `output_json`, its steps, and 1 MiB for the
    /// rest), so a frame far past the text bound is refused as it arrives,
    /// not after it was buffered and decoded whole.
    pub(crate) fn query_frame_limit(&self) -> usize {
        let within_bounds = self
            .max_text_bytes
            .saturating_mul(2)
            .saturating_add(self.max_step_bytes)
            .saturating_add(1024 * 1024);
        self.max_query_frame_bytes.min(within_bounds)
    }
}

/// The most bytes of a Query document, as a JSON body or a `query` frame.
pub(crate) const MAX_QUERY_BODY_BYTES: usize = 64 * 1024 * 1024;

/// The default bound on a turn's answer text.
pub(crate) const DEFAULT_MAX_TEXT_BYTES: usize = 16 * 1024 * 1024;

/// The default bound on a turn's steps.
pub(crate) const DEFAULT_MAX_STEP_BYTES: usize = 4 * 1024 * 1024;

/// The default wait for the `query` frame after the terminal event.
const DEFAULT_FINAL_QUERY_WAIT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    /// The final frame's bound follows the turn's text bound: a frame far
    /// past it is refused while it arrives.
    #[test]
    fn the_query_frame_limit_follows_the_text_bound() {
        let mib = 1024 * 1024;
        assert_eq!(StreamConfig::default().query_frame_limit(), 37 * mib);
        let small = StreamConfig::default()
            .max_text_bytes(mib)
            .max_step_bytes(mib);
        assert_eq!(small.query_frame_limit(), 4 * mib);
        let tight = StreamConfig::default().max_query_frame_bytes(mib);
        assert_eq!(tight.query_frame_limit(), mib);
    }
}
