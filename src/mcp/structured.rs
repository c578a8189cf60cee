//! Tool results serialized once.
//!
//! A successful result carries its output twice: as JSON text (the text
//! content) and as `structuredContent`. [`Structured`] writes the output's
//! JSON text straight from the typed value. Over stdio, where this server
//! writes each answer itself, the value is not built a second time as a
//! `serde_json::Value` tree: `structuredContent` holds a per-process
//! placeholder (an object, as rmcp keeps only object structured content for
//! older protocol revisions), and [`splice_structured`] puts the text in its place while
//! the answer is written, so both copies are the same bytes and the output
//! is walked once. Elsewhere (HTTP, in-process clients) `structuredContent`
//! is the value as a tree, as rmcp's `Json` makes it.

use std::sync::{Arc, OnceLock, Weak};

use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, Extensions, JsonRpcMessage,
    ServerJsonRpcMessage, ServerResult,
};
use serde::Serialize;
use serde_json::Value;

/// Marks a request whose transport writes `structuredContent` from the
/// text content (set by the stdio transport in the request's extensions).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WritesStructuredFromText;

tokio::task_local! {
    /// Set while a call runs whose answer is written by [`splice_structured`].
    static FROM_TEXT: ();
}

/// Whether the transport of the request with `extensions` writes
/// `structuredContent` from the text content.
pub(crate) fn writes_from_text(extensions: &Extensions) -> bool {
    extensions.get::<WritesStructuredFromText>().is_some()
}

/// Runs `call` so that its [`Structured`] results leave `structuredContent`
/// to the transport when `from_text`.
pub(crate) async fn scoped<F: Future>(from_text: bool, call: F) -> F::Output {
    if from_text {
        FROM_TEXT.scope((), call).await
    } else {
        call.await
    }
}

/// Field `key` of `result`'s structured content, read from its text when
/// the transport writes the structured content from the text.
pub(crate) fn structured_field<'a>(
    result: &'a CallToolResult,
    key: &str,
) -> Option<std::borrow::Cow<'a, Value>> {
    use std::borrow::Cow;
    match (&result.structured_content, result.content.as_slice()) {
        (Some(value), [ContentBlock::Text(text)]) if is_placeholder(value) => {
            // Parsed only when the key is there at all, and then only the
            // key's value is built: the rest is skipped.
            let quoted = format!("\"{key}\"");
            memchr::memmem::find(text.text.as_bytes(), quoted.as_bytes())?;
            field_of_text(&text.text, key).map(Cow::Owned)
        }
        (Some(value), _) => value.get(key).map(Cow::Borrowed),
        _ => None,
    }
}

/// Member `key` of the JSON object `text` (the last one, as a whole parse
/// keeps), with every other member skipped rather than built.
fn field_of_text(text: &str, key: &str) -> Option<Value> {
    use serde::Deserializer as _;
    use serde::de::{IgnoredAny, MapAccess, Visitor};

    /// Whether a map key is the one wanted.
    struct IsKey<'k>(&'k str);
    impl<'de> serde::de::DeserializeSeed<'de> for IsKey<'_> {
        type Value = bool;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_str(self)
        }
    }
    impl Visitor<'_> for IsKey<'_> {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a key")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
            Ok(v == self.0)
        }
    }

    /// The wanted member of an object.
    struct Member<'k>(&'k str);
    impl<'de> Visitor<'de> for Member<'_> {
        type Value = Option<Value>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(wanted) = map.next_key_seed(IsKey(self.0))? {
                if wanted {
                    found = Some(map.next_value::<Value>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }

    let mut de = serde_json::Deserializer::from_str(text);
    let found = (&mut de).deserialize_map(Member(key)).ok()?;
    de.end().ok()?;
    found
}

/// The key of the placeholder `structuredContent` (`{"<key>":true}`) of a
/// result whose structured content is its text: random per process, so no
/// data can imitate it.
fn placeholder() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| process_token("nexus-mcp:structured-content-is-text:"))
}

/// `prefix` followed by 32 random hex digits, made once per process by its
/// caller: a key no output text imitates. Without randomness the digits
/// come from the process id, still unlike any text the tools write (they
/// never write these prefixes).
fn process_token(prefix: &str) -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        let pid = std::process::id().to_le_bytes();
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = pid[i % pid.len()];
        }
    }
    let mut token = String::with_capacity(prefix.len() + 32);
    token.push_str(prefix);
    for b in bytes {
        use std::fmt::Write as _;
        let _ = write!(token, "{b:02x}");
    }
    token
}

