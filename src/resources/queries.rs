use crate::client::Call;
use crate::status::Rating;
use crate::{Client, types};

/// Stored query turns. Get one from [`Client::queries`].
#[derive(Debug, Clone, Copy)]
pub struct Queries<'c> {
    pub(crate) client: &'c Client,
}

impl<'c> Queries<'c> {
    /// `GET /queries/{id}`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call (404 for an unknown turn).
    pub fn get<'a>(&self, id: &'a str) -> Call<'a, types::Query>
    where
        'c: 'a,
    {
        let client = self.client;
        Call::new(client.call_meta("get_query", client.api().get_query(id)))
    }

    /// `POST /queries/{id}/cancel`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub fn cancel<'a>(&self, id: &'a str) -> Call<'a, types::Query>
    where
        'c: 'a,
    {
        let client = self.client;
        Call::new(client.call_meta("cancel_query", client.api().cancel_query(id)))
    }

    /// `GET /queries/{id}/trace`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub fn trace<'a>(&self, id: &'a str) -> Call<'a, types::Trace>
    where
        'c: 'a,
    {
        let client = self.client;
        Call::new(client.call_meta("get_query_trace", client.api().get_query_trace(id)))
    }

    /// `POST /queries/{id}/feedback`: rates the answer, with an optional comment.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`](crate::Error::InvalidRequest) for a comment
    /// the API would refuse; any error of the call.
    pub fn feedback<'a>(&self, id: &'a str, rating: Rating, comment: Option<&str>) -> Call<'a, ()>
    where
        'c: 'a,
    {
        let client = self.client;
        let comment = comment.map(|c| {
            types::CreateQueryFeedbackBodyComment::try_from(c.to_owned())
                .map_err(|e| crate::Error::InvalidRequest(format!("feedback comment: {e}")))
        });
        Call::new(async move {
            let body = types::CreateQueryFeedbackBody {
                comment: comment.transpose()?,
                rating: rating.to_string(),
            };
            client
                .call_meta(
                    "create_query_feedback",
                    client.api().create_query_feedback(id, &body),
                )
                .await
        })
    }
}
