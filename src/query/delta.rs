//! The `delta` of a `response.output_text.delta` frame, read without
//! building any JSON value: the data is scanned once, every member's string
//! borrowed in place, and the delta copied (and unescaped) into the one
//! `String` the event keeps.
//!
//! Only the plain shape is read here: an object whose members are all
//! strings, with simple escapes. Anything else (another value type, a
//! `\u` escape, invalid JSON) is left to the general decoder, so both give
//! the same answer for every input.

/// The `delta` member of `data`, or `None` when `data` is not an object of
/// string members with exactly one `delta` (or uses what this reader leaves
/// to the general decoder).
pub(crate) fn text_delta(data: &str) -> Option<String> {
    let bytes = data.as_bytes();
    let mut at = skip_space(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_space(bytes, at + 1);
    let mut delta = None;
    if bytes.get(at) == Some(&b'}') {
        return None;
    }
    loop {
        let (key, after_key) = string(bytes, at)?;
        at = skip_space(bytes, after_key);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_space(bytes, at + 1);
        let (value, after_value) = string(bytes, at)?;
        if key == b"delta" {
            if delta.is_some() {
                // A duplicate member: the general decoder refuses it.
                return None;
            }
            delta = Some(unescape(value)?);
        }
        at = skip_space(bytes, after_value);
        match bytes.get(at) {
            Some(b',') => at = skip_space(bytes, at + 1),
            Some(b'}') => break,
            _ => return None,
        }
    }
    (skip_space(bytes, at + 1) == bytes.len()).then_some(())?;
    delta
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = bytes.get(at) {
        at += 1;
    }
    at
}

/// The raw (still escaped) contents of the JSON string starting at `at`,
/// and the position after its closing quote.
fn string(bytes: &[u8], at: usize) -> Option<(&[u8], usize)> {
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let start = at + 1;
    let mut i = start;
    loop {
        let rest = bytes.get(i..)?;
        let found = memchr::memchr2(b'"', b'\\', rest)?;
        i += found;
        if bytes[i] == b'"' {
            let raw = &bytes[start..i];
            // Control characters must be escaped in JSON.
            if raw.iter().any(|b| *b < 0x20) {
                return None;
            }
            return Some((raw, i + 1));
        }
        // A backslash: skip it and the character it escapes.
        i += 2;
    }
}

/// `raw` unescaped; `None` for `\u` escapes and invalid ones (left to the
/// general decoder).
fn unescape(raw: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(i) = memchr::memchr(b'\\', rest) {
        out.extend_from_slice(&rest[..i]);
        let unescaped = match rest.get(i + 1)? {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            _ => return None,
        };
        out.push(unescaped);
        rest = &rest[i + 2..];
    }
    out.extend_from_slice(rest);
    // The input is a `str` and escapes only add ASCII: still UTF-8.
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::borrow::Cow;

    #[derive(serde::Deserialize)]
    struct Wire<'a> {
        #[serde(borrow)]
        delta: Cow<'a, str>,
    }

    fn general(data: &str) -> Option<String> {
        serde_json::from_str::<Wire<'_>>(data)
            .ok()
            .map(|w| w.delta.into_owned())
    }

    /// This reader either leaves `data` to the general decoder or agrees
    /// with it.
    fn agrees(data: &str) {
        if let Some(fast) = text_delta(data) {
            assert_eq!(Some(fast), general(data), "{data:?}");
        }
    }

    #[test]
    fn the_plain_shape_is_read_here() {
        let data =
            r#"{"type":"response.output_text.delta","query_id":"q_1","delta":"h\u00e9 \"x\"\n"}"#;
        // `\u` is left to the general decoder.
        assert_eq!(text_delta(data), None);
        for (data, delta) in [
            (
                r#"{"type":"response.output_text.delta","query_id":"q_1","delta":"für \"x\"\\n\/"}"#,
                "für \"x\"\\n/",
            ),
            (r#" { "delta" : "a\tb" , "k" : "" } "#, "a\tb"),
            (r#"{"delta":""}"#, ""),
        ] {
            assert_eq!(text_delta(data).as_deref(), Some(delta), "{data}");
            agrees(data);
        }
    }

    #[test]
    fn other_shapes_are_left_to_the_general_decoder() {
        for data in [
            r#"{"delta":5}"#,
            r#"{"delta":"a","new":[1]}"#,
            r#"{"delta":"a","delta":"b"}"#,
            r#"{"delta":"a",}"#,
            r#"{"delta":"a"} x"#,
            r#"{"delta":"a\x"}"#,
            "{\"delta\":\"a\nb\"}",
            r#"{"type":"x"}"#,
            r#"{}"#,
            r#"["delta"]"#,
            r#"{"delta":"a""#,
            r#"{"delta":"a\"#,
        ] {
            assert_eq!(text_delta(data), None, "{data}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(1024)
        ))]

        /// Objects built of JSON-ish pieces, valid or not: this reader
        /// never disagrees with the general decoder.
        #[test]
        fn never_disagrees_with_the_general_decoder(
            pieces in proptest::collection::vec(prop_oneof![
                Just("{".to_owned()), Just("}".to_owned()), Just(",".to_owned()),
                Just(":".to_owned()), Just(" ".to_owned()), Just("\"delta\"".to_owned()),
                Just("\"type\"".to_owned()), Just("5".to_owned()), Just("[1]".to_owned()),
                "\"[a-z \\\\\"/nt\\u{e9}\\u{1}]{0,6}\"",
                "\\PC{0,4}",
            ], 0..12),
            text in "[a-z \\u{e9}\\u{1f600}\"\\\\\n\t/]{0,12}",
        ) {
            agrees(&pieces.concat());
            let data = format!(
                "{{\"type\":\"response.output_text.delta\",\"delta\":{}}}",
                serde_json::to_string(&text).unwrap()
            );
            prop_assert_eq!(text_delta(&data), Some(text));
        }
    }
}
