//! The spec (`openapi/nexus_2026-07.oas.yaml`) for tests: its operations,
//! a checker of values against its schemas, and a check of raw answers.
#![allow(dead_code, unreachable_pub)]

use serde_json::{Value, json};

pub fn spec() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/openapi/nexus_2026-07.oas.yaml"
    ))
    .unwrap();
    let yaml: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    serde_json::to_value(yaml).unwrap()
}

/// `(operationId, METHOD, path template)` of every spec operation.
pub fn operations(spec: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if method == "parameters" {
                continue;
            }
            out.push((
                op["operationId"].as_str().unwrap().to_owned(),
                method.to_uppercase(),
                path.clone(),
            ));
        }
    }
    out
}

/// A minimal JSON Schema (OpenAPI 3.0 subset) checker: `$ref`, `allOf`,
/// `anyOf`/`oneOf`, `type`, `nullable`, `enum`/`x-enum`, `required`, `properties`,
/// `items`, `additionalProperties`, `format: date-time`. A `$ref` that does
/// not resolve is an error, never a schema that accepts anything.
pub fn check(spec: &Value, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let target = r
            .strip_prefix("#/components/schemas/")
            .and_then(|name| spec["components"]["schemas"].get(name));
        match target {
            Some(target) => check(spec, target, value, at, errors),
            None => errors.push(format!("{at}: unresolved $ref {r:?}")),
        }
        return;
    }
    if value.is_null() {
        let nullable = schema.get("nullable").and_then(Value::as_bool) == Some(true)
            || schema.as_object().is_some_and(|o| o.is_empty());
        if !nullable {
            errors.push(format!("{at}: null where the schema is not nullable"));
        }
        return;
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            check(spec, s, value, at, errors);
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(any) = schema.get(key).and_then(Value::as_array) {
            let ok = any.iter().any(|s| {
                let mut e = Vec::new();
                check(spec, s, value, at, &mut e);
                e.is_empty()
            });
            if !ok {
                errors.push(format!("{at}: matches none of {key}"));
            }
        }
    }
    let ty = schema.get("type").and_then(Value::as_str);
    let type_ok = match ty {
        None => true,
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some(_) => true,
    };
    if !type_ok {
        errors.push(format!("{at}: expected {ty:?}, got {value}"));
        return;
    }
    // The spec lists known values as `x-enum` (open for clients, which must
    // accept new ones); the local server sends only values it lists.
    if let Some(allowed) = schema
        .get("enum")
        .or_else(|| schema.get("x-enum"))
        .and_then(Value::as_array)
        && !allowed.contains(value)
    {
        errors.push(format!("{at}: {value} is not one of {allowed:?}"));
    }
    if schema.get("format").and_then(Value::as_str) == Some("date-time")
        && let Some(s) = value.as_str()
        && chrono::DateTime::parse_from_rfc3339(s).is_err()
    {
        errors.push(format!("{at}: {s:?} is not an RFC 3339 date-time"));
    }
    if let Some(obj) = value.as_object() {
        if let Some(req) = schema.get("required").and_then(Value::as_array) {
            for r in req.iter().filter_map(Value::as_str) {
                if !obj.contains_key(r) {
                    errors.push(format!("{at}: missing required field {r:?}"));
                }
            }
        }
        let props = schema.get("properties").and_then(Value::as_object);
        for (k, v) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(s) => check(spec, s, v, &format!("{at}.{k}"), errors),
                None => {
                    if let Some(extra) =
                        schema.get("additionalProperties").filter(|a| a.is_object())
                    {
                        check(spec, extra, v, &format!("{at}.{k}"), errors);
                    }
                }
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array()) {
        for (i, v) in arr.iter().enumerate() {
            check(spec, items, v, &format!("{at}[{i}]"), errors);
        }
    }
}

/// Checks a raw answer against the spec's response for its status.
pub async fn conforms(spec: &Value, op_path: &str, method: &str, resp: reqwest::Response) -> Value {
    let status = resp.status().as_u16().to_string();
    let op = &spec["paths"][op_path][method.to_lowercase()];
    let declared = &op["responses"][&status];
    assert!(
        !declared.is_null(),
        "{method} {op_path}: status {status} is not declared"
    );
    let ctype = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = resp.bytes().await.unwrap();
    let content = &declared["content"];
    if content.is_null() {
        return Value::Null;
    }
    if ctype.starts_with("text/event-stream") {
        assert!(
            !content["text/event-stream"].is_null(),
            "{op_path}: SSE not declared"
        );
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let mut frames = Vec::new();
        for raw in text.split("\n\n").filter(|f| f.contains("data:")) {
            let event = raw
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_default();
            let data: Value =
                serde_json::from_str(raw.lines().find_map(|l| l.strip_prefix("data: ")).unwrap())
                    .unwrap();
            let schema = if event == "query" {
                json!({"$ref": "#/components/schemas/Query"})
            } else {
                json!({"$ref": "#/components/schemas/QueryEvent"})
            };
            let mut errors = Vec::new();
            check(spec, &schema, &data, event, &mut errors);
            assert!(errors.is_empty(), "{op_path} frame {event}: {errors:#?}");
            let name = if event == "query" {
                "Query"
            } else {
                "QueryEvent"
            };
            if let Some(why) = super::fidelity::loss(spec, name, &data) {
                panic!("{op_path} frame {event}: the SDK loses data: {why}");
            }
            frames.push(data);
        }
        return Value::Array(frames);
    }
    if ctype.starts_with("application/octet-stream") {
        assert!(
            !content["application/octet-stream"].is_null(),
            "{op_path}: bytes not declared"
        );
        return Value::Null;
    }
    assert!(
        ctype.starts_with("application/json"),
        "{op_path}: content type {ctype}"
    );
    let value: Value = serde_json::from_slice(&bytes).unwrap();
    let mut errors = Vec::new();
    check(
        spec,
        &content["application/json"]["schema"],
        &value,
        "$",
        &mut errors,
    );
    assert!(
        errors.is_empty(),
        "{method} {op_path} {status}: {errors:#?}\n{value:#}"
    );
    // What the server answered survives the SDK's generated type.
    let schema = &content["application/json"]["schema"];
    let op_id = op["operationId"].as_str().unwrap_or_default();
    let code = status.parse().unwrap();
    if let Some(why) = super::fidelity::answer_loss(spec, op_id, code, schema, &value) {
        panic!("{method} {op_path}: the SDK loses data: {why}");
    }
    value
}
