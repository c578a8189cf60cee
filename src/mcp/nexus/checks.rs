//! The Nexus tools' checks of what their argument types cannot say: every
//! problem is a `VALIDATION` error naming its field.

use std::time::Duration;

use crate::mcp::tool_error::ToolError;

/// The longest context slug or query id accepted, in characters.
pub(super) const MAX_ID_CHARS: usize = 128;
/// The most `get_query` waits server-side.
pub const MAX_WAIT_SECONDS: u64 = 60;

/// A context slug or a query id: 1 to 128 letters, digits, `-`, `_` or `.`.
pub(super) fn checked_id<'a>(id: &'a str, field: &str) -> Result<&'a str, ToolError> {
    let id = id.trim();
    if id.is_empty() {
        return Err(ToolError::validation(
            field,
            format!("{field} must not be empty"),
        ));
    }
    let well_formed = id.len() <= MAX_ID_CHARS
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && id != "."
        && id != "..";
    if !well_formed {
        let hint = match field {
            "context" => "a context slug from list_contexts",
            _ => "the query_id returned by query_context",
        };
        return Err(ToolError::validation(
            field,
            format!("{field} is not a valid id: expected {hint}"),
        ));
    }
    Ok(id)
}

/// `wait_seconds` as a duration: a whole number from 0 to
/// [`MAX_WAIT_SECONDS`] (5.0 is an integer in JSON Schema's sense).
pub(super) fn checked_wait(seconds: Option<&serde_json::Number>) -> Result<Duration, ToolError> {
    let Some(n) = seconds else {
        return Ok(Duration::ZERO);
    };
    let whole = match (n.as_u64(), n.as_f64()) {
        (Some(s), _) => Some(s),
        (None, Some(f)) if f.fract() == 0.0 && (0.0..=MAX_WAIT_SECONDS as f64).contains(&f) => {
            Some(f as u64)
        }
        _ => None,
    };
    match whole {
        Some(s) if s <= MAX_WAIT_SECONDS => Ok(Duration::from_secs(s)),
        _ => Err(ToolError::validation(
            "wait_seconds",
            format!("wait_seconds must be an integer from 0 to {MAX_WAIT_SECONDS}"),
        )),
    }
}
