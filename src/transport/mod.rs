//! The one place that sends HTTP requests: headers, authentication, retries,
//! version tracking, and the mapping of failures to [`Error`].
//!
//! Both layers go through it: the generated client (via its hooks in
//! `src/api/mod.rs`) and the hand-written query and upload code.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use reqwest::{Request, Response, StatusCode};
use secrecy::ExposeSecret;
use tracing::Instrument;

mod attempt;
pub(crate) mod auth;
mod bodies;
pub(crate) mod marks;
pub(crate) mod media;
pub(crate) mod observe;
pub(crate) mod redirect;
pub(crate) mod retry;
pub(crate) mod tuning;
pub(crate) mod version;

/// What the servers (`mcp`, `local`, `web`) may use of the transport, and
/// nothing else: the backoff arithmetic, the same-origin rule of redirects,
/// the retry count of a scope and the mapping of reqwest's errors. A test
/// (`tests/sdk/module_graph.rs`) keeps every other path out of their code.
#[cfg(feature = "mcp")]
pub(crate) mod for_servers {
    pub(crate) use super::map_reqwest;
    pub(crate) use super::observe::counting_retries;
    pub(crate) use super::redirect::same_origin;
    pub(crate) use super::retry::Backoff;
}

use self::attempt::{Answered, Attempts, next_attempt};
use self::auth::Auth;
pub(crate) use self::bodies::read_limited;
use self::bodies::{
    ERROR_BODY_LIMIT, RAW_BODY_MARKER, bounded, envelope_bytes, http_response,
    normalize_error_body, parse_envelope, too_large,
};
use self::redirect::RedirectRefused;
use self::tuning::{CallOptions, Tuning, request_id};
use self::version::{API_VERSION_HEADER, ApiVersion, VersionTracker};
use crate::error::{Error, Result, millis};

/// Marks a response rewritten because of a redirect to another origin (one
/// a custom client followed, or one that reached the crate unfollowed); its
/// value is [`RedirectRefused::to_marker`].
const REDIRECT_MARKER: &str = "x-nexus-knowql-redirect-refused";

/// The header names of every request, parsed once (`HeaderMap` lookups by
/// `&str` parse the name each time).
const API_VERSION_NAME: reqwest::header::HeaderName =
    reqwest::header::HeaderName::from_static("x-pinecone-api-version");
const API_KEY_NAME: reqwest::header::HeaderName =
    reqwest::header::HeaderName::from_static("x-pinecone-api-key");
const PROGENITOR_VERSION_NAME: reqwest::header::HeaderName =
    reqwest::header::HeaderName::from_static("api-version");

/// Makes a fresh copy of a request whose body cannot be cloned.
pub(crate) type Rebuild<'a> = dyn Fn() -> Option<Request> + Send + Sync + 'a;

/// Shared state behind every request of one [`Client`](crate::Client).
///
/// It is the generated client's inner value (`api::Client::inner()`); users
/// obtain a configured generated client from [`Client::api`](crate::Client::api)
/// and never build this themselves.
#[derive(Clone)]
pub struct Transport {
    inner: Arc<TransportInner>,
    /// Timeouts, retries and extra headers: the client's, or a
    /// `with_options` copy's.
    tuning: Arc<Tuning>,
}

pub(crate) struct TransportInner {
    pub(crate) http: reqwest::Client,
    /// How `http` was built, when it is the built-in client.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) http_recipe: Option<HttpRecipe>,
    pub(crate) base_url: String,
    pub(crate) version: ApiVersion,
    pub(crate) version_value: HeaderValue,
    pub(crate) tracker: VersionTracker,
    pub(crate) auth: Auth,
    /// Sent on each request (set only for a caller's own `reqwest::Client`).
    pub(crate) user_agent: Option<HeaderValue>,
    /// The most bytes of one response body (event streams excepted).
    pub(crate) max_response_bytes: usize,
    /// Reads the token out of a `POST /auth/login` answer.
    pub(crate) login_token: fn(&[u8]) -> Option<String>,
}

