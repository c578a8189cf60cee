//! The configured [`Client`]: base URL, credentials, API version, timeouts and
//! retry policy, shared by every call.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderValue;
use secrecy::SecretString;

mod response;
mod wait;

pub use crate::error::MAX_RATE_LIMIT_HEADERS;
pub use response::{Call, ResponseMeta};
pub(crate) use wait::Poller;
pub use wait::WaitPolicy;

pub use crate::transport::DEFAULT_REQUEST_TIMEOUT;
pub use crate::transport::auth::API_KEY_HEADER;
pub use crate::transport::redirect::{MAX_REDIRECTS, redirect_policy};
pub use crate::transport::retry::RetryPolicy;
pub use crate::transport::tuning::{CallOptions, RESERVED_HEADERS};
pub use crate::transport::version::{API_VERSION_HEADER, ApiVersion, DEFAULT_API_VERSION};

use crate::api::{self, ErrorEnvelope};
use crate::error::{Error, Result};
use crate::transport::{self, Transport, auth, version};

/// Environment variable holding the base URL, for example `https://HOST/api`.
pub const ENV_BASE_URL: &str = "NEXUS_BASE_URL";
/// Environment variable holding the Pinecone API key.
pub const ENV_API_KEY: &str = "PINECONE_API_KEY";
/// Environment variable holding the API version to request (optional).
pub const ENV_API_VERSION: &str = "NEXUS_API_VERSION";

/// The default `User-Agent`: `nexus-knowql/VERSION`.
pub const USER_AGENT: &str = concat!("nexus-knowql/", env!("CARGO_PKG_VERSION"));

/// Default time allowed to open a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default longest wait for the response headers of an event stream (a
/// streamed turn's `POST /query`, `GET /queries/{id}/events`).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Default longest time spent reading an error answer's body.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Default total time for a synchronous turn ([`TurnBuilder::send`](crate::TurnBuilder::send)):
/// above the service's 900 s cap on a turn.
pub const DEFAULT_TURN_TIMEOUT: Duration = Duration::from_secs(930);

/// A Nexus API client. Cheap to clone: clones share one connection pool.
///
/// ```no_run
/// # async fn run() -> nexus_knowql::Result<()> {
/// use nexus_knowql::Client;
/// let client = Client::builder()
///     .base_url("https://nexus.example.com/api")
///     .api_key("pcsk_...")
///     .build()?;
/// for context in client.contexts().list().await? {
///     println!("{} queryable={}", context.slug, context.is_queryable());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    api: api::Client,
    transport: Transport,
    /// Cancels started by turns dropped before their end
    /// ([`StreamConfig::cancel_on_drop`](crate::StreamConfig::cancel_on_drop)).
    /// Shared with every [`Client::with_options`] copy.
    cancels: Arc<std::sync::Mutex<tokio::task::JoinSet<()>>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("transport", &self.inner.transport)
            .finish()
    }
}

impl Client {
    /// A builder with nothing set.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// A client configured from `NEXUS_BASE_URL`, `PINECONE_API_KEY` (optional)
    /// and `NEXUS_API_VERSION` (optional).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when `NEXUS_BASE_URL` is missing or invalid.
    pub fn from_env() -> Result<Client> {
        ClientBuilder::from_env().build()
    }

    /// The generated low-level client, sharing this client's transport
    /// (authentication, version header, retries). It reaches every operation
    /// of the API except the multipart upload, which is
    /// [`Sources::upload_file`](crate::resources::Sources::upload_file).
    /// Its calls' errors convert into [`Error`] with `?`, and their
    /// `ResponseValue` gives a [`ResponseMeta`] with
    /// [`ResponseMeta::from_headers`].
    pub fn api(&self) -> &api::Client {
        &self.inner.api
    }

    /// The base URL requests go to (no trailing slash).
    pub fn base_url(&self) -> &str {
        self.inner.transport.base_url()
    }

    /// The API version this client sends.
    pub fn api_version(&self) -> &ApiVersion {
        self.inner.transport.version()
    }