/// A tool's output, returned as its JSON text and as `structuredContent`.
#[derive(Debug)]
pub(crate) struct Structured<T>(pub(crate) T);

/// A tool's output already written as its JSON text (or the error that
/// stopped writing it), returned like [`Structured`].
#[derive(Debug)]
pub(crate) struct StructuredText(pub(crate) serde_json::Result<String>);

fn encode_failure(e: serde_json::Error) -> rmcp::ErrorData {
    rmcp::ErrorData::internal_error(format!("Failed to serialize structured content: {e}"), None)
}

fn from_text() -> bool {
    FROM_TEXT.try_with(|_| ()).is_ok()
}

fn placeholder_value() -> Value {
    // Built once: a clone copies it without hashing its key again.
    static VALUE: OnceLock<Value> = OnceLock::new();
    VALUE
        .get_or_init(|| {
            let mut map = serde_json::Map::with_capacity(1);
            map.insert(placeholder().to_owned(), Value::Bool(true));
            Value::Object(map)
        })
        .clone()
}

fn text_result(text: String, structured: Value) -> CallToolResponse {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(structured);
    result.into()
}

impl<T: Serialize> IntoCallToolResult for Structured<T> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        let text = serde_json::to_string(&self.0).map_err(encode_failure)?;
        let structured = if from_text() {
            placeholder_value()
        } else {
            serde_json::to_value(&self.0).map_err(encode_failure)?
        };
        Ok(text_result(text, structured))
    }
}

impl IntoCallToolResult for StructuredText {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        let text = self.0.map_err(encode_failure)?;
        let structured = if from_text() {
            placeholder_value()
        } else {
            serde_json::from_str(&text).map_err(encode_failure)?
        };
        Ok(text_result(text, structured))
    }
}

/// The text content of `message` when it is a tool result whose
/// `structuredContent` is the placeholder.
fn placeholder_text(message: &mut ServerJsonRpcMessage) -> Option<&mut String> {
    let JsonRpcMessage::Response(response) = message else {
        return None;
    };
    let ServerResult::CallToolResult(result) = &mut response.result else {
        return None;
    };
    match (&result.structured_content, result.content.as_mut_slice()) {
        (Some(value), [ContentBlock::Text(text)]) if is_placeholder(value) => Some(&mut text.text),
        _ => None,
    }
}

/// Whether `value` is the placeholder `structuredContent`.
fn is_placeholder(value: &Value) -> bool {
    // Its one entry compared in place: no hashing of the long key.
    value.as_object().is_some_and(|map| {
        map.len() == 1
            && map
                .iter()
                .next()
                .is_some_and(|(k, v)| k == placeholder() && *v == Value::Bool(true))
    })
}

/// How the answer around a placeholder result is found.
struct Markers {
    /// The text that stands in for the text content while the rest of the
    /// answer is written.
    text: String,
    /// That text as serialized (quoted).
    quoted_text: memchr::memmem::Finder<'static>,
    /// The placeholder `structuredContent` as serialized.
    structured: memchr::memmem::Finder<'static>,
}

/// The markers, with their searchers built once.
fn markers() -> &'static Markers {
    static MARKERS: OnceLock<Markers> = OnceLock::new();
    MARKERS.get_or_init(|| {
        let key = placeholder();
        let text = format!("{key}:text");
        let quoted = format!("\"{text}\"");
        let structured = format!("{{\"{key}\":true}}");
        Markers {
            quoted_text: memchr::memmem::Finder::new(quoted.as_bytes()).into_owned(),
            structured: memchr::memmem::Finder::new(structured.as_bytes()).into_owned(),
            text,
        }
    })
}

/// A text suffix with its JSON escaping written ahead: a text content that
/// ends with it is escaped only up to it (see [`expect_suffix`]).
#[derive(Debug)]
pub(crate) struct EscapedSuffix {
    raw: Box<str>,
    escaped: Box<str>,
}

impl EscapedSuffix {
    /// `raw` with its escaping.
    ///
    /// # Errors
    /// `raw` does not serialize (never for a string).
    pub(crate) fn new(raw: String) -> serde_json::Result<Self> {
        let quoted = serde_json::to_string(&raw)?;
        let escaped = quoted
            .get(1..quoted.len().saturating_sub(1))
            .unwrap_or_default()
            .into();
        Ok(EscapedSuffix {
            raw: raw.into_boxed_str(),
            escaped,
        })
    }

    /// The suffix.
    pub(crate) fn raw(&self) -> &str {
        &self.raw
    }

