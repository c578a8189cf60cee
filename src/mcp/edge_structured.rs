//! Structured content written where the answer is written.
//!
//! Over HTTP, rmcp serializes each answer itself. A Nexus tool result that
//! would carry its output twice (the text content and `structuredContent`)
//! builds no `serde_json::Value` tree for the second copy when the request
//! carries an [`EdgeSlot`] (the HTTP guard adds one to a stateless
//! `tools/call`): the tool keeps the output's JSON text in the slot and sets
//! `structuredContent` to a placeholder; the guard then writes that text in
//! the placeholder's place in the answer's bytes ([`splice`]). The bytes
//! that go out are those the tree would have been written as.

use std::sync::{Arc, OnceLock};

use serde_json::Value;

/// Where a tool keeps the JSON text of its `structuredContent` for the
/// transport to write; carried in the HTTP request's extensions.
#[derive(Debug, Clone, Default)]
pub(crate) struct EdgeSlot(Arc<OnceLock<String>>);

impl EdgeSlot {
    /// The slot of the request whose extensions are `extensions`, if its
    /// transport writes structured content from one.
    pub(crate) fn of(extensions: &rmcp::model::Extensions) -> Option<&EdgeSlot> {
        extensions
            .get::<http::request::Parts>()?
            .extensions
            .get::<EdgeSlot>()
    }

    /// Keeps `json` (one JSON object's text) and returns the placeholder
    /// `structuredContent` standing for it; gives `json` back when the slot
    /// already holds a text (then the caller keeps it as a tree).
    pub(crate) fn hold(&self, json: String) -> Result<Value, String> {
        self.0.set(json)?;
        let mut map = serde_json::Map::with_capacity(1);
        map.insert(token().to_owned(), Value::Bool(true));
        Ok(Value::Object(map))
    }

    /// The text held, if any.
    pub(crate) fn held(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }
}

/// The placeholder's key: random per process, so no data can imitate it.
fn token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| super::structured::process_token("nexus-mcp:structured-content-at-edge:"))
}

/// The placeholder as serialized, with its searcher built once.
fn marker() -> &'static memchr::memmem::Finder<'static> {
    static MARKER: OnceLock<memchr::memmem::Finder<'static>> = OnceLock::new();
    MARKER.get_or_init(|| {
        let serialized = format!("{{\"{}\":true}}", token());
        memchr::memmem::Finder::new(serialized.as_bytes()).into_owned()
    })
}

/// `bytes` with the one placeholder in it replaced by `json`; `None` when
/// `bytes` holds no placeholder.
pub(crate) fn splice(bytes: &[u8], json: &str) -> Option<Vec<u8>> {
    let marker = marker();
    let at = marker.find(bytes)?;
    let end = at.checked_add(marker.needle().len())?;
    let (head, tail) = (bytes.get(..at)?, bytes.get(end..)?);
    let mut out = Vec::with_capacity(head.len() + json.len() + tail.len());
    out.extend_from_slice(head);
    out.extend_from_slice(json.as_bytes());
    out.extend_from_slice(tail);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_spliced_bytes_are_those_of_the_tree() {
        let output = json!({"contexts": [{"slug": "a \"quoted\" {}", "n": 1.5, "x": null}]});
        let json = serde_json::to_string(&output).unwrap();
        let slot = EdgeSlot::default();
        let placeholder = slot.hold(json.clone()).unwrap();
        let answer = |structured: &Value| {
            serde_json::to_vec(&json!({
                "jsonrpc": "2.0", "id": 3,
                "result": {"content": [{"type": "text", "text": json}], "structuredContent": structured}
            }))
            .unwrap()
        };
        let spliced = splice(&answer(&placeholder), slot.held().unwrap()).unwrap();
        assert_eq!(
            String::from_utf8(spliced).unwrap(),
            String::from_utf8(answer(&output)).unwrap()
        );
    }

    #[test]
    fn a_slot_holds_one_text_and_bytes_without_a_placeholder_stay() {
        let slot = EdgeSlot::default();
        assert!(slot.held().is_none());
        assert!(slot.hold("{}".to_owned()).is_ok());
        assert_eq!(
            slot.hold("{\"b\":1}".to_owned()),
            Err("{\"b\":1}".to_owned())
        );
        assert_eq!(slot.held(), Some("{}"));
        assert_eq!(splice(b"{\"structuredContent\":{}}", "{}"), None);
        // Only the process's own token marks a placeholder.
        let other = b"{\"nexus-mcp:structured-content-at-edge:00\":true}";
        assert_eq!(splice(other, "{}"), None);
    }
}
