//! Extractive answers: the sentences of the retrieved passages that best
//! match the question, quoted verbatim, with citations. Also the
//! retrieval-only payload and best-effort structured output for a `shape`.
//!
//! Nothing here invents text: every answer sentence and every shaped value
//! is copied from a source, and what cannot be found is reported as missing.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value, json};

use super::search::{Chunk, WeightedTerm, terms};
use crate::types;

/// Most characters of an answer.
const ANSWER_CHARS: usize = 900;
/// Most sentences taken from one passage.
const UNITS_PER_PASSAGE: usize = 3;
/// Passages an answer may draw from.
const PASSAGES: usize = 3;
/// A passage is quoted only if it scores at least this share of the best.
const RELATIVE_SCORE: f32 = 0.5;

/// A retrieved passage with its score.
#[derive(Debug, Clone)]
pub(crate) struct Hit {
    pub(crate) score: f32,
    pub(crate) context: String,
    pub(crate) chunk: Chunk,
}

/// An extractive answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub(crate) text: String,
    pub(crate) citations: Vec<types::Citation>,
    /// How many passages the answer quotes.
    pub(crate) passages_used: usize,
}

/// The text of an answer when nothing matched.
pub(crate) const NO_MATCH: &str =
    "No passage in the scoped contexts matches this question, so there is nothing to quote.";

/// A sentence, list item or code block of a passage.
#[derive(Debug, Clone, PartialEq)]
struct Unit {
    text: String,
    code: bool,
}

/// Splits a passage into quotable units, in order.
fn units(text: &str) -> Vec<Unit> {
    let mut out = Vec::new();
    let mut para = String::new();
    let mut code: Option<String> = None;
    let flush = |para: &mut String, out: &mut Vec<Unit>| {
        for s in sentences(para) {
            out.push(Unit {
                text: s,
                code: false,
            });
        }
        para.clear();
    };
    for line in text.lines() {
        let t = line.trim();
        if let Some(block) = code.as_mut() {
            block.push('\n');
            block.push_str(line);
            if t.starts_with("```") || t.starts_with("~~~") {
                out.push(Unit {
                    text: std::mem::take(block),
                    code: true,
                });
                code = None;
            }
            continue;
        }
        if t.starts_with("```") || t.starts_with("~~~") {
            flush(&mut para, &mut out);
            code = Some(line.to_owned());
            continue;
        }
        if t.is_empty() {
            flush(&mut para, &mut out);
            continue;
        }
        if let Some(item) = list_item(t) {
            flush(&mut para, &mut out);
            para.push_str(item);
            flush(&mut para, &mut out);
            continue;
        }
        if t.starts_with('|') || t.starts_with('>') && t.len() == 1 {
            // Table rows and empty quotes carry no sentence of their own.
            continue;
        }
        if !para.is_empty() {
            para.push(' ');
        }
        para.push_str(t.trim_start_matches('>').trim());
    }
    if let Some(block) = code {
        out.push(Unit {
            text: block,
            code: true,
        });
    }
    flush(&mut para, &mut out);
    out
}

fn list_item(line: &str) -> Option<&str> {
    if let Some(rest) = line
        .strip_prefix("- ")
        .or_else(|| line.strip_prefix("* "))
        .or_else(|| line.strip_prefix("+ "))
    {
        return Some(rest.trim());
    }
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 0 && line[digits..].starts_with(". ") {
        return Some(line[digits + 2..].trim());
    }
    None
}

/// Sentences of a paragraph: cut after `.`, `!` or `?` followed by a space.
fn sentences(para: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = para.as_bytes();
    for i in 0..bytes.len() {
        if matches!(bytes[i], b'.' | b'!' | b'?')
            && bytes.get(i + 1) == Some(&b' ')
            && bytes
                .get(i + 2)
                .is_some_and(|b| b.is_ascii_uppercase() || *b == b'`')
        {
            let s = para[start..=i].trim();
            if !s.is_empty() {
                out.push(s.to_owned());
            }
            start = i + 1;
        }
    }
    let s = para[start..].trim();
    if !s.is_empty() {
        out.push(s.to_owned());
    }
    out
}

