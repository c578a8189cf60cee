//! What the transport writes on an error answer to a generated call, so that
//! the error of that call converts into [`Error`] without the transport at
//! hand (`impl From<progenitor_client::Error<types::Error>> for Error`): the
//! operation it answered, the API version sent, and the error body it read.

use std::sync::Mutex;

use reqwest::Response;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

/// The operation (operationId) an error answer to a generated call answered.
pub(crate) const OPERATION_MARKER: HeaderName = HeaderName::from_static("x-nexus-knowql-operation");
/// The `X-Pinecone-Api-Version` sent with the request it answered.
pub(crate) const SENT_VERSION_MARKER: HeaderName =
    HeaderName::from_static("x-nexus-knowql-sent-version");

/// The operation named when an error cannot say which generated call failed
/// (one that failed before an answer arrived). No generated call starts a
/// turn (`POST /query` is hand-written), so its retry advice is that of any
/// call that starts none.
pub(crate) const UNKNOWN_OPERATION: &str = "api";

/// The error body the transport read (at most its error-body bound), kept on
/// the answer it rebuilt: an answer the generated client does not expect is
/// handed on unread, and its conversion cannot read a body.
#[derive(Debug, Clone)]
pub(crate) struct ErrorBody {
    /// The envelope's `code`.
    pub(crate) code: Option<String>,
    /// The envelope's `message`, or the raw text.
    pub(crate) message: String,
    /// The raw text, when it was not the envelope.
    pub(crate) raw: Option<String>,
}

/// The operation ids generated calls have gone through, so a name read back
/// from [`OPERATION_MARKER`] becomes the `&'static str` errors carry. It
/// holds at most one entry per operation of the API.
static OPERATIONS: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

/// Notes an operation id of a generated call.
pub(crate) fn remember_operation(operation: &'static str) {
    let mut known = OPERATIONS.lock().unwrap_or_else(|p| p.into_inner());
    if !known.contains(&operation) {
        known.push(operation);
    }
}

/// The remembered operation id spelled `name`.
fn known_operation(name: &str) -> Option<&'static str> {
    let known = OPERATIONS.lock().unwrap_or_else(|p| p.into_inner());
    known.iter().copied().find(|op| *op == name)
}

/// Marks an error answer to the generated call `operation`.
pub(crate) fn mark(resp: &mut Response, operation: &'static str, sent_version: &HeaderValue) {
    if let Ok(op) = HeaderValue::from_str(operation) {
        resp.headers_mut().insert(OPERATION_MARKER, op);
    }
    resp.headers_mut()
        .insert(SENT_VERSION_MARKER, sent_version.clone());
}

/// `(operation, sent version)` of a marked error answer; unmarked:
/// [`UNKNOWN_OPERATION`] and an empty version.
pub(crate) fn read(headers: &HeaderMap) -> (&'static str, String) {
    let text = |name: &HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let operation = text(&OPERATION_MARKER)
        .and_then(known_operation)
        .unwrap_or(UNKNOWN_OPERATION);
    let sent = text(&SENT_VERSION_MARKER).unwrap_or_default().to_owned();
    (operation, sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_remembered_operations_are_named() {
        remember_operation("get_context");
        let mut headers = HeaderMap::new();
        headers.insert(OPERATION_MARKER, HeaderValue::from_static("get_context"));
        headers.insert(SENT_VERSION_MARKER, HeaderValue::from_static("2026-07"));
        assert_eq!(read(&headers), ("get_context", "2026-07".to_owned()));
        headers.insert(OPERATION_MARKER, HeaderValue::from_static("made_up"));
        assert_eq!(read(&headers).0, UNKNOWN_OPERATION);
        assert_eq!(read(&HeaderMap::new()), (UNKNOWN_OPERATION, String::new()));
    }
}
