//! Tool-level errors: what an agent reads when a tool ran and failed.
//!
//! A failed tool call is a successful MCP response whose result has
//! `isError: true` and a JSON body `{code, message, recoverable, field?,
//! suggestion?}`, sent both as a text block and as `structuredContent`.
//! Protocol errors are kept for requests that cannot be routed.
//!
//! # Error bodies and `outputSchema`
//!
//! MCP asks that structured content conform to the tool's `outputSchema`,
//! and some clients check it on error results too. Every tool's schema is
//! therefore the union of its success shape and [`ToolError`]'s
//! ([`with_error_branch`]): the success properties stay at the top level,
//! their `required` list moves into the first `anyOf` branch and the error
//! shape is the second, so both kinds of result validate.

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde::Serialize;
use serde_json::{Value, json};

use super::redact::redact;

/// The `code` of a [`ToolError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum ToolErrorCode {
    /// Bad arguments; `field` names the argument.
    Validation,
    /// The named thing does not exist.
    NotFound,
    /// Missing or refused credentials.
    Unauthorized,
    /// Nexus answered with an error or could not be reached.
    NexusError,
    /// Pinecone answered with an error or could not be reached.
    PineconeError,
    /// A deadline passed.
    Timeout,
    /// A required earlier step of the flow was skipped.
    FlowGate,
    /// The tool is not available in this server's state or mode.
    Lifecycle,
    /// The caller cancelled the request; the work it started was stopped.
    Cancelled,
}

impl ToolErrorCode {
    /// Every code, as it appears in JSON.
    pub const ALL: [&'static str; 9] = [
        "VALIDATION",
        "NOT_FOUND",
        "UNAUTHORIZED",
        "NEXUS_ERROR",
        "PINECONE_ERROR",
        "TIMEOUT",
        "FLOW_GATE",
        "LIFECYCLE",
        "CANCELLED",
    ];
}

/// A tool failure as the agent sees it.
///
/// ```
/// use nexus_knowql::mcp::ToolError;
/// let e = ToolError::validation("question", "question must not be empty");
/// let json = e.to_json();
/// assert_eq!(json["code"], "VALIDATION");
/// assert_eq!(json["field"], "question");
/// assert_eq!(json["recoverable"], true);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolError {
    /// What kind of failure.
    pub code: ToolErrorCode,
    /// What happened, for the agent.
    pub message: String,
    /// Whether calling again (perhaps with other arguments) may succeed.
    pub recoverable: bool,
    /// The argument at fault (for `VALIDATION`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What to do next.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suggestion: Option<String>,
}

impl ToolError {
    /// A new error.
    pub fn new(code: ToolErrorCode, message: impl Into<String>, recoverable: bool) -> Self {
        ToolError {
            code,
            message: message.into(),
            recoverable,
            field: None,
            suggestion: None,
        }
    }

    /// A `VALIDATION` error on `field` (always recoverable).
    pub fn validation(field: impl Into<String>, message: impl Into<String>) -> Self {
        ToolError {
            field: Some(field.into()),
            ..ToolError::new(ToolErrorCode::Validation, message, true)
        }
    }

    /// A `CANCELLED` error: the caller gave up on the request.
    pub fn cancelled() -> Self {
        ToolError::new(
            ToolErrorCode::Cancelled,
            "the request was cancelled; the work it started was stopped",
            true,
        )
    }

    /// A `TIMEOUT` error: `what` did not finish within `deadline`.
    pub fn timeout(what: &str, deadline: std::time::Duration) -> Self {
        ToolError::new(
            ToolErrorCode::Timeout,
            format!("{what} did not answer within {} ms", deadline.as_millis()),
            true,
        )
        .with_suggestion("call the tool again")
    }

    /// Adds a suggestion.
    pub fn with_suggestion(mut self, suggestion: impl Into<String>) -> Self {
        self.suggestion = Some(suggestion.into());
        self
    }

    /// The JSON body, with credentials redacted.
    pub fn to_json(&self) -> serde_json::Value {
        let mut e = self.clone();
        e.message = redact(&e.message);
        e.suggestion = e.suggestion.as_deref().map(redact);
        serde_json::to_value(&e).unwrap_or_else(|_| serde_json::json!({"code": "NEXUS_ERROR", "message": "error", "recoverable": false}))
    }

    /// The MCP tool result: `isError: true`, the JSON as text and as
    /// structured content (which validates against every tool's
    /// `outputSchema`: each admits a `ToolError` as its error branch).
    pub fn into_result(self) -> rmcp::model::CallToolResult {
        rmcp::model::CallToolResult::structured_error(self.to_json())
    }
}

/// The JSON Schema of a [`ToolError`] body.
pub(super) fn error_schema() -> Value {
    json!({
        "type": "object",
        "title": "ToolError",
        "description": "The body of a failed tool call (isError: true).",
        "properties": {
            "code": {"type": "string", "enum": ToolErrorCode::ALL},
            "message": {"type": "string"},
            "recoverable": {"type": "boolean"},
            "field": {"type": "string"},
            "suggestion": {"type": "string"}
        },
        "required": ["code", "message", "recoverable"],
        "additionalProperties": false
    })
}

/// A tool's `outputSchema` that accepts both `success` and a [`ToolError`].
///
/// The success schema's properties and `$defs` stay where they are; its
/// `required` list (and any top-level `anyOf`/`oneOf`/`allOf`) moves into
/// the first branch of a top-level `anyOf` whose second branch is
/// [`error_schema`].
pub(super) fn with_error_branch(success: JsonObject) -> Arc<JsonObject> {
    let mut schema = success;
    let mut branch = JsonObject::new();
    for key in ["required", "anyOf", "oneOf", "allOf"] {
        if let Some(v) = schema.remove(key) {
            branch.insert(key.to_owned(), v);
        }
    }
    schema.insert(
        "anyOf".to_owned(),
        Value::Array(vec![Value::Object(branch), error_schema()]),
    );
    Arc::new(schema)
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, redact(&self.message))
    }
}

impl std::error::Error for ToolError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_schema_lists_every_code() {
        // Each listed code is one the enum serializes to, and back.
        let json: Vec<Value> = ToolErrorCode::ALL.map(Value::from).to_vec();
        for code in &json {
            let parsed: ToolErrorCode = serde_json::from_value(code.clone()).unwrap();
            assert_eq!(&serde_json::to_value(parsed).unwrap(), code);
        }
        assert_eq!(error_schema()["properties"]["code"]["enum"], json!(json));
    }

    #[test]
    fn the_success_requirements_move_into_the_first_branch() {
        let success = json!({
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "required": ["a"],
            "anyOf": [{"required": ["a"]}]
        });
        let schema = with_error_branch(success.as_object().unwrap().clone());
        assert_eq!(schema.get("required"), None);
        assert_eq!(schema["properties"], success["properties"]);
        assert_eq!(
            schema["anyOf"][0],
            json!({"required": ["a"], "anyOf": [{"required": ["a"]}]})
        );
        assert_eq!(schema["anyOf"][1], error_schema());
    }

    #[test]
    fn key_order_and_redaction() {
        let e = ToolError::new(
            ToolErrorCode::NexusError,
            "failed with api_key=sekrit",
            false,
        )
        .with_suggestion("retry");
        let text = e.to_json().to_string();
        assert_eq!(
            text,
            r#"{"code":"NEXUS_ERROR","message":"failed with api_key=***","recoverable":false,"suggestion":"retry"}"#
        );
    }
}
