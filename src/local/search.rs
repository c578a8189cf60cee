//! Lexical retrieval: sources are cut into chunks by heading and size, and
//! each context gets a tantivy index (BM25) over them.
//!
//! Words are normalized here, once, for documents and questions alike
//! (lower case, stop words dropped, a light suffix stemmer), and tantivy
//! indexes the normalized words split on whitespace. Keeping normalization in
//! one function means the index, the query and the answer extractor always
//! agree on what a "term" is.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, BoostQuery, Occur, Query, TermQuery};
use tantivy::schema::{
    Field, INDEXED, IndexRecordOption, STORED, Schema, TextFieldIndexing, TextOptions, Value,
};
use tantivy::{Index, IndexReader, ReloadPolicy, TantivyDocument, Term, doc};

/// Default chunk size in characters.
pub(crate) const DEFAULT_CHUNK_CHARS: usize = 1200;

/// The longest word that is indexed; longer runs (hashes, base64) are noise.
const MAX_TERM_CHARS: usize = 40;

/// Writer memory; tantivy needs at least 15 MB per indexing thread.
const WRITER_MEMORY: usize = 64 * 1024 * 1024;

/// One retrievable passage of a source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Chunk {
    /// Source path inside the context, for example `uploads/guide.md`.
    pub(crate) source: String,
    /// The headings above the passage, outermost first.
    pub(crate) section_path: Vec<String>,
    /// The passage text (Markdown as written).
    pub(crate) text: String,
}

/// Whether a path is chunked as Markdown (by headings) rather than plain text.
pub(crate) fn is_markdown(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    [".md", ".markdown", ".mdx"]
        .iter()
        .any(|ext| lower.ends_with(ext))
}

/// Cuts one document into chunks of about `target` characters. Markdown is
/// split at every heading first (outside code fences), so a chunk never
/// spans two sections; plain text is split by paragraphs only.
pub(crate) fn chunk_document(source: &str, text: &str, target: usize) -> Vec<Chunk> {
    let target = target.max(64);
    let markdown = is_markdown(source);
    let mut chunks = Vec::new();
    let mut headings: Vec<String> = Vec::new();
    let mut body = String::new();
    let mut fence: Option<&str> = None;

    for line in text.lines() {
        let trimmed = line.trim_start();
        if markdown {
            if let Some(open) = fence {
                if trimmed.starts_with(open) {
                    fence = None;
                }
                body.push_str(line);
                body.push('\n');
                continue;
            }
            if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
                fence = Some(&trimmed[..3]);
                body.push_str(line);
                body.push('\n');
                continue;
            }
            if let Some((level, title)) = heading(line) {
                split_section(source, &headings, &body, target, &mut chunks);
                body.clear();
                headings.truncate(level - 1);
                while headings.len() < level - 1 {
                    // A skipped level (# then ###) keeps the path aligned.
                    headings.push(String::new());
                }
                headings.push(title);
                continue;
            }
        }
        body.push_str(line);
        body.push('\n');
    }
    split_section(source, &headings, &body, target, &mut chunks);
    chunks
}

/// `(level, title)` of an ATX heading line.
fn heading(line: &str) -> Option<(usize, String)> {
    if line.starts_with("    ") {
        return None;
    }
    let t = line.trim_start();
    let level = t.bytes().take_while(|b| *b == b'#').count();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &t[level..];
    if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
        return None;
    }
    let title = rest.trim().trim_end_matches('#').trim().to_owned();
    Some((level, title))
}

/// Splits one section's body into chunks at paragraph boundaries.
fn split_section(
    source: &str,
    headings: &[String],
    body: &str,
    target: usize,
    out: &mut Vec<Chunk>,
) {
    let section_path: Vec<String> = headings.iter().filter(|h| !h.is_empty()).cloned().collect();
    let mut current = String::new();
    let mut emit = |text: &str| {
        let text = text.trim();
        if !text.is_empty() {
            out.push(Chunk {
                source: source.to_owned(),
                section_path: section_path.clone(),
                text: text.to_owned(),
            });
        }
    };
    for para in paragraphs(body) {
        if !current.is_empty() && current.len() + para.len() + 2 > target {
            emit(&current);
            current.clear();
        }
        if para.len() > target * 2 {
            // One huge paragraph: cut it at whitespace near the target size.
            for piece in split_long(para, target) {
                emit(piece);
            }
            continue;
        }
        if !current.is_empty() {
            current.push_str("\n\n");
        }
        current.push_str(para);
    }
    emit(&current);
}