/// How well a unit answers: the summed weights of the distinct question
/// terms it contains.
fn unit_score(unit: &str, question: &[WeightedTerm]) -> f32 {
    let words: HashSet<String> = terms(unit).into_iter().collect();
    question
        .iter()
        .filter(|(t, _)| words.contains(t))
        .map(|(_, w)| *w)
        .sum()
}

/// The number of `chunk`'s source among `citations` (from 1), adding it,
/// or its section to it.
fn cite(citations: &mut Vec<types::Citation>, chunk: &Chunk) -> usize {
    match citations.iter().position(|c| c.source == chunk.source) {
        Some(i) => {
            let c = &mut citations[i];
            if !chunk.section_path.is_empty() && !c.section_paths.contains(&chunk.section_path) {
                c.section_paths.push(chunk.section_path.clone());
            }
            i + 1
        }
        None => {
            citations.push(types::Citation {
                grounding: Some("extractive".to_owned()),
                kind: Some("chunk".to_owned()),
                pages: Vec::new(),
                section_paths: if chunk.section_path.is_empty() {
                    Vec::new()
                } else {
                    vec![chunk.section_path.clone()]
                },
                source: chunk.source.clone(),
            });
            citations.len()
        }
    }
}

/// One paragraph of an answer: its units, then its citation mark `[n]`.
fn paragraph(group: &[Unit], n: usize) -> String {
    let mut para = String::new();
    for u in group {
        if u.code {
            if !para.is_empty() {
                para.push('\n');
            }
            para.push_str(&u.text);
            para.push('\n');
        } else {
            if !para.is_empty() && !para.ends_with('\n') {
                para.push(' ');
            }
            para.push_str(&u.text);
        }
    }
    if para.ends_with('\n') {
        para.push_str(&format!("[{n}]"));
    } else {
        para.push_str(&format!(" [{n}]"));
    }
    para
}

/// Composes an extractive answer from ranked hits.
pub(crate) fn compose(hits: &[Hit], question: &[WeightedTerm]) -> Answer {
    let mut groups: Vec<(usize, Vec<Unit>)> = Vec::new();
    let mut used_chars = 0;
    let best = hits.first().map_or(0.0, |h| h.score);
    for (rank, hit) in hits.iter().take(PASSAGES).enumerate() {
        if rank > 0 && hit.score < best * RELATIVE_SCORE {
            break;
        }
        let all = units(&hit.chunk.text);
        let mut scored: Vec<(usize, f32)> = all
            .iter()
            .enumerate()
            .map(|(i, u)| (i, unit_score(&u.text, question)))
            .filter(|(_, s)| *s > 0.0)
            .collect();
        if scored.is_empty() && rank == 0 && !all.is_empty() {
            // The passage matched through its headings: quote its opening.
            scored.push((0, 0.0));
        }
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut picked: Vec<usize> = Vec::new();
        for (i, _) in scored.into_iter().take(UNITS_PER_PASSAGE) {
            let len = all[i].text.len();
            if used_chars > 0 && used_chars + len > ANSWER_CHARS {
                continue;
            }
            used_chars += len;
            picked.push(i);
        }
        if picked.is_empty() {
            continue;
        }
        picked.sort_unstable();
        groups.push((rank, picked.into_iter().map(|i| all[i].clone()).collect()));
        if used_chars >= ANSWER_CHARS {
            break;
        }
    }
    if groups.is_empty() {
        return Answer {
            text: NO_MATCH.to_owned(),
            citations: Vec::new(),
            passages_used: 0,
        };
    }

    let mut citations: Vec<types::Citation> = Vec::new();
    let mut paragraphs = Vec::new();
    for (rank, group) in &groups {
        let chunk = &hits[*rank].chunk;
        let n = cite(&mut citations, chunk);
        paragraphs.push(paragraph(group, n));
    }
    Answer {
        text: paragraphs.join("\n\n"),
        citations,
        passages_used: groups.len(),
    }
}