/// Default total time for one ordinary request (not for event streams or a
/// synchronous turn), and the bound on `POST /auth/login`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The default bound on one response body.
pub(crate) const DEFAULT_MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// The settings of the built-in `reqwest::Client`.
#[derive(Debug, Clone)]
pub(crate) struct HttpRecipe {
    pub(crate) user_agent: String,
    pub(crate) connect_timeout: Option<Duration>,
}

impl HttpRecipe {
    /// The built-in client: credentials never follow a redirect to another
    /// origin, and connecting is bounded.
    pub(crate) fn build(&self) -> Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder()
            .redirect(redirect::redirect_policy())
            .user_agent(self.user_agent.as_str());
        if let Some(limit) = self.connect_timeout {
            builder = builder.connect_timeout(limit);
        }
        builder
            .build()
            .map_err(|e| Error::InvalidRequest(format!("could not build the HTTP client: {e}")))
    }
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("base_url", &self.inner.base_url)
            .field("api_version", &self.inner.version.as_str())
            .field("auth", &self.inner.auth)
            .field("retry", &self.tuning.retry)
            .field("request_timeout", &self.tuning.request_timeout)
            .field("header_timeout", &self.tuning.header_timeout)
            .field("read_timeout", &self.tuning.read_timeout)
            .field("turn_timeout", &self.tuning.turn_timeout)
            .field("max_response_bytes", &self.inner.max_response_bytes)
            .finish()
    }
}

