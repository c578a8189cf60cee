use crate::status::Rating;
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
            .call("get_query", self.client.api().get_query(id))
            .await
    }

    /// `POST /queries/{id}/cancel`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub async fn cancel(&self, id: &str) -> Result<types::Query> {
        self.client
            .call("cancel_query", self.client.api().cancel_query(id))
            .await
    }

    /// `GET /queries/{id}/trace`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub async fn trace(&self, id: &str) -> Result<types::Trace> {
        self.client
            .call("get_query_trace", self.client.api().get_query_trace(id))
            .await
    }

    /// `POST /queries/{id}/feedback`: rates the answer, with an optional comment.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`](crate::Error::InvalidRequest) for a comment
    /// the API would refuse; any error of the call.
    pub async fn feedback(&self, id: &str, rating: Rating, comment: Option<&str>) -> Result<()> {
        let comment = comment
            .map(|c| {
                types::CreateQueryFeedbackBodyComment::try_from(c.to_owned())
                    .map_err(|e| crate::Error::InvalidRequest(format!("feedback comment: {e}")))
            })
            .transpose()?;
        let body = types::CreateQueryFeedbackBody {
            comment,
            rating: rating.to_string(),
        };
        self.client
            .call(
                "create_query_feedback",
                self.client.api().create_query_feedback(id, &body),
            )
            .await
    }
}
