//! Credential redaction for everything the MCP server returns or logs.

use std::sync::LazyLock;

use regex::Regex;

struct Rule {
    re: Regex,
    /// Replacement; `$1` keeps the label in front of the secret.
    with: &'static str,
}

static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    let rule = |pattern: &str, with| Rule {
        // The patterns are constants; a failure here is a programming error
        // caught by the unit tests below.
        re: Regex::new(pattern).unwrap_or_else(|e| panic!("redaction pattern {pattern}: {e}")),
        with,
    };
    vec![
        // Legacy Pinecone keys are UUIDs.
        rule(
            r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
            "***",
        ),
        rule(r"pcsk_[A-Za-z0-9_-]{20,}", "***"),
        // A labelled key needs `:` or `=` after the label: in "api key is
        // invalid" the next word is prose, not a secret.
        rule(
            r#"(?i)(api[_\s-]?key["']?\s*[:=]\s*["']?)([^\s"',}]+)"#,
            "${1}***",
        ),
        rule(r#"(?i)(authorization:\s*bearer\s+)([^\s"',}]+)"#, "${1}***"),
        rule(r#"(?i)(bearer\s+)([A-Za-z0-9._~+/=-]{8,})"#, "${1}***"),
    ]
});

/// Replaces API keys and bearer tokens in `text` with `***`.
///
/// ```
/// use nexus_knowql::mcp::redact::redact;
/// let s = redact("call failed: api_key=pcsk_abcdefghijklmnopqrstuvwxyz0123456789 header Authorization: Bearer abc.def.ghi");
/// assert!(!s.contains("pcsk_abc"));
/// assert!(!s.contains("abc.def.ghi"));
/// ```
pub fn redact(text: &str) -> String {
    let mut out = std::borrow::Cow::Borrowed(text);
    for rule in RULES.iter() {
        if rule.re.is_match(&out) {
            out = std::borrow::Cow::Owned(rule.re.replace_all(&out, rule.with).into_owned());
        }
    }
    out.into_owned()
}

/// Redacts `text` and also every occurrence of the given known secrets.
pub fn redact_with(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_owned();
    for s in secrets.iter().filter(|s| s.len() >= 4) {
        out = out.replace(*s, "***");
    }
    redact(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_every_shape() {
        let cases = [
            (
                "key 123e4567-e89b-12d3-a456-426614174000 end",
                "key *** end",
            ),
            ("pcsk_ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789abcd", "***"),
            ("apiKey: sekrit123", "apiKey: ***"),
            ("{\"api_key\":\"sekrit\"}", "{\"api_key\":\"***\"}"),
            (
                "Authorization: Bearer tok.en.value",
                "Authorization: Bearer ***",
            ),
            ("nothing to see", "nothing to see"),
            ("api key=sekrit", "api key=***"),
            ("Api-Key: sekrit", "Api-Key: ***"),
            (
                "Invalid API key provided, check the api-key header",
                "Invalid API key provided, check the api-key header",
            ),
            ("your apiKey is wrong", "your apiKey is wrong"),
        ];
        for (input, want) in cases {
            assert_eq!(redact(input), want, "{input}");
        }
    }

    #[test]
    fn known_secrets_are_removed() {
        assert_eq!(
            redact_with("the key was hunter22!", &["hunter22!"]),
            "the key was ***"
        );
    }
}
