//! The JSON Schema subset a `shape` is sent in, made from a schemars schema,
//! and the check of an `output_json` against it.
//!
//! The subset: `type` (one of `object`, `string`, `number`, `integer`,
//! `boolean`, `array`), `properties`, `required`, `items`, `enum` (of
//! strings) and `description`. Made from a schema by:
//! - inlining every `$ref` to `$defs` / `definitions` (a type that refers to
//!   itself is refused: the subset has no recursion);
//! - an optional value (`type: [T, "null"]`, `anyOf`/`oneOf` with
//!   `{"type": "null"}`) becoming `T`, left out of `required`;
//! - `oneOf`/`anyOf` of string constants (an enum with documented
//!   variants) becoming one `enum`;
//! - dropping every other keyword (`$schema`, `title`, `format`, `minimum`,
//!   `maximum`, `default`, `examples`, `additionalProperties`, ...): the
//!   decode into the type checks what they said.
//!
//! Anything else (an enum with data, `allOf`, a map without `properties`)
//! is refused with the path of the part that does not fit.

use serde_json::{Map, Value};

/// Most `$ref`s followed while inlining one schema.
const MAX_INLINED: usize = 1000;
/// Deepest nesting of the result.
const MAX_DEPTH: usize = 16;

const TYPES: [&str; 6] = ["object", "string", "number", "integer", "boolean", "array"];

