//! Tool-level errors: what an agent reads when a tool ran and failed.
//!
//! A failed tool call is a successful MCP response whose result has
//! `isError: true` and a JSON body `{code, message, recoverable, field?,
//! suggestion?}`. Protocol errors are kept for requests that cannot be routed.

use serde::Serialize;

use super::redact::redact;

/// The `code` of a [`ToolError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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

    /// The MCP tool result: `isError: true`, the JSON as text and as structured content.
    pub fn into_result(self) -> rmcp::model::CallToolResult {
        rmcp::model::CallToolResult::structured_error(self.to_json())
    }
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
