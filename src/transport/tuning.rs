//! [`CallOptions`]: the timeouts and retry policy of a client, overridden
//! for the calls made through one [`Client::with_options`](crate::Client::with_options)
//! copy, and the extra headers it sends; and how a request id is read.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::error::{Error, Result};

use super::retry::RetryPolicy;

/// Setters of `Option<Duration>` fields named as the setters, each taking a
/// `Duration` or an `Option<Duration>` (`None`: no limit): the timeouts of
/// [`ClientBuilder`](crate::ClientBuilder) and [`CallOptions`].
macro_rules! timeout_setters {
    ($($(#[$doc:meta])* $name:ident;)+) => {$(
        $(#[$doc])*
        pub fn $name(mut self, timeout: impl Into<Option<std::time::Duration>>) -> Self {
            self.$name = Some(timeout.into());
            self
        }
    )+};
}
pub(crate) use timeout_setters;

/// The timeouts and retry policy every request of a transport follows.
#[derive(Debug, Clone)]
pub(crate) struct Tuning {
    pub(crate) retry: RetryPolicy,
    /// Total time of one ordinary request.
    pub(crate) request_timeout: Option<Duration>,
    /// The longest wait for the response headers of an event stream.
    pub(crate) header_timeout: Option<Duration>,
    /// The longest wait for a body the transport reads itself (error bodies).
    pub(crate) read_timeout: Option<Duration>,
    /// The one bound on a turn, whichever way it runs.
    pub(crate) turn_timeout: Option<Duration>,
    /// Extra headers on every request (values marked sensitive).
    pub(crate) headers: HeaderMap,
}

/// Overrides of the client's timeouts and retry policy for some calls.
/// Anything not set keeps the client's value. Every timeout setter takes a
/// `Duration` or an `Option<Duration>` (`None`: no limit), as
/// [`ClientBuilder`](crate::ClientBuilder)'s do.
///
/// Apply them with [`Client::with_options`](crate::Client::with_options),
/// which returns a client for those calls (sharing the connection pool and
/// credentials), so the same shape fits every call: resources, turns,
/// listings and [`Client::api`](crate::Client::api).
///
/// ```no_run
/// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
/// use std::time::Duration;
/// use nexus_knowql::{CallOptions, RetryPolicy};
///
/// let quick = CallOptions::new()
///     .request_timeout(Duration::from_secs(5))
///     .retry(RetryPolicy::never());
/// let contexts = client.with_options(quick).contexts().list().await?;
/// # drop(contexts); Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[must_use]
pub struct CallOptions {
    retry: Option<RetryPolicy>,
    request_timeout: Option<Option<Duration>>,
    header_timeout: Option<Option<Duration>>,
    read_timeout: Option<Option<Duration>>,
    turn_timeout: Option<Option<Duration>>,
    headers: HeaderMap,
}

/// Headers a call may not set: the credentials and the API version (set
/// from the client's configuration), and what the client decides per
/// request (body framing, content type, what it accepts, the event to
/// resume after, the user agent, the host).
pub const RESERVED_HEADERS: [&str; 12] = [
    "authorization",
    "proxy-authorization",
    "x-pinecone-api-key",
    "x-pinecone-api-version",
    "api-version",
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "accept",
    "last-event-id",
    "user-agent",
];

impl CallOptions {
    /// No overrides.
    pub fn new() -> Self {
        CallOptions::default()
    }

    /// How failed requests are retried.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    crate::transport::tuning::timeout_setters! {
        /// Total time for one ordinary request; see
        /// [`ClientBuilder::request_timeout`](crate::ClientBuilder::request_timeout).
        request_timeout;

        /// The longest wait for an event stream's response headers; see
        /// [`ClientBuilder::header_timeout`](crate::ClientBuilder::header_timeout).
        header_timeout;

        /// The longest time spent reading an error answer's body; see
        /// [`ClientBuilder::read_timeout`](crate::ClientBuilder::read_timeout).
        read_timeout;

        /// The one bound on a turn; see
        /// [`ClientBuilder::turn_timeout`](crate::ClientBuilder::turn_timeout).
        turn_timeout;
    }

    /// Sends the header `name: value` on every request of the calls made
    /// with these options (a second value for the same name replaces the
    /// first). The value is kept as sensitive: `Debug` never shows it.
    ///
    /// ```no_run
    /// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
    /// use nexus_knowql::CallOptions;
    /// let traced = client.with_options(CallOptions::new().header("x-trace-id", "job-17")?);
    /// let contexts = traced.contexts().list().await?;
    /// # drop(contexts); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] (naming the header, never its value) for a
    /// name that is not a valid header name, a value that is not visible
    /// ASCII or tabs and spaces, and a name in [`RESERVED_HEADERS`] or
    /// starting `x-nexus-knowql-`: the credentials and the API version come
    /// from the client's configuration only, and are never replaced by a
    /// per-call header.
    pub fn header(mut self, name: &str, value: &str) -> Result<Self> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| Error::InvalidRequest(format!("invalid header name {name:?}")))?;
        if RESERVED_HEADERS.contains(&name.as_str()) || name.as_str().starts_with("x-nexus-knowql-")
        {
            return Err(Error::InvalidRequest(format!(
                "the header {name} is set by the client and cannot be set per call"
            )));
        }
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            Error::InvalidRequest(format!(
                "the value of header {name} has a character that cannot be sent"
            ))
        })?;
        value.set_sensitive(true);
        self.headers.insert(name, value);
        Ok(self)
    }

    /// `tuning` with these overrides.
    pub(crate) fn apply(&self, tuning: &Tuning) -> Tuning {
        let mut headers = tuning.headers.clone();
        for (name, value) in &self.headers {
            headers.insert(name.clone(), value.clone());
        }
        Tuning {
            headers,
            retry: self.retry.clone().unwrap_or_else(|| tuning.retry.clone()),
            request_timeout: self.request_timeout.unwrap_or(tuning.request_timeout),
            header_timeout: self.header_timeout.unwrap_or(tuning.header_timeout),
            read_timeout: self.read_timeout.unwrap_or(tuning.read_timeout),
            turn_timeout: self.turn_timeout.unwrap_or(tuning.turn_timeout),
        }
    }
}

