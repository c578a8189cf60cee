//! The Pinecone tools end to end: an rmcp client over `tokio::io::duplex`
//! talking to `PineconeServer`, which talks to the in-process Pinecone fake.

use std::time::Duration;

use super::pinecone_harness::*;
use crate::support::pinecone_fake;
use pinecone_fake::{KEY_A, PineconeFake, Record};
use serde_json::json;

#[tokio::test]
async fn tools_are_listed_read_only_with_output_schemas() {
    let h = harness().await;
    let tools = h.client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "count",
            "generate_urls",
            "guided_query",
            "keyword_search",
            "list_namespaces",
            "namespace_router",
            "query",
            "query_documents",
            "suggest_query_params"
        ]
    );
    for t in &tools {
        let a = t.annotations.as_ref().expect("annotations");
        assert_eq!(a.read_only_hint, Some(true), "{}", t.name);
        assert_eq!(a.destructive_hint, Some(false), "{}", t.name);
        let schema = t
            .output_schema
            .as_ref()
            .unwrap_or_else(|| panic!("output schema of {}", t.name));
        assert_eq!(schema["type"], "object", "{}", t.name);
    }
    let info = h.client.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|s| s.name.as_str()),
        Some("Pinecone Read-Only MCP")
    );
}

#[tokio::test]
async fn list_namespaces_reports_fields_hides_reserved_namespace_and_caches() {
    let h = harness().await;
    let first = h.ok("list_namespaces", json!({})).await;
    assert_eq!(first["status"], "success");
    assert_eq!(first["cache_hit"], false);
    assert_eq!(first["count"], 2);
    let names: Vec<&str> = first["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["wg21-papers", "mailing"]);
    let papers = &first["namespaces"][0];
    assert_eq!(papers["record_count"], 4);
    assert_eq!(papers["metadata_fields"]["author"], "string[]");
    assert_eq!(papers["metadata_fields"]["chunk_index"], "number");
    assert_eq!(papers["metadata_fields"]["chunk_text"], "string");
    assert_eq!(papers["schema_source"], "sampled");
    assert!(
        papers.get("source").is_none(),
        "single-key rows carry no source"
    );
    assert!(first["cache_ttl_seconds"].as_u64().unwrap() > 1700);
    assert!(first["expires_at_iso"].as_str().unwrap().ends_with('Z'));
    // Time passes (an answer computed per call would show it).
    crate::support::mcp::jump_clock(std::time::Duration::from_secs(2)).await;
    let second = h.ok("list_namespaces", json!({})).await;
    assert_eq!(second["cache_hit"], true);
    assert_eq!(h.fake.count("stats:kb"), 1);
    // One cache entry expires at one instant, whenever it is asked (its
    // text is written once per entry).
    assert_eq!(second["expires_at_iso"], first["expires_at_iso"]);
}

#[tokio::test]
async fn suggest_then_query_passes_the_gate_and_reranks() {
    let h = harness_with(PineconeFake::start().await, gated).await;
    let gate = h
        .err(
            "query",
            json!({"query_text": "schedulers", "namespace": " wg21-papers "}),
        )
        .await;
    assert_eq!(
        gate,
        json!({"code": "FLOW_GATE", "message": "Flow requires suggest_query_params first. Call suggest_query_params with namespace and user_query before query/count tools.", "recoverable": true, "suggestion": "Call suggest_query_params for namespace 'wg21-papers' first"})
    );
    let s = h.ok("suggest_query_params", json!({"namespace": " wg21-papers ", "user_query": "what does P2300 say about schedulers"})).await;
    assert_eq!(s["namespace_found"], true);
    assert_eq!(s["recommended_tool"], "detailed");
    assert_eq!(
        s["suggested_fields"],
        json!(["document_number", "title", "url", "author", "chunk_text"])
    );
    let q = h
        .ok(
            "query",
            json!({"query_text": "schedulers ", "namespace": "wg21-papers", "preset": "detailed"}),
        )
        .await;
    assert_eq!(q["mode"], "query_detailed");
    assert_eq!(q["query"], "schedulers ", "the query is echoed as given");
    assert_eq!(q["results"][0]["reranked"], true);
    assert_eq!(q["results"][0]["document_id"], "P2300R10");
    assert_eq!(q["results"][0]["paper_number"], "P2300R10");
    assert_eq!(q["results"][0]["author"], "Michal Dominiak,Eric Niebler");
    assert!(q.get("experimental").is_none(), "nothing degraded: {q}");
    assert!(q["results"][0]["metadata"].get("chunk_text").is_none());
    assert_eq!(h.fake.count("rerank"), 1);
}

#[tokio::test]
async fn empty_query_text_is_a_validation_error() {
    let h = harness().await;
    let e = h
        .err(
            "query",
            json!({"query_text": "  ", "namespace": "wg21-papers"}),
        )
        .await;
    assert_eq!(
        e,
        json!({"code": "VALIDATION", "message": "Query text cannot be empty", "recoverable": true, "field": "query_text"})
    );
    let e = h
        .err("count", json!({"query_text": "x", "namespace": " "}))
        .await;
    assert_eq!(e["field"], "namespace");
    assert_eq!(
        e["suggestion"],
        "Use a namespace name from list_namespaces (trimmed)."
    );
    let e = h
        .err(
            "keyword_search",
            json!({"query_text": "x", "namespace": " "}),
        )
        .await;
    assert_eq!(e["message"], "Namespace cannot be empty");
    let e = h
        .err(
            "query",
            json!({"query_text": "x", "namespace": "wg21-papers", "top_k": 101}),
        )
        .await;
    assert_eq!(e["field"], "top_k");
}

#[tokio::test]
async fn argument_type_errors_are_validation_tool_errors_naming_the_field() {
    let h = harness().await;
    let e = h
        .err(
            "query",
            json!({"query_text": "x", "namespace": "wg21-papers", "top_k": "ten"}),
        )
        .await;
    assert_eq!(e["code"], "VALIDATION");
    assert_eq!(e["field"], "top_k");
    // The caller is told the JSON type to send, not a Rust type.
    let message = e["message"].as_str().unwrap();
    assert!(message.ends_with("expected integer"), "{e}");
    let e = h
        .err(
            "query",
            json!({"query_text": "x", "namespace": "wg21-papers", "use_reranking": "yes"}),
        )
        .await;
    assert!(
        e["message"].as_str().unwrap().ends_with("expected boolean"),
        "{e}"
    );
    let e = h.err("query", json!({"query_text": "x"})).await;
    assert_eq!(e["code"], "VALIDATION");
    assert_eq!(e["field"], "namespace");
    let e = h
        .err(
            "query",
            json!({"query_text": "x", "namespace": "n", "preset": "turbo"}),
        )
        .await;
    assert_eq!(e["field"], "preset");
    let e = h
        .err(
            "generate_urls",
            json!({"namespace": "mailing", "records": [{}, 3]}),
        )
        .await;
    assert_eq!(e["field"], "records.1");
}

#[tokio::test]
async fn metadata_filter_errors_name_the_path_and_filters_are_forwarded() {
    let h = harness().await;
    let e = h.err("query", json!({"query_text": "x", "namespace": "wg21-papers", "metadata_filter": {"year": {"$regex": "a"}}})).await;
    assert_eq!(e["field"], "year.$regex");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with("Unknown filter operator \"$regex\" at \"year\".")
    );
    let e = h.err("count", json!({"query_text": "x", "namespace": "wg21-papers", "metadata_filter": {"tags": {"$in": []}}})).await;
    assert_eq!(e["field"], "tags.$in");
    let filter = json!({"author": {"$in": ["Jane Doe"]}});
    let c = h.ok("count", json!({"query_text": "anything", "namespace": "wg21-papers", "metadata_filter": filter})).await;
    assert_eq!(c["count"], 1);
    assert_eq!(c["metadata_filter"], filter);
    let sent = h.fake.requests("search:kb");
    assert_eq!(sent.last().unwrap()["body"]["query"]["filter"], filter);
}