/// What a retrieval-only turn returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetrievalMode {
    /// Hits with their text (`retrieval_only`, `compose: false`, `chunks_only`).
    Chunks,
    /// Hits without text (`pointers_only`).
    Pointers,
    /// Curated artifacts (`artifacts_only`); the local server builds none.
    Artifacts,
}

/// The `output_json` of a retrieval-only turn.
pub(crate) fn retrieval_json(
    hits: &[Hit],
    mode: RetrievalMode,
    max_items: usize,
    max_chars: usize,
) -> Map<String, Value> {
    let items: Vec<Value> = match mode {
        RetrievalMode::Artifacts => Vec::new(),
        _ => hits
            .iter()
            .take(max_items)
            .map(|h| {
                let mut item = json!({
                    "kind": "chunk",
                    "context": h.context,
                    "source": h.chunk.source,
                    "section_path": h.chunk.section_path,
                    "score": h.score,
                });
                if mode == RetrievalMode::Chunks {
                    item["text"] = Value::String(truncate(&h.chunk.text, max_chars));
                }
                item
            })
            .collect(),
    };
    let mut out = Map::new();
    out.insert(
        "mode".to_owned(),
        Value::String(
            match mode {
                RetrievalMode::Chunks => "chunks",
                RetrievalMode::Pointers => "pointers",
                RetrievalMode::Artifacts => "artifacts",
            }
            .to_owned(),
        ),
    );
    out.insert("total".to_owned(), json!(items.len()));
    out.insert("hits".to_owned(), Value::Array(items));
    out
}

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((i, _)) => text[..i].to_owned(),
        None => text.to_owned(),
    }
}

/// Most properties a `shape` may have, nested ones included.
pub(crate) const MAX_SHAPE_PROPERTIES: usize = 2_000;
/// Deepest nesting of objects in a `shape`.
const MAX_SHAPE_DEPTH: usize = 16;

/// Counts the properties of a shape and its nested objects; `Err` past
/// the caps.
fn count_properties(
    schema: &Map<String, Value>,
    depth: usize,
    total: &mut usize,
) -> Result<(), String> {
    if depth > MAX_SHAPE_DEPTH {
        return Err(format!(
            "shape nests objects deeper than {MAX_SHAPE_DEPTH} levels"
        ));
    }
    let Some(Value::Object(props)) = schema.get("properties") else {
        return Ok(());
    };
    for prop in props.values() {
        *total = total.saturating_add(1);
        if *total > MAX_SHAPE_PROPERTIES {
            return Err(format!(
                "shape has more than {MAX_SHAPE_PROPERTIES} properties (nested ones included)"
            ));
        }
        if let Some(obj) = prop.as_object() {
            count_properties(obj, depth + 1, total)?;
        }
    }
    Ok(())
}

/// Checks that a `shape` is a JSON Schema object with `properties`, within
/// the caps on properties and nesting.
pub(crate) fn validate_shape(shape: &Map<String, Value>) -> Result<(), String> {
    let ty = shape
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("object");
    if ty != "object" {
        return Err(format!("shape must describe an object, not {ty:?}"));
    }
    match shape.get("properties") {
        Some(Value::Object(p)) if !p.is_empty() => {}
        _ => return Err("shape must have a non-empty `properties` object".to_owned()),
    }
    count_properties(shape, 0, &mut 0)
}

/// Fills a `shape` from the retrieved passages, best effort.
///
/// Strings get the best matching sentence, string arrays a few, numbers the
/// first number of the best matching sentence that has one, enums the value
/// the passages mention most. A required property that cannot be filled is
/// an error naming it; an optional one is left out.
///
/// Runs until done or until `stop` is set (then it fails).
pub(crate) fn fill_shape(
    shape: &Map<String, Value>,
    hits: &[Hit],
    question: &[WeightedTerm],
    stop: &AtomicBool,
) -> Result<Map<String, Value>, String> {
    let all_units: Vec<String> = hits
        .iter()
        .take(8)
        .flat_map(|h| units(&h.chunk.text))
        .filter(|u| !u.code)
        .map(|u| u.text)
        .collect();
    fill_object(shape, &all_units, question, "", stop)
}

