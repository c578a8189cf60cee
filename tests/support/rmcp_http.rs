//! rmcp's Streamable HTTP client on reqwest 0.12: an implementation of
//! rmcp's `StreamableHttpClient` (rmcp's own needs reqwest 0.13, and the
//! crate keeps one reqwest major), enforcing the transport's byte limits.
#![allow(dead_code, unreachable_pub)]

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::{ClientInitializeError, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use rmcp::{RoleClient, ServiceExt};
use sse_stream::{Sse, SseStream};

const SESSION_ID: &str = "mcp-session-id";
const LAST_EVENT_ID: &str = "last-event-id";
const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";

type Error = StreamableHttpError<reqwest::Error>;
type Events = BoxStream<'static, Result<Sse, SseError>>;

/// A reqwest 0.12 client speaking rmcp's Streamable HTTP client protocol.
#[derive(Debug, Clone, Default)]
pub struct Reqwest012(pub reqwest::Client);

/// The transport's settings for `url`, with `headers` (such as the
/// caller's key) on every request.
pub fn config(url: &str, headers: &[(&str, &str)]) -> StreamableHttpClientTransportConfig {
    let custom = headers.iter().map(|(name, value)| {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("a header name");
        (name, HeaderValue::from_str(value).expect("a header value"))
    });
    StreamableHttpClientTransportConfig::with_uri(url).custom_headers(custom.collect())
}

/// rmcp's client `handler` connected over Streamable HTTP with `config`.
pub async fn connect_http<H: rmcp::ClientHandler>(
    handler: H,
    config: StreamableHttpClientTransportConfig,
) -> Result<RunningService<RoleClient, H>, ClientInitializeError> {
    let transport = StreamableHttpClientTransport::with_client(Reqwest012::default(), config);
    handler.serve(transport).await
}

/// Whether a `Content-Type` is `expected`, ignoring parameters and case.
fn is_media(content_type: Option<&HeaderValue>, expected: &str) -> bool {
    content_type
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(expected))
}

/// The request with the session id, custom headers and bearer token.
fn decorate(
    mut req: reqwest::RequestBuilder,
    session_id: Option<&str>,
    auth: Option<String>,
    custom: HashMap<HeaderName, HeaderValue>,
) -> reqwest::RequestBuilder {
    if let Some(id) = session_id {
        req = req.header(SESSION_ID, id);
    }
    if let Some(token) = auth {
        req = req.bearer_auth(token);
    }
    for (name, value) in custom {
        req = req.header(name, value);
    }
    req
}

/// The whole body, or `ResponseBodyTooLarge` past `max` bytes.
async fn bounded_body(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, Error> {
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(StreamableHttpError::Client)? {
        if body.len().saturating_add(chunk.len()) > max {
            return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Counts the raw bytes of the event being received; a blank line ends it.
#[derive(Default)]
struct EventBound {
    event: usize,
    line: usize,
    after_cr: bool,
}

impl EventBound {
    /// Whether the event so far, with `chunk`, stays within `max` bytes.
    fn fits(&mut self, chunk: &[u8], max: usize) -> bool {
        for &b in chunk {
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    if self.line == 0 {
                        self.event = 0;
                    }
                    self.line = 0;
                }
                _ => {
                    self.after_cr = false;
                    self.line = self.line.saturating_add(1);
                    self.event = self.event.saturating_add(1);
                }
            }
            if self.event > max {
                return false;
            }
        }
        true
    }
}

/// The events of an SSE body, failing on (and ending after) an event over `max` bytes.
fn events(resp: reqwest::Response, max: usize) -> Events {
    let mut bound = EventBound::default();
    let bytes = resp.bytes_stream().scan(false, move |failed, item| {
        let item = match item {
            _ if *failed => return futures::future::ready(None),
            Ok(chunk) if bound.fits(&chunk, max) => Ok(chunk),
            Ok(_) => Err(std::io::Error::other(format!("SSE event over {max} bytes"))),
            Err(e) => Err(std::io::Error::other(e)),
        };
        *failed = item.is_err();
        futures::future::ready(Some(item))
    });
    SseStream::from_bytes_stream(bytes).boxed()
}

/// The error of a non-success status other than a JSON-RPC error.
fn status_error(status: StatusCode) -> Error {
    StreamableHttpError::UnexpectedServerResponse(Cow::Owned(format!("HTTP {status}")))
}

impl StreamableHttpClient for Reqwest012 {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth: Option<String>,
        custom: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let limits = StreamableHttpResponseLimits::default();
        self.post_message_with_response_limits(uri, message, session_id, auth, custom, limits)
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth: Option<String>,
        custom: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(uri, message, session_id, auth, custom, limits)
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth: Option<String>,
        custom: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let req = self
            .0
            .post(uri.as_ref())
            .header(ACCEPT, format!("{EVENT_STREAM}, {JSON}"))
            .json(&message);
        let resp = decorate(req, session_id.as_deref(), auth, custom)
            .send()
            .await
            .map_err(StreamableHttpError::Client)?;
        let status = resp.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && session_id.is_some() {
            return Err(StreamableHttpError::SessionExpired);
        }
        let new_session = resp
            .headers()
            .get(SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let content_type = resp.headers().get(CONTENT_TYPE).cloned();
        if is_media(content_type.as_ref(), EVENT_STREAM) && status.is_success() {
            let events = events(resp, limits.max_sse_event_size);
            return Ok(StreamableHttpPostResponse::Sse(events, new_session));
        }
        if !is_media(content_type.as_ref(), JSON) {
            if status.is_success() && !matches!(message, JsonRpcMessage::Request(_)) {
                // Nothing awaits an answer: an empty 200 is an acknowledgement.
                return Ok(StreamableHttpPostResponse::Accepted);
            }
            return Err(status_error(status));
        }
        let body = bounded_body(resp, limits.max_json_response_size).await?;
        match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
            // A JSON-RPC error may come with an error status.
            Ok(msg) if status.is_success() || matches!(msg, JsonRpcMessage::Error(_)) => {
                Ok(StreamableHttpPostResponse::Json(msg, new_session))
            }
            Err(e) if status.is_success() => Err(StreamableHttpError::Deserialize(e)),
            _ => Err(status_error(status)),
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth: Option<String>,
        custom: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        let req = decorate(self.0.delete(uri.as_ref()), Some(&session_id), auth, custom);
        let resp = req.send().await.map_err(StreamableHttpError::Client)?;
        if resp.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(());
        }
        resp.error_for_status()
            .map(drop)
            .map_err(StreamableHttpError::Client)
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth: Option<String>,
        custom: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Events, Error> {
        let max = StreamableHttpResponseLimits::default().max_sse_event_size;
        self.get_stream_with_max_sse_event_size(uri, session_id, last_event_id, auth, custom, max)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth: Option<String>,
        custom: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<Events, Error> {
        let mut req = self.0.get(uri.as_ref()).header(ACCEPT, EVENT_STREAM);
        if let Some(id) = last_event_id {
            req = req.header(LAST_EVENT_ID, id);
        }
        let resp = decorate(req, session_id.as_deref(), auth, custom)
            .send()
            .await
            .map_err(StreamableHttpError::Client)?;
        let status = resp.status();
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if !status.is_success() {
            return Err(status_error(status));
        }
        let content_type = resp.headers().get(CONTENT_TYPE);
        if !is_media(content_type, EVENT_STREAM) {
            let ct = content_type.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            return Err(StreamableHttpError::UnexpectedContentType(ct));
        }
        Ok(events(resp, max_sse_event_size))
    }
}