/// Blank-line separated paragraphs; a fenced code block stays one paragraph.
fn paragraphs(body: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    let mut in_fence = false;
    let mut offset = 0;
    for line in body.split_inclusive('\n') {
        let t = line.trim();
        if t.starts_with("```") || t.starts_with("~~~") {
            in_fence = !in_fence;
        }
        if t.is_empty() && !in_fence {
            if let Some(s) = start.take() {
                out.push(body[s..offset].trim_end());
            }
        } else if start.is_none() {
            start = Some(offset);
        }
        offset += line.len();
    }
    if let Some(s) = start {
        out.push(body[s..].trim_end());
    }
    out
}

fn split_long(text: &str, target: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > target {
        let mut cut = target;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let cut = rest[..cut]
            .rfind(char::is_whitespace)
            .filter(|&i| i > target / 2)
            .unwrap_or(cut);
        out.push(&rest[..cut]);
        rest = rest[cut..].trim_start();
    }
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

const STOP_WORDS: &[&str] = &[
    "a", "about", "after", "all", "also", "an", "and", "any", "are", "as", "at", "be", "been",
    "but", "by", "can", "could", "did", "do", "does", "for", "from", "had", "has", "have", "how",
    "i", "if", "in", "into", "is", "it", "its", "just", "me", "my", "no", "not", "of", "on", "or",
    "our", "so", "some", "than", "that", "the", "their", "them", "then", "there", "these", "they",
    "this", "those", "to", "us", "was", "we", "were", "what", "when", "where", "which", "who",
    "why", "will", "with", "would", "you", "your",
];

/// The normalized terms of a text, in order (repeats kept).
pub(crate) fn terms(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && w.chars().count() <= MAX_TERM_CHARS)
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .map(stem)
        .collect()
}

/// A light English suffix stemmer: enough for "resumes", "resuming" and
/// "resumed" to meet "resume", never so much that unrelated words merge often.
fn stem(word: String) -> String {
    let w = word.as_str();
    if !w.is_ascii() || w.len() <= 3 {
        return word;
    }
    let base = if let Some(b) = w.strip_suffix("ies").filter(|b| b.len() >= 2) {
        format!("{b}y")
    } else if let Some(b) = w.strip_suffix("ing").filter(|b| b.len() >= 3) {
        undouble(b)
    } else if let Some(b) = w.strip_suffix("ed").filter(|b| b.len() >= 3) {
        undouble(b)
    } else if let Some(b) = w
        .strip_suffix("es")
        .filter(|b| b.ends_with("sh") || b.ends_with("ch") || b.ends_with('x') || b.ends_with("ss"))
    {
        b.to_owned()
    } else if let Some(b) = w
        .strip_suffix('s')
        .filter(|b| !b.ends_with('s') && !b.ends_with('u'))
    {
        b.to_owned()
    } else {
        word.clone()
    };
    // "resum" (from "resuming"/"resumed") and "resume" must meet.
    match base.strip_suffix('e') {
        Some(b) if b.len() >= 3 => b.to_owned(),
        _ => base,
    }
}

fn undouble(b: &str) -> String {
    let bytes = b.as_bytes();
    let n = bytes.len();
    if n >= 2 && bytes[n - 1] == bytes[n - 2] && !matches!(bytes[n - 1], b'l' | b's' | b'z') {
        b[..n - 1].to_owned()
    } else {
        b.to_owned()
    }
}

/// A term of a question with its weight (earlier turns weigh less).
pub(crate) type WeightedTerm = (String, f32);

/// The weight of a question's own terms; earlier turns' terms weigh less.
pub(crate) const OWN_TERM_WEIGHT: f32 = 1.0;

/// Merges terms, keeping each term's highest weight.
pub(crate) fn weigh(groups: &[(&str, f32)]) -> Vec<WeightedTerm> {
    let mut weights: HashMap<String, f32> = HashMap::new();
    let mut order = Vec::new();
    for (text, weight) in groups {
        for t in terms(text) {
            let slot = weights.entry(t.clone()).or_insert_with(|| {
                order.push(t);
                0.0
            });
            *slot = slot.max(*weight);
        }
    }
    order
        .into_iter()
        .map(|t| {
            let w = weights.get(&t).copied().unwrap_or(0.0);
            (t, w)
        })
        .collect()
}