    /// Bytes held: the suffix and its escaping.
    pub(crate) fn len(&self) -> usize {
        self.raw.len().saturating_add(self.escaped.len())
    }
}

/// The suffix most recently expected, held weakly: it lives as long as
/// its owner keeps it.
static EXPECTED_SUFFIX: std::sync::Mutex<Weak<EscapedSuffix>> = std::sync::Mutex::new(Weak::new());

/// Tells the writer that text contents will likely end with `suffix`: it
/// then escapes only what precedes it. Any text is still written exactly.
/// Only the latest suffix is remembered, and only while `suffix` lives.
pub(crate) fn expect_suffix(suffix: &Arc<EscapedSuffix>) {
    if let Ok(mut slot) = EXPECTED_SUFFIX.lock()
        && !std::ptr::eq(slot.as_ptr(), Arc::as_ptr(suffix))
    {
        *slot = Arc::downgrade(suffix);
    }
}

/// The longest string [`write_string`] escapes itself; longer ones go
/// through serde_json.
const SHORT_STRING: usize = 256;

/// What each byte is written as inside a JSON string: `0` as itself, `u`
/// as `\u00xx`, any other as a backslash and that byte.
static ESCAPES: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = b'u';
        b += 1;
    }
    table[0x08] = b'b';
    table[0x0c] = b'f';
    table[b'\n' as usize] = b'n';
    table[b'\r' as usize] = b'r';
    table[b'\t' as usize] = b't';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// Writes `text` as a JSON string, escaped exactly as serde_json escapes
/// it (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u00xx` for other
/// control characters; everything else as it is): runs of plain bytes are
/// copied whole.
fn write_string(text: &str, out: &mut Vec<u8>) -> serde_json::Result<()> {
    if text.len() > SHORT_STRING {
        return serde_json::to_writer(out, text);
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = text.as_bytes();
    // Room for the longest escaping (`\u00xx`, six bytes a byte) and quotes.
    out.reserve(bytes.len().saturating_mul(6).saturating_add(2));
    out.push(b'"');
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape = ESCAPES[usize::from(b)];
        if escape == 0 {
            continue;
        }
        out.extend_from_slice(bytes.get(run..i).unwrap_or_default());
        run = i + 1;
        if escape == b'u' {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', escape]);
        }
    }
    out.extend_from_slice(bytes.get(run..).unwrap_or_default());
    out.push(b'"');
    Ok(())
}

/// Writes `text` as a JSON string.
fn write_escaped(text: &str, out: &mut Vec<u8>) -> serde_json::Result<()> {
    let expected = EXPECTED_SUFFIX.lock().ok().and_then(|slot| slot.upgrade());
    if let Some(suffix) = expected
        && let Some(head) = text.strip_suffix(&*suffix.raw)
    {
        write_string(head, out)?;
        out.pop();
        out.extend_from_slice(suffix.escaped.as_bytes());
        out.push(b'"');
        return Ok(());
    }
    write_string(text, out)
}

/// Writes `message` into `out` when it is a tool result with the
/// placeholder `structuredContent` and only the fields written here: the
/// envelope as rmcp's types serialize it (the same bytes; see the tests),
/// the text escaped once and copied once as the structured content.
/// `false`, with nothing written, for any other message.
fn write_tool_answer(
    message: &ServerJsonRpcMessage,
    out: &mut Vec<u8>,
) -> serde_json::Result<bool> {
    let JsonRpcMessage::Response(response) = message else {
        return Ok(false);
    };
    let ServerResult::CallToolResult(result) = &response.result else {
        return Ok(false);
    };
    let (Some(structured), [ContentBlock::Text(text)]) =
        (&result.structured_content, result.content.as_slice())
    else {
        return Ok(false);
    };
    if result.meta.is_some()
        || text.meta.is_some()
        || text.annotations.is_some()
        || !is_placeholder(structured)
    {
        return Ok(false);
    }
    let text = text.text.as_str();
    out.reserve(text.len().saturating_mul(2).saturating_add(128));
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    serde_json::to_writer(&mut *out, &response.id)?;
    out.extend_from_slice(b",\"result\":{");
    if let Some(kind) = &result.result_type {
        out.extend_from_slice(b"\"resultType\":");
        serde_json::to_writer(&mut *out, kind)?;
        out.push(b',');
    }
    out.extend_from_slice(b"\"content\":[{\"type\":\"text\",\"text\":");
    write_escaped(text, out)?;
    out.extend_from_slice(b"}],\"structuredContent\":");
    out.extend_from_slice(text.as_bytes());
    match result.is_error {
        Some(true) => out.extend_from_slice(b",\"isError\":true"),
        Some(false) => out.extend_from_slice(b",\"isError\":false"),
        None => {}
    }
    out.extend_from_slice(b"}}");
    Ok(true)
}