#[tokio::test]
async fn count_dedupes_documents_and_reports_truncation() {
    let h = harness().await;
    let c = h
        .ok(
            "count",
            json!({"query_text": "anything", "namespace": "wg21-papers"}),
        )
        .await;
    assert_eq!(
        c,
        json!({"status": "success", "count": 3, "truncated": false, "namespace": "wg21-papers"})
    );
    let body = &h.fake.requests("search:kb")[0]["body"];
    assert_eq!(body["query"]["top_k"], 10_000);
    assert_eq!(body["fields"], json!(["document_number", "url", "doc_id"]));
    h.fake.add(
        (0..10_000)
            .map(|i| Record {
                index: "kb".into(),
                namespace: "big".into(),
                id: format!("b{i}"),
                fields: json!({"document_number": format!("D{}", i % 40), "chunk_text": "x"})
                    .as_object()
                    .cloned()
                    .unwrap(),
            })
            .collect(),
    );
    let c = h
        .ok("count", json!({"query_text": "x", "namespace": "big"}))
        .await;
    assert_eq!(c["count"], 40);
    assert_eq!(c["truncated"], true);
}

#[tokio::test]
async fn one_failed_leg_keeps_the_other_legs_results() {
    let h = harness().await;
    h.fake.fail("search:kb-sparse", 400, 1);
    let q = h.ok("query", json!({"query_text": "exception safety", "namespace": "wg21-papers", "use_reranking": false})).await;
    assert_eq!(ids(&q["results"])[0], "P1234R0");
    assert_eq!(q["experimental"], json!({"hybrid_leg_failed": "sparse"}));
    // The dense leg fails and the sparse leg finds nothing: degraded.
    h.fake.fail("search:kb", 400, 1);
    let q = h
        .ok(
            "query",
            json!({"query_text": "zzz", "namespace": "wg21-papers", "use_reranking": false}),
        )
        .await;
    assert_eq!(q["result_count"], 0);
    assert_eq!(
        q["experimental"],
        json!({"degraded": true, "degradation_reason": "dense_leg_failed", "hybrid_leg_failed": "dense"})
    );
}