/// The subset form of a whole schema (its root must be an object).
pub(crate) fn to_subset(schema: &Value) -> Result<Map<String, Value>, String> {
    let defs = schema
        .get("$defs")
        .or_else(|| schema.get("definitions"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut converter = Converter {
        defs: &defs,
        budget: MAX_INLINED,
        stack: Vec::new(),
    };
    let (out, _) = converter.convert(schema, "")?;
    match out {
        Value::Object(map) if map.get("type") == Some(&Value::from("object")) => Ok(map),
        _ => Err("the root of a shape must be a struct (a JSON object)".to_owned()),
    }
}

/// Inlines `$ref`s within a budget and a depth while converting.
struct Converter<'d> {
    defs: &'d Map<String, Value>,
    /// `$ref`s that may still be followed.
    budget: usize,
    /// The definitions being inlined, outermost first.
    stack: Vec<String>,
}

impl Converter<'_> {
    /// Converts one schema; the bool says whether it allowed `null`.
    fn convert(&mut self, schema: &Value, at: &str) -> Result<(Value, bool), String> {
        let here = || place(at);
        if self.stack.len() > MAX_DEPTH {
            return Err(format!("{} nests deeper than {MAX_DEPTH} levels", here()));
        }
        let Some(obj) = schema.as_object() else {
            return Err(format!("{}: not a schema the subset can carry", here()));
        };
        if let Some(reference) = obj.get("$ref").and_then(Value::as_str) {
            return self.convert_ref(obj, reference, at);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(options)) = obj.get(key) {
                return self.convert_union(obj, options, at);
            }
        }
        if obj.contains_key("allOf") || obj.contains_key("not") {
            return Err(format!(
                "{}: `allOf` / `not` have no place in the subset",
                here()
            ));
        }
        let (ty, nullable) = type_of(obj, at)?;
        let mut out = Map::new();
        out.insert("type".into(), Value::from(ty.clone()));
        if let Some(d) = obj.get("description").filter(|d| d.is_string()) {
            out.insert("description".into(), d.clone());
        }
        if let Some(options) = enum_of(obj, at)? {
            out.insert("enum".into(), Value::Array(options));
        }
        match ty.as_str() {
            "object" => self.convert_properties(obj, &mut out, at)?,
            "array" => {
                let items = obj
                    .get("items")
                    .ok_or_else(|| format!("{}: an array without `items`", here()))?;
                let (value, _) = self.convert(items, &format!("{at}[]"))?;
                out.insert("items".into(), value);
            }
            _ => {}
        }
        Ok((Value::Object(out), nullable))
    }

    /// A `$ref` inlined: the definition it names, with the referring schema's
    /// description; recursion and an exhausted budget are refused.
    fn convert_ref(
        &mut self,
        obj: &Map<String, Value>,
        reference: &str,
        at: &str,
    ) -> Result<(Value, bool), String> {
        let here = || place(at);
        if reference == "#" {
            return Err(format!(
                "{}: the root type refers to itself; the subset has no recursion",
                here()
            ));
        }
        let name = reference
            .strip_prefix("#/$defs/")
            .or_else(|| reference.strip_prefix("#/definitions/"))
            .ok_or_else(|| format!("{}: cannot inline `$ref` {reference:?}", here()))?;
        if self.stack.iter().any(|s| s == name) {
            return Err(format!(
                "{}: type {name} refers to itself; the subset has no recursion",
                here()
            ));
        }
        self.budget = self
            .budget
            .checked_sub(1)
            .ok_or_else(|| format!("{}: too many `$ref`s", here()))?;
        let target = self
            .defs
            .get(name)
            .ok_or_else(|| format!("{}: `$ref` to a missing definition {name:?}", here()))?;
        self.stack.push(name.to_owned());
        let result = self.convert(target, at);
        self.stack.pop();
        let (mut value, nullable) = result?;
        if let (Some(d), Value::Object(m)) = (obj.get("description"), &mut value) {
            m.insert("description".into(), d.clone());
        }
        Ok((value, nullable))
    }

    /// An object's `properties`, each converted, and the `required` names
    /// that stay required (a nullable property is optional in the subset).
    fn convert_properties(
        &mut self,
        obj: &Map<String, Value>,
        out: &mut Map<String, Value>,
        at: &str,
    ) -> Result<(), String> {
        let props = obj
            .get("properties")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                format!(
                    "{}: an object without `properties` (a map) has no place in the subset",
                    place(at)
                )
            })?;
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut properties = Map::new();
        let mut still_required = Vec::new();
        for (name, prop) in props {
            let path = if at.is_empty() {
                name.clone()
            } else {
                format!("{at}.{name}")
            };
            let (value, nullable) = self.convert(prop, &path)?;
            if required.contains(&name.as_str()) && !nullable {
                still_required.push(Value::from(name.clone()));
            }
            properties.insert(name.clone(), value);
        }
        out.insert("properties".into(), Value::Object(properties));
        if !still_required.is_empty() {
            out.insert("required".into(), Value::Array(still_required));
        }
        Ok(())
    }

    /// `anyOf` / `oneOf`: `[T, null]` is an optional `T`; string constants are an enum.
    fn convert_union(
        &mut self,
        obj: &Map<String, Value>,
        options: &[Value],
        at: &str,
    ) -> Result<(Value, bool), String> {
        let is_null = |o: &Value| {
            o.get("type") == Some(&Value::from("null")) || o.get("const") == Some(&Value::Null)
        };
        let nullable = options.iter().any(is_null);
        let rest: Vec<&Value> = options.iter().filter(|o| !is_null(o)).collect();
        let mut converted = Vec::new();
        for option in &rest {
            converted.push(self.convert(option, at)?.0);
        }
        let mut value = match converted.as_slice() {
            [one] => one.clone(),
            many if many.iter().all(|v| {
                v.get("enum")
                    .and_then(Value::as_array)
                    .is_some_and(|e| !e.is_empty())
            }) =>
            {
                let values: Vec<Value> = many
                    .iter()
                    .filter_map(|v| v.get("enum").and_then(Value::as_array))
                    .flatten()
                    .cloned()
                    .collect();
                serde_json::json!({ "type": "string", "enum": values })
            }
            _ => {
                return Err(format!(
                    "{}: a choice between shapes (an enum with data) has no place in the subset",
                    place(at)
                ));
            }
        };
        if let (Some(d), Value::Object(m)) = (obj.get("description"), &mut value) {
            m.insert("description".into(), d.clone());
        }
        Ok((value, nullable))
    }
}

/// Where a schema sits, for messages: the root, or its path in backticks.
fn place(at: &str) -> String {
    if at.is_empty() {
        "the root".to_owned()
    } else {
        format!("`{at}`")
    }
}

