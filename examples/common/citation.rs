//! How every example prints citations: numbered footnotes, each
//! `source § Section › Sub (p. 3)`.

use std::fmt::Write as _;

use nexus_knowql::types;

/// One citation as a footnote body: `source § Section › Sub (p. 3)`.
pub(crate) fn citation_text(citation: &types::Citation) -> String {
    let mut text = citation.source.clone();
    let sections: Vec<String> = citation
        .section_paths
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| p.join(" › "))
        .collect();
    if !sections.is_empty() {
        let _ = write!(text, " § {}", sections.join("; "));
    }
    match citation.pages.as_slice() {
        [] => {}
        [page] => {
            let _ = write!(text, " (p. {page})");
        }
        pages => {
            let pages: Vec<String> = pages.iter().map(i64::to_string).collect();
            let _ = write!(text, " (pp. {})", pages.join(", "));
        }
    }
    text
}

/// Citations as numbered footnotes, one per line (empty when there are none).
pub(crate) fn footnotes(citations: &[types::Citation]) -> String {
    let mut out = String::new();
    for (i, c) in citations.iter().enumerate() {
        let _ = writeln!(out, "[{}] {}", i + 1, citation_text(c));
    }
    out
}
