//! The server's error type: every failure becomes the API's `Error` envelope
//! (`{"message", "code"?}`) with the right status.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use crate::types;

/// A request the local server refuses or could not serve.
///
/// The message is written for the caller; internal details (paths on disk,
/// index errors) are logged, not returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocalError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (injected 503s).
    pub(crate) retry_after: Option<u64>,
}

/// The `Retry-After` seconds of a `not_saved` answer: about the time a
/// supervisor takes to restart the server.
const NOT_SAVED_RETRY_SECS: u64 = 5;

/// The `Retry-After` seconds of a `resource_exhausted` answer: time for
/// descriptors to be closed or space to be freed.
const EXHAUSTED_RETRY_SECS: u64 = 5;

/// `EMFILE` and `ENFILE` (the same numbers on Linux and macOS).
#[cfg(unix)]
const OUT_OF_DESCRIPTORS: [i32; 2] = [24, 23];
#[cfg(not(unix))]
const OUT_OF_DESCRIPTORS: [i32; 0] = [];

/// What an I/O error says the server ran out of, if it ran out of something
/// (disk space, a quota, file descriptors, memory), rather than what a
/// request did wrong.
pub(crate) fn exhaustion(e: &std::io::Error) -> Option<&'static str> {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::StorageFull => return Some("the disk is full"),
        ErrorKind::QuotaExceeded => return Some("the disk quota is exceeded"),
        ErrorKind::OutOfMemory => return Some("the server is out of memory"),
        _ => {}
    }
    e.raw_os_error()
        .filter(|code| OUT_OF_DESCRIPTORS.contains(code))
        .map(|_| "the server has too many open files")
}

/// Result of a handler or a store operation.
pub(crate) type LocalResult<T> = Result<T, LocalError>;

impl LocalError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        LocalError {
            status,
            message: message.into(),
            code: None,
            retry_after: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }

    pub(crate) fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, message)
    }

    /// A request from a foreign `Host` or `Origin`.
    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        LocalError {
            code: Some("forbidden"),
            ..Self::new(StatusCode::FORBIDDEN, message)
        }
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    pub(crate) fn unsupported_version(asked: &str) -> Self {
        LocalError {
            code: Some("unsupported_api_version"),
            ..Self::bad_request(format!(
                "API version {asked:?} is not supported; use 2026-07 or unstable"
            ))
        }
    }

    pub(crate) fn unavailable(retry_after_secs: u64) -> Self {
        LocalError {
            retry_after: Some(retry_after_secs),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service unavailable (injected fault)",
            )
        }
    }

    /// A change that was not applied because the server could not save
    /// it (or could not save one before it): 503, code `not_saved`. Nothing
    /// of it is on disk or will be; the server stops, so a retry after
    /// `Retry-After` reaches it once restarted.
    pub(crate) fn not_saved() -> Self {
        LocalError {
            code: Some("not_saved"),
            retry_after: Some(NOT_SAVED_RETRY_SECS),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server could not save its state; nothing of this request was applied",
            )
        }
    }

    /// A change whose write may or may not have reached the disk (the wait
    /// for it ended, or the disk failed while committing it): 500, code
    /// `outcome_unknown`. Read the resource before retrying.
    pub(crate) fn outcome_unknown() -> Self {
        LocalError {
            code: Some("outcome_unknown"),
            ..Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the server could not confirm that this change was saved; read it back before retrying",
            )
        }
    }

    /// A write refused at admission because the database writer is behind
    /// (its backlog is full): 503, code `busy`, with `Retry-After`. Nothing
    /// was applied.
    pub(crate) fn write_backlog_full() -> Self {
        LocalError {
            code: Some("busy"),
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is behind writing its state; nothing of this request was applied",
            )
        }
    }

    /// An upload refused because the most uploads are being staged: 503,
    /// code `busy`, with `Retry-After`. Nothing was applied.
    /// An upload waited its turn on a context (the imports, removals and
    /// forks ahead of it) for too long: 503, code `busy`, nothing changed.
    pub(crate) fn context_busy() -> Self {
        LocalError {
            code: Some("busy"),
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the context is busy with other imports; retry shortly",
            )
        }
    }

    pub(crate) fn staging_full() -> Self {
        LocalError {
            code: Some("busy"),
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "other uploads are being staged; retry shortly",
            )
        }
    }

    /// The server ran out of a resource (`cause`: disk space, descriptors,
    /// memory) while serving a request that is itself fine: 503, code
    /// `resource_exhausted`, with `Retry-After`. Nothing was applied.
    pub(crate) fn exhausted(cause: impl std::fmt::Display) -> Self {
        tracing::warn!(%cause, "a request failed for want of a resource");
        LocalError {
            code: Some("resource_exhausted"),
            retry_after: Some(EXHAUSTED_RETRY_SECS),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{cause}; nothing of this request was applied, retry later"),
            )
        }
    }

    /// An I/O failure while `context`: [`LocalError::exhausted`] when the
    /// server ran out of a resource, else [`LocalError::internal`].
    pub(crate) fn io(context: &str, e: &std::io::Error) -> Self {
        match exhaustion(e) {
            Some(cause) => Self::exhausted(cause),
            None => Self::internal(context, e),
        }
    }

    /// An unexpected internal failure: logged in full, answered briefly.
    pub(crate) fn internal(context: &str, err: impl std::fmt::Display) -> Self {
        tracing::error!(error = %err, "{context}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal error: {context}"),
        )
    }
}

