use crate::{Client, Result, types};

/// Stored query turns. Get one from [`Client::queries`].
#[derive(Debug, Clone, Copy)]
pub struct Queries<'c> {
    pub(crate) client: &'c Client,
}

impl Queries<'_> {
    /// `GET /queries/{id}`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call (404 for an unknown turn).
    pub async fn get(&self, id: &str) -> Result<types::Query> {
        self.client
            .call("get_query", self.client.api().get_query(id, None))
            .await
    }

    /// A [`QueryHandle`](crate::QueryHandle) for a turn started anywhere
    /// (another process, another client), learnt from `GET /queries/{id}`:
    /// poll it, wait for it, cancel it, or read its events from the start
    /// ([`QueryHandle::events`](crate::QueryHandle::events)) or after a
    /// stored checkpoint
    /// ([`QueryHandle::events_after`](crate::QueryHandle::events_after)).
    ///
    /// The handle belongs to no [`Session`](crate::Session) of this
    /// process: to ask a follow-up, use
    /// [`Session::resume`](crate::Session::resume) with its session id.
    ///
    /// ```no_run
    /// # async fn run(client: nexus_knowql::Client, checkpoint: u64) -> nexus_knowql::Result<()> {
    /// use futures::StreamExt;
    /// let handle = client.queries().attach("q_123").await?;
    /// let mut rest = handle.events_after(checkpoint).await?;
    /// while let Some(event) = rest.next().await {
    ///     let _ = event?;
    /// }
    /// let query = rest.finish().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call (404 for an unknown turn).
    pub async fn attach(&self, id: &str) -> Result<crate::QueryHandle> {
        let span = crate::query::TurnSpan::new("attach");
        span.learn(Some(id), None);
        let query = {
            use tracing::Instrument;
            self.get(id).instrument(span.span()).await?
        };
        Ok(crate::QueryHandle::new(
            self.client.clone(),
            query,
            None,
            crate::StreamConfig::default(),
            span,
        ))
    }

    /// `POST /queries/{id}/cancel`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub async fn cancel(&self, id: &str) -> Result<types::Query> {
        self.client
            .call("cancel_query", self.client.api().cancel_query(id, None))
            .await
    }

    /// `GET /queries/{id}/trace`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub async fn trace(&self, id: &str) -> Result<types::Trace> {
        self.client
            .call(
                "get_query_trace",
                self.client.api().get_query_trace(id, None),
            )
            .await
    }

    /// `POST /queries/{id}/feedback` with `rating` `up` or `down`.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`](crate::Error::InvalidRequest) for a comment
    /// the API would refuse; any error of the call.
    pub async fn feedback(&self, id: &str, up: bool, comment: Option<&str>) -> Result<()> {
        let comment = comment
            .map(|c| {
                types::CreateQueryFeedbackBodyComment::try_from(c.to_owned())
                    .map_err(|e| crate::Error::InvalidRequest(format!("feedback comment: {e}")))
            })
            .transpose()?;
        let body = types::CreateQueryFeedbackBody {
            comment,
            rating: if up { "up" } else { "down" }.to_owned(),
        };
        self.client
            .call(
                "create_query_feedback",
                self.client.api().create_query_feedback(id, None, &body),
            )
            .await
    }
}
