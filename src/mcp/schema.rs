//! Tool schemas every client can read.
//!
//! schemars writes JSON Schema 2020-12 with extras that some clients refuse:
//! integer `format`s such as `uint64` or `int64` (not JSON Schema formats;
//! validators warn on each), and, in input schemas, `$ref` into `$defs`,
//! `oneOf` of `const` for enums and type arrays such as
//! `["string", "null"]` for optional fields (some function-calling backends
//! reject all three). [`portable`] rewrites a tool's schemas:
//!
//! - every schema loses the `format`s JSON Schema does not define;
//! - the input schema is inlined (no `$ref`, no `$defs`), enums become
//!   `enum` lists, and a field that may be null is written as its non-null
//!   type (an optional field is simply left out; `null` is still accepted).
//!
//! Output schemas keep their `$defs` and their nullable fields, but lose
//! non-standard formats and type arrays: a field that may be null is
//! written `anyOf` of its type and `null` (the spelling portable schema
//! checkers such as the MCP Inspector's ask for). They also lose what only
//! a reader would use and a client pays for in every `tools/list`: the
//! descriptions and titles of their members (the tool's description says
//! what it returns), and `oneOf` of `const`s, written as one `const` or an
//! `enum`. What they accept is unchanged.

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{JsonObject, Tool};
use serde_json::{Map, Value};

/// The formats JSON Schema 2020-12 defines.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// How deep `$ref`s are followed when inlining; deeper (recursive) ones
/// become `{}` (any value).
const MAX_REF_DEPTH: usize = 16;

/// Keys whose values are data, not subschemas.
const DATA_KEYS: &[&str] = &[
    "enum",
    "const",
    "default",
    "examples",
    "required",
    "title",
    "description",
];

/// Rewrites the schemas of every tool in `router` with [`portable`].
pub(crate) fn portable_router<S>(router: &mut ToolRouter<S>) {
    for route in router.map.values_mut() {
        route.attr = portable(route.attr.clone());
    }
}

/// `tool` with schemas every client can read (see the module docs).
pub(crate) fn portable(mut tool: Tool) -> Tool {
    tool.input_schema = Arc::new(portable_input(&tool.input_schema));
    if let Some(output) = tool.output_schema.take() {
        let mut value = Value::Object((*output).clone());
        strip_formats(&mut value);
        split_type_arrays(&mut value);
        trim_output(&mut value);
        if let Value::Object(map) = value {
            tool.output_schema = Some(Arc::new(map));
        }
    }
    tool
}

/// An input schema inlined and without type arrays, `oneOf` of `const` or
/// non-standard formats.
pub(crate) fn portable_input(schema: &JsonObject) -> JsonObject {
    let defs = definitions(schema);
    match flatten(&Value::Object(schema.clone()), &defs, 0) {
        Value::Object(mut map) => {
            map.remove("$defs");
            map.remove("definitions");
            map
        }
        _ => JsonObject::new(),
    }
}

/// The `$defs` (or draft-07 `definitions`) of a root schema.
fn definitions(schema: &JsonObject) -> Map<String, Value> {
    let mut defs = Map::new();
    for key in ["definitions", "$defs"] {
        if let Some(Value::Object(found)) = schema.get(key) {
            defs.extend(found.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    defs
}

/// The definition a local `$ref` names, if any.
fn resolve<'a>(reference: &str, defs: &'a Map<String, Value>) -> Option<&'a Value> {
    let name = reference
        .strip_prefix("#/$defs/")
        .or_else(|| reference.strip_prefix("#/definitions/"))?;
    defs.get(name)
}

fn flatten(schema: &Value, defs: &Map<String, Value>, depth: usize) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    // A `$ref` is replaced by what it names; its siblings (a description)
    // win over the definition's.
    if let Some(Value::String(reference)) = map.get("$ref") {
        let inlined = match resolve(reference, defs) {
            Some(target) if depth < MAX_REF_DEPTH => flatten(target, defs, depth + 1),
            _ => Value::Object(Map::new()),
        };
        if let Value::Object(inlined) = inlined {
            out = inlined;
        }
    }
    for (key, value) in map {
        if key == "$ref" || key == "$defs" || key == "definitions" {
            continue;
        }
        let value = if DATA_KEYS.contains(&key.as_str()) {
            value.clone()
        } else if matches!(key.as_str(), "properties" | "patternProperties") {
            match value {
                Value::Object(props) => Value::Object(
                    props
                        .iter()
                        .map(|(k, v)| (k.clone(), flatten(v, defs, depth)))
                        .collect(),
                ),
                other => other.clone(),
            }
        } else {
            match value {
                Value::Object(_) => flatten(value, defs, depth),
                Value::Array(items) => Value::Array(
                    items
                        .iter()
                        .map(|v| {
                            if v.is_object() {
                                flatten(v, defs, depth)
                            } else {
                                v.clone()
                            }
                        })
                        .collect(),
                ),
                other => other.clone(),
            }
        };
        out.insert(key.clone(), value);
    }
    simplify(out)
}