    /// A client for some calls with other timeouts or retry policy: the
    /// same connection pool, credentials and API version, with `options`
    /// over this client's settings. Cheap; use it for one call or keep it.
    ///
    /// Extra headers set with [`CallOptions::header`] go on every request of
    /// the copy.
    ///
    /// ```no_run
    /// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
    /// use std::time::Duration;
    /// use nexus_knowql::CallOptions;
    ///
    /// // A long turn, with a longer limit than the client's.
    /// let patient = client.with_options(CallOptions::new().turn_timeout(Duration::from_secs(1800)));
    /// let session = patient.session(["handbook"]).build()?;
    /// let answer = session.ask("Summarize every policy").send().await?;
    /// println!("{}", answer.answer_text());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn with_options(&self, options: CallOptions) -> Client {
        let transport = self.inner.transport.with_options(&options);
        let api = api::Client::new_with_client(
            self.inner.transport.base_url(),
            self.inner.transport.http().clone(),
            transport.clone(),
        );
        Client {
            inner: Arc::new(ClientInner {
                api,
                transport,
                cancels: Arc::clone(&self.inner.cancels),
            }),
        }
    }

    /// The version the server last echoed in `X-Pinecone-Api-Version`, if any.
    pub fn server_api_version(&self) -> Option<String> {
        self.inner.transport.last_server_version()
    }

    /// Waits until every cancel started by a turn dropped before its end
    /// ([`StreamConfig::cancel_on_drop`](crate::StreamConfig::cancel_on_drop))
    /// has been answered, at most `limit`; returns how many were still
    /// pending then. A short program calls it before returning from `main`,
    /// since a runtime that shuts down drops its unfinished tasks (so does a
    /// `current_thread` runtime that is not polled).
    ///
    /// ```no_run
    /// # async fn run(client: nexus_knowql::Client) {
    /// use std::time::Duration;
    /// let left = client.finish_cancels(Duration::from_secs(10)).await;
    /// assert_eq!(left, 0);
    /// # }
    /// ```
    pub async fn finish_cancels(&self, limit: std::time::Duration) -> usize {
        let mut pending = std::mem::take(&mut *self.lock_cancels());
        let drained = tokio::time::timeout(limit, async {
            while pending.join_next().await.is_some() {}
        })
        .await;
        if drained.is_ok() {
            return 0;
        }
        let left = pending.len();
        // Not awaited any more, but not aborted either: they go on running.
        pending.detach_all();
        left
    }

    /// Runs a cancel of a dropped turn on `runtime`, tracked for
    /// [`Client::finish_cancels`].
    pub(crate) fn spawn_cancel(
        &self,
        runtime: &tokio::runtime::Handle,
        cancel: impl Future<Output = ()> + Send + 'static,
    ) {
        let mut set = self.lock_cancels();
        // Forget the finished ones, so the set stays small.
        while set.try_join_next().is_some() {}
        set.spawn_on(cancel, runtime);
    }

    fn lock_cancels(&self) -> std::sync::MutexGuard<'_, tokio::task::JoinSet<()>> {
        // Only whole-value operations happen under the lock.
        self.inner.cancels.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn transport(&self) -> &Transport {
        &self.inner.transport
    }

    /// Runs a generated call and maps its error.
    pub(crate) async fn call<T, E, F>(&self, operation: &'static str, fut: F) -> Result<T>
    where
        E: ErrorEnvelope,
        F: Future<
            Output = std::result::Result<
                progenitor_client::ResponseValue<T>,
                progenitor_client::Error<E>,
            >,
        >,
    {
        self.call_meta(operation, fut).await.map(|(value, _)| value)
    }

    /// [`Client::call`], with what the answer said besides its body.
    pub(crate) async fn call_meta<T, E, F>(
        &self,
        operation: &'static str,
        fut: F,
    ) -> Result<(T, ResponseMeta)>
    where
        E: ErrorEnvelope,
        F: Future<
            Output = std::result::Result<
                progenitor_client::ResponseValue<T>,
                progenitor_client::Error<E>,
            >,
        >,
    {
        match fut.await {
            Ok(v) => {
                let meta = ResponseMeta::from_headers(v.status().as_u16(), v.headers());
                Ok((v.into_inner(), meta))
            }
            Err(e) => Err(api::map_error(&self.inner.transport, operation, e).await),
        }
    }

    /// A request builder for a path below the base URL (hand-written calls).
    pub(crate) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let url = format!("{}{}", self.inner.transport.base_url(), path);
        self.inner.transport.http().request(method, url)
    }

    /// Sends a hand-written request; a non-2xx answer is an [`Error`].
    pub(crate) async fn send(
        &self,
        operation: &'static str,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response> {
        let req = built(operation, req)?;
        self.inner.transport.send(req, operation).await
    }

    /// Sends a hand-written request for an event stream, the wait for its
    /// headers bounded by the header timeout.
    pub(crate) async fn send_stream(
        &self,
        operation: &'static str,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response> {
        let req = built(operation, req)?;
        self.inner.transport.send_stream(req, operation).await
    }
}

