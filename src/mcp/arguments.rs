//! The one way a tool reads its arguments: into a `Deserialize` struct
//! (whose `JsonSchema` is the advertised `inputSchema`), every problem a
//! `VALIDATION` [`ToolError`] naming the field and the JSON type to send.

use rmcp::model::JsonObject;
use serde::de::DeserializeOwned;

use crate::mcp::tool_error::ToolError;

/// `args` read as `T`, or a `VALIDATION` error naming the field (its path,
/// `records.1` for an array item) and saying, in JSON's words, what was
/// sent and what was expected. Read in place: the arguments are not copied.
pub(crate) fn parse<T: DeserializeOwned>(args: &JsonObject) -> Result<T, ToolError> {
    serde_path_to_error::deserialize::<_, T>(args).map_err(|e| {
        let path = e.path().to_string();
        let cause = json_type_names(&e.into_inner().to_string());
        let field = if path == "." {
            cause
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split('`').next())
                .unwrap_or("arguments")
                .to_owned()
        } else {
            path.replace('[', ".").replace(']', "")
        };
        ToolError::validation(
            field.clone(),
            format!("Invalid argument \"{field}\": {cause}"),
        )
    })
}

/// `cause` (a deserializer's message) with its Rust type names put as the
/// JSON types a caller sends: "expected integer", not "expected i64".
fn json_type_names(cause: &str) -> String {
    const NAMES: &[(&str, &str)] = &[
        ("floating point", "number"),
        ("unit value", "null"),
        ("a JSON number", "number"),
        ("a sequence", "array"),
        ("sequence", "array"),
        ("a boolean", "boolean"),
        ("a string", "string"),
        ("a map", "object"),
        ("map", "object"),
        ("f32", "number"),
        ("f64", "number"),
    ];
    const INTEGERS: &[&str] = &[
        "i8", "i16", "i32", "i64", "i128", "isize", "u8", "u16", "u32", "u64", "u128", "usize",
    ];
    let mut out = String::with_capacity(cause.len());
    let mut rest = cause;
    // The type names follow "invalid type: " and "expected ".
    while let Some(at) = ["invalid type: ", "expected "]
        .iter()
        .filter_map(|lead| rest.find(lead).map(|i| i + lead.len()))
        .min()
    {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let word_end = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        if INTEGERS.contains(&&rest[..word_end]) {
            out.push_str("integer");
            rest = &rest[word_end..];
        } else if let Some((name, json)) = NAMES.iter().find(|(name, _)| {
            rest.strip_prefix(name)
                .is_some_and(|after| !after.starts_with(|c: char| c.is_ascii_alphanumeric()))
        }) {
            out.push_str(json);
            rest = &rest[name.len()..];
        } else if let Some(after) = rest.strip_prefix("struct ") {
            out.push_str("object");
            let end = after
                .find(|c: char| !c.is_ascii_alphanumeric())
                .unwrap_or(after.len());
            rest = &after[end..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)] // Only read to see it fail.
    struct Args {
        text: String,
        top_k: Option<i64>,
        fields: Option<Vec<String>>,
        filter: Option<serde_json::Map<String, serde_json::Value>>,
    }

    #[test]
    fn arguments_read_in_place_fail_as_a_copy_of_them_fails() {
        let bad = [
            serde_json::json!({"text": 3}),
            serde_json::json!({}),
            serde_json::json!({"text": "q", "top_k": "ten"}),
            serde_json::json!({"text": "q", "fields": [1, "a"]}),
            serde_json::json!({"text": "q", "filter": 7}),
        ];
        for args in bad {
            let args = args.as_object().cloned().unwrap_or_default();
            let copied = serde_path_to_error::deserialize::<_, Args>(serde_json::Value::Object(
                args.clone(),
            ))
            .map(|_| ())
            .map_err(|e| (e.path().to_string(), e.into_inner().to_string()));
            let in_place = serde_path_to_error::deserialize::<_, Args>(&args)
                .map(|_| ())
                .map_err(|e| (e.path().to_string(), e.into_inner().to_string()));
            assert_eq!(in_place, copied, "{args:?}");
            assert!(copied.is_err(), "{args:?}");
            let checked = parse::<Args>(&args).expect_err("a bad argument");
            assert_eq!(checked.code, crate::mcp::ToolErrorCode::Validation);
        }
    }

    #[test]
    fn errors_name_the_field_and_its_json_type() {
        let args = serde_json::json!({"text": "q", "fields": ["a", 1]});
        let e = parse::<Args>(args.as_object().expect("an object")).expect_err("bad");
        assert_eq!(e.field.as_deref(), Some("fields.1"));
        assert_eq!(
            e.message,
            "Invalid argument \"fields.1\": invalid type: integer `1`, expected string"
        );
        let e = parse::<Args>(&JsonObject::new()).expect_err("missing");
        assert_eq!(e.field.as_deref(), Some("text"));
    }

    #[test]
    fn argument_errors_name_json_types() {
        for (cause, shown) in [
            (
                "invalid type: string \"ten\", expected i64",
                "invalid type: string \"ten\", expected integer",
            ),
            (
                "invalid type: floating point `1.5`, expected u32",
                "invalid type: number `1.5`, expected integer",
            ),
            (
                "invalid type: sequence, expected a string",
                "invalid type: array, expected string",
            ),
            (
                "invalid type: map, expected a boolean",
                "invalid type: object, expected boolean",
            ),
            (
                "invalid type: integer `7`, expected struct MetadataFilter",
                "invalid type: integer `7`, expected object",
            ),
            (
                "invalid type: unit value, expected f64",
                "invalid type: null, expected number",
            ),
            (
                "invalid type: string \"5\", expected a JSON number",
                "invalid type: string \"5\", expected number",
            ),
            ("missing field `namespace`", "missing field `namespace`"),
            (
                "unknown variant `fastest`, expected one of `fast`",
                "unknown variant `fastest`, expected one of `fast`",
            ),
        ] {
            assert_eq!(json_type_names(cause), shown, "{cause}");
        }
    }
}