/// One schema object's rewrites, its subschemas already done.
fn simplify(mut map: Map<String, Value>) -> Value {
    for key in ["anyOf", "oneOf"] {
        let Some(Value::Array(branches)) = map.get(key) else {
            continue;
        };
        let branches = branches.clone();
        let non_null: Vec<&Value> = branches.iter().filter(|b| !is_null_schema(b)).collect();
        if let Some(values) = const_values(&non_null) {
            // `oneOf` of `const`: an `enum`.
            map.remove(key);
            if let Some(kind) = common_type(&non_null) {
                map.insert("type".to_owned(), Value::String(kind));
            }
            map.insert("enum".to_owned(), Value::Array(values));
        } else if non_null.len() == 1 && branches.len() == 2 {
            // `T` or null: `T`, with this object's own keys on top.
            map.remove(key);
            if let Value::Object(inner) = non_null[0] {
                for (k, v) in inner {
                    map.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
        }
    }
    if let Some(Value::Array(kinds)) = map.get("type") {
        let kinds: Vec<Value> = kinds
            .iter()
            .filter(|k| k.as_str() != Some("null"))
            .cloned()
            .collect();
        match kinds.len() {
            0 => {
                map.insert("type".to_owned(), Value::String("null".to_owned()));
            }
            1 => {
                map.insert("type".to_owned(), kinds[0].clone());
            }
            _ => {
                map.remove("type");
                let branches = kinds
                    .into_iter()
                    .map(|k| {
                        let mut branch = Map::new();
                        branch.insert("type".to_owned(), k);
                        Value::Object(branch)
                    })
                    .collect();
                map.insert("anyOf".to_owned(), Value::Array(branches));
            }
        }
    }
    // An optional field's `default: null` no longer matches its type.
    if map.get("default") == Some(&Value::Null) && map.get("type") != Some(&Value::from("null")) {
        map.remove("default");
    }
    drop_format(&mut map);
    Value::Object(map)
}

fn is_null_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("null")
        || schema.get("const") == Some(&Value::Null)
}

/// The `const`s of branches that are each just a `const` (with a type or
/// a description), or `None`.
fn const_values(branches: &[&Value]) -> Option<Vec<Value>> {
    if branches.is_empty() {
        return None;
    }
    branches
        .iter()
        .map(|b| {
            let obj = b.as_object()?;
            let only_const = obj
                .keys()
                .all(|k| matches!(k.as_str(), "const" | "type" | "description" | "title"));
            if only_const {
                obj.get("const").cloned()
            } else {
                None
            }
        })
        .collect()
}

/// The one JSON type of all `const` branches' values, if they share one.
fn common_type(branches: &[&Value]) -> Option<String> {
    let mut kind: Option<&'static str> = None;
    for branch in branches {
        let this = match branch.get("const")? {
            Value::String(_) => "string",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            _ => return None,
        };
        if kind.is_some_and(|k| k != this) {
            return None;
        }
        kind = Some(this);
    }
    kind.map(str::to_owned)
}

fn drop_format(map: &mut Map<String, Value>) {
    let standard = map
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|f| STANDARD_FORMATS.contains(&f));
    if !standard {
        map.remove("format");
    }
}

