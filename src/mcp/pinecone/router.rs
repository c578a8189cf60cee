//! Namespace routing: ranks namespaces by how well a question names them.
//!
//! Matching is on whole words (lower-cased ASCII alphanumeric runs), so a
//! namespace `ai` does not match "explain". A plural `s` is tolerated.

use super::discovery::NamespaceRow;

/// Lowest score that makes a namespace a recommendation: at least one word
/// of its name must appear in the question. Field hints alone are too weak.
pub(super) const MIN_ROUTE_SCORE: u32 = 2;

/// One ranked namespace.
#[derive(Debug, Clone, PartialEq, serde::Serialize, schemars::JsonSchema)]
pub(super) struct RouteSuggestion {
    /// Namespace name.
    pub namespace: String,
    /// 3 when the whole name appears, else 2 per name word; +1 per field named.
    pub score: u32,
    /// Records in the namespace.
    pub record_count: u64,
    /// Why it scored.
    pub reasons: Vec<String>,
    /// Source of the namespace (sources mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// Lower-cased words of `text`.
pub(super) fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect()
}

fn same_word(query_word: &str, word: &str) -> bool {
    query_word == word
        || query_word.strip_suffix('s') == Some(word)
        || word.strip_suffix('s') == Some(query_word)
}

/// True when `needle` occurs as consecutive words of `haystack`.
fn contains_phrase(haystack: &[String], needle: &[String]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|w| w.iter().zip(needle).all(|(q, n)| same_word(q, n)))
}

/// Scores one namespace against the question's words.
pub(super) fn score(query: &[String], row: &NamespaceRow) -> RouteSuggestion {
    let mut score = 0;
    let mut reasons: Vec<String> = Vec::new();
    let name = words(&row.name);
    if contains_phrase(query, &name) {
        score += 3;
        reasons.push("query mentions namespace name".to_owned());
    } else {
        let mut seen: Vec<&String> = Vec::new();
        for word in name.iter().filter(|w| w.len() >= 2) {
            if seen.contains(&word) {
                continue;
            }
            seen.push(word);
            if query.iter().any(|q| same_word(q, word)) {
                score += 2;
                reasons.push(format!("query matches namespace token: {word}"));
            }
        }
    }
    for field in row.metadata_fields.keys() {
        if contains_phrase(query, &words(field)) {
            score += 1;
            let reason = format!("field hint: {field}");
            if !reasons.contains(&reason) {
                reasons.push(reason);
            }
        }
    }
    RouteSuggestion {
        namespace: row.name.clone(),
        score,
        record_count: row.record_count,
        reasons,
        source: row.source.clone(),
    }
}

/// Ranks every namespace: score descending, then fewer records first, then
/// discovery order.
pub(super) fn rank(user_query: &str, rows: &[NamespaceRow]) -> Vec<RouteSuggestion> {
    let query = words(user_query);
    let mut ranked: Vec<RouteSuggestion> = rows.iter().map(|r| score(&query, r)).collect();
    ranked.sort_by(|a, b| {
        b.score
            .cmp(&a.score)
            .then(a.record_count.cmp(&b.record_count))
    });
    ranked
}

/// The namespace to use: the best one when it clears [`MIN_ROUTE_SCORE`],
/// or the only one there is.
pub(super) fn recommend(ranked: &[RouteSuggestion]) -> Option<&RouteSuggestion> {
    match ranked {
        [only] => Some(only),
        [best, ..] if best.score >= MIN_ROUTE_SCORE => Some(best),
        _ => None,
    }
}