/// The BM25 index of one context, with the chunks it points into.
pub(crate) struct ContextIndex {
    index: Index,
    reader: IndexReader,
    text: Field,
    heading: Field,
    ord: Field,
    chunks: Vec<Chunk>,
    /// The knowledge files' names and sizes, built once per index (an
    /// index is one curation's generation).
    knowledge: std::sync::OnceLock<Vec<(String, u64)>>,
}

impl std::fmt::Debug for ContextIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextIndex")
            .field("chunks", &self.chunks.len())
            .finish_non_exhaustive()
    }
}

fn schema() -> (Schema, Field, Field, Field) {
    let words = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer("whitespace")
            .set_index_option(IndexRecordOption::WithFreqs),
    );
    let mut b = Schema::builder();
    let text = b.add_text_field("text", words.clone());
    let heading = b.add_text_field("heading", words);
    let ord = b.add_u64_field("ord", STORED | INDEXED);
    (b.build(), text, heading, ord)
}

impl ContextIndex {
    /// Indexes `chunks`, in memory or in `dir` (which must exist and be empty).
    pub(crate) fn build(chunks: Vec<Chunk>, dir: Option<&Path>) -> tantivy::Result<Self> {
        let (schema, text, heading, ord) = schema();
        let index = match dir {
            Some(d) => Index::create_in_dir(d, schema)?,
            None => Index::create_in_ram(schema),
        };
        let mut writer = index.writer::<TantivyDocument>(WRITER_MEMORY)?;
        for (i, c) in chunks.iter().enumerate() {
            writer.add_document(doc!(
                text => terms(&c.text).join(" "),
                heading => terms(&c.section_path.join(" ")).join(" "),
                ord => i as u64,
            ))?;
        }
        writer.commit()?;
        writer.wait_merging_threads()?;
        Self::with_reader(index, text, heading, ord, chunks)
    }

    /// Opens an index written by [`ContextIndex::build`] in `dir`.
    pub(crate) fn open(dir: &Path, chunks: Vec<Chunk>) -> tantivy::Result<Self> {
        let index = Index::open_in_dir(dir)?;
        let (_, text, heading, ord) = schema();
        let this = Self::with_reader(index, text, heading, ord, chunks)?;
        if this.reader.searcher().num_docs() != this.chunks.len() as u64 {
            return Err(tantivy::TantivyError::InvalidArgument(
                "index and chunk table disagree".into(),
            ));
        }
        Ok(this)
    }

    fn with_reader(
        index: Index,
        text: Field,
        heading: Field,
        ord: Field,
        chunks: Vec<Chunk>,
    ) -> tantivy::Result<Self> {
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        Ok(ContextIndex {
            index,
            reader,
            text,
            heading,
            ord,
            chunks,
            knowledge: std::sync::OnceLock::new(),
        })
    }

    /// Merges the index's segments into one and removes the files no
    /// longer used; returns the segment counts before and after.
    /// Searches keep working meanwhile (they map hits through the stored
    /// ordinal, which merging keeps).
    pub(crate) fn compact(&self) -> tantivy::Result<(usize, usize)> {
        let before = self.index.searchable_segment_ids()?;
        if before.len() > 1 {
            let mut writer = self.index.writer::<TantivyDocument>(WRITER_MEMORY)?;
            writer.merge(&before).wait()?;
            writer.garbage_collect_files().wait()?;
            writer.wait_merging_threads()?;
        }
        self.reader.reload()?;
        let after = self.index.searchable_segment_ids()?.len();
        Ok((before.len(), after))
    }

    /// The knowledge files (one Markdown file per source under `chunks/`)
    /// with their sizes, computed once and kept with the index.
    pub(crate) fn knowledge_files(&self) -> &[(String, u64)] {
        self.knowledge.get_or_init(|| {
            let mut sizes: std::collections::BTreeMap<String, u64> = Default::default();
            for c in &self.chunks {
                let size = knowledge_section(c).len() as u64;
                let slot = sizes.entry(knowledge_name(&c.source)).or_default();
                *slot = slot.saturating_add(size);
            }
            sizes.into_iter().collect()
        })
    }