/// The one type a schema names, and whether it also admits `null`.
fn type_of(obj: &Map<String, Value>, at: &str) -> Result<(String, bool), String> {
    let here = || place(at);
    let (ty, nullable) = match obj.get("type") {
        Some(Value::String(t)) => (t.clone(), false),
        Some(Value::Array(ts)) => {
            let named: Vec<&str> = ts
                .iter()
                .filter_map(Value::as_str)
                .filter(|t| *t != "null")
                .collect();
            match named.as_slice() {
                [one] => ((*one).to_owned(), named.len() < ts.len()),
                _ => return Err(format!("{}: a value of several types ({ts:?})", here())),
            }
        }
        None if obj.contains_key("enum") => ("string".to_owned(), false),
        None if obj.contains_key("const") => ("string".to_owned(), false),
        None => {
            return Err(format!(
                "{}: a value of any type has no place in the subset",
                here()
            ));
        }
        Some(other) => return Err(format!("{}: `type` {other} is not a type name", here())),
    };
    if !TYPES.contains(&ty.as_str()) {
        return Err(format!(
            "{}: type {ty:?} has no place in the subset",
            here()
        ));
    }
    Ok((ty, nullable))
}

/// The string options of an `enum` or `const`, if the schema has either.
fn enum_of(obj: &Map<String, Value>, at: &str) -> Result<Option<Vec<Value>>, String> {
    if let Some(options) = obj.get("enum").and_then(Value::as_array) {
        let strings: Vec<Value> = options.iter().filter(|o| o.is_string()).cloned().collect();
        if strings.is_empty()
            || strings.len() + usize::from(options.contains(&Value::Null)) < options.len()
        {
            return Err(format!(
                "{}: only enums of strings fit the subset",
                place(at)
            ));
        }
        return Ok(Some(strings));
    }
    match obj.get("const") {
        Some(c) if !c.is_string() => Err(format!(
            "{}: only string constants fit the subset",
            place(at)
        )),
        Some(c) => Ok(Some(vec![c.clone()])),
        None => Ok(None),
    }
}

/// Checks `value` against a subset schema; the error names the path of the
/// first value that does not fit (`details.mode`, `steps[2]`).
pub(crate) fn check(schema: &Map<String, Value>, value: &Value, at: &str) -> Result<(), String> {
    let here = || {
        if at.is_empty() {
            "the root".to_owned()
        } else {
            format!("`{at}`")
        }
    };
    let ty = schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("object");
    let fits = match ty {
        "object" => value.is_object(),
        "string" => value.is_string(),
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64(),
        "boolean" => value.is_boolean(),
        "array" => value.is_array(),
        _ => true,
    };
    if !fits {
        return Err(format!("{}: expected {ty}, found {}", here(), kind(value)));
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        return Err(format!(
            "{}: {value} is not one of {}",
            here(),
            Value::Array(options.clone())
        ));
    }
    match value {
        Value::Object(map) => {
            if let Some(required) = schema.get("required").and_then(Value::as_array) {
                for name in required.iter().filter_map(Value::as_str) {
                    if !map.contains_key(name) {
                        let path = if at.is_empty() {
                            name.to_owned()
                        } else {
                            format!("{at}.{name}")
                        };
                        return Err(format!("`{path}`: missing"));
                    }
                }
            }
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                let required = schema.get("required").and_then(Value::as_array);
                let is_required = |n: &str| required.is_some_and(|r| r.iter().any(|x| x == n));
                for (name, sub) in props {
                    // An optional value may also come as null.
                    if map.get(name).is_some_and(Value::is_null) && !is_required(name) {
                        continue;
                    }
                    if let (Some(v), Some(sub)) = (map.get(name), sub.as_object()) {
                        let path = if at.is_empty() {
                            name.clone()
                        } else {
                            format!("{at}.{name}")
                        };
                        check(sub, v, &path)?;
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items").and_then(Value::as_object) {
                for (i, item) in items.iter().enumerate() {
                    check(sub, item, &format!("{at}[{i}]"))?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
