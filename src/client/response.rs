//! What one answer said besides its body ([`ResponseMeta`]), and the call
//! type of the resources ([`Call`]) that hands it out on request.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use reqwest::header::HeaderMap;

use crate::error::{RateLimits, Result};
use crate::transport::retry::retry_after;
use crate::transport::tuning::request_id;

/// What the server's answer to one call said besides its body: its status,
/// its request id (for a support ticket or a log line) and its rate-limit
/// headers, when it sent them.
///
/// It is the answer's own, so calls running side by side each read theirs.
/// Get it from a resource call with [`Call::with_metadata`], or from a
/// generated call's `ResponseValue` with [`ResponseMeta::from_headers`].
/// It holds no request header, so never a credential.
///
/// ```no_run
/// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
/// let (task, meta) = client.tasks().get("task_123").with_metadata().await?;
/// tracing::info!(request_id = meta.request_id(), task = task.id, "got the task");
/// if let Some(left) = meta.rate_limit("remaining-requests") {
///     println!("{left} requests left");
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResponseMeta {
    status: u16,
    request_id: Option<String>,
    retry_after: Option<Duration>,
    rate_limit: RateLimits,
}

impl ResponseMeta {
    /// The metadata of an answer with `status` and `headers`, for example
    /// a generated call's: `ResponseMeta::from_headers(rv.status().as_u16(), rv.headers())`.
    ///
    /// Header values that are not visible ASCII are left out; a request id
    /// is cut at 256 bytes and a rate-limit value at 64; at most 16
    /// rate-limit headers are kept.
    pub fn from_headers(status: u16, headers: &HeaderMap) -> Self {
        ResponseMeta {
            status,
            request_id: request_id(headers),
            retry_after: retry_after(headers),
            rate_limit: RateLimits::from_headers(headers),
        }
    }

    /// The HTTP status of the answer.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The server's request id (`x-request-id`, `x-pinecone-request-id` or
    /// `request-id`, at most 256 bytes), when it sent one.
    pub fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    /// The answer's `Retry-After`, when it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The value of the rate-limit header `x-ratelimit-{name}` (for example
    /// `rate_limit("remaining-requests")`), when the answer carried it.
    pub fn rate_limit(&self, name: &str) -> Option<&str> {
        self.rate_limit.get(name)
    }

    /// Every `x-ratelimit-*` header of the answer, as `(name without the
    /// prefix, value)`.
    pub fn rate_limits(&self) -> impl Iterator<Item = (&str, &str)> {
        self.rate_limit.iter()
    }
}

impl fmt::Display for ResponseMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "status {}", self.status)?;
        if let Some(id) = &self.request_id {
            write!(f, ", request {id}")?;
        }
        Ok(())
    }
}

type CallFuture<'a, T> = Pin<Box<dyn Future<Output = Result<(T, ResponseMeta)>> + Send + 'a>>;

/// One call of a resource that makes one request (`client.contexts().get(..)`,
/// `client.tasks().get(..)`, …): a future of the typed answer. `.await` it for the answer, or call
/// [`Call::with_metadata`] for the answer and its [`ResponseMeta`].
///
/// ```no_run
/// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
/// let contexts = client.contexts().list().await?;
/// let (contexts, meta) = client.contexts().list().with_metadata().await?;
/// println!("{} contexts (request {:?})", contexts.len(), meta.request_id());
/// # Ok(()) }
/// ```
#[must_use = "a call does nothing until awaited"]
pub struct Call<'a, T> {
    future: CallFuture<'a, T>,
}

impl<T> fmt::Debug for Call<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call").finish_non_exhaustive()
    }
}

impl<'a, T> Call<'a, T> {
    pub(crate) fn new(future: impl Future<Output = Result<(T, ResponseMeta)>> + Send + 'a) -> Self {
        Call {
            future: Box::pin(future),
        }
    }

    /// Runs the call; gives the typed answer with what the answer said
    /// besides its body.
    ///
    /// # Errors
    /// As awaiting the call; an error carries its own request id
    /// ([`Error::request_id`](crate::Error::request_id)).
    pub async fn with_metadata(self) -> Result<(T, ResponseMeta)> {
        self.future.await
    }
}

impl<T> Future for Call<'_, T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.future
            .as_mut()
            .poll(cx)
            .map(|answer| answer.map(|(value, _)| value))
    }
}
