use crate::{Client, Result, types};

/// Stored sessions. Get one from [`Client::sessions`]. To run turns, use
/// [`Client::session`](crate::Client::session).
#[derive(Debug, Clone, Copy)]
pub struct Sessions<'c> {
    pub(crate) client: &'c Client,
}

impl Sessions<'_> {
    /// `GET /sessions`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub async fn list(&self) -> Result<Vec<types::Session>> {
        let page = self
            .client
            .call("list_sessions", self.client.api().list_sessions(None, None))
            .await?;
        Ok(page.sessions)
    }

    /// `GET /sessions/{id}`: the session with its turns.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call (404 for an unknown session).
    pub async fn get(&self, id: &str) -> Result<types::GetSessionResponse> {
        self.client
            .call("get_session", self.client.api().get_session(id, None))
            .await
    }

    /// `DELETE /sessions/{id}`.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub async fn delete(&self, id: &str) -> Result<bool> {
        let r = self
            .client
            .call("delete_session", self.client.api().delete_session(id, None))
            .await?;
        Ok(r.deleted)
    }
}
