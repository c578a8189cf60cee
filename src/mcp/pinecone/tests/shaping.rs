//! Routing, suggestions, URL generators, fusion, counting and reassembly.

use serde_json::{Map, Value, json};

use super::obj;
use crate::mcp::pinecone::discovery::{NamespaceRow, SchemaSource};
use crate::mcp::pinecone::documents::reassemble;
use crate::mcp::pinecone::fusion::{Hit, fuse};
use crate::mcp::pinecone::router::{rank, recommend};
use crate::mcp::pinecone::search::count_documents;
use crate::mcp::pinecone::suggest::{SuggestedTool, suggest};
use crate::mcp::pinecone::urls::{UrlMethod, mailing_url, slack_url};

fn ns(name: &str, count: u64, fields: &[&str]) -> NamespaceRow {
    NamespaceRow {
        name: name.into(),
        source: None,
        record_count: count,
        metadata_fields: fields
            .iter()
            .map(|f| ((*f).to_owned(), json!("string")))
            .collect(),
        schema_source: SchemaSource::Sampled,
        description: None,
    }
}

#[test]
fn router_ranks_by_score_then_smaller_namespace() {
    let rows = [
        ns("big-papers", 900, &[]),
        ns("papers", 10, &[]),
        ns("slack", 5, &["author"]),
    ];
    let ranked = rank("papers by author", &rows);
    let order: Vec<&str> = ranked.iter().map(|r| r.namespace.as_str()).collect();
    assert_eq!(order, ["papers", "big-papers", "slack"]);
    assert_eq!(
        (ranked[0].score, ranked[1].score, ranked[2].score),
        (3, 2, 1)
    );
    assert_eq!(recommend(&ranked).unwrap().namespace, "papers");
    let only_field = rank("by author", &rows);
    assert!(
        recommend(&only_field).is_none(),
        "a field hint alone does not route"
    );
    assert_eq!(
        recommend(&rank("anything", &[ns("solo", 1, &[])]))
            .unwrap()
            .namespace,
        "solo"
    );
    assert_eq!(
        rank("explain", &[ns("ai", 1, &[]), ns("b", 1, &[])])[0].score,
        0,
        "no substring matches"
    );
}

#[test]
fn suggestion_heuristics() {
    let fields = obj(
        json!({"document_number": "string", "title": "string", "url": "string", "author": "string[]", "chunk_text": "string", "year": "number"}),
    );
    let s = suggest(Some(&fields), "How many papers by Jane?");
    assert_eq!(
        (s.recommended_tool, s.use_count_tool),
        (SuggestedTool::Count, true)
    );
    assert_eq!(s.suggested_fields, ["document_number", "url"]);
    let s = suggest(Some(&fields), "summarize the proposal");
    assert_eq!(s.recommended_tool, SuggestedTool::Detailed);
    assert_eq!(
        s.suggested_fields,
        ["document_number", "title", "url", "author", "chunk_text"]
    );
    let s = suggest(Some(&fields), "list recent papers");
    assert_eq!(s.recommended_tool, SuggestedTool::Fast);
    assert_eq!(
        s.suggested_fields,
        ["document_number", "title", "url", "author"]
    );
    let s = suggest(None, "x");
    assert!(!s.namespace_found);
    let other = obj(
        json!({"a": "string", "b": "string", "c": "string", "d": "string", "e": "string", "f": "string"}),
    );
    assert_eq!(suggest(Some(&other), "list").suggested_fields.len(), 5);
    assert_eq!(
        suggest(Some(&other), "show the text")
            .suggested_fields
            .len(),
        6
    );
    assert!(suggest(Some(&Map::new()), "x").namespace_found);
}

// ---- URL generators ------------------------------------------------------

#[test]
fn builtin_url_generators() {
    let m = mailing_url(&obj(
        json!({"list_name": "boost@lists.boost.org", "msg_id": "M1"}),
    ));
    assert_eq!(
        m.url.as_deref(),
        Some("https://lists.boost.org/archives/list/boost@lists.boost.org/message/M1/")
    );
    let m = mailing_url(&obj(json!({"thread_id": " T9 "})));
    assert_eq!(
        m.url.as_deref(),
        Some("https://lists.boost.org/archives/list/T9/")
    );
    let s = slack_url(&obj(json!({"source": "https://slack/x", "team_id": "T"})));
    assert_eq!(
        (s.url.as_deref(), s.method),
        (Some("https://slack/x"), UrlMethod::MetadataSource)
    );
    let s = slack_url(&obj(json!({"team_id": "T"})));
    assert_eq!(
        s.reason.as_deref(),
        Some("slack-Cpplang requires team_id, channel_id, and doc_id (or source)")
    );
}

// ---- fusion, counting, reassembly ---------------------------------------

fn hit(id: &str, score: f64, meta: Value, content: &str) -> Hit {
    Hit {
        id: id.into(),
        score,
        content: content.into(),
        metadata: obj(meta),
    }
}

#[test]
fn fusion_dedupes_by_id_and_orders_by_rank() {
    let out = fuse(
        vec![
            hit("a", 0.9, json!({}), "a"),
            hit("b", 0.5, json!({}), "b-dense"),
        ],
        vec![
            hit("b", 7.0, json!({}), "b-sparse"),
            hit("c", 5.0, json!({}), "c"),
        ],
    );
    let ids: Vec<&str> = out.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(ids, ["b", "a", "c"]);
    assert_eq!(
        out[0].content, "b-sparse",
        "the copy with the higher raw score is kept"
    );
}

#[test]
fn count_uses_identifier_fields_then_ids() {
    let hits = [
        hit("1", 1.0, json!({"document_number": "D1"}), ""),
        hit("2", 1.0, json!({"document_number": "D1", "url": "u"}), ""),
        hit("3", 1.0, json!({"url": "u"}), ""),
        hit("4", 1.0, json!({"doc_id": ""}), ""),
        hit("5", 1.0, json!({}), ""),
        hit("5", 1.0, json!({}), ""),
    ];
    let c = count_documents(&hits, "ns");
    assert_eq!(c.count, 4);
    assert!(!c.truncated);
}

#[test]
fn reassembly_groups_orders_and_caps() {
    let hits = [
        hit(
            "x2",
            0.4,
            json!({"doc_id": "X", "chunk_index": "2"}),
            "third",
        ),
        hit("y", 0.9, json!({"url": "Y"}), "only"),
        hit(
            "x0",
            0.8,
            json!({"doc_id": "X", "chunk_index": 0}),
            " first ",
        ),
        hit("x-", 0.1, json!({"doc_id": "X"}), "unordered"),
        hit("x1", 0.3, json!({"doc_id": "X", "start_index": 1}), ""),
        hit("", 0.3, json!({}), "no key"),
    ];
    let docs = reassemble(&hits, 5, 3);
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0].document_id, "Y");
    let x = &docs[1];
    assert_eq!(
        x.merged_content, "first\n\nthird",
        "blank chunks are dropped, the cap keeps the first three"
    );
    assert_eq!(x.chunk_count, 3);
    assert_eq!(x.best_score, 0.8);
    assert_eq!(reassemble(&hits, 1, 200).len(), 1);
}
