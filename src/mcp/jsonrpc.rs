//! What a POST body carries, read before any tool sees it: malformed JSON
//! and invalid JSON-RPC are answered here as JSON-RPC errors.

use std::borrow::Cow;

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use rmcp::model::ClientJsonRpcMessage;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// JSON-RPC "parse error".
pub(crate) const PARSE_ERROR: i32 = -32700;
/// JSON-RPC "invalid request".
pub(crate) const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC "method not found".
pub(crate) const METHOD_NOT_FOUND: i32 = -32601;
/// JSON-RPC "invalid params".
pub(crate) const INVALID_PARAMS: i32 = -32602;

/// The MCP request methods whose parameters are checked against their
/// types before the service sees them: a known method with malformed
/// parameters is `-32602 Invalid params`, not "method not found".
const TYPED_METHODS: &[&str] = &[
    "ping",
    "initialize",
    "server/discover",
    "completion/complete",
    "logging/setLevel",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
];

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

/// Why a body is not a JSON-RPC message (or not a well-formed request): a
/// JSON-RPC error code and text, and the request's id when it has a usable
/// one (`null` otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid {
    pub(crate) code: i32,
    pub(crate) message: String,
    pub(crate) id: serde_json::Value,
}

fn id_text(id: &serde_json::Value) -> Option<String> {
    let text = id.to_string();
    (text.len() <= MAX_ID_BYTES).then_some(text)
}

/// Notifications counted by name; others are `other`.
const NOTIFICATIONS: &[&str] = &[
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
];

/// The metrics label of JSON-RPC method `method`: one of a fixed set.
fn method_label(method: Option<&str>, answers: bool) -> &'static str {
    match method {
        None if answers => "response",
        None => "other",
        Some(m) => TYPED_METHODS
            .iter()
            .chain(NOTIFICATIONS)
            .find(|known| **known == m)
            .copied()
            .unwrap_or("other"),
    }
}

/// Reads one JSON-RPC message from `body`, with its method as a metrics
/// label (one of a fixed set).
///
/// # Errors
/// [`PARSE_ERROR`] for bytes that are not JSON; [`INVALID_REQUEST`] for a
/// batch or any JSON that is not one JSON-RPC 2.0 message.
pub(crate) fn classify(body: &[u8]) -> Result<(Message, &'static str), Invalid> {
    classify_keeping(body).map(|(message, label, _)| (message, label))
}

/// [`classify`], also returning the message as rmcp's type when the checks
/// decoded it (requests of the methods whose parameters are checked), so
/// that it is not decoded twice.
pub(crate) fn classify_keeping(
    body: &[u8],
) -> Result<(Message, &'static str, Option<ClientJsonRpcMessage>), Invalid> {
    let invalid = |message: &str| Invalid {
        code: INVALID_REQUEST,
        message: message.to_owned(),
        id: serde_json::Value::Null,
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
    if let Some(id) = &probe.id
        && !(id.is_string() || id.is_i64() || id.is_u64())
    {
        return Err(invalid(
            "invalid request: `id` must be a string or an integer",
        ));
    }
    if probe.params.as_ref().is_some_and(|p| !p.is_object()) {
        return Err(invalid("invalid request: `params` must be an object"));
    }
    let answers = probe.result.is_some() || probe.error.is_some();
    if (probe.result.is_some() && probe.error.is_some()) || (probe.method.is_some() && answers) {
        return Err(invalid(
            "invalid request: a message is a request, a notification, a result or an error",
        ));
    }
    let mut kept = None;
    if let (Some(method), Some(id)) = (probe.method.as_deref(), &probe.id)
        && TYPED_METHODS.contains(&method)
    {
        kept = Some(check_params(body, method, id)?);
    }
    let label = method_label(probe.method.as_deref(), answers);
    let message = match (probe.method.as_deref(), &probe.id) {
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
    };
    Ok((message, label, kept))
}

fn parse_error(e: serde_json::Error) -> Invalid {
    Invalid {
        code: PARSE_ERROR,
        message: format!("parse error: {e}"),
        id: serde_json::Value::Null,
    }
}

/// `-32602` when request `body` of a known `method` does not decode as
/// that method's request (rmcp would take it for an unknown method).
/// Returns the request decoded.
fn check_params(
    body: &[u8],
    method: &str,
    id: &serde_json::Value,
) -> Result<ClientJsonRpcMessage, Invalid> {
    use rmcp::model::{ClientRequest, JsonRpcMessage};
    if method == "tools/call"
        && let Some(call) = tool_call(body)
    {
        return Ok(call);
    }
    match serde_json::from_slice::<ClientJsonRpcMessage>(body) {
        Ok(JsonRpcMessage::Request(request))
            if matches!(request.request, ClientRequest::CustomRequest(_)) => {}
        Ok(typed) => return Ok(typed),
        Err(_) => {}
    }
    Err(Invalid {
        code: INVALID_PARAMS,
        message: format!("invalid params: malformed parameters for `{method}`"),
        id: id.clone(),
    })
}

/// A `tools/call` request decoded straight into rmcp's type, as rmcp's own
/// decoding makes it (the parameters' `_meta` in the request's extensions),
/// without first trying every other message shape; `None` when it does not
/// decode this way (the general decoding then decides).
fn tool_call(body: &[u8]) -> Option<ClientJsonRpcMessage> {
    use rmcp::model::{
        CallToolRequest, CallToolRequestParams, ClientRequest, JsonRpcMessage, JsonRpcRequest,
        RequestId,
    };
    /// The request; `jsonrpc` was checked by [`classify_keeping`].
    #[derive(Deserialize)]
    struct Call<'a> {
        id: RequestId,
        #[serde(borrow)]
        method: Cow<'a, str>,
        params: CallToolRequestParams,
    }
    let call: Call<'_> = serde_json::from_slice(body).ok()?;
    if call.method != "tools/call" {
        return None;
    }
    let mut request = CallToolRequest::new(call.params);
    if let Some(meta) = request.params.meta.take() {
        request.extensions.insert(meta);
    }
    Some(JsonRpcMessage::Request(JsonRpcRequest::new(
        call.id,
        ClientRequest::CallToolRequest(request),
    )))
}