/// A hand-written request, built; one that cannot be is
/// [`Error::InvalidRequest`] naming `operation`.
fn built(operation: &'static str, req: reqwest::RequestBuilder) -> Result<reqwest::Request> {
    req.build()
        .map_err(|e| Error::InvalidRequest(format!("{operation}: {e}")))
}

/// Builds a [`Client`]. Setters never fail; [`ClientBuilder::build`] reports
/// the first problem.
#[must_use]
#[derive(Default)]
pub struct ClientBuilder {
    base_url: Option<String>,
    api_key: Option<SecretString>,
    /// Where the key came from, to name it (never its value) in an error.
    api_key_source: &'static str,
    login: bool,
    api_version: ApiVersion,
    connect_timeout: Option<Option<Duration>>,
    request_timeout: Option<Option<Duration>>,
    header_timeout: Option<Option<Duration>>,
    read_timeout: Option<Option<Duration>>,
    turn_timeout: Option<Option<Duration>>,
    max_response_bytes: Option<usize>,
    retry: RetryPolicy,
    user_agent: Option<String>,
    http: Option<reqwest::Client>,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("login", &self.login)
            .field("api_version", &self.api_version)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("header_timeout", &self.header_timeout)
            .field("read_timeout", &self.read_timeout)
            .field("turn_timeout", &self.turn_timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("retry", &self.retry)
            .field("user_agent", &self.user_agent)
            .finish()
    }
}

impl ClientBuilder {
    /// A builder preset from `NEXUS_BASE_URL`, `PINECONE_API_KEY` and
    /// `NEXUS_API_VERSION`; later setters override them.
    pub fn from_env() -> Self {
        let var = |name| {
            std::env::var(name)
                .ok()
                .filter(|v: &String| !v.trim().is_empty())
        };
        ClientBuilder {
            base_url: var(ENV_BASE_URL),
            api_key: var(ENV_API_KEY).map(SecretString::from),
            api_key_source: ENV_API_KEY,
            api_version: var(ENV_API_VERSION)
                .map(ApiVersion::from)
                .unwrap_or_default(),
            ..ClientBuilder::default()
        }
    }