/// Which requests carry no total timeout (they stream for as long as a turn runs).
fn is_event_stream(req: &Request) -> bool {
    req.headers()
        .get(reqwest::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

impl Transport {
    pub(crate) fn new(inner: TransportInner, tuning: Tuning) -> Self {
        Transport {
            inner: Arc::new(inner),
            tuning: Arc::new(tuning),
        }
    }

    /// The same transport with `options` over its timeouts, retries and
    /// extra headers.
    pub(crate) fn with_options(&self, options: &CallOptions) -> Self {
        Transport {
            inner: Arc::clone(&self.inner),
            tuning: Arc::new(options.apply(&self.tuning)),
        }
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }

    /// The retry policy calls through this transport follow.
    pub(crate) fn retry_policy(&self) -> &retry::RetryPolicy {
        &self.tuning.retry
    }

    /// A new built-in HTTP client (its own connection pool) made like this
    /// transport's; `None` when the caller supplied the client.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn new_http(&self) -> Option<Result<reqwest::Client>> {
        self.inner.http_recipe.as_ref().map(HttpRecipe::build)
    }

    pub(crate) fn base_url(&self) -> &str {
        &self.inner.base_url
    }

    pub(crate) fn version(&self) -> &ApiVersion {
        &self.inner.version
    }

    pub(crate) fn last_server_version(&self) -> Option<String> {
        self.inner.tracker.last_seen()
    }

    /// Sends `req` with authentication, the version header and retries.
    ///
    /// Returns the server's final answer whatever its status; error bodies
    /// that are not the JSON envelope are rewritten into one (see
    /// [`Transport::error_from_response`]) so the status is never lost.
    ///
    /// This is the generated client's way in: an error answer is marked
    /// with `operation` and the version sent (see [`marks`]), so the
    /// generated call's error converts into [`Error`] with `?`.
    pub(crate) async fn execute(
        &self,
        req: Request,
        operation: &'static str,
    ) -> reqwest::Result<Response> {
        marks::remember_operation(operation);
        // Boxed: the retry loop's state is large, and every future that
        // awaits it (generated calls, tool handlers) would hold, and move, a
        // copy of it otherwise.
        let mut resp = Box::pin(self.execute_rebuilding(req, None, operation)).await?;
        if !resp.status().is_success() {
            marks::mark(&mut resp, operation, &self.inner.version_value);
        }
        Ok(resp)
    }

    /// [`Transport::execute`] for a request whose body cannot be cloned (a
    /// multipart upload): `rebuild` makes a fresh copy for each further
    /// attempt, so re-login and retries work as for any other request. When
    /// it gives `None`, the attempt under way is the last one.
    pub(crate) async fn execute_rebuilding(
        &self,
        req: Request,
        rebuild: Option<&Rebuild<'_>>,
        operation: &str,
    ) -> reqwest::Result<Response> {
        self.execute_until(req, rebuild, operation, None).await
    }

    /// [`Transport::execute_rebuilding`] under a deadline the caller
    /// enforces (`until`): a retry whose wait would end at or past it is
    /// not made, and the last answer (a 429 with its `Retry-After`) is
    /// returned instead, so the caller's deadline never cuts a backoff and
    /// the server's advice reaches the caller.
    async fn execute_until(
        &self,
        mut req: Request,
        rebuild: Option<&Rebuild<'_>>,
        operation: &str,
        until: Option<tokio::time::Instant>,
    ) -> reqwest::Result<Response> {
        let sent_version = self.prepare(&mut req);
        let mut call = Attempts {
            origin: req.url().clone(),
            operation,
            sent_version,
            idempotent: retry::is_idempotent(req.method()),
            streams: is_event_stream(&req),
            started: tokio::time::Instant::now(),
            until,
            backoff: self.tuning.retry.backoff(),
            retries: 0,
            relogged_in: false,
            redirects: 0,
        };
        loop {
            let (mut attempt, last_chance) = next_attempt(&mut req, rebuild);
            let token_generation = match self.authorize(&mut attempt).await? {
                Ok(generation) => generation,
                Err(refused) => return Ok(refused),
            };
            let span = tracing::debug_span!(
                "http",
                op = operation,
                http.method = %attempt.method(),
                url.path = attempt.url().path(),
                attempt = call.retries + 1,
                http.status_code = tracing::field::Empty,
            );
            let result = self
                .inner
                .http
                .execute(attempt)
                .instrument(span.clone())
                .await;
            let answered = match result {
                Ok(resp) => {
                    let sent = (token_generation, last_chance);
                    self.on_answer(&mut call, &mut req, resp, &span, sent).await
                }
                Err(err) => self.on_failure(&mut call, err, &span, last_chance).await?,
            };
            match answered {
                Answered::Again => continue,
                Answered::Done(resp) => return Ok(resp),
            }
        }
    }

    /// Sets what every request carries: the call's extra headers, the API
    /// version, the user agent (for a caller's own client) and the request
    /// timeout. Returns the API version sent.
    fn prepare(&self, req: &mut Request) -> String {
        let inner = &*self.inner;
        // The call's extra headers first: none of them can be one the
        // client sets (see `CallOptions::header`).
        for (name, value) in &self.tuning.headers {
            req.headers_mut().insert(name.clone(), value.clone());
        }
        // progenitor adds an `api-version` header of its own; the API reads
        // only `X-Pinecone-Api-Version`.
        req.headers_mut().remove(PROGENITOR_VERSION_NAME);
        if !req.headers().contains_key(API_VERSION_NAME) {
            req.headers_mut()
                .insert(API_VERSION_NAME, inner.version_value.clone());
        }
        if let Some(ua) = &inner.user_agent {
            req.headers_mut()
                .insert(reqwest::header::USER_AGENT, ua.clone());
        }
        if req.timeout().is_none() && !is_event_stream(req) {
            *req.timeout_mut() = self.tuning.request_timeout;
        }
        req.headers()
            .get(API_VERSION_NAME)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    }

    /// The delay before another attempt, or `None` when the budget is spent.
    fn next_delay(
        &self,
        backoff: &mut retry::Backoff,
        retries: &mut u32,
        (started, until): (tokio::time::Instant, Option<tokio::time::Instant>),
        retry_after: Option<Duration>,
    ) -> Option<Duration> {
        let policy = &self.tuning.retry;
        if *retries >= policy.max_retries {
            return None;
        }
        let delay = policy.next_delay(backoff, retry_after);
        if started.elapsed().saturating_add(delay) > policy.max_elapsed {
            return None;
        }
        if until.is_some_and(|end| tokio::time::Instant::now() + delay >= end) {
            return None;
        }
        *retries += 1;
        observe::note_retry();
        Some(delay)
    }

    /// Adds credentials. `Ok(Err(response))` is a refused login, returned as
    /// the request's answer.
    async fn authorize(
        &self,
        req: &mut Request,
    ) -> reqwest::Result<std::result::Result<Option<u64>, Response>> {
        match &self.inner.auth {
            Auth::None => Ok(Ok(None)),
            Auth::ApiKey(key) => {
                if let Ok(mut v) = HeaderValue::from_str(key.expose_secret()) {
                    v.set_sensitive(true);
                    req.headers_mut().insert(API_KEY_NAME, v);
                }
                Ok(Ok(None))
            }
            Auth::Login(state) => {
                let (generation, token) = match state.token() {
                    Some(t) => t,
                    None => {
                        let _guard = state.login_lock.lock().await;
                        match state.token() {
                            Some(t) => t,
                            None => match self.login().await? {
                                Ok(token) => state.store(token),
                                Err(refused) => return Ok(Err(refused)),
                            },
                        }
                    }
                };
                if let Ok(mut v) =
                    HeaderValue::from_str(&format!("Bearer {}", token.expose_secret()))
                {
                    v.set_sensitive(true);
                    req.headers_mut().insert(AUTHORIZATION, v);
                }
                Ok(Ok(Some(generation)))
            }
        }
    }

    /// `POST /auth/login`: exchanges the API key for a bearer token.
    async fn login(&self) -> reqwest::Result<std::result::Result<String, Response>> {
        let Auth::Login(state) = &self.inner.auth else {
            return Ok(Ok(String::new()));
        };
        tracing::debug!("logging in");
        let body = serde_json::json!({ "api_key": state.key.expose_secret() });
        // Every request waits on the login lock this runs under: it always
        // has a deadline, even when ordinary requests have none.
        let limit = self
            .tuning
            .request_timeout
            .unwrap_or(DEFAULT_REQUEST_TIMEOUT);
        let req = self
            .inner
            .http
            .post(format!("{}/auth/login", self.inner.base_url))
            .header(API_VERSION_HEADER, self.inner.version_value.clone())
            .timeout(limit)
            .json(&body)
            .build()?;
        let origin = req.url().clone();
        let resp = self.inner.http.execute(req).await?;
        if !redirect::same_origin(&origin, resp.url()) {
            let refused = RedirectRefused::followed(resp.url());
            return Ok(Err(redirect_refused_response(refused)));
        }
        if !resp.status().is_success() {
            return Ok(Err(
                normalize_error_body(resp, self.tuning.read_timeout).await
            ));
        }
        let bytes = bounded(resp, self.inner.max_response_bytes).bytes().await?;
        match (self.inner.login_token)(&bytes) {
            Some(token) => Ok(Ok(token)),
            None => {
                // Present an undecodable login answer as a refused login.
                let rebuilt = http_response(
                    StatusCode::UNAUTHORIZED,
                    &HeaderMap::new(),
                    envelope_bytes("login answer could not be decoded", None),
                    true,
                );
                Ok(Err(rebuilt))
            }
        }
    }

    fn observe_version(&self, sent: &str, headers: &HeaderMap) {
        if let Some(echoed) = headers.get(API_VERSION_NAME).and_then(|v| v.to_str().ok()) {
            self.inner.tracker.observe(sent, echoed);
        }
    }

    /// Sends a hand-written request; a non-2xx answer becomes an [`Error`].
    pub(crate) async fn send(&self, req: Request, operation: &'static str) -> Result<Response> {
        self.send_rebuilding(req, None, operation).await
    }

    /// [`Transport::send`] with a way to rebuild an uncloneable request (see
    /// [`Transport::execute_rebuilding`]).
    pub(crate) async fn send_rebuilding(
        &self,
        req: Request,
        rebuild: Option<&Rebuild<'_>>,
        operation: &'static str,
    ) -> Result<Response> {
        self.send_until(req, rebuild, operation, None).await
    }

    async fn send_until(
        &self,
        req: Request,
        rebuild: Option<&Rebuild<'_>>,
        operation: &'static str,
        until: Option<tokio::time::Instant>,
    ) -> Result<Response> {
        let started = tokio::time::Instant::now();
        // Boxed, as in `execute`.
        let resp = Box::pin(self.execute_until(req, rebuild, operation, until))
            .await
            .map_err(|e| {
                let mut e = self.map_reqwest(operation, e);
                if let Error::Timeout { elapsed_ms, .. } = &mut e {
                    *elapsed_ms = millis(started.elapsed());
                }
                e
            })?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(self.error_from_response(operation, resp).await)
        }
    }

    /// Sends a request for an event stream: like [`Transport::send`], with
    /// the wait for the response headers (and any error body) bounded by the
    /// header timeout. The body itself is never cut by a total timeout.
    ///
    /// A `POST /query` that runs out of time is not sent again: the server
    /// may already run the turn. Retries (after a 429) never wait past the
    /// header timeout: the last answer, with its `Retry-After`, is the
    /// error then, not a timeout.
    pub(crate) async fn send_stream(
        &self,
        req: Request,
        operation: &'static str,
    ) -> Result<Response> {
        let Some(limit) = self.tuning.header_timeout else {
            return self.send(req, operation).await;
        };
        let until = tokio::time::Instant::now().checked_add(limit);
        let send = self.send_until(req, None, operation, until);
        match tokio::time::timeout(limit, send).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(
                    op = operation,
                    limit_ms = millis(limit),
                    "no response headers in time"
                );
                Err(Error::timeout(operation, limit, None))
            }
        }
    }

    /// The total time allowed to a synchronous turn, if bounded.
    pub(crate) fn turn_timeout(&self) -> Option<Duration> {
        self.tuning.turn_timeout
    }

    /// Turns an error answer into an [`Error`].
    pub(crate) async fn error_from_response(
        &self,
        operation: &'static str,
        resp: Response,
    ) -> Error {
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = read_limited(resp, ERROR_BODY_LIMIT, self.tuning.read_timeout)
            .await
            .unwrap_or_default();
        let (code, message, raw) = parse_envelope(&headers, &body);
        self.error_from_parts(operation, status, &headers, code, message, raw)
    }

    pub(crate) fn error_from_parts(
        &self,
        operation: &'static str,
        status: u16,
        headers: &HeaderMap,
        code: Option<String>,
        message: String,
        raw_body: Option<String>,
    ) -> Error {
        let answer = ErrorAnswer {
            status,
            headers,
            code,
            message,
            raw_body,
        };
        error_from_answer(operation, self.inner.version.as_str(), answer)
    }

    pub(crate) fn map_reqwest(&self, operation: &'static str, err: reqwest::Error) -> Error {
        map_reqwest(operation, err, self.tuning.request_timeout)
    }

    /// Whether an error answer's body was rewritten into the envelope
    /// because it was not one (its message is then the raw body).
    pub(crate) fn is_raw_error_body(headers: &HeaderMap) -> bool {
        headers.contains_key(RAW_BODY_MARKER)
    }

    /// The start of a body read for an error message (bounded in bytes and
    /// time).
    pub(crate) async fn read_error_body(&self, resp: Response) -> Vec<u8> {
        read_limited(resp, ERROR_BODY_LIMIT, self.tuning.read_timeout)
            .await
            .unwrap_or_default()
    }
}

