//! How internal failures become the `ToolError` an agent reads.

use crate::mcp::{ToolError, ToolErrorCode};

use super::client::PineconeError;
use super::search::SearchError;

/// Suggestion attached to every `TIMEOUT`.
pub(super) const TIMEOUT_SUGGESTION: &str =
    "Retry the request, or increase --pinecone-request-timeout-ms.";

/// Why a tool call failed (boxed: it travels through every `?`).
#[derive(Debug, Clone)]
pub(crate) struct Failure(Box<Kind>);

#[derive(Debug, Clone)]
enum Kind {
    /// Already an agent-facing error (validation, gate, …).
    Tool(ToolError),
    /// A Pinecone call failed.
    Pinecone(PineconeError),
    /// A search failed.
    Search(SearchError),
}

impl From<ToolError> for Failure {
    fn from(e: ToolError) -> Self {
        Failure(Box::new(Kind::Tool(e)))
    }
}

impl From<PineconeError> for Failure {
    fn from(e: PineconeError) -> Self {
        Failure(Box::new(Kind::Pinecone(e)))
    }
}

impl From<SearchError> for Failure {
    fn from(e: SearchError) -> Self {
        Failure(Box::new(Kind::Search(e)))
    }
}

impl Failure {
    /// The agent-facing error: timeouts become `TIMEOUT`, other Pinecone
    /// failures `PINECONE_ERROR` with the tool's fixed message, or with the
    /// redacted cause when `details` is on.
    pub(crate) fn into_tool_error(self, tool: &str, fallback: &str, details: bool) -> ToolError {
        let (timeout, refused, cause) = match *self.0 {
            Kind::Tool(e) => return e,
            Kind::Pinecone(e) => (
                e.is_timeout(),
                matches!(e.status(), Some(401 | 403)),
                e.to_string(),
            ),
            Kind::Search(e) => (e.is_timeout(), e.key_refused(), e.to_string()),
        };
        if refused {
            // The same code and hint as the Nexus tools give a refused key.
            let message = if details {
                crate::mcp::redact::redact(&cause)
            } else {
                "Pinecone refused the API key.".to_owned()
            };
            return ToolError::new(ToolErrorCode::Unauthorized, message, false)
            .with_suggestion(
                "Check the Pinecone API key: over HTTP send a valid key in the X-Pinecone-Api-Key header; over stdio set PINECONE_API_KEY.",
            );
        }
        tracing::error!(tool, error = %crate::mcp::redact::redact(&cause), "tool failed");
        let message = if details { cause } else { fallback.to_owned() };
        if timeout {
            ToolError::new(ToolErrorCode::Timeout, message, true)
                .with_suggestion(TIMEOUT_SUGGESTION)
        } else {
            ToolError::new(ToolErrorCode::PineconeError, message, false)
        }
    }
}