    /// The API base URL, for example `https://HOST/api` (required).
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = Some(url.into());
        self
    }

    /// The Pinecone API key, sent as `X-Pinecone-Api-Key` (or exchanged for a
    /// token with [`ClientBuilder::login`]).
    ///
    /// Whitespace around the key (a trailing newline from `echo` into a
    /// secret, a CRLF `.env`) is trimmed when the client is built; a key
    /// with any other character that is not visible ASCII is refused there
    /// with [`Error::InvalidRequest`], which names where the key came from
    /// (`api_key()` or `PINECONE_API_KEY`) but never the key.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(SecretString::from(key.into()));
        self.api_key_source = "api_key()";
        self
    }

    /// Exchange the API key at `POST /auth/login` for a bearer token, send
    /// `Authorization: Bearer`, and log in again once when a token is refused.
    pub fn login(mut self, enabled: bool) -> Self {
        self.login = enabled;
        self
    }

    /// The API version to request (default `2026-07`).
    pub fn api_version(mut self, version: impl Into<ApiVersion>) -> Self {
        self.api_version = version.into();
        self
    }

    crate::transport::tuning::timeout_setters! {
        /// Time allowed to open a connection (default 10 s); `None` leaves it
        /// to the operating system. Like every timeout setter of the crate, it
        /// takes a `Duration` or an `Option<Duration>`.
        connect_timeout;

        /// Total time for one ordinary request (default 60 s); `None` for no
        /// limit. It also bounds `POST /auth/login` (60 s when `None`), which
        /// every request waits on. Event streams and synchronous turns are never
        /// cut by it: see [`ClientBuilder::header_timeout`] (and the per-turn
        /// idle limit) and [`ClientBuilder::turn_timeout`].
        request_timeout;

        /// The longest wait for the response headers of an event stream: a
        /// streamed turn's `POST /query` (default 30 s) and every
        /// `GET /queries/{id}/events`. A `POST /query` that runs out of time
        /// fails with [`Error::Timeout`] and is never sent again. `None` waits
        /// forever.
        header_timeout;

        /// The longest time spent reading the body of an error answer (default
        /// 30 s); what arrived by then is kept. `None` waits forever.
        read_timeout;

        /// The one bound on a turn (default 930 s, above the service's 900 s
        /// cap); `None` for no limit. Every way of running or reading a turn
        /// ends by it, counted from the call:
        /// [`send`](crate::TurnBuilder::send),
        /// [`stream`](crate::TurnBuilder::stream) (reconnects and the reading
        /// of the stored turn included), [`background`](crate::TurnBuilder::background)
        /// with [`QueryHandle::wait`](crate::QueryHandle::wait), and the streams
        /// of [`QueryHandle::resume_from`](crate::QueryHandle::resume_from) and
        /// [`CheckpointedTurn`](crate::CheckpointedTurn) that resume a turn. When
        /// it passes, the call fails with [`Error::Timeout`]; the turn is not
        /// cancelled. The expert knobs of [`StreamConfig`](crate::StreamConfig)
        /// (idle timeout, reconnect budget) only give up sooner. Override it for
        /// some calls with [`CallOptions::turn_timeout`].
        ///
        /// ```
        /// use std::time::Duration;
        /// let client = nexus_knowql::Client::builder()
        ///     .base_url("http://127.0.0.1:8080/api")
        ///     .api_key("pcsk-example")
        ///     .turn_timeout(Duration::from_secs(120))
        ///     .build()?;
        /// # drop(client);
        /// # Ok::<(), nexus_knowql::Error>(())
        /// ```
        turn_timeout;
    }

    /// The most bytes of one response body the client reads (default
    /// 64 MiB), for every call: generated ones, the stored Query, error
    /// answers. A larger body fails with [`Error::ResponseTooLarge`] naming
    /// the operation and the limit, without being read to its end. Event
    /// streams are bounded per frame instead (see
    /// [`StreamConfig`](crate::StreamConfig)).
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        self.max_response_bytes = Some(limit.max(1));
        self
    }

    /// How failed requests are retried.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Overrides the `User-Agent` (default `nexus-knowql/VERSION`).
    pub fn user_agent(mut self, ua: impl Into<String>) -> Self {
        self.user_agent = Some(ua.into());
        self
    }

    /// Uses this `reqwest::Client` instead of the built-in one, for anything
    /// the builder does not offer (a proxy of your own, extra root or client
    /// certificates, DNS, pool sizes).
    ///
    /// Whatever the client, the crate applies per request: the credentials
    /// (key header, login token and re-login), `X-Pinecone-Api-Version`, the
    /// retry policy and `Retry-After`, [`request_timeout`](Self::request_timeout),
    /// the [`user_agent`](Self::user_agent) when one was set, and the check
    /// that every answer comes from the configured origin.
    ///
    /// Only the built-in client is shaped by
    /// [`connect_timeout`](Self::connect_timeout), the default user agent, the
    /// TLS backend chosen by Cargo feature, the system proxy settings and the
    /// redirect rule. reqwest follows redirects inside the client, before the
    /// crate sees the answer, so build yours with
    /// [`client::redirect_policy()`](crate::client::redirect_policy) (or no
    /// redirects at all): with reqwest's default policy a redirect to another
    /// host still carries `X-Pinecone-Api-Key`, and the crate can only refuse
    /// the answer afterwards ([`Error::Redirect`]).
    pub fn http_client(mut self, client: reqwest::Client) -> Self {
        self.http = Some(client);
        self
    }

    /// Builds the client.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a missing or invalid base URL, an invalid
    /// version or user agent, an API key that cannot be sent (empty, or with
    /// a character that is not visible ASCII inside it), or login without an
    /// API key.
    pub fn build(self) -> Result<Client> {
        let raw = self.base_url.ok_or_else(|| {
            Error::InvalidRequest(format!(
                "no base URL: set {ENV_BASE_URL} or call base_url()"
            ))
        })?;
        let parsed = url::Url::parse(raw.trim())
            .map_err(|e| Error::InvalidRequest(format!("invalid base URL {raw:?}: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Error::InvalidRequest(format!(
                "base URL {raw:?} must be http or https"
            )));
        }
        let base_url = parsed.as_str().trim_end_matches('/').to_owned();
        let version_value = HeaderValue::from_str(self.api_version.as_str()).map_err(|_| {
            Error::InvalidRequest(format!(
                "invalid API version {:?}",
                self.api_version.as_str()
            ))
        })?;
        let api_key = self
            .api_key
            .map(|key| checked_key(key, self.api_key_source))
            .transpose()?;
        let auth = match (api_key, self.login) {
            (Some(key), true) => auth::Auth::Login(auth::LoginState::new(key)),
            (Some(key), false) => auth::Auth::ApiKey(key),
            (None, true) => return Err(Error::InvalidRequest("login needs an API key".into())),
            (None, false) => auth::Auth::None,
        };
        // With a client of the caller's, a user agent set here goes on each request.
        let user_agent = match (&self.user_agent, self.http.is_some()) {
            (Some(ua), true) => Some(
                HeaderValue::from_str(ua)
                    .map_err(|_| Error::InvalidRequest(format!("invalid user agent {ua:?}")))?,
            ),
            _ => None,
        };
        let (http, http_recipe) = match self.http {
            Some(c) => (c, None),
            None => {
                let recipe = transport::HttpRecipe {
                    user_agent: self.user_agent.unwrap_or_else(|| USER_AGENT.to_owned()),
                    connect_timeout: self
                        .connect_timeout
                        .unwrap_or(Some(DEFAULT_CONNECT_TIMEOUT)),
                };
                (recipe.build()?, Some(recipe))
            }
        };
        let tuning = transport::tuning::Tuning {
            retry: self.retry,
            request_timeout: self
                .request_timeout
                .unwrap_or(Some(DEFAULT_REQUEST_TIMEOUT)),
            header_timeout: self.header_timeout.unwrap_or(Some(DEFAULT_HEADER_TIMEOUT)),
            read_timeout: self.read_timeout.unwrap_or(Some(DEFAULT_READ_TIMEOUT)),
            turn_timeout: self.turn_timeout.unwrap_or(Some(DEFAULT_TURN_TIMEOUT)),
            headers: reqwest::header::HeaderMap::new(),
        };
        let transport = Transport::new(
            transport::TransportInner {
                user_agent,
                http: http.clone(),
                http_recipe,
                base_url: base_url.clone(),
                version: self.api_version,
                version_value,
                tracker: version::VersionTracker::default(),
                auth,
                max_response_bytes: self
                    .max_response_bytes
                    .unwrap_or(transport::DEFAULT_MAX_RESPONSE_BYTES),
                login_token: api::login_token,
            },
            tuning,
        );
        let api = api::Client::new_with_client(&base_url, http, transport.clone());
        Ok(Client {
            inner: Arc::new(ClientInner {
                api,
                transport,
                cancels: Arc::default(),
            }),
        })
    }
}