/// An error answer, read: its status, headers and envelope.
pub(crate) struct ErrorAnswer<'h> {
    pub(crate) status: u16,
    pub(crate) headers: &'h HeaderMap,
    pub(crate) code: Option<String>,
    pub(crate) message: String,
    pub(crate) raw_body: Option<String>,
}

/// Turns an error answer to `operation`, sent with API version
/// `sent_version`, into an [`Error`].
pub(crate) fn error_from_answer(
    operation: &'static str,
    sent_version: &str,
    answer: ErrorAnswer<'_>,
) -> Error {
    let ErrorAnswer {
        status,
        headers,
        code,
        message,
        raw_body,
    } = answer;
    if let Some(refused) = headers
        .get(REDIRECT_MARKER)
        .and_then(|v| v.to_str().ok())
        .and_then(RedirectRefused::from_marker)
    {
        return refused.to_error(operation);
    }
    let request_id = request_id(headers);
    if status == 401 {
        return Error::Unauthorized {
            operation,
            message,
            request_id,
        };
    }
    if status == 400 && code.as_deref() == Some("unsupported_api_version") {
        return Error::UnsupportedApiVersion(Box::new(crate::error::UnsupportedVersion {
            operation,
            sent: sent_version.to_owned(),
            message,
            request_id,
        }));
    }
    let mut e = Error::api(operation, status, code, message, request_id, raw_body);
    if let Error::Api(api) = &mut e {
        api.retry_after = retry::retry_after(headers);
        api.rate_limits = crate::error::RateLimits::from_headers(headers);
    }
    e
}