fn fill_object(
    schema: &Map<String, Value>,
    units: &[String],
    question: &[WeightedTerm],
    at: &str,
    stop: &AtomicBool,
) -> Result<Map<String, Value>, String> {
    let required: HashSet<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = Map::new();
    let Some(Value::Object(props)) = schema.get("properties") else {
        return Ok(out);
    };
    for (name, prop) in props {
        if stop.load(Ordering::Relaxed) {
            return Err("stopped".to_owned());
        }
        let path = if at.is_empty() {
            name.clone()
        } else {
            format!("{at}.{name}")
        };
        let prop = prop.as_object().cloned().unwrap_or_default();
        let hint = format!(
            "{} {}",
            name.replace('_', " "),
            prop.get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
        );
        let mut terms_for: Vec<WeightedTerm> = super::search::weigh(&[(&hint, 1.0)]);
        terms_for.extend(question.iter().map(|(t, w)| (t.clone(), w * 0.5)));
        match fill_value(&prop, units, &terms_for, &path, stop) {
            Ok(Some(v)) => {
                out.insert(name.clone(), v);
            }
            Ok(None) if required.contains(name.as_str()) => {
                return Err(format!(
                    "the retrieved passages hold no value for required property `{path}`"
                ));
            }
            Ok(None) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn fill_value(
    prop: &Map<String, Value>,
    units: &[String],
    question: &[WeightedTerm],
    path: &str,
    stop: &AtomicBool,
) -> Result<Option<Value>, String> {
    let ranked = rank_units(units, question);
    if let Some(Value::Array(options)) = prop.get("enum") {
        let best = options
            .iter()
            .filter_map(|o| o.as_str().map(|s| (o, s.to_lowercase())))
            .map(|(o, s)| {
                let n = units
                    .iter()
                    .filter(|u| u.to_lowercase().contains(&s))
                    .count();
                (o, n)
            })
            .filter(|(_, n)| *n > 0)
            .max_by_key(|(_, n)| *n)
            .map(|(o, _)| o.clone());
        return Ok(best);
    }
    match prop.get("type").and_then(Value::as_str).unwrap_or("string") {
        "string" => Ok(ranked.first().map(|u| Value::String(u.clone()))),
        "number" | "integer" => {
            for u in &ranked {
                if let Some(n) = first_number(u, prop.get("type") == Some(&json!("integer"))) {
                    return Ok(Some(n));
                }
            }
            Ok(None)
        }
        "array" => {
            let item_type = prop
                .get("items")
                .and_then(|i| i.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("string");
            if item_type != "string" {
                // Only text can be quoted; other item types stay unfilled.
                return Ok(None);
            }
            let items: Vec<Value> = ranked
                .iter()
                .take(3)
                .map(|u| Value::String(u.clone()))
                .collect();
            Ok((!items.is_empty()).then_some(Value::Array(items)))
        }
        "object" => fill_object(prop, units, question, path, stop).map(|m| Some(Value::Object(m))),
        // Booleans and other types cannot be read off a quoted sentence.
        _ => Ok(None),
    }
}

/// Units that contain at least one of the terms, best first.
fn rank_units(units: &[String], question: &[WeightedTerm]) -> Vec<String> {
    let mut scored: Vec<(f32, usize)> = units
        .iter()
        .enumerate()
        .map(|(i, u)| (unit_score(u, question), i))
        .filter(|(s, _)| *s > 0.0)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().map(|(_, i)| units[i].clone()).collect()
}

fn first_number(text: &str, integer: bool) -> Option<Value> {
    for word in text.split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')') {
        let w = word.trim_end_matches(['.', ';', ':', '%']);
        if integer {
            if let Ok(n) = w.parse::<i64>() {
                return Some(json!(n));
            }
        } else if let Ok(n) = w.parse::<f64>()
            && n.is_finite()
        {
            return Some(json!(n));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::search::weigh;

    fn hit(source: &str, path: &[&str], text: &str) -> Hit {
        Hit {
            score: 1.0,
            context: "docs".into(),
            chunk: Chunk {
                source: source.into(),
                section_path: path.iter().map(|s| s.to_string()).collect(),
                text: text.into(),
            },
        }
    }

    #[test]
    fn answer_quotes_matching_sentences_with_citations() {
        let hits = vec![
            hit(
                "guide.md",
                &["Streaming", "Resume"],
                "Streams can drop. Reconnect with Last-Event-ID to resume the stream. Nothing else.",
            ),
            hit("other.md", &[], "Unrelated text about cats."),
        ];
        let a = compose(&hits, &weigh(&[("how do I resume a stream", 1.0)]));
        assert!(
            a.text
                .contains("Reconnect with Last-Event-ID to resume the stream. [1]"),
            "{}",
            a.text
        );
        assert!(!a.text.contains("cats"));
        assert!(!a.text.contains("Nothing else"));
        assert_eq!(a.citations.len(), 1);
        assert_eq!(a.citations[0].source, "guide.md");
        assert_eq!(
            a.citations[0].section_paths,
            vec![vec!["Streaming".to_string(), "Resume".to_string()]]
        );
    }

    #[test]
    fn no_hits_say_so_without_citations() {
        let a = compose(&[], &weigh(&[("anything", 1.0)]));
        assert_eq!(a.text, NO_MATCH);
        assert!(a.citations.is_empty());
    }

    #[test]
    fn code_blocks_and_list_items_are_units() {
        let u = units("Intro line.\n\n- first item\n- second item\n\n```sh\ncargo run\n```\n");
        let texts: Vec<_> = u.iter().map(|u| (u.text.as_str(), u.code)).collect();
        assert_eq!(
            texts,
            vec![
                ("Intro line.", false),
                ("first item", false),
                ("second item", false),
                ("```sh\ncargo run\n```", true),
            ]
        );
    }

    #[test]
    fn shape_is_filled_from_passages_or_fails_clearly() {
        let hits = vec![hit(
            "limits.md",
            &["Limits"],
            "The upload limit is 256 megabytes. Archives are expanded on import.",
        )];
        let q = weigh(&[("what is the upload limit", 1.0)]);
        let shape: Map<String, Value> = serde_json::from_value(json!({
            "type": "object",
            "properties": {
                "limit_mb": {"type": "integer", "description": "upload limit"},
                "summary": {"type": "string"},
                "flag": {"type": "boolean"}
            },
            "required": ["limit_mb"]
        }))
        .unwrap();
        let out = fill_shape(&shape, &hits, &q, &AtomicBool::new(false)).unwrap();
        assert_eq!(out["limit_mb"], json!(256));
        assert!(out["summary"].as_str().unwrap().contains("upload limit"));
        let strict: Map<String, Value> = serde_json::from_value(json!({
            "type": "object",
            "properties": {"flag": {"type": "boolean"}},
            "required": ["flag"]
        }))
        .unwrap();
        let err = fill_shape(&strict, &hits, &q, &AtomicBool::new(false)).unwrap_err();
        assert!(err.contains("flag"), "{err}");
        assert!(validate_shape(&Map::new()).is_err());
    }

    #[test]
    fn retrieval_json_caps_items_and_text() {
        let hits = vec![hit("a.md", &["A"], "abcdef"), hit("b.md", &[], "ghijkl")];
        let out = retrieval_json(&hits, RetrievalMode::Chunks, 1, 3);
        assert_eq!(out["total"], json!(1));
        assert_eq!(out["hits"][0]["text"], json!("abc"));
        let out = retrieval_json(&hits, RetrievalMode::Pointers, 10, 3);
        assert!(out["hits"][1].get("text").is_none());
    }
}