/// Removes every non-standard `format` in `schema`, wherever it is.
fn strip_formats(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.get("format").is_some_and(Value::is_string) {
                drop_format(map);
            }
            for (key, value) in map.iter_mut() {
                if !DATA_KEYS.contains(&key.as_str()) {
                    strip_formats(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_formats),
        _ => {}
    }
}

/// Keys that stay on a schema whose type array is split: they describe the
/// value whatever its type.
const ANNOTATION_KEYS: &[&str] = &[
    "description",
    "title",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
];

/// Rewrites every `"type": [A, B, …]` into `anyOf` of one-type branches;
/// the keys that constrain a value (properties, items, formats, bounds…)
/// go to each non-null branch, annotations stay where they were.
fn split_type_arrays(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match (key.as_str(), value) {
                    // Maps of names to subschemas: a property may be
                    // called `description` or `default`.
                    (
                        "properties" | "patternProperties" | "$defs" | "definitions",
                        Value::Object(named),
                    ) => named.values_mut().for_each(split_type_arrays),
                    (key, _) if DATA_KEYS.contains(&key) => {}
                    (_, value) => split_type_arrays(value),
                }
            }
            let Some(Value::Array(kinds)) = map.get("type") else {
                return;
            };
            let kinds = kinds.clone();
            map.remove("type");
            if let [only] = kinds.as_slice() {
                map.insert("type".to_owned(), only.clone());
                return;
            }
            let constraints: Vec<String> = map
                .keys()
                .filter(|k| !ANNOTATION_KEYS.contains(&k.as_str()))
                .cloned()
                .collect();
            let mut moved = Map::new();
            for key in constraints {
                if let Some(value) = map.remove(&key) {
                    moved.insert(key, value);
                }
            }
            let branches: Vec<Value> = kinds
                .into_iter()
                .map(|kind| {
                    let mut branch = Map::new();
                    if kind.as_str() != Some("null") {
                        branch.extend(moved.iter().map(|(k, v)| (k.clone(), v.clone())));
                    }
                    branch.insert("type".to_owned(), kind);
                    Value::Object(branch)
                })
                .collect();
            map.insert("anyOf".to_owned(), Value::Array(branches));
        }
        Value::Array(items) => items.iter_mut().for_each(split_type_arrays),
        _ => {}
    }
}

/// Annotations an output schema loses (see the module docs).
const OUTPUT_ANNOTATIONS: &[&str] = &["description", "title", "$comment"];