/// `reqwest::Request::try_clone` failed: the body is a stream. Take the
/// request itself for the one attempt it allows.
fn take_request(req: &mut Request) -> Request {
    let placeholder = Request::new(req.method().clone(), req.url().clone());
    std::mem::replace(req, placeholder)
}

/// Whether a request that failed may have reached the server: anything but
/// a failure to connect (then nothing was sent). The one rule for "may this
/// POST be sent again?"; [`Error::may_have_reached_server`] carries its
/// verdict.
pub(crate) fn may_have_reached_server(err: &reqwest::Error) -> bool {
    !err.is_connect()
}

pub(crate) fn map_reqwest(
    operation: &'static str,
    err: reqwest::Error,
    timeout: Option<Duration>,
) -> Error {
    if let Some(refused) = redirect::refused(&err) {
        return refused.to_error(operation);
    }
    if let Some(limit) = too_large(&err) {
        return Error::ResponseTooLarge {
            operation,
            limit: u64::try_from(limit).unwrap_or(u64::MAX),
        };
    }
    if err.is_timeout() {
        return Error::Timeout {
            operation,
            elapsed_ms: timeout.map_or(0, millis),
            query_id: None,
        };
    }
    // reqwest calls a body that broke off (a cut connection, a bad chunk)
    // "error decoding response body"; the crate decodes JSON itself, so
    // here it is always the connection, and the cause is what reqwest wraps.
    if err.is_decode()
        && let Some(cause) = std::error::Error::source(&err)
    {
        return Error::transport(operation, crate::error::chain(cause), false);
    }
    let connect = !may_have_reached_server(&err);
    // reqwest's error text may contain the URL, never headers; strip the URL
    // anyway in case a caller put a secret in a query string.
    Error::transport(operation, err.without_url(), connect)
}

/// Where a redirect answer points, resolved against the URL it came from.
fn redirect_target(resp: &Response) -> Option<url::Url> {
    if !resp.status().is_redirection() {
        return None;
    }
    let location = resp
        .headers()
        .get(reqwest::header::LOCATION)?
        .to_str()
        .ok()?;
    resp.url().join(location).ok()
}

/// The answer that stands in for a redirect to another origin (or for what a
/// custom client fetched there): the foreign answer is never handed on.
fn redirect_refused_response(refused: RedirectRefused) -> Response {
    tracing::warn!(location = %refused.location, "{}", refused.reason());
    let mut headers = HeaderMap::new();
    let marker = HeaderValue::from_str(&refused.to_marker())
        .unwrap_or_else(|_| HeaderValue::from_static("refused (another origin)"));
    headers.insert(REDIRECT_MARKER, marker);
    http_response(
        StatusCode::MISDIRECTED_REQUEST,
        &headers,
        envelope_bytes(&refused.to_string(), None),
        false,
    )
}
