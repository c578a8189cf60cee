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
}
