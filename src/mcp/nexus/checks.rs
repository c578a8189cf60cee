//! The Nexus tools' argument checks: every problem is a `VALIDATION` error
//! naming its field.

use std::time::Duration;

use rmcp::model::JsonObject;
use serde_json::Value;

use crate::mcp::tool_error::ToolError;

/// The longest context slug or query id accepted, in characters.
pub(super) const MAX_ID_CHARS: usize = 128;
/// The most `get_query` waits server-side.
pub const MAX_WAIT_SECONDS: u64 = 60;

// ---------------------------------------------------------------------------
// Argument checks.

pub(super) fn required_str<'a>(args: &'a JsonObject, field: &str) -> Result<&'a str, ToolError> {
    match args.get(field) {
        None | Some(Value::Null) => {
            Err(ToolError::validation(field, format!("{field} is required")))
        }
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(ToolError::validation(
            field,
            format!("{field} must be a string, not {}", json_kind(other)),
        )),
    }
}

/// A context slug or a query id: 1 to 128 letters, digits, `-`, `_` or `.`.
pub(super) fn required_id<'a>(args: &'a JsonObject, field: &str) -> Result<&'a str, ToolError> {
    let id = required_str(args, field)?.trim();
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

pub(super) fn optional_wait(args: &JsonObject) -> Result<Duration, ToolError> {
    const FIELD: &str = "wait_seconds";
    let out_of_range = || {
        ToolError::validation(
            FIELD,
            format!("{FIELD} must be an integer from 0 to {MAX_WAIT_SECONDS}"),
        )
    };
    let seconds = match args.get(FIELD) {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(s), _) => s,
            // 5.0 is an integer in JSON Schema's sense.
            (None, Some(f)) if f.fract() == 0.0 && (0.0..=MAX_WAIT_SECONDS as f64).contains(&f) => {
                f as u64
            }
            _ => return Err(out_of_range()),
        },
        Some(other) => {
            return Err(ToolError::validation(
                FIELD,
                format!(
                    "{FIELD} must be an integer from 0 to {MAX_WAIT_SECONDS}, not {}",
                    json_kind(other)
                ),
            ));
        }
    };
    if seconds > MAX_WAIT_SECONDS {
        return Err(out_of_range());
    }
    Ok(Duration::from_secs(seconds))
}

pub(super) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