/// The JSON type of `params`, read without keeping its contents.
#[derive(Debug)]
struct Shape(bool);

impl Shape {
    fn is_object(&self) -> bool {
        self.0
    }
}

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Shape;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Shape, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Shape(true))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Shape, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Shape(false))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Shape, E> {
                Ok(Shape(false))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Shape, E> {
                Ok(Shape(false))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Shape, E> {
                Ok(Shape(false))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Shape, E> {
                Ok(Shape(false))
            }
            fn visit_str<E>(self, _: &str) -> Result<Shape, E> {
                Ok(Shape(false))
            }
            fn visit_unit<E>(self) -> Result<Shape, E> {
                Ok(Shape(false))
            }
        }
        d.deserialize_any(Visit)
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
    #[serde(default)]
    params: Option<Shape>,
    #[serde(default)]
    result: Option<IgnoredAny>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

/// The JSON-RPC error object for `invalid` (its id, or `null`).
pub(crate) fn error_json(invalid: &Invalid) -> serde_json::Value {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": invalid.id,
        "error": {"code": invalid.code, "message": invalid.message},
    })
}

/// The answer carrying the JSON-RPC error for `invalid`: 400 for a body
/// that is no valid JSON-RPC request, 200 for a request whose parameters
/// are wrong (a JSON-RPC error answer to a valid request).
pub(crate) fn error_response(invalid: &Invalid) -> Response {
    let status = if invalid.code == INVALID_PARAMS {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    };
    (
        status,
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
        classify(body.as_bytes())
            .map(|(m, _)| m)
            .map_err(|e| e.code)
    }

    #[test]
    fn messages_are_told_apart() {
        assert_eq!(
            kind(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#
            ),
            Ok(Message::Initialize)
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x"}}"#),
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
        for body in [
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[1]}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}"#,
        ] {
            assert_eq!(kind(body), Err(INVALID_REQUEST), "{body}");
        }
    }

    #[test]
    fn a_tool_call_decodes_as_rmcp_decodes_it() {
        for body in [
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"query","arguments":{"a":[1,{"b":null}]}}}"#,
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"q","_meta":{"progressToken":3,"k":"v"},"extra":1}}"#,
            r#"{"jsonrpc":"2.0","id":8,"params":{"_meta":null,"name":"q"},"method":"tools/call"}"#,
        ] {
            let fast = tool_call(body.as_bytes()).expect("decodes");
            let general: ClientJsonRpcMessage = serde_json::from_slice(body.as_bytes()).unwrap();
            assert_eq!(
                serde_json::to_value(&fast).unwrap(),
                serde_json::to_value(&general).unwrap(),
                "{body}"
            );
            let meta = |m: &ClientJsonRpcMessage| match m {
                rmcp::model::JsonRpcMessage::Request(rmcp::model::JsonRpcRequest {
                    request: rmcp::model::ClientRequest::CallToolRequest(r),
                    ..
                }) => r
                    .extensions
                    .get::<rmcp::model::RequestMetaObject>()
                    .cloned(),
                _ => None,
            };
            assert_eq!(meta(&fast), meta(&general), "{body}");
        }
        assert!(tool_call(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":[1]}}"#).is_none());
    }

    #[test]
    fn malformed_params_of_known_methods_are_invalid_params() {
        for body in [
            r#"{"jsonrpc":"2.0","id":4,"method":"logging/setLevel","params":{"level":"verbose"}}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x","arguments":[1]}}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"completion/complete","params":{"ref":{"type":"ref/nope"},"argument":{"name":"a","value":"b"}}}"#,
        ] {
            let invalid = classify(body.as_bytes()).unwrap_err();
            assert_eq!(invalid.code, INVALID_PARAMS, "{body}");
            assert_eq!(invalid.id, serde_json::json!(4));
        }
        assert!(classify(br#"{"jsonrpc":"2.0","id":4,"method":"logging/setLevel","params":{"level":"debug"}}"#).is_ok());
        assert!(
            classify(br#"{"jsonrpc":"2.0","id":4,"method":"vendor/thing","params":{"x":[1]}}"#)
                .is_ok()
        );
    }
}
