//! Validation of `metadata_filter` before it is forwarded to Pinecone.
//!
//! The filter is sent unchanged; this only rejects shapes Pinecone would
//! reject, with a message and the dot path of the first offending part.

use serde_json::{Map, Value};

/// Deepest `$and`/`$or` nesting accepted.
pub(super) const MAX_FILTER_DEPTH: usize = 10;

/// Operators accepted in a filter.
pub(super) const ALLOWED_OPERATORS: [&str; 11] = [
    "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$and", "$or",
];

/// Why a filter was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FilterError {
    /// What is wrong.
    pub message: String,
    /// Dot path of the offending part (`""` for the depth limit).
    pub field: String,
}

fn fail(message: String, field: impl Into<String>) -> Result<(), FilterError> {
    Err(FilterError {
        message,
        field: field.into(),
    })
}

fn is_primitive(v: &Value) -> bool {
    matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_))
}

fn is_logical(op: &str) -> bool {
    op == "$and" || op == "$or"
}

/// Checks a metadata filter; the first problem found (depth first) wins.
///
/// # Errors
/// A [`FilterError`] with the message and field path.
pub(super) fn validate_filter(filter: &Map<String, Value>) -> Result<(), FilterError> {
    validate_record(filter, None, 0)
}

fn validate_record(
    record: &Map<String, Value>,
    prefix: Option<&str>,
    depth: usize,
) -> Result<(), FilterError> {
    if depth > MAX_FILTER_DEPTH {
        return fail(
            format!("Filter nesting exceeds maximum depth of {MAX_FILTER_DEPTH}."),
            "",
        );
    }
    for (key, value) in record {
        let path = match prefix {
            Some(p) => format!("{p}.{key}"),
            None => key.clone(),
        };
        validate_value(value, &path, key, depth)?;
    }
    Ok(())
}

fn validate_value(value: &Value, path: &str, last: &str, depth: usize) -> Result<(), FilterError> {
    match value {
        Value::Null => fail(format!("Invalid null/undefined at \"{path}\"."), path),
        v if is_primitive(v) => Ok(()),
        Value::Array(items) => {
            if items.is_empty() {
                if is_logical(last) {
                    return fail(
                        format!(
                            "Operator \"{last}\" at \"{path}\" must contain at least one filter object."
                        ),
                        path,
                    );
                }
                return Ok(());
            }
            if items.iter().all(is_primitive) {
                return Ok(());
            }
            for (i, item) in items.iter().enumerate() {
                let item_path = format!("{path}.{i}");
                let Value::Object(record) = item else {
                    return fail(
                        format!(
                            "Operator \"{last}\" at \"{item_path}\" must use an array of filter objects."
                        ),
                        item_path,
                    );
                };
                validate_record(record, Some(&item_path), depth + 1)?;
            }
            Ok(())
        }
        Value::Object(ops) => {
            for (op, operand) in ops {
                let op_path = format!("{path}.{op}");
                if !op.starts_with('$') {
                    return fail(
                        format!(
                            "Nested metadata filters must use operator keys starting with \"$\" at \"{path}\"; got \"{op}\"."
                        ),
                        op_path,
                    );
                }
                if !ALLOWED_OPERATORS.contains(&op.as_str()) {
                    return fail(
                        format!(
                            "Unknown filter operator \"{op}\" at \"{path}\". Allowed operators: {}.",
                            ALLOWED_OPERATORS.join(", ")
                        ),
                        op_path,
                    );
                }
                check_operand(op, operand, path, &op_path)?;
                validate_value(operand, &op_path, op, depth)?;
            }
            Ok(())
        }
        // Every JSON value is covered above; numbers, strings and booleans are primitives.
        _ => Ok(()),
    }
}

fn check_operand(op: &str, operand: &Value, path: &str, op_path: &str) -> Result<(), FilterError> {
    match op {
        "$in" | "$nin" => match operand {
            Value::Array(items) if items.is_empty() => fail(
                format!("Operator \"{op}\" at \"{path}\" must contain at least one value."),
                op_path,
            ),
            Value::Array(items) if items.iter().all(is_primitive) => Ok(()),
            _ => fail(
                format!("Operator \"{op}\" at \"{path}\" must use an array of primitive values."),
                op_path,
            ),
        },
        "$exists" => match operand {
            Value::Bool(_) => Ok(()),
            _ => fail(
                format!("Operator \"$exists\" at \"{path}\" must use a boolean value."),
                op_path,
            ),
        },
        "$and" | "$or" => match operand {
            Value::Array(items) if items.is_empty() => fail(
                format!("Operator \"{op}\" at \"{path}\" must contain at least one filter object."),
                op_path,
            ),
            Value::Array(_) => Ok(()),
            _ => fail(
                format!("Operator \"{op}\" at \"{path}\" must use an array of filter objects."),
                op_path,
            ),
        },
        _ if is_primitive(operand) => Ok(()),
        _ => fail(
            format!("Operator \"{op}\" at \"{path}\" must use a primitive value."),
            op_path,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(v: Value) -> Result<(), FilterError> {
        validate_filter(v.as_object().unwrap())
    }

    #[test]
    fn depth_ten_passes_and_eleven_fails() {
        let mut f = json!({"a": 1});
        for _ in 0..10 {
            f = json!({"$and": [f]});
        }
        assert!(check(f.clone()).is_ok());
        let f = json!({"$and": [f]});
        let e = check(f).unwrap_err();
        assert_eq!(e.field, "");
        assert_eq!(e.message, "Filter nesting exceeds maximum depth of 10.");
    }
}