/// Drops an output schema's annotations and writes its `oneOf` (or
/// `anyOf`) of `const`s as one `const` or an `enum`, wherever they are:
/// the values it accepts stay the same.
fn trim_output(schema: &mut Value) {
    let map = match schema {
        Value::Object(map) => map,
        Value::Array(items) => {
            items.iter_mut().for_each(trim_output);
            return;
        }
        _ => return,
    };
    for (key, value) in map.iter_mut() {
        match (key.as_str(), value) {
            // Maps of names to subschemas: a property may be called
            // `description`.
            (
                "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas",
                Value::Object(named),
            ) => named.values_mut().for_each(trim_output),
            (key, _) if DATA_KEYS.contains(&key) => {}
            (_, value) => trim_output(value),
        }
    }
    map.retain(|key, value| !(OUTPUT_ANNOTATIONS.contains(&key.as_str()) && value.is_string()));
    for key in ["oneOf", "anyOf"] {
        if map.contains_key("const") || map.contains_key("enum") {
            break;
        }
        let Some(Value::Array(branches)) = map.get(key) else {
            continue;
        };
        let branches: Vec<&Value> = branches.iter().collect();
        let Some(mut values) = const_values(&branches) else {
            continue;
        };
        let kind = common_type(&branches);
        map.remove(key);
        if let Some(kind) = kind {
            map.entry("type").or_insert(Value::String(kind));
        }
        match values.len() {
            1 => map.insert("const".to_owned(), values.remove(0)),
            _ => map.insert("enum".to_owned(), Value::Array(values)),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn output_type_arrays_become_any_of_with_constraints_on_the_typed_branch() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "answer": {"type": ["string", "null"], "description": "text", "maxLength": 5},
                "rows": {"type": ["array", "null"], "items": {"type": ["integer", "null"]}},
                "plain": {"type": ["string"]},
                "description": {"type": ["string", "null"]}
            },
            "$defs": {"Row": {"type": ["object", "null"], "properties": {"a": {"type": "string"}}}}
        });
        split_type_arrays(&mut schema);
        assert_eq!(
            schema["properties"]["answer"],
            json!({"description": "text", "anyOf": [
                {"type": "string", "maxLength": 5}, {"type": "null"}
            ]})
        );
        assert_eq!(
            schema["properties"]["rows"]["anyOf"][0]["items"],
            json!({"anyOf": [{"type": "integer"}, {"type": "null"}]})
        );
        assert_eq!(schema["properties"]["plain"], json!({"type": "string"}));
        assert!(schema["properties"]["description"]["anyOf"].is_array());
        assert_eq!(
            schema["$defs"]["Row"]["anyOf"][0]["properties"]["a"],
            json!({"type": "string"})
        );
        assert!(!schema.to_string().contains(r#""type":["#), "{schema}");
    }

    fn object(v: Value) -> JsonObject {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn input_schemas_are_inlined_and_plain() {
        let schema = object(json!({
            "type": "object",
            "properties": {
                "top_k": {"type": ["integer", "null"], "format": "int64", "minimum": 1, "default": null},
                "source": {"type": ["string", "null"], "description": "Source name."},
                "preset": {"anyOf": [{"$ref": "#/$defs/Preset"}, {"type": "null"}], "description": "Preset."},
                "when": {"type": "string", "format": "date-time"}
            },
            "required": ["top_k"],
            "$defs": {"Preset": {"oneOf": [
                {"type": "string", "const": "fast", "description": "Fast."},
                {"type": "string", "const": "full", "description": "Full."}
            ]}}
        }));
        let flat = Value::Object(portable_input(&schema));
        assert_eq!(
            flat,
            json!({
                "type": "object",
                "properties": {
                    "top_k": {"type": "integer", "minimum": 1},
                    "source": {"type": "string", "description": "Source name."},
                    "preset": {"type": "string", "enum": ["fast", "full"], "description": "Preset."},
                    "when": {"type": "string", "format": "date-time"}
                },
                "required": ["top_k"]
            })
        );
    }

    #[test]
    fn recursive_refs_end() {
        let schema = object(json!({
            "$ref": "#/$defs/Node",
            "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}}
        }));
        let flat = Value::Object(portable_input(&schema));
        assert!(!flat.to_string().contains("$ref"), "{flat}");
    }

    #[test]
    fn output_schemas_lose_annotations_and_write_consts_plainly() {
        let mut schema = json!({
            "description": "A result.",
            "type": "object",
            "properties": {
                "status": {"description": "Always ok.", "$ref": "#/$defs/Status"},
                "mode": {"oneOf": [
                    {"description": "Fast.", "type": "string", "const": "fast"},
                    {"description": "Full.", "type": "string", "const": "full"}
                ]},
                "description": {"title": "Kept name", "anyOf": [{"type": "string"}, {"type": "null"}]},
                "either": {"anyOf": [{"const": 1}, {"const": "one"}]}
            },
            "required": ["status", "description"],
            "$defs": {"Status": {"description": "Status.", "oneOf": [
                {"description": "Ok.", "type": "string", "const": "ok"}
            ]}}
        });
        trim_output(&mut schema);
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "status": {"$ref": "#/$defs/Status"},
                    "mode": {"type": "string", "enum": ["fast", "full"]},
                    "description": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "either": {"enum": [1, "one"]}
                },
                "required": ["status", "description"],
                "$defs": {"Status": {"type": "string", "const": "ok"}}
            })
        );
    }

    #[test]
    fn output_schemas_only_lose_formats() {
        let mut schema = json!({
            "type": "object",
            "properties": {"count": {"type": "integer", "format": "uint64", "minimum": 0},
                           "maybe": {"type": ["string", "null"]}},
            "$defs": {"X": {"type": "integer", "format": "uint"}}
        });
        strip_formats(&mut schema);
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {"count": {"type": "integer", "minimum": 0},
                               "maybe": {"type": ["string", "null"]}},
                "$defs": {"X": {"type": "integer"}}
            })
        );
    }
}
