//! Response bodies: the bound on a body's size, and error answers whose
//! body is rewritten into the API's JSON envelope so no status is lost.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Response, ResponseBuilderExt, StatusCode};

use super::marks::ErrorBody;
use crate::error::snippet;

/// Marks a rewritten error response whose body was not the JSON envelope.
pub(super) const RAW_BODY_MARKER: &str = "x-nexus-knowql-raw-error-body";

/// The most bytes of an error body that are read.
pub(super) const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// A response body cut off at the client's size limit.
#[derive(Debug)]
pub(crate) struct BodyTooLarge {
    pub(crate) limit: usize,
}

impl fmt::Display for BodyTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the answer is larger than the limit of {} bytes",
            self.limit
        )
    }
}

impl std::error::Error for BodyTooLarge {}

/// The limit a body error was cut at, when it is one.
pub(super) fn too_large(err: &(dyn std::error::Error + 'static)) -> Option<usize> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(t) = e.downcast_ref::<BodyTooLarge>() {
            return Some(t.limit);
        }
        next = e.source();
    }
    None
}

/// `resp` with a body that fails once it grows past `limit` (at once when
/// its declared length does).
pub(super) fn bounded(resp: Response, limit: usize) -> Response {
    use futures::StreamExt;
    let limit_bytes = u64::try_from(limit).unwrap_or(u64::MAX);
    // A body of a known length ends there (the HTTP layer reads no byte
    // past it; a decompressed body has no known length): within the limit
    // it needs no counting, nor a new response.
    if resp.content_length().is_some_and(|n| n <= limit_bytes) {
        return resp;
    }
    let declared_over = resp.content_length().is_some_and(|n| n > limit_bytes);
    // The headers move to the new response, and its URL is the answer's
    // (not parsed again).
    let mut resp = resp;
    let headers = std::mem::take(resp.headers_mut());
    let mut builder = http::Response::builder()
        .status(resp.status())
        .version(resp.version())
        .url(resp.url().clone());
    if let Some(h) = builder.headers_mut() {
        *h = headers;
    }
    let mut seen = 0usize;
    let body = resp.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(|e| Box::new(e) as crate::error::BoxError)?;
        seen = seen.saturating_add(chunk.len());
        if declared_over || seen > limit {
            return Err(Box::new(BodyTooLarge { limit }) as crate::error::BoxError);
        }
        Ok(chunk)
    });
    match builder.body(reqwest::Body::wrap_stream(body)) {
        Ok(r) => Response::from(r),
        Err(_) => Response::from(http::Response::new(Bytes::new())),
    }
}

/// `(code, message, raw body if not the envelope)`.
pub(super) fn parse_envelope(
    headers: &HeaderMap,
    body: &[u8],
) -> (Option<String>, String, Option<String>) {
    #[derive(serde::Deserialize)]
    struct Envelope {
        message: String,
        #[serde(default)]
        code: Option<String>,
    }
    match serde_json::from_slice::<Envelope>(body) {
        Ok(e) if headers.contains_key(RAW_BODY_MARKER) => {
            (None, e.message.clone(), Some(e.message))
        }
        Ok(e) => (e.code, e.message, None),
        Err(_) => {
            let raw = snippet(body);
            let message = if raw.trim().is_empty() {
                "(empty body)".to_owned()
            } else {
                raw.clone()
            };
            (None, message, Some(raw))
        }
    }
}

/// Reads at most `limit` bytes of a body, for at most `time` (what arrived
/// by then is kept).
pub(crate) async fn read_limited(
    mut resp: Response,
    limit: usize,
    time: Option<Duration>,
) -> reqwest::Result<Vec<u8>> {
    let deadline = time.and_then(|t| tokio::time::Instant::now().checked_add(t));
    let mut out = Vec::new();
    loop {
        let chunk = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, resp.chunk()).await {
                Ok(chunk) => chunk?,
                Err(_) => {
                    tracing::debug!(
                        read = out.len(),
                        "an error body took too long; keeping what arrived"
                    );
                    break;
                }
            },
            None => resp.chunk().await?,
        };
        let Some(chunk) = chunk else { break };
        let room = limit.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

pub(super) fn envelope_bytes(message: &str, code: Option<&str>) -> Bytes {
    let v = match code {
        Some(c) => serde_json::json!({ "message": message, "code": c }),
        None => serde_json::json!({ "message": message }),
    };
    Bytes::from(v.to_string())
}

pub(super) fn http_response(
    status: StatusCode,
    headers: &HeaderMap,
    body: Bytes,
    raw: bool,
) -> Response {
    let mut builder = http::Response::builder().status(status);
    if let Some(h) = builder.headers_mut() {
        for (k, v) in headers {
            if k != reqwest::header::CONTENT_LENGTH && k != reqwest::header::CONTENT_TYPE {
                h.append(k.clone(), v.clone());
            }
        }
        h.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if raw {
            h.insert(RAW_BODY_MARKER, HeaderValue::from_static("1"));
        }
    }
    match builder.body(body) {
        Ok(r) => Response::from(r),
        Err(_) => Response::from(http::Response::new(Bytes::new())),
    }
}

/// Makes an error answer's body the JSON envelope so that the generated
/// client keeps the status even when the server sent text or HTML.
pub(super) async fn normalize_error_body(
    resp: Response,
    read_timeout: Option<Duration>,
) -> Response {
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = read_limited(resp, ERROR_BODY_LIMIT, read_timeout)
        .await
        .unwrap_or_default();
    let is_envelope = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .is_some_and(|v| v.get("message").is_some_and(|m| m.is_string()));
    let (mut resp, read) = if is_envelope {
        let (code, message, _) = parse_envelope(&HeaderMap::new(), &body);
        let read = ErrorBody {
            code,
            message,
            raw: None,
        };
        (
            http_response(status, &headers, Bytes::from(body), false),
            read,
        )
    } else {
        let raw = snippet(&body);
        let text = if raw.trim().is_empty() {
            status.canonical_reason().unwrap_or("error").to_owned()
        } else {
            raw
        };
        let resp = http_response(status, &headers, envelope_bytes(&text, None), true);
        let read = ErrorBody {
            code: None,
            message: text.clone(),
            raw: Some(text),
        };
        (resp, read)
    };
    resp.extensions_mut().insert(read);
    resp
}