/// Serializes `message` into `out`, writing a placeholder
/// `structuredContent` as the result's text, unescaped.
///
/// # Errors
/// The message does not serialize.
pub(crate) fn splice_structured(
    mut message: ServerJsonRpcMessage,
    out: &mut Vec<u8>,
) -> serde_json::Result<()> {
    if write_tool_answer(&message, out)? {
        return Ok(());
    }
    let markers = markers();
    let Some(slot) = placeholder_text(&mut message) else {
        return serde_json::to_writer(out, &message);
    };
    // The answer is written around the text: with a marker in its place,
    // it is a short envelope in which both markers are found quickly.
    let text = std::mem::replace(slot, markers.text.clone());
    let mut envelope = Vec::with_capacity(256);
    serde_json::to_writer(&mut envelope, &message)?;
    let at_text = markers.quoted_text.find(&envelope);
    let at_structured = markers.structured.find(&envelope);
    let (Some(at_text), Some(at_structured)) = (at_text, at_structured) else {
        // Not written as expected: the text goes back in, escaped in place,
        // and the structured content stays the placeholder.
        if let Some(slot) = placeholder_text(&mut message) {
            *slot = text;
        }
        return serde_json::to_writer(out, &message);
    };
    out.reserve(envelope.len() + text.len().saturating_mul(2));
    let mut rest = 0;
    let mut pieces = [
        (at_text, markers.quoted_text.needle().len(), true),
        (at_structured, markers.structured.needle().len(), false),
    ];
    pieces.sort_unstable_by_key(|p| p.0);
    for (at, len, escaped) in pieces {
        out.extend_from_slice(envelope.get(rest..at).unwrap_or_default());
        if escaped {
            write_escaped(&text, out)?;
        } else {
            out.extend_from_slice(text.as_bytes());
        }
        rest = at + len;
    }
    out.extend_from_slice(envelope.get(rest..).unwrap_or_default());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{JsonRpcResponse, JsonRpcVersion2_0, RequestId};

    #[derive(Serialize)]
    struct Output {
        name: &'static str,
        count: u64,
        quote: &'static str,
    }

    fn message(result: CallToolResponse) -> ServerJsonRpcMessage {
        let CallToolResponse::Complete(result) = result else {
            panic!("a complete result");
        };
        JsonRpcMessage::Response(JsonRpcResponse {
            jsonrpc: JsonRpcVersion2_0,
            id: RequestId::Number(7),
            result: ServerResult::CallToolResult(result),
        })
    }

    fn output() -> Output {
        Output {
            name: "ns",
            count: 3,
            quote: "a \"quoted\" nexus-mcp:structured-content-is-text: word",
        }
    }

    #[tokio::test]
    async fn the_spliced_answer_is_the_answer_with_the_value_tree() {
        let with_tree = Structured(output()).into_call_tool_result().unwrap();
        let mut expected = Vec::new();
        splice_structured(message(with_tree), &mut expected).unwrap();
        let from_text = FROM_TEXT
            .scope((), async { Structured(output()).into_call_tool_result() })
            .await
            .unwrap();
        let mut spliced = b"earlier bytes".to_vec();
        splice_structured(message(from_text), &mut spliced).unwrap();
        assert_eq!(&spliced[..13], b"earlier bytes");
        assert_eq!(
            std::str::from_utf8(&spliced[13..]).unwrap(),
            std::str::from_utf8(&expected).unwrap()
        );
        let value: Value = serde_json::from_slice(&spliced[13..]).unwrap();
        assert_eq!(value["result"]["structuredContent"]["count"], 3);
    }

    /// `result` answered to request `id`, with its type discriminator,
    /// error flag and text annotations set as given.
    fn variant(
        result: CallToolResponse,
        id: RequestId,
        kind: Option<rmcp::model::ResultType>,
        is_error: Option<bool>,
        annotated: bool,
    ) -> ServerJsonRpcMessage {
        let mut message = message(result);
        if let JsonRpcMessage::Response(response) = &mut message {
            response.id = id;
            if let ServerResult::CallToolResult(result) = &mut response.result {
                result.result_type = kind;
                result.is_error = is_error;
                if annotated && let [ContentBlock::Text(text)] = result.content.as_mut_slice() {
                    text.annotations = Some(rmcp::model::Annotations::default());
                }
            }
        }
        message
    }

    #[tokio::test]
    async fn every_envelope_is_written_as_rmcp_writes_it() {
        let ids = [
            RequestId::Number(0),
            RequestId::Number(-12),
            RequestId::String("a \"quoted\" id".into()),
        ];
        let kinds = [None, Some(rmcp::model::ResultType::COMPLETE)];
        for id in ids {
            for kind in &kinds {
                for is_error in [None, Some(false), Some(true)] {
                    for annotated in [false, true] {
                        let with_tree = Structured(output()).into_call_tool_result().unwrap();
                        let tree =
                            variant(with_tree, id.clone(), kind.clone(), is_error, annotated);
                        let expected = serde_json::to_string(&tree).unwrap();
                        let from_text = FROM_TEXT
                            .scope((), async { Structured(output()).into_call_tool_result() })
                            .await
                            .unwrap();
                        let placed =
                            variant(from_text, id.clone(), kind.clone(), is_error, annotated);
                        let mut spliced = Vec::new();
                        splice_structured(placed, &mut spliced).unwrap();
                        assert_eq!(
                            std::str::from_utf8(&spliced).unwrap(),
                            expected,
                            "{id:?} {kind:?} {is_error:?} {annotated}"
                        );
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn a_text_ending_with_the_expected_suffix_is_written_the_same() {
        let with_tree = Structured(output()).into_call_tool_result().unwrap();
        let mut expected = Vec::new();
        splice_structured(message(with_tree), &mut expected).unwrap();
        let text = serde_json::to_string(&output()).unwrap();
        let at = text.find("\"quote\"").unwrap();
        for suffix in [&text[at..], &text[..], "}", "not a suffix \"\n"] {
            let kept = Arc::new(EscapedSuffix::new(suffix.to_owned()).unwrap());
            expect_suffix(&kept);
            let from_text = FROM_TEXT
                .scope((), async { Structured(output()).into_call_tool_result() })
                .await
                .unwrap();
            let mut spliced = Vec::new();
            splice_structured(message(from_text), &mut spliced).unwrap();
            assert_eq!(
                std::str::from_utf8(&spliced).unwrap(),
                std::str::from_utf8(&expected).unwrap(),
                "suffix {suffix:?}"
            );
        }
    }

    #[test]
    fn a_member_read_from_text_is_the_member_of_the_whole_parse() {
        for text in [
            r#"{"a":1,"experimental":{"x":[1,{"y":"z"}]},"b":"\"experimental\""}"#,
            r#"{"experimental":1,"experimental":{"last":true}}"#,
            r#"{"exp\u0065rimental":"escaped key","n":null}"#,
            r#"{"other":{"experimental":"nested only"}}"#,
            r#"{"experimental":null}"#,
            r#"[1,2]"#,
            r#"{"experimental":1} trailing"#,
            "not json",
        ] {
            let whole: Option<Value> = serde_json::from_str::<Value>(text)
                .ok()
                .and_then(|v| v.get("experimental").cloned());
            assert_eq!(field_of_text(text, "experimental"), whole, "{text}");
        }
    }

    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        let mut every_ascii: String = (0u8..0x80).map(char::from).collect();
        every_ascii.push_str("é \u{2028} \u{1F600} \u{7f}");
        let long = every_ascii.repeat(4);
        for text in [
            "",
            "plain",
            "a \"b\" \\ c",
            every_ascii.as_str(),
            long.as_str(),
        ] {
            for cut in [0, 1, 7, text.len()] {
                let Some(text) = text.get(..cut.min(text.len())).or(Some(text)) else {
                    continue;
                };
                let mut out = Vec::new();
                write_string(text, &mut out).unwrap();
                assert_eq!(
                    std::str::from_utf8(&out).unwrap(),
                    serde_json::to_string(text).unwrap(),
                    "{text:?}"
                );
            }
            let mut out = b"kept".to_vec();
            write_string(text, &mut out).unwrap();
            assert_eq!(out[4..], *serde_json::to_string(text).unwrap().as_bytes());
        }
    }

    #[tokio::test]
    async fn outside_a_scope_the_structured_content_is_a_tree() {
        let CallToolResponse::Complete(result) =
            Structured(output()).into_call_tool_result().unwrap()
        else {
            panic!("a complete result");
        };
        assert_eq!(result.structured_content.unwrap()["name"], "ns");
    }
}
