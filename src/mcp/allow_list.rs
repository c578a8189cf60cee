//! The tools an operator exposes: `nexus-mcp --tools name,name`. Tools left
//! out are not listed, and a call to one is answered as a call to a tool
//! that does not exist.

use std::sync::Arc;

/// Why a tool allow-list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolAllowListError {
    /// The list names tools no configured family serves.
    #[error("no tool is named {}; the tools served are {}", .unknown.join(", "), .served.join(", "))]
    Unknown {
        /// The names not served, in the order given.
        unknown: Vec<String>,
        /// Every tool the configured families serve.
        served: Vec<String>,
    },
    /// The list names no tool at all.
    #[error("the tool allow-list names no tool")]
    Empty,
}

/// The names of the tools exposed, checked against the tools `served`.
pub(crate) fn checked<I, S>(
    names: I,
    served: &[String],
) -> Result<Arc<[Box<str>]>, ToolAllowListError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut exposed: Vec<Box<str>> = Vec::new();
    let mut unknown = Vec::new();
    for name in names {
        let name = name.as_ref().trim();
        if name.is_empty() || exposed.iter().any(|n| &**n == name) {
            continue;
        }
        if served.iter().any(|s| s == name) {
            exposed.push(Box::from(name));
        } else if !unknown.iter().any(|u| u == name) {
            unknown.push(name.to_owned());
        }
    }
    if !unknown.is_empty() {
        return Err(ToolAllowListError::Unknown {
            unknown,
            served: served.to_vec(),
        });
    }
    if exposed.is_empty() {
        return Err(ToolAllowListError::Empty);
    }
    Ok(exposed.into())
}

/// `text` without the sentences and clauses (ended by `.` or `;` outside
/// parentheses) that name one of the `hidden` tools: instructions never
/// point a model at a tool it cannot call.
pub(crate) fn without_mentions(text: &str, hidden: &[String]) -> String {
    if hidden.is_empty() {
        return text.to_owned();
    }
    text.split("\n\n")
        .map(|paragraph| kept_pieces(paragraph, hidden))
        .filter(|kept| !kept.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// The pieces of `paragraph` that name no `hidden` tool, joined.
fn kept_pieces(paragraph: &str, hidden: &[String]) -> String {
    let mut kept: Vec<&str> = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    let bytes = paragraph.as_bytes();
    for (i, &byte) in bytes.iter().enumerate() {
        match byte {
            b'(' => depth += 1,
            b')' => depth = depth.saturating_sub(1),
            b'.' | b';' if depth == 0 => {
                let ends = bytes.get(i + 1).is_none_or(u8::is_ascii_whitespace);
                if ends {
                    kept.push(&paragraph[start..=i]);
                    start = i + 1;
                }
            }
            _ => {}
        }
    }
    kept.push(&paragraph[start..]);
    let out: Vec<&str> = kept
        .into_iter()
        .map(str::trim)
        .filter(|piece| !piece.is_empty() && !hidden.iter().any(|tool| names(piece, tool)))
        .collect();
    let mut joined = out.join(" ");
    if joined.ends_with(';') {
        joined.pop();
        joined.push('.');
    }
    joined
}

/// Whether `text` names `tool` as a whole word.
fn names(text: &str, tool: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(tool).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + tool.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served() -> Vec<String> {
        ["query", "count", "get_query"].map(String::from).to_vec()
    }

    #[test]
    fn names_are_trimmed_deduplicated_and_checked() {
        let exposed = checked([" query", "count", "query", ""], &served()).unwrap();
        assert_eq!(&*exposed, &[Box::from("query"), Box::from("count")]);
        let err = checked(["query", "qeury", "nope", "nope"], &served()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no tool is named qeury, nope; the tools served are query, count, get_query"
        );
        assert_eq!(
            checked([" ", ""], &served()),
            Err(ToolAllowListError::Empty)
        );
    }

    #[test]
    fn instructions_lose_what_names_a_hidden_tool() {
        let text = "Intro. Flow: 1) call list_things (cached; see x); 2) call query_it; \
                    3) call get_it.\n\nOther: count counts (query_it too). Last one.";
        let hidden = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            without_mentions(text, &hidden(&["list_things"])),
            "Intro. 2) call query_it; 3) call get_it.\n\nOther: count counts (query_it too). Last one."
        );
        assert_eq!(
            without_mentions(text, &hidden(&["query_it"])),
            "Intro. Flow: 1) call list_things (cached; see x); 3) call get_it.\n\nLast one."
        );
        assert_eq!(
            without_mentions(text, &hidden(&["get_it", "count"])),
            "Intro. Flow: 1) call list_things (cached; see x); 2) call query_it.\n\nLast one."
        );
        // Whole words only: `query` is not `query_it`.
        assert_eq!(without_mentions(text, &hidden(&["query"])), text);
    }
}
