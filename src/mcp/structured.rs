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

use std::sync::OnceLock;

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
            // Parsed only when the key is there at all.
            let quoted = format!("\"{key}\"");
            memchr::memmem::find(text.text.as_bytes(), quoted.as_bytes())?;
            let mut value: Value = serde_json::from_str(&text.text).ok()?;
            value.get_mut(key).map(|v| Cow::Owned(v.take()))
        }
        (Some(value), _) => value.get(key).map(Cow::Borrowed),
        _ => None,
    }
}

/// The key of the placeholder `structuredContent` (`{"<key>":true}`) of a
/// result whose structured content is its text: random per process, so no
/// data can imitate it.
fn placeholder() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let mut bytes = [0u8; 16];
        if getrandom::fill(&mut bytes).is_err() {
            // Without randomness the token is still unlike any output text
            // the tools write (they never write this prefix).
            let pid = std::process::id().to_le_bytes();
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = pid[i % pid.len()];
            }
        }
        let mut token = String::from("nexus-mcp:structured-content-is-text:");
        for b in bytes {
            use std::fmt::Write as _;
            let _ = write!(token, "{b:02x}");
        }
        token
    })
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
    let mut map = serde_json::Map::with_capacity(1);
    map.insert(placeholder().to_owned(), Value::Bool(true));
    Value::Object(map)
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

/// The text of `message` when it is a tool result whose `structuredContent`
/// is the placeholder: the bytes that belong in its place.
fn text_for_placeholder(message: &ServerJsonRpcMessage) -> Option<&str> {
    let JsonRpcMessage::Response(response) = message else {
        return None;
    };
    let ServerResult::CallToolResult(result) = &response.result else {
        return None;
    };
    match (&result.structured_content, result.content.as_slice()) {
        (Some(value), [ContentBlock::Text(text)]) if is_placeholder(value) => Some(&text.text),
        _ => None,
    }
}

/// Whether `value` is the placeholder `structuredContent`.
fn is_placeholder(value: &Value) -> bool {
    value
        .as_object()
        .is_some_and(|map| map.len() == 1 && map.get(placeholder()) == Some(&Value::Bool(true)))
}

/// Serializes `message` into `out`, writing a placeholder
/// `structuredContent` as the result's text, unescaped.
///
/// # Errors
/// The message does not serialize.
pub(crate) fn splice_structured(
    message: &ServerJsonRpcMessage,
    out: &mut Vec<u8>,
) -> serde_json::Result<()> {
    let start = out.len();
    serde_json::to_writer(&mut *out, message)?;
    let Some(text) = text_for_placeholder(message) else {
        return Ok(());
    };
    // The placeholder as serialized: `{"<key>":true}`. In the escaped text
    // content a quote is always `\"`, so it appears once, after the text
    // content.
    let key = placeholder();
    let mut quoted = Vec::with_capacity(key.len() + 9);
    quoted.extend_from_slice(b"{\"");
    quoted.extend_from_slice(key.as_bytes());
    quoted.extend_from_slice(b"\":true}");
    if let Some(at) = memchr::memmem::rfind(&out[start..], &quoted) {
        let at = start + at;
        // What follows the placeholder is a few bytes (`isError`, the
        // closing braces): copied aside, not shifted byte by byte.
        let tail = out.split_off(at + quoted.len());
        out.truncate(at);
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(&tail);
    }
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
        splice_structured(&message(with_tree), &mut expected).unwrap();
        let from_text = FROM_TEXT
            .scope((), async { Structured(output()).into_call_tool_result() })
            .await
            .unwrap();
        let mut spliced = b"earlier bytes".to_vec();
        splice_structured(&message(from_text), &mut spliced).unwrap();
        assert_eq!(&spliced[..13], b"earlier bytes");
        assert_eq!(
            std::str::from_utf8(&spliced[13..]).unwrap(),
            std::str::from_utf8(&expected).unwrap()
        );
        let value: Value = serde_json::from_slice(&spliced[13..]).unwrap();
        assert_eq!(value["result"]["structuredContent"]["count"], 3);
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