#[tokio::test]
async fn both_legs_failing_is_a_pinecone_error_with_the_fixed_message() {
    let h = harness().await;
    h.fake.fail("search:kb", 400, 1);
    h.fake.fail("search:kb-sparse", 400, 1);
    let e = h
        .err(
            "query",
            json!({"query_text": "x", "namespace": "wg21-papers"}),
        )
        .await;
    assert_eq!(
        e,
        json!({"code": "PINECONE_ERROR", "message": "An error occurred while processing your query", "recoverable": false})
    );
}

#[tokio::test]
async fn missing_rerank_model_is_reported_not_degraded() {
    let h = harness().await;
    let q = h
        .ok(
            "query",
            json!({"query_text": "coroutines", "namespace": "wg21-papers", "use_reranking": true}),
        )
        .await;
    assert_eq!(q["results"][0]["reranked"], false);
    assert_eq!(q["experimental"]["rerank_skipped_reason"], "no_model");
    assert!(
        q["experimental"]["degradation_reason"]
            .as_str()
            .unwrap()
            .starts_with("rerank_skipped_no_model:")
    );
    assert!(q["experimental"].get("degraded").is_none());
    assert_eq!(h.fake.count("rerank"), 0);
}

#[tokio::test]
async fn failed_rerank_degrades_to_fused_order_after_retries() {
    let h = harness_with(PineconeFake::start().await, with_rerank).await;
    h.fake.fail("rerank", 503, 3);
    let q = h
        .ok(
            "query",
            json!({"query_text": "coroutines", "namespace": "wg21-papers", "top_k": 2}),
        )
        .await;
    assert_eq!(q["result_count"], 2);
    assert_eq!(q["results"][0]["reranked"], false);
    assert_eq!(q["experimental"]["degraded"], true);
    let reason = q["experimental"]["degradation_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("rerank_failed: rerank failed with HTTP 503"),
        "{reason}"
    );
    assert!(!reason.contains(KEY_A), "the key is redacted: {reason}");
    assert_eq!(h.fake.count("rerank"), 3, "one call and two retries");
}

#[tokio::test]
async fn transient_503_is_retried_and_requests_carry_key_and_version() {
    let h = harness().await;
    h.fake.fail("search:kb", 503, 2);
    let q = h
        .ok(
            "keyword_search",
            json!({"query_text": "coroutines", "namespace": "wg21-papers"}),
        )
        .await;
    assert_eq!(q["index"], "kb-sparse");
    assert_eq!(ids(&q["results"]), ["P0001R0"]);
    let q = h
        .ok(
            "query",
            json!({"query_text": "coroutines", "namespace": "wg21-papers", "use_reranking": false}),
        )
        .await;
    assert!(
        q.get("experimental").is_none(),
        "the dense leg recovered: {q}"
    );
    assert_eq!(h.fake.count("search:kb"), 3);
    assert!(
        h.fake
            .headers()
            .iter()
            .all(|(k, v)| k == KEY_A && v == "2026-04")
    );
}