impl std::fmt::Display for LocalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for LocalError {
    fn into_response(self) -> Response {
        let body = types::Error {
            code: self.code.map(str::to_owned),
            message: self.message,
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// `axum::Json` whose rejections (malformed JSON, wrong content type, body
/// too large) answer with the API's error envelope.
#[derive(Debug)]
pub(crate) struct ApiJson<T>(pub(crate) T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = LocalError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> LocalError {
    LocalError::new(rejection.status(), rejection.body_text())
}

/// `axum::extract::Query` whose rejection is the API's error envelope.
#[derive(Debug)]
pub(crate) struct ApiQuery<T>(pub(crate) T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = LocalError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(rejection) => Err(query_rejection(rejection)),
        }
    }
}

fn query_rejection(rejection: QueryRejection) -> LocalError {
    LocalError::new(rejection.status(), rejection.body_text())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn error_answers_with_the_envelope_and_retry_after() {
        let resp = LocalError::unavailable(2).into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        let err: types::Error = serde_json::from_slice(&body).unwrap();
        assert!(err.message.contains("unavailable"));
        assert_eq!(err.code, None);
    }

    /// Catches exhaustion answered as the request's fault or as an uncoded
    /// 500: out of descriptors or space is 503 `resource_exhausted` with
    /// `Retry-After`; another failure stays an internal error.
    #[tokio::test]
    async fn running_out_of_a_resource_is_503_with_a_code() {
        let cases = [
            std::io::Error::from_raw_os_error(24),
            std::io::Error::from_raw_os_error(23),
            std::io::Error::from(std::io::ErrorKind::StorageFull),
        ];
        for e in cases {
            let resp = LocalError::io("staging the upload", &e).into_response();
            assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{e}");
            assert_eq!(resp.headers()[header::RETRY_AFTER], "5");
            let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
            let err: types::Error = serde_json::from_slice(&body).unwrap();
            assert_eq!(err.code.as_deref(), Some("resource_exhausted"), "{e}");
        }
        let other = LocalError::io("staging the upload", &std::io::Error::other("bad sector"));
        assert_eq!(other.status, StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[tokio::test]
    async fn unsupported_version_carries_its_code() {
        let resp = LocalError::unsupported_version("1999-01").into_response();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        let err: types::Error = serde_json::from_slice(&body).unwrap();
        assert_eq!(err.code.as_deref(), Some("unsupported_api_version"));
    }
}