/// Header names that may carry the server's request id, in order of preference.
const REQUEST_ID_NAMES: [http::HeaderName; 3] = [
    http::HeaderName::from_static("x-request-id"),
    http::HeaderName::from_static("x-pinecone-request-id"),
    http::HeaderName::from_static("request-id"),
];

/// The longest request id kept (a longer header value is cut).
pub(crate) const MAX_REQUEST_ID_LEN: usize = 256;

/// The server's request id in `headers`, if any (cut at
/// [`MAX_REQUEST_ID_LEN`] bytes).
pub(crate) fn request_id(headers: &HeaderMap) -> Option<String> {
    let id = REQUEST_ID_NAMES
        .iter()
        .find_map(|h| headers.get(h))
        .and_then(|v| v.to_str().ok())?;
    // `to_str` let only visible ASCII through: any byte is a boundary.
    Some(id[..id.len().min(MAX_REQUEST_ID_LEN)].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_replace_only_what_they_set() {
        let base = Tuning {
            retry: RetryPolicy::default(),
            request_timeout: Some(Duration::from_secs(60)),
            header_timeout: Some(Duration::from_secs(30)),
            read_timeout: Some(Duration::from_secs(30)),
            turn_timeout: None,
            headers: HeaderMap::new(),
        };
        let t = CallOptions::new()
            .request_timeout(Duration::from_secs(5))
            .header_timeout(None)
            .retry(RetryPolicy::never())
            .apply(&base);
        assert_eq!(t.request_timeout, Some(Duration::from_secs(5)));
        assert_eq!(t.header_timeout, None);
        assert_eq!(t.read_timeout, Some(Duration::from_secs(30)));
        assert_eq!(t.turn_timeout, None);
        assert_eq!(t.retry, RetryPolicy::never());
        let same = CallOptions::new().apply(&base);
        assert_eq!(same.request_timeout, base.request_timeout);
        assert_eq!(same.retry, base.retry);
    }

    #[test]
    fn reserved_and_invalid_headers_are_refused_without_their_value() {
        for name in RESERVED_HEADERS.iter().copied().chain([
            "X-Pinecone-Api-Key",
            "Authorization",
            "x-nexus-knowql-operation",
        ]) {
            let e = CallOptions::new().header(name, "pcsk_secret").unwrap_err();
            assert!(matches!(e, Error::InvalidRequest(_)), "{name}: {e:?}");
            assert!(!e.to_string().contains("pcsk_secret"), "{e}");
        }
        let e = CallOptions::new().header("x-a", "line\nbreak").unwrap_err();
        assert!(!e.to_string().contains("line"), "{e}");
        assert!(CallOptions::new().header("bad name", "v").is_err());
        let ok = CallOptions::new()
            .header("x-trace-id", "secret-trace")
            .unwrap();
        assert!(!format!("{ok:?}").contains("secret-trace"), "{ok:?}");
    }

    #[test]
    fn request_ids_are_bounded() {
        let mut headers = HeaderMap::new();
        headers.insert("request-id", "r-2".parse().unwrap());
        assert_eq!(request_id(&headers).as_deref(), Some("r-2"));
        headers.insert("x-request-id", "a".repeat(1000).parse().unwrap());
        assert_eq!(request_id(&headers).unwrap().len(), MAX_REQUEST_ID_LEN);
    }
}
