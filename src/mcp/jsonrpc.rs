//! What a POST body carries, read before any tool sees it: malformed JSON
//! and invalid JSON-RPC are answered here as JSON-RPC errors.

use std::borrow::Cow;

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// JSON-RPC "parse error".
pub(crate) const PARSE_ERROR: i32 = -32700;
/// JSON-RPC "invalid request".
pub(crate) const INVALID_REQUEST: i32 = -32600;

/// The longest request id remembered for cancellation (as JSON).
const MAX_ID_BYTES: usize = 128;

/// The part of a POST body the guard acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    /// An `initialize` request.
    Initialize,
    /// Another request, with its id as JSON (when short enough to track).
    Request(Option<String>),
    /// `notifications/cancelled`, naming a request id as JSON.
    Cancelled(Option<String>),
    /// Any other notification or a response.
    Other,
}

/// Why a body is not a JSON-RPC message: a JSON-RPC error code and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid {
    pub(crate) code: i32,
    pub(crate) message: String,
}

fn id_text(id: &serde_json::Value) -> Option<String> {
    let text = id.to_string();
    (text.len() <= MAX_ID_BYTES).then_some(text)
}

/// Reads one JSON-RPC message from `body`.
///
/// # Errors
/// [`PARSE_ERROR`] for bytes that are not JSON; [`INVALID_REQUEST`] for a
/// batch or any JSON that is not one JSON-RPC 2.0 message.
pub(crate) fn classify(body: &[u8]) -> Result<Message, Invalid> {
    let invalid = |message: &str| Invalid {
        code: INVALID_REQUEST,
        message: message.to_owned(),
    };
    // The shape first, reading no more than the guard needs: parameters
    // are checked for syntax only.
    let first = body.iter().copied().find(|b| !b.is_ascii_whitespace());
    if first == Some(b'[') {
        serde_json::from_slice::<IgnoredAny>(body).map_err(parse_error)?;
        return Err(invalid("invalid request: batches are not supported"));
    }
    if first != Some(b'{') {
        serde_json::from_slice::<IgnoredAny>(body).map_err(parse_error)?;
        return Err(invalid("invalid request: not a JSON-RPC message object"));
    }
    let probe: Probe<'_> = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            invalid("invalid request: malformed JSON-RPC message")
        } else {
            parse_error(e)
        }
    })?;
    if probe.jsonrpc.as_deref() != Some("2.0") {
        return Err(invalid("invalid request: `jsonrpc` must be \"2.0\""));
    }
    Ok(match (probe.method.as_deref(), &probe.id) {
        (Some("initialize"), Some(_)) => Message::Initialize,
        (Some(_), Some(id)) => Message::Request(id_text(id)),
        (Some("notifications/cancelled"), None) => {
            let value: serde_json::Value = serde_json::from_slice(body).map_err(parse_error)?;
            Message::Cancelled(
                value
                    .get("params")
                    .and_then(|p| p.get("requestId"))
                    .and_then(id_text),
            )
        }
        (Some(_), None) => Message::Other,
        (None, Some(_)) if probe.result.is_some() || probe.error.is_some() => Message::Other,
        (None, _) => return Err(invalid("invalid request: no `method`")),
    })
}

fn parse_error(e: serde_json::Error) -> Invalid {
    Invalid {
        code: PARSE_ERROR,
        message: format!("parse error: {e}"),
    }
}

/// The fields of a message the guard reads; the rest is only checked to
/// be JSON.
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
    id: Option<serde_json::Value>,
    #[serde(default, rename = "params")]
    _params: Option<IgnoredAny>,
    #[serde(default)]
    result: Option<IgnoredAny>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

/// The JSON-RPC error object for `invalid`, with a null id.
pub(crate) fn error_json(invalid: &Invalid) -> serde_json::Value {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": invalid.code, "message": invalid.message},
    })
}

/// A 400 answer carrying the JSON-RPC error for `invalid`.
pub(crate) fn error_response(invalid: &Invalid) -> Response {
    (
        StatusCode::BAD_REQUEST,
        [(http::header::CONTENT_TYPE, "application/json")],
        error_json(invalid).to_string(),
    )
        .into_response()
}

/// The answer to a request cancelled by its caller (JSON-RPC code -32800).
pub(crate) fn cancelled_response(id: &str) -> Response {
    let id: serde_json::Value = serde_json::from_str(id).unwrap_or(serde_json::Value::Null);
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": -32800, "message": "request cancelled by the client"},
    });
    (
        StatusCode::OK,
        [(http::header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(body: &str) -> Result<Message, i32> {
        classify(body.as_bytes()).map_err(|e| e.code)
    }

    #[test]
    fn messages_are_told_apart() {
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#),
            Ok(Message::Initialize)
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":[1]}"#),
            Ok(Message::Request(Some("\"a\"".to_owned())))
        );
        assert_eq!(
            kind(
                r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}"#
            ),
            Ok(Message::Cancelled(Some("7".to_owned())))
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Ok(Message::Other)
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":3,"result":{}}"#),
            Ok(Message::Other)
        );
    }

    #[test]
    fn bad_bodies_get_json_rpc_codes() {
        assert_eq!(kind("{not json"), Err(PARSE_ERROR));
        assert_eq!(classify(b"\xff\xfe").map_err(|e| e.code), Err(PARSE_ERROR));
        assert_eq!(
            kind(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
            Err(INVALID_REQUEST)
        );
        assert_eq!(kind(r#""ping""#), Err(INVALID_REQUEST));
        assert_eq!(kind(r#"{"id":1,"method":"ping"}"#), Err(INVALID_REQUEST));
        assert_eq!(kind(r#"{"jsonrpc":"2.0","id":1}"#), Err(INVALID_REQUEST));
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":1,"method":5}"#),
            Err(INVALID_REQUEST)
        );
    }
}