#[tokio::test]
async fn a_passed_deadline_is_a_timeout_error() {
    let h = harness_with(PineconeFake::start().await, |f| {
        let mut c = f.config();
        c.request_timeout = Duration::from_millis(200);
        c
    })
    .await;
    h.fake.delay("search:kb", Duration::from_secs(5));
    h.fake.delay("search:kb-sparse", Duration::from_secs(5));
    let started = std::time::Instant::now();
    let e = h
        .err(
            "query",
            json!({"query_text": "x", "namespace": "wg21-papers"}),
        )
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the deadline cancels the call"
    );
    assert_eq!(e["code"], "TIMEOUT");
    assert_eq!(e["recoverable"], true);
    assert_eq!(
        e["suggestion"],
        "Retry the request, or increase --pinecone-request-timeout-ms."
    );
}

#[tokio::test]
async fn query_documents_reranks_only_when_asked_or_configured() {
    // No model configured: nothing is reranked and nothing is reported.
    let h = harness().await;
    let d = h
        .ok(
            "query_documents",
            json!({"query_text": "coroutines", "namespace": "wg21-papers"}),
        )
        .await;
    assert!(d.get("experimental").is_none(), "{d}");
    // Asked for without a model: the skip is reported.
    let d = h
        .ok(
            "query_documents",
            json!({"query_text": "coroutines", "namespace": "wg21-papers", "use_reranking": true}),
        )
        .await;
    assert_eq!(
        d["experimental"]["rerank_skipped_reason"], "no_model",
        "{d}"
    );
    assert_eq!(h.fake.requests("rerank").len(), 0);
    // A model configured: reranked unless declined.
    let h = harness_with(PineconeFake::start().await, with_rerank).await;
    let q = json!({"query_text": "coroutines", "namespace": "wg21-papers"});
    h.ok("query_documents", q.clone()).await;
    assert_eq!(h.fake.requests("rerank").len(), 1);
    let mut declined = q;
    declined["use_reranking"] = json!(false);
    h.ok("query_documents", declined).await;
    assert_eq!(h.fake.requests("rerank").len(), 1);
}

#[tokio::test]
async fn query_documents_reassembles_chunks_in_document_order() {
    let h = harness_with(PineconeFake::start().await, with_rerank).await;
    let d = h.ok("query_documents", json!({"query_text": "schedulers senders execution", "namespace": "wg21-papers", "top_k": 2})).await;
    let doc = &d["documents"][0];
    assert_eq!(doc["document_id"], "P2300R10");
    assert_eq!(doc["chunk_count"], 2);
    assert_eq!(
        doc["merged_content"],
        "std::execution proposes senders and receivers for asynchronous execution.\n\nSchedulers and senders: the second part describes scheduler concepts."
    );
    assert_eq!(d["result_count"], 2);
}

#[tokio::test]
async fn query_documents_fetches_beyond_100_chunks_and_reranks_in_batches_of_id_and_text() {
    let h = harness_with(PineconeFake::start().await, with_rerank).await;
    h.fake.add(many_chunks("bulk", 150, "bulk chunk text"));
    let d = h
        .ok(
            "query_documents",
            json!({"query_text": "bulk chunk", "namespace": "bulk", "top_k": 20}),
        )
        .await;
    assert_eq!(
        h.fake.requests("search:kb")[0]["body"]["query"]["top_k"],
        500
    );
    let total: u64 = d["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["chunk_count"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 150, "every chunk is kept, not only 100");
    let reranks = h.fake.requests("rerank");
    let sizes: Vec<usize> = reranks
        .iter()
        .map(|r| r["documents"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes.iter().sum::<usize>(), 150);
    assert!(sizes.iter().all(|s| *s <= 100), "{sizes:?}");
    for r in &reranks {
        for doc in r["documents"].as_array().unwrap() {
            let mut keys: Vec<&str> = doc
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            keys.sort_unstable();
            assert_eq!(keys, ["_id", "chunk_text"]);
        }
    }
}

#[tokio::test]
async fn merged_content_is_capped_by_the_payload_budget() {
    let h = harness().await;
    let long = "word ".repeat(400);
    h.fake.add(many_chunks("long", 90, &long));
    let d = h
        .ok(
            "query_documents",
            json!({"query_text": "word", "namespace": "long", "top_k": 3}),
        )
        .await;
    let docs = d["documents"].as_array().unwrap();
    for doc in docs {
        assert!(doc["merged_content"].as_str().unwrap().chars().count() <= 20_000);
        assert_eq!(doc["content_truncated"], true);
    }
}