    /// The text of one knowledge file, if it exists.
    pub(crate) fn knowledge_text(&self, name: &str) -> Option<String> {
        let files = self.knowledge_files();
        let i = files.binary_search_by(|(n, _)| n.as_str().cmp(name)).ok()?;
        let mut out = String::with_capacity(usize::try_from(files[i].1).unwrap_or(0));
        for c in self
            .chunks
            .iter()
            .filter(|c| knowledge_name(&c.source) == name)
        {
            out.push_str(&knowledge_section(c));
        }
        Some(out)
    }

    /// The indexed chunks, in index order.
    pub(crate) fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// The best `limit` chunks for the weighted terms: `(score, chunk index)`.
    ///
    /// Terms of weight [`OWN_TERM_WEIGHT`] or more are the question's own;
    /// lighter ones come from earlier turns of its session. When the question
    /// has terms of its own, a chunk must match one of them, and the earlier
    /// turns' terms only rank the chunks that do: a follow-up that names a new
    /// subject ("What is a context?" after a question on streams) is answered
    /// about that subject. A follow-up with no term of its own ("Why?") is
    /// answered from the earlier turns' terms alone.
    pub(crate) fn search(
        &self,
        terms: &[WeightedTerm],
        limit: usize,
    ) -> tantivy::Result<Vec<(f32, usize)>> {
        if terms.is_empty() || limit == 0 || self.chunks.is_empty() {
            return Ok(Vec::new());
        }
        let (own, earlier): (Vec<&WeightedTerm>, Vec<&WeightedTerm>) =
            terms.iter().partition(|(_, w)| *w >= OWN_TERM_WEIGHT);
        let query: Box<dyn Query> = if own.is_empty() {
            Box::new(BooleanQuery::new(self.term_clauses(&earlier)))
        } else {
            let mut clauses = self.term_clauses(&earlier);
            clauses.push((
                Occur::Must,
                Box::new(BooleanQuery::new(self.term_clauses(&own))),
            ));
            Box::new(BooleanQuery::new(clauses))
        };
        let searcher = self.reader.searcher();
        let top = searcher.search(query.as_ref(), &TopDocs::with_limit(limit).order_by_score())?;
        let mut out = Vec::with_capacity(top.len());
        for (score, addr) in top {
            let doc: TantivyDocument = searcher.doc(addr)?;
            if let Some(i) = doc.get_first(self.ord).and_then(|v| v.as_u64())
                && (i as usize) < self.chunks.len()
            {
                out.push((score, i as usize));
            }
        }
        Ok(out)
    }

    /// One optional clause per term and field (text, and headings at 0.6),
    /// boosted by the term's weight.
    fn term_clauses(&self, terms: &[&WeightedTerm]) -> Vec<(Occur, Box<dyn Query>)> {
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::with_capacity(terms.len() * 2);
        for (term, weight) in terms {
            for (field, boost) in [(self.text, 1.0f32), (self.heading, 0.6)] {
                let q = TermQuery::new(
                    Term::from_field_text(field, term),
                    IndexRecordOption::WithFreqs,
                );
                clauses.push((
                    Occur::Should,
                    Box::new(BoostQuery::new(Box::new(q), weight * boost)),
                ));
            }
        }
        clauses
    }

    /// Number of documents tantivy holds (equals the chunk count).
    pub(crate) fn num_docs(&self) -> u64 {
        self.reader.searcher().num_docs()
    }
}

/// The knowledge file of a source: `chunks/{source}`, `.md` added when the
/// source has another extension.
fn knowledge_name(source: &str) -> String {
    if source.ends_with(".md") {
        format!("chunks/{source}")
    } else {
        format!("chunks/{source}.md")
    }
}

