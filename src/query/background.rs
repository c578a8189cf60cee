//! [`QueryHandle`]: a turn running in the background.

use std::fmt;
use std::time::Duration;

use backoff::backoff::Backoff;

use super::session::TurnSlot;
use super::stream::{EventConnection, StreamConfig, open_events};
use super::turn::{QueryTurn, into_outcome};
use crate::error::{Error, Result};
use crate::{Client, types};

/// A turn started with [`TurnBuilder::background`](crate::TurnBuilder::background).
///
/// It polls only when asked ([`QueryHandle::get`], [`QueryHandle::wait`]);
/// the SDK runs nothing behind the caller's back. While the handle lives and
/// has not seen the turn end, its session counts the turn as in flight.
pub struct QueryHandle {
    client: Client,
    query: types::Query,
    slot: Option<TurnSlot>,
    stream_config: StreamConfig,
}

impl fmt::Debug for QueryHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryHandle")
            .field("id", &self.query.id)
            .field("session_id", &self.query.session_id)
            .field("status", &self.query.status)
            .finish_non_exhaustive()
    }
}

/// How [`QueryHandle::wait_with`] polls.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct QueryWait {
    timeout: Duration,
    initial_interval: Duration,
    max_interval: Duration,
}

impl Default for QueryWait {
    fn default() -> Self {
        QueryWait {
            // Above the service's 900 s cap on a turn.
            timeout: Duration::from_secs(930),
            initial_interval: Duration::from_millis(200),
            max_interval: Duration::from_secs(5),
        }
    }
}

impl QueryWait {
    /// Gives up after this long (default 930 s) with [`Error::Timeout`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The first polling interval (default 200 ms); it grows up to `max` (default 5 s).
    pub fn interval(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_interval = initial;
        self.max_interval = max.max(initial);
        self
    }
}

impl QueryHandle {
    pub(crate) fn new(
        client: Client,
        query: types::Query,
        slot: TurnSlot,
        stream_config: StreamConfig,
    ) -> Self {
        let mut handle = QueryHandle {
            client,
            query,
            slot: Some(slot),
            stream_config,
        };
        handle.observe_terminal();
        handle
    }

    /// The turn's id.
    pub fn id(&self) -> &str {
        &self.query.id
    }

    /// The turn's session id.
    pub fn session_id(&self) -> &str {
        &self.query.session_id
    }

    /// The Query as last seen (the 202 answer, or the last poll).
    pub fn last_seen(&self) -> &types::Query {
        &self.query
    }

    fn observe(&mut self, query: types::Query) {
        self.query = query;
        self.observe_terminal();
    }

    fn observe_terminal(&mut self) {
        if self.query.is_terminal()
            && let Some(slot) = self.slot.take()
        {
            slot.learn(Some(&self.query.session_id), Some(&self.query.id));
        }
    }

    /// `GET /queries/{id}`: the turn now, whatever its status.
    ///
    /// # Errors
    /// Any error of the call.
    pub async fn get(&mut self) -> Result<types::Query> {
        let query = self.client.queries().get(&self.query.id).await?;
        self.observe(query.clone());
        Ok(query)
    }

    /// Polls until the turn ends, with the default [`QueryWait`].
    ///
    /// # Errors
    /// As for [`QueryHandle::wait_with`].
    pub async fn wait(&mut self) -> Result<types::Query> {
        self.wait_with(QueryWait::default()).await
    }

    /// Polls `GET /queries/{id}` with a growing interval until the turn is
    /// `completed`, `failed` or `cancelled`.
    ///
    /// # Errors
    /// [`Error::TurnFailed`] / [`Error::TurnCancelled`] for a turn that ended
    /// so; [`Error::Timeout`] when `wait.timeout` passes first; any error of
    /// the polls.
    ///
    /// # Cancel safety
    /// Dropping the future stops polling; the turn goes on on the server.
    pub async fn wait_with(&mut self, wait: QueryWait) -> Result<types::Query> {
        let started = tokio::time::Instant::now();
        let mut intervals = backoff::ExponentialBackoff {
            current_interval: wait.initial_interval,
            initial_interval: wait.initial_interval,
            randomization_factor: 0.1,
            multiplier: 1.5,
            max_interval: wait.max_interval,
            max_elapsed_time: None,
            ..backoff::ExponentialBackoff::default()
        };
        loop {
            let query = self.get().await?;
            if query.is_terminal() {
                return into_outcome(query);
            }
            let delay = intervals.next_backoff().unwrap_or(wait.max_interval);
            if started.elapsed().saturating_add(delay) > wait.timeout {
                return Err(Error::Timeout {
                    operation: "get_query",
                    elapsed_ms: super::millis(started.elapsed()),
                });
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// Attaches to the turn's events (`GET /queries/{id}/events`) from the
    /// start, with the same exactly-once resume as a streamed turn.
    ///
    /// # Errors
    /// Any error answer to the events request.
    pub async fn events(self) -> Result<QueryTurn> {
        let QueryHandle {
            client,
            query,
            slot,
            stream_config,
        } = self;
        let resp = open_events(&client, &query.id, None).await?;
        let conn = EventConnection::new(client, stream_config, resp, Some(query.id));
        Ok(QueryTurn::new(conn, slot))
    }

    /// Like [`QueryHandle::events`], with its own [`StreamConfig`].
    ///
    /// # Errors
    /// As for [`QueryHandle::events`].
    pub async fn events_with(mut self, config: StreamConfig) -> Result<QueryTurn> {
        self.stream_config = config;
        self.events().await
    }

    /// `POST /queries/{id}/cancel`: stops the turn on the server.
    ///
    /// # Errors
    /// Any error of the call.
    pub async fn cancel(&mut self) -> Result<types::Query> {
        let query = self.client.queries().cancel(&self.query.id).await?;
        self.observe(query.clone());
        Ok(query)
    }
}
