//! Media types as HTTP compares them: the type and subtype without their
//! parameters, case-insensitively (`Text/Event-Stream; charset=utf-8` is
//! `text/event-stream`).

use reqwest::header::{CONTENT_TYPE, HeaderMap};

/// Whether the `Content-Type` of `headers` is `expected` (a lowercase
/// `type/subtype`), whatever its case and parameters.
pub(crate) fn content_type_is(headers: &HeaderMap, expected: &str) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| media_type_is(v.as_bytes(), expected))
}

/// Whether the media type `value` (a header's bytes) is `expected`.
pub(crate) fn media_type_is(value: &[u8], expected: &str) -> bool {
    let essence = value.split(|&b| b == b';').next().unwrap_or_default();
    essence
        .trim_ascii()
        .eq_ignore_ascii_case(expected.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_and_parameters_do_not_matter() {
        for v in [
            "text/event-stream",
            "Text/Event-Stream",
            " TEXT/EVENT-STREAM ; charset=UTF-8",
        ] {
            assert!(media_type_is(v.as_bytes(), "text/event-stream"), "{v}");
        }
        for v in [
            "text/event-streams",
            "text/plain",
            "",
            "text/event-stream-x;a",
        ] {
            assert!(!media_type_is(v.as_bytes(), "text/event-stream"), "{v}");
        }
        assert!(media_type_is(
            b"Application/JSON; charset=utf-8",
            "application/json"
        ));
    }
}