/// One chunk as a section of its knowledge file.
fn knowledge_section(c: &Chunk) -> String {
    let heading = if c.section_path.is_empty() {
        c.source.clone()
    } else {
        c.section_path.join(" > ")
    };
    format!("## {heading}\n\n{}\n\n", c.text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# Guide\n\nIntro text.\n\n## Streaming\n\nStreams send events.\n\n```\n# not a heading\n```\n\n### Resume\n\nReconnect with Last-Event-ID to resume a stream.\n\n# Other\n\nUnrelated words.\n";

    #[test]
    fn markdown_is_chunked_by_headings_with_section_paths() {
        let chunks = chunk_document("docs/guide.md", DOC, 1200);
        let paths: Vec<Vec<&str>> = chunks
            .iter()
            .map(|c| c.section_path.iter().map(String::as_str).collect())
            .collect();
        assert_eq!(
            paths,
            vec![
                vec!["Guide"],
                vec!["Guide", "Streaming"],
                vec!["Guide", "Streaming", "Resume"],
                vec!["Other"],
            ]
        );
        assert!(
            chunks[1].text.contains("# not a heading"),
            "fenced lines stay text"
        );
        assert!(chunks.iter().all(|c| c.source == "docs/guide.md"));
    }

    #[test]
    fn long_sections_are_cut_near_the_target_size() {
        let para = "word ".repeat(100);
        let text = format!("# T\n\n{para}\n\n{para}\n\n{para}\n");
        let chunks = chunk_document("a.md", &text, 600);
        assert_eq!(chunks.len(), 3);
        assert!(chunks.iter().all(|c| c.text.len() <= 600));
        let huge = "x ".repeat(2000);
        let chunks = chunk_document("a.txt", &huge, 500);
        assert!(chunks.len() >= 8 && chunks.iter().all(|c| c.text.len() <= 500));
    }

    #[test]
    fn plain_text_has_no_section_path() {
        let chunks = chunk_document("notes.txt", "# not markdown\n\ntext", 1200);
        assert_eq!(chunks.len(), 1);
        assert!(chunks[0].section_path.is_empty());
    }

    #[test]
    fn terms_normalize_inflections_and_drop_stop_words() {
        assert_eq!(terms("How do I resume a stream?"), vec!["resum", "stream"]);
        assert_eq!(terms("Resuming resumed resumes"), vec!["resum"; 3]);
        assert_eq!(terms("Last-Event-ID"), vec!["last", "event", "id"]);
        assert_eq!(terms("queries query"), vec!["query", "query"]);
    }

    #[test]
    fn bm25_ranks_the_matching_section_first() {
        let chunks = chunk_document("docs/guide.md", DOC, 1200);
        let index = ContextIndex::build(chunks, None).unwrap();
        assert_eq!(index.num_docs(), 4);
        let hits = index
            .search(&weigh(&[("how to resume a stream", 1.0)]), 3)
            .unwrap();
        let best = &index.chunks()[hits[0].1];
        assert_eq!(best.section_path.last().map(String::as_str), Some("Resume"));
        assert!(
            index
                .search(&weigh(&[("zebra", 1.0)]), 3)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn persisted_index_reopens() {
        let dir = std::env::temp_dir().join(format!("nexus-local-idx-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let chunks = chunk_document("docs/guide.md", DOC, 1200);
        drop(ContextIndex::build(chunks.clone(), Some(&dir)).unwrap());
        let index = ContextIndex::open(&dir, chunks).unwrap();
        assert!(
            !index
                .search(&weigh(&[("resume", 1.0)]), 2)
                .unwrap()
                .is_empty()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn compacting_merges_segments_and_search_still_finds_chunks() {
        let chunks: Vec<Chunk> = ["alpha tea", "beta coffee", "gamma water"]
            .iter()
            .map(|t| Chunk {
                source: format!("{t}.md"),
                section_path: Vec::new(),
                text: (*t).to_owned(),
            })
            .collect();
        // Three commits: three segments.
        let (schema, text, heading, ord) = schema();
        let index = Index::create_in_ram(schema);
        let mut writer = index.writer::<TantivyDocument>(WRITER_MEMORY).unwrap();
        for (i, c) in chunks.iter().enumerate() {
            writer
                .add_document(doc!(text => terms(&c.text).join(" "), ord => i as u64))
                .unwrap();
            writer.commit().unwrap();
        }
        writer.wait_merging_threads().unwrap();
        let index = ContextIndex::with_reader(index, text, heading, ord, chunks).unwrap();
        assert_eq!(index.compact().unwrap(), (3, 1));
        let hits = index.search(&weigh(&[("coffee", 1.0)]), 3).unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(index.chunks()[hits[0].1].source, "beta coffee.md");
        assert_eq!(index.num_docs(), 3);
    }
}
