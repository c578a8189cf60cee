//! SDK errors as the Nexus tools' errors.

use crate::mcp::tool_error::{ToolError, ToolErrorCode};
use crate::{Error, types};

// ---------------------------------------------------------------------------
// Error mapping.

/// What a failed call was about, for NOT_FOUND messages.
#[derive(Debug, Clone, Copy)]
pub(super) enum Subject<'a> {
    None,
    Context(&'a str),
    Query(&'a str),
}

pub(super) fn not_queryable(context: &types::ContextResponse) -> ToolError {
    let slug = &context.slug;
    let (message, suggestion) = if context.is_curating {
        (
            format!(
                "context `{slug}` is not queryable yet: it is being curated for the first time"
            ),
            "wait for curation to finish (list_contexts shows is_curating and queryable), then call query_context again".to_owned(),
        )
    } else {
        (
            format!(
                "context `{slug}` is not queryable: it is a {} context that has never been curated",
                context.kind.as_str()
            ),
            format!(
                "curate it first (POST /contexts/{slug}/curate), then call query_context again once list_contexts shows queryable=true"
            ),
        )
    };
    ToolError {
        field: Some("context".into()),
        ..ToolError::new(ToolErrorCode::Validation, message, true)
    }
    .with_suggestion(suggestion)
}

/// Maps an SDK error to what the agent reads.
pub(super) fn nexus_error(err: Error, subject: Subject<'_>) -> ToolError {
    if err.is_not_found() {
        return match subject {
            Subject::Context(slug) => ToolError::new(
                ToolErrorCode::NotFound,
                format!("no context `{slug}` in this project"),
                true,
            )
            .with_suggestion("call list_contexts to see the available slugs"),
            Subject::Query(id) => {
                ToolError::new(ToolErrorCode::NotFound, format!("no query `{id}`"), true)
                    .with_suggestion("pass the query_id returned by query_context")
            }
            Subject::None => ToolError::new(ToolErrorCode::NotFound, err.to_string(), false),
        };
    }
    match &err {
        Error::Unauthorized { .. } => ToolError::new(
            ToolErrorCode::Unauthorized,
            format!("Nexus refused the credentials: {err}"),
            false,
        )
        .with_suggestion("check the Pinecone API key the server or the HTTP request provides"),
        Error::Timeout { .. } => ToolError::new(
            ToolErrorCode::Timeout,
            format!("Nexus did not answer in time: {err}"),
            true,
        )
        .with_suggestion("call the tool again"),
        Error::Transport { .. } => ToolError::new(
            ToolErrorCode::NexusError,
            format!("could not reach Nexus: {}", error_chain(&err)),
            true,
        )
        .with_suggestion("check that Nexus is running and reachable, then call the tool again"),
        Error::InvalidRequest(_) => {
            ToolError::new(ToolErrorCode::NexusError, err.to_string(), false)
        }
        _ if err.is_conflict() => ToolError::new(ToolErrorCode::NexusError, err.to_string(), true)
            .with_suggestion("another turn is in flight; wait for it, then try again"),
        _ => ToolError::new(
            ToolErrorCode::NexusError,
            err.to_string(),
            err.is_retryable(),
        ),
    }
}

/// The error and its sources, joined (the top level alone says "transport error").
pub(super) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
