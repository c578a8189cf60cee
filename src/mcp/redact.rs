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
        // A `pcsk_` key as it is, percent-encoded (any of its bytes), in hex,
        // and in base64 (standard or URL-safe, padded or not, at any of the
        // three alignments inside a longer base64 text: the characters that
        // depend on `pcsk_` alone).
        rule(
            r"(?i:p|%70)(?i:c|%63)(?i:s|%73)(?i:k|%6b)(?:_|%5[fF])(?:[A-Za-z0-9_-]|%[0-9A-Fa-f]{2}){20,}",
            "***",
        ),
        rule(r"(?i)7063736b5f(?:[0-9a-f]{2}){20,}", "***"),
        rule(r"(?:cGNza1|Bjc2tf|wY3NrX)[A-Za-z0-9+/_-]{24,}={0,2}", "***"),
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
pub(super) fn redact(text: &str) -> String {
    let mut out = std::borrow::Cow::Borrowed(text);
    for rule in RULES.iter() {
        if rule.re.is_match(&out) {
            out = std::borrow::Cow::Owned(rule.re.replace_all(&out, rule.with).into_owned());
        }
    }
    out.into_owned()
}

/// Redacts `text` and also every occurrence of the given known secrets,
/// as they are and in the encodings an upstream may echo them in: base64
/// (standard and URL-safe, with or without padding, also inside a longer
/// base64 text), hex (either case), percent-encoding (every byte, either
/// case) and JSON string escaping.
pub(super) fn redact_with(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_owned();
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        for form in encodings(secret) {
            if form.len() >= 4 && out.contains(&form) {
                out = out.replace(&form, "***");
            }
        }
    }
    redact(&out)
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const BASE64_URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// `secret` and its encodings, longest first (so a form is replaced before
/// a shorter one inside it).
fn encodings(secret: &str) -> Vec<String> {
    let bytes = secret.as_bytes();
    let mut forms = vec![secret.to_owned()];
    if let Ok(quoted) = serde_json::to_string(secret) {
        forms.push(quoted.trim_matches('"').to_owned());
    }
    for alphabet in [BASE64, BASE64_URL] {
        forms.extend((0..3).map(|shift| base64_core(bytes, shift, alphabet)));
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    forms.push(hex.to_ascii_uppercase());
    forms.push(hex);
    let percent: String = bytes.iter().map(|b| format!("%{b:02X}")).collect();
    forms.push(percent.to_ascii_lowercase());
    forms.push(percent);
    forms.sort_by_key(|form| std::cmp::Reverse(form.len()));
    forms.dedup();
    forms
}

/// The base64 characters of `secret` placed `shift` bytes into an encoded
/// text that depend on its bytes alone: what any base64 text containing it
/// at that alignment contains, whatever surrounds it.
fn base64_core(secret: &[u8], shift: usize, alphabet: &[u8; 64]) -> String {
    let bytes: Vec<u8> = std::iter::repeat_n(0, shift)
        .chain(secret.iter().copied())
        .collect();
    let first = (8 * shift).div_ceil(6);
    let end = 8 * bytes.len() / 6;
    (first..end)
        .map(|i| {
            let (byte, offset) = (6 * i / 8, 6 * i % 8);
            let high = u16::from(bytes.get(byte).copied().unwrap_or(0));
            let low = u16::from(bytes.get(byte + 1).copied().unwrap_or(0));
            let value = (((high << 8) | low) >> (10 - offset)) & 0x3f;
            char::from(alphabet[usize::from(value)])
        })
        .collect()
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
    fn encoded_pcsk_keys_are_removed() {
        let key = "pcsk_ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789abcd";
        let b64 = "cGNza19BQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWl8wMTIzNDU2Nzg5YWJjZA==";
        // The same key inside longer base64 texts, at the other alignments.
        let shifted = "eHBjc2tfQUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVpfMDEyMzQ1Njc4OWFiY2Q=";
        let twice = "eHhwY3NrX0FCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaXzAxMjM0NTY3ODlhYmNk";
        let hex = "7063736b5f4142434445464748494a4b4c4d4e4f505152535455565758595a5f30313233343536373839616263";
        let percent = "pcsk%5FABCDEFGHIJKLMNOPQRSTUVWXYZ%5F0123456789abcd";
        for text in [b64, shifted, twice, hex, &hex.to_uppercase(), percent] {
            let out = redact(&format!("upstream said: {text} (end)"));
            assert!(out.contains("***"), "{out}");
            assert!(!out.contains("QUJDREVGR0hJSktMTU5PUFFS"), "{out}");
            assert!(!out.contains("4142434445464748"), "{out}");
            assert!(!out.contains("ABCDEFGHIJKLMNOP"), "{out}");
        }
        assert_eq!(redact(key), "***");
    }

    #[test]
    fn known_secrets_are_removed_in_every_encoding() {
        let secret = "hunter22-secret/key+value";
        let forms = [
            "aHVudGVyMjItc2VjcmV0L2tleSt2YWx1ZQ==",
            "aHVudGVyMjItc2VjcmV0L2tleSt2YWx1ZQ",
            "aHVudGVyMjItc2VjcmV0L2tleSt2YWx1ZQ",
            // "x" + secret, standard and URL-safe.
            "eGh1bnRlcjIyLXNlY3JldC9rZXkrdmFsdWU=",
            "eGh1bnRlcjIyLXNlY3JldC9rZXkrdmFsdWU",
            // "xy" + secret, URL-safe.
            "eHlodW50ZXIyMi1zZWNyZXQva2V5K3ZhbHVl",
            "68756e74657232322d7365637265742f6b65792b76616c7565",
            "68756E74657232322D7365637265742F6B65792B76616C7565",
            "%68%75%6E%74%65%72%32%32%2D%73%65%63%72%65%74%2F%6B%65%79%2B%76%61%6C%75%65",
            "%68%75%6e%74%65%72%32%32%2d%73%65%63%72%65%74%2f%6b%65%79%2b%76%61%6c%75%65",
        ];
        for form in forms {
            let out = redact_with(&format!("echo {form} end"), &[secret]);
            assert!(out.starts_with("echo ") && out.ends_with(" end"), "{out}");
            assert!(out.contains("***"), "{form} -> {out}");
            assert!(out.len() < form.len() / 2 + 20, "{form} -> {out}");
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
