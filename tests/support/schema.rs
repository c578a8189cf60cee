//! Checks a tool result against the tool's declared `outputSchema` with a
//! JSON Schema validator (draft 2020-12), on success and on tool errors.
#![allow(dead_code, unreachable_pub)]

use rmcp::model::{CallToolResult, Tool};
use serde_json::Value;

/// The tool's output schema, itself checked against the meta-schema.
pub fn output_schema(tool: &Tool) -> Value {
    let schema = Value::Object(
        tool.output_schema
            .as_ref()
            .unwrap_or_else(|| panic!("{} declares no outputSchema", tool.name))
            .as_ref()
            .clone(),
    );
    assert_eq!(schema["type"], "object", "{}: outputSchema type", tool.name);
    if let Err(e) = jsonschema::meta::validate(&schema) {
        panic!(
            "{}: outputSchema is not a valid JSON Schema: {e}",
            tool.name
        );
    }
    schema
}

/// Asserts that `result` carries structured content (on success and on a
/// tool error alike), that it validates against `tool`'s `outputSchema`, and
/// that the first text block is the same JSON (or, for `list_contexts`, the
/// array it wraps).
pub fn assert_conforms(tool: &Tool, result: &CallToolResult) {
    let schema = output_schema(tool);
    let validator = jsonschema::validator_for(&schema)
        .unwrap_or_else(|e| panic!("{}: cannot compile outputSchema: {e}", tool.name));
    let structured = result.structured_content.as_ref().unwrap_or_else(|| {
        panic!(
            "{}: no structuredContent (isError {:?})",
            tool.name, result.is_error
        )
    });
    let errors: Vec<String> = validator
        .iter_errors(structured)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{}: structuredContent does not match outputSchema (isError {:?}): {errors:?}\n{structured}",
        tool.name,
        result.is_error
    );
    if result.is_error == Some(true) {
        assert!(
            structured["code"].is_string(),
            "{}: {structured}",
            tool.name
        );
    }
}

/// Asserts that `value` does NOT validate against `tool`'s schema (the
/// schema has teeth).
pub fn assert_rejects(tool: &Tool, value: &Value) {
    let schema = output_schema(tool);
    assert!(
        !jsonschema::is_valid(&schema, value),
        "{}: outputSchema accepts {value}",
        tool.name
    );
}
