//! The one wording of a context that does not exist, shared by `ask`,
//! `chat`, `nexus` and `worker`:
//!
//! ```text
//! error: no context named "nope" (404 not_found, request id req_…)
//! ```

// Each example uses a different part of this module.
#![allow(dead_code)]

use nexus_knowql::{Client, Error};

/// Why a call about context `slug` failed: the unknown context named as
/// above when the server answered 404, else `None` (the caller words the
/// error as any other).
pub(crate) fn missing(slug: &str, error: &Error) -> Option<String> {
    if !error.is_not_found() {
        return None;
    }
    let mut details: Vec<String> = Vec::new();
    let status = error.status().map(|s| s.as_u16().to_string());
    let answer: Vec<&str> = status
        .iter()
        .map(String::as_str)
        .chain(error.code())
        .collect();
    if !answer.is_empty() {
        details.push(answer.join(" "));
    }
    if let Some(id) = error.request_id() {
        details.push(format!("request id {id}"));
    }
    let details = match details.is_empty() {
        true => String::new(),
        false => format!(" ({})", details.join(", ")),
    };
    Some(format!("no context named \"{slug}\"{details}"))
}

/// The first context of `scope` the server does not know, worded by
/// [`missing`]. For a call naming several contexts that was answered 404:
/// the answer does not say which one is missing; this asks for each.
pub(crate) async fn first_missing(client: &Client, scope: &[String]) -> Option<String> {
    for slug in scope {
        if let Err(e) = client.contexts().get(slug).await
            && let Some(line) = missing(slug, &e)
        {
            return Some(line);
        }
    }
    None
}

/// Checks that context `slug` exists: the missing one worded as above, any
/// other failure as the error's text.
pub(crate) async fn require(client: &Client, slug: &str) -> Result<(), String> {
    match client.contexts().get(slug).await {
        Ok(_) => Ok(()),
        Err(e) => Err(missing(slug, &e).unwrap_or_else(|| e.to_string())),
    }
}