/// The API key without surrounding whitespace, or an error naming its
/// source (never its value) when it is empty or has a character that cannot
/// go in a header as it is.
fn checked_key(key: SecretString, source: &str) -> Result<SecretString> {
    use secrecy::ExposeSecret;
    let trimmed = key.expose_secret().trim();
    if trimmed.is_empty() {
        return Err(Error::InvalidRequest(format!(
            "the API key from {source} is empty"
        )));
    }
    if let Some(at) = trimmed.bytes().position(|b| !b.is_ascii_graphic()) {
        return Err(Error::InvalidRequest(format!(
            "the API key from {source} has a character that is not visible ASCII \
             (a space, control character or non-ASCII letter) at byte {at}; it was not sent"
        )));
    }
    if trimmed.len() == key.expose_secret().len() {
        return Ok(key);
    }
    Ok(SecretString::from(trimmed.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys_are_trimmed_or_refused_without_showing_them() {
        for (key, ok) in [
            ("pcsk_abc\n", true),
            ("pcsk_abc\r\n", true),
            ("  pcsk_abc\t", true),
            ("pcsk_\u{7f}abc", false),
            ("pcsk abc", false),
            ("pcsk_\nabc", false),
            ("pcsk_é", false),
            (" \n", false),
        ] {
            let built = Client::builder()
                .base_url("http://127.0.0.1:1")
                .api_key(key)
                .build();
            match built {
                Ok(_) => assert!(ok, "{key:?} accepted"),
                Err(e) => {
                    assert!(!ok, "{key:?} refused: {e}");
                    let text = e.to_string();
                    assert!(text.contains("api_key()"), "{text}");
                    assert!(!text.contains("abc"), "{text}");
                }
            }
        }
        let key = checked_key(SecretString::from("pcsk_abc\r\n"), "x").unwrap();
        assert_eq!(secrecy::ExposeSecret::expose_secret(&key), "pcsk_abc");
    }

    #[test]
    fn a_call_does_not_carry_the_retry_loop_inline() {
        // The retry loop's state is boxed in the transport; without that, a
        // plain `list()` is over 8 KiB in a debug build, and every future
        // that awaits it holds a copy.
        let client = Client::builder()
            .base_url("http://127.0.0.1:9")
            .build()
            .unwrap();
        let contexts = client.contexts();
        let list = contexts.list();
        assert!(
            std::mem::size_of_val(&list) <= 6 * 1024,
            "{} bytes",
            std::mem::size_of_val(&list)
        );
    }

    #[test]
    fn build_rejects_bad_config() {
        assert!(matches!(
            Client::builder().build(),
            Err(Error::InvalidRequest(_))
        ));
        assert!(matches!(
            Client::builder().base_url("not a url").build(),
            Err(Error::InvalidRequest(_))
        ));
        assert!(matches!(
            Client::builder().base_url("ftp://x").build(),
            Err(Error::InvalidRequest(_))
        ));
        assert!(matches!(
            Client::builder().base_url("http://x").login(true).build(),
            Err(Error::InvalidRequest(_))
        ));
        assert!(matches!(
            Client::builder()
                .base_url("http://x")
                .api_version("bad\nversion")
                .build(),
            Err(Error::InvalidRequest(_))
        ));
    }

    #[test]
    fn base_url_trailing_slash_is_dropped() {
        let c = Client::builder()
            .base_url("http://127.0.0.1:9/api/")
            .build()
            .unwrap();
        assert_eq!(c.base_url(), "http://127.0.0.1:9/api");
    }

    #[test]
    fn debug_never_shows_the_key() {
        let b = Client::builder()
            .base_url("http://x")
            .api_key("pcsk_topsecret");
        assert!(!format!("{b:?}").contains("pcsk_topsecret"));
        let c = b.login(true).build().unwrap();
        assert!(!format!("{c:?}").contains("pcsk_topsecret"));
    }

    #[allow(dead_code)]
    fn assert_send_sync() {
        fn is<T: Send + Sync + Clone + 'static>() {}
        is::<Client>();
    }
}
