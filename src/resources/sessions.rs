use futures::StreamExt;

use super::pages::{self, FetchFn, Fetched, Pages};
use crate::client::Call;
use crate::{Client, types};

/// The API's largest `limit` for `GET /sessions`.
const SESSIONS_MAX_PAGE: u64 = 200;

/// Stored sessions. Get one from [`Client::sessions`]. To run turns, use
/// [`Client::session`](crate::Client::session).
#[derive(Debug, Clone, Copy)]
pub struct Sessions<'c> {
    pub(crate) client: &'c Client,
}

impl<'c> Sessions<'c> {
    /// `GET /sessions`: the stored sessions, most recently updated first.
    /// `.await` the builder for the list, or read [`ListSessions::pages`].
    ///
    /// The 2026-07 API pages sessions by `limit` alone (at most 200 a
    /// request) and offers no offset or cursor, so one request is all a
    /// listing can make: it returns the newest 200 sessions at most. When the
    /// server fills that page, older sessions may exist that the API cannot
    /// list, and a `tracing` warning says so. [`ListSessions::page_size`] asks
    /// for fewer.
    ///
    /// ```no_run
    /// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
    /// for s in client.sessions().list().await? {
    ///     println!("{} {:?}", s.id, s.title);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn list(&self) -> ListSessions<'c> {
        ListSessions {
            client: self.client,
            page_size: SESSIONS_MAX_PAGE,
        }
    }

    /// `GET /sessions/{id}`: the session with its turns.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call (404 for an unknown session).
    pub fn get<'a>(&self, id: &'a str) -> Call<'a, types::GetSessionResponse>
    where
        'c: 'a,
    {
        let client = self.client;
        Call::new(client.call_meta("get_session", client.api().get_session(id)))
    }

    /// `DELETE /sessions/{id}`. Deleting a session that is already gone
    /// succeeds too.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub fn delete<'a>(&self, id: &'a str) -> Call<'a, ()>
    where
        'c: 'a,
    {
        let client = self.client;
        Call::new(async move {
            let (r, meta) = client
                .call_meta("delete_session", client.api().delete_session(id))
                .await?;
            if !r.deleted {
                tracing::debug!(session_id = id, "the session was already gone");
            }
            Ok(((), meta))
        })
    }
}

/// A listing of stored sessions. Get one from [`Sessions::list`].
#[derive(Debug, Clone, Copy)]
#[must_use = "a listing does nothing until awaited or read with pages()"]
pub struct ListSessions<'c> {
    client: &'c Client,
    page_size: u64,
}

impl<'c> ListSessions<'c> {
    /// The most sessions to return, 1 to 200 (default 200, the API's
    /// maximum): with this API version the listing is one page.
    pub fn page_size(mut self, n: u64) -> Self {
        self.page_size = n;
        self
    }

    /// The listing as a stream of pages (with this API version, one page).
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call; [`Error::InvalidRequest`](crate::Error::InvalidRequest)
    /// for a page size out of range.
    pub fn pages(self) -> Pages<'c, types::Session> {
        let op = "list_sessions";
        let limit = match pages::page_size(op, self.page_size, SESSIONS_MAX_PAGE)
            .and_then(|n| std::num::NonZeroU64::new(n).ok_or_else(|| zero_limit(op)))
        {
            Ok(n) => n,
            Err(e) => return futures::stream::once(async { Err(e) }).boxed(),
        };
        let client = self.client;
        let fetch: FetchFn<'c, types::Session> = Box::new(move |_| {
            Box::pin(async move {
                let page = client
                    .call(op, client.api().list_sessions(Some(limit)))
                    .await?;
                if page.sessions.len() as u64 >= SESSIONS_MAX_PAGE {
                    tracing::warn!(
                        count = page.sessions.len(),
                        "the API lists at most 200 sessions; older ones are not reachable"
                    );
                }
                Ok(Fetched {
                    items: page.sessions,
                    offset: 0,
                    total: None,
                    next: None,
                })
            })
        });
        pages::paginate(op, 0, usize::MAX, |s| s.id.clone(), fetch)
    }
}

fn zero_limit(op: &'static str) -> crate::Error {
    crate::Error::InvalidRequest(format!("{op}: page_size must be at least 1"))
}

pages::items_and_await!(
    ListSessions,
    types::Session,
    /// The sessions one by one; the errors of [`ListSessions::pages`] end it.
    ///
    /// ```no_run
    /// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
    /// use futures::TryStreamExt;
    /// let mut sessions = client.sessions().list().items();
    /// while let Some(session) = sessions.try_next().await? {
    ///     println!("{}", session.id);
    /// }
    /// # Ok(()) }
    /// ```
);
