//! The Pinecone tools end to end, continued: guided queries and their
//! router, discovery, several sources, redaction, the JSON-RPC frames
//! written, the schema manifest and cancellation.

use std::time::Duration;

use super::pinecone_harness::*;
use crate::support::pinecone_fake;
use nexus_knowql::mcp::NexusMcp;
use nexus_knowql::mcp::pinecone::{PineconeServer, Profile};
use pinecone_fake::{KEY_A, PineconeFake, Record};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

#[tokio::test]
async fn guided_query_routes_automatically_in_single_key_mode() {
    let h = harness().await;
    let g = h
        .ok(
            "guided_query",
            json!({"user_query": "what does the wg21 papers corpus say about schedulers"}),
        )
        .await;
    let trace = &g["experimental"]["decision_trace"];
    assert_eq!(trace["input_namespace"], Value::Null);
    assert_eq!(trace["routed_namespace"], "wg21-papers");
    assert_eq!(trace["selected_namespace"], "wg21-papers");
    assert_eq!(trace["suggested_tool"], "detailed");
    assert_eq!(trace["selected_tool"], "detailed");
    assert_eq!(trace["rerank_status"], "skipped_no_model");
    assert_eq!(trace["enrich_urls"], true);
    assert!(trace.get("selected_source").is_none());
    assert_eq!(g["result"]["mode"], "query_detailed");
    assert_eq!(g["result"]["results"][0]["document_id"], "P2300R10");
    let keys: Vec<&str> = trace
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "cache_hit",
            "input_namespace",
            "routed_namespace",
            "selected_namespace",
            "ranked_namespaces",
            "suggested_fields",
            "suggested_tool",
            "selected_tool",
            "explanation",
            "enrich_urls",
            "rerank_status"
        ]
    );
}

#[tokio::test]
async fn guided_query_count_override_and_url_enrichment() {
    let h = harness_with(PineconeFake::start().await, |f| {
        let mut c = f.config();
        c.builtin_url_generators = true;
        c
    })
    .await;
    let g = h
        .ok(
            "guided_query",
            json!({"user_query": "how many papers", "namespace": "wg21-papers"}),
        )
        .await;
    assert_eq!(
        g["result"],
        json!({"tool": "count", "namespace": "wg21-papers", "query": "how many papers", "count": 3, "truncated": false})
    );
    assert_eq!(
        g["experimental"]["decision_trace"]["rerank_status"],
        "skipped"
    );
    let g = h.ok("guided_query", json!({"user_query": "list boost release threads", "namespace": "mailing", "preferred_tool": "full"})).await;
    let rows = g["result"]["results"].as_array().unwrap();
    let urls: Vec<&str> = rows.iter().map(|r| r["url"].as_str().unwrap()).collect();
    assert!(
        urls.contains(&"https://lists.boost.org/archives/list/boost@lists.boost.org/message/MSG2/"),
        "{urls:?}"
    );
    assert!(
        urls.contains(
            &"https://lists.boost.org/archives/list/boost-announce@lists.boost.org/message/ABC123/"
        ),
        "{urls:?}"
    );
}

#[tokio::test]
async fn guided_query_reports_failed_rerank_even_when_a_leg_failed() {
    let h = harness_with(PineconeFake::start().await, with_rerank).await;
    h.fake.fail("search:kb-sparse", 400, 1);
    h.fake.fail("rerank", 400, 1);
    let g = h
        .ok(
            "guided_query",
            json!({"user_query": "what does it say about coroutines", "namespace": "wg21-papers"}),
        )
        .await;
    assert_eq!(
        g["experimental"]["decision_trace"]["rerank_status"],
        "failed"
    );
    assert_eq!(g["result"]["experimental"]["hybrid_leg_failed"], "sparse");
}

#[tokio::test]
async fn router_uses_word_boundaries_and_a_threshold() {
    let h = harness().await;
    h.fake.add_empty_namespace("kb", "ai", 0);
    let r = h
        .ok(
            "namespace_router",
            json!({"user_query": "explain the proposal", "top_n": 5}),
        )
        .await;
    assert_eq!(r["recommended_namespace"], Value::Null);
    assert!(
        r["suggestions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["score"] == 0),
        "{r}"
    );
    let r = h
        .ok(
            "namespace_router",
            json!({"user_query": "List WG21 papers by author"}),
        )
        .await;
    assert_eq!(r["recommended_namespace"], "wg21-papers");
    assert_eq!(
        r["suggestions"][0],
        json!({"namespace": "wg21-papers", "score": 4, "record_count": 4, "reasons": ["query mentions namespace name", "field hint: author"]})
    );
    let r = h
        .ok(
            "namespace_router",
            json!({"user_query": "papers from wg21"}),
        )
        .await;
    assert_eq!(
        r["suggestions"][0]["reasons"],
        json!([
            "query matches namespace token: wg21",
            "query matches namespace token: papers"
        ])
    );
    let e = h
        .err(
            "guided_query",
            json!({"user_query": "explain the proposal"}),
        )
        .await;
    assert_eq!(e["code"], "VALIDATION");
    assert_eq!(e["field"], "namespace");
}

#[tokio::test]
async fn discovery_failures_are_errors_and_are_not_cached() {
    let h = harness().await;
    h.fake.fail("stats:kb", 400, 1);
    let e = h.err("list_namespaces", json!({})).await;
    assert_eq!(
        e,
        json!({"code": "PINECONE_ERROR", "message": "Failed to list namespaces", "recoverable": false})
    );
    let ok = h.ok("list_namespaces", json!({})).await;
    assert_eq!(ok["count"], 2);
    assert_eq!(ok["cache_hit"], false);
}

#[tokio::test]
async fn concurrent_cold_calls_share_one_discovery() {
    let h = harness().await;
    h.fake.delay("stats:kb", Duration::from_millis(300));
    let calls = (0..6).map(|_| h.call("list_namespaces", json!({})));
    let results = futures::future::join_all(calls).await;
    assert!(results.iter().all(|(err, body)| !err && body["count"] == 2));
    assert_eq!(h.fake.count("stats:kb"), 1);
}

#[tokio::test]
async fn unknown_source_is_a_validation_error_everywhere() {
    let h = harness().await;
    for tool in ["list_namespaces", "namespace_router", "guided_query"] {
        let e = h
            .err(tool, json!({"source": "nope", "user_query": "papers"}))
            .await;
        assert_eq!(e["code"], "VALIDATION", "{tool}");
        assert_eq!(e["field"], "source", "{tool}");
    }
    let ok = h.ok("list_namespaces", json!({"source": "default"})).await;
    assert_eq!(ok["count"], 2);
}

#[tokio::test]
async fn nested_metadata_values_pass_through() {
    let h = harness().await;
    h.fake.add(vec![Record { index: "kb".into(), namespace: "nested".into(), id: "n1".into(), fields: json!({"document_number": "N1", "extra": {"a": [1, {"b": null}]}, "chunk_text": "nested metadata"}).as_object().cloned().unwrap() }]);
    let q = h
        .ok(
            "query",
            json!({"query_text": "nested", "namespace": "nested", "use_reranking": false}),
        )
        .await;
    assert_eq!(
        q["results"][0]["metadata"]["extra"],
        json!({"a": [1, {"b": null}]})
    );
}

#[tokio::test]
async fn fusion_keeps_both_legs_represented() {
    let h = harness().await;
    let rec = |id: &str, fields: Value| Record {
        index: "kb".into(),
        namespace: "fusion".into(),
        id: id.into(),
        fields: fields.as_object().cloned().unwrap(),
    };
    h.fake.add(vec![
        rec("d1", json!({"document_number": "D1", "fake_dense_score": 0.99, "chunk_text": "semantic neighbour"})),
        rec("d2", json!({"document_number": "D2", "fake_dense_score": 0.98, "chunk_text": "another neighbour"})),
        rec("s1", json!({"document_number": "S1", "fake_dense_score": 0.2, "chunk_text": "alpha beta gamma"})),
        rec("s2", json!({"document_number": "S2", "fake_dense_score": 0.1, "chunk_text": "alpha beta"})),
    ]);
    let q = h.ok("query", json!({"query_text": "alpha beta gamma", "namespace": "fusion", "top_k": 2, "use_reranking": false})).await;
    // Raw scores (dot products of 9 and 6 vs similarities below 1) would return S1, S2 only.
    assert_eq!(ids(&q["results"]), ["D1", "S1"]);
    assert_eq!(q["results"][0]["score"], 0.5);
}

#[tokio::test]
async fn generate_urls_uses_metadata_then_generators() {
    let h = harness_with(PineconeFake::start().await, |f| {
        let mut c = f.config();
        c.profile = Profile::Alliance;
        c.builtin_url_generators = true;
        c
    })
    .await;
    let u = h.ok("generate_urls", json!({"namespace": "mailing", "records": [
        {"metadata": {"doc_id": "boost-announce@lists.boost.org/message/O5VYCDZADVDHK5Z5LAYJBHMDOAFQL7P6"}},
        {"url": " https://x.test/a "},
        {"thread_id": ""},
    ]})).await;
    assert_eq!(u["count"], 3);
    assert_eq!(
        u["results"][0]["url"],
        "https://lists.boost.org/archives/list/boost-announce@lists.boost.org/message/O5VYCDZADVDHK5Z5LAYJBHMDOAFQL7P6/"
    );
    assert_eq!(u["results"][0]["method"], "generated.mailing");
    assert_eq!(
        u["results"][1],
        json!({"index": 1, "url": "https://x.test/a", "method": "metadata.url", "reason": null, "metadata": {"url": " https://x.test/a "}})
    );
    assert_eq!(
        u["results"][2]["reason"],
        "mailing requires doc_id, msg_id, or thread_id to generate URL"
    );
    let s = h.ok("generate_urls", json!({"namespace": "slack-Cpplang", "records": [{"team_id": "T123456789", "channel_id": "C123456", "doc_id": "1234567.890"}]})).await;
    assert_eq!(
        s["results"][0]["url"],
        "https://app.slack.com/client/T123456789/C123456/p1234567890"
    );
    let n = h
        .ok(
            "generate_urls",
            json!({"namespace": "wg21-papers", "records": [{"title": "x"}]}),
        )
        .await;
    assert_eq!(n["results"][0]["method"], "unavailable");
    assert_eq!(
        n["results"][0]["reason"],
        "URL generation is not supported for namespace \"wg21-papers\""
    );
}

#[tokio::test]
async fn gate_expires_and_is_unlocked_by_guided_query() {
    let h = harness_with(PineconeFake::start().await, |f| {
        let mut c = gated(f);
        c.cache_ttl = Duration::from_secs(600);
        c
    })
    .await;
    h.ok(
        "suggest_query_params",
        json!({"namespace": "wg21-papers", "user_query": "list papers"}),
    )
    .await;
    h.ok(
        "count",
        json!({"namespace": "wg21-papers", "query_text": "x"}),
    )
    .await;
    // The gate reads tokio's clock: move it past the gate's lifetime.
    crate::support::mcp::jump_clock(Duration::from_secs(601)).await;
    let e = h
        .err(
            "count",
            json!({"namespace": "wg21-papers", "query_text": "x"}),
        )
        .await;
    assert_eq!(
        e["message"],
        "Previous suggest_query_params context expired. Call suggest_query_params again before query/count tools."
    );
    h.ok(
        "guided_query",
        json!({"user_query": "list papers", "namespace": "mailing"}),
    )
    .await;
    h.ok(
        "query_documents",
        json!({"namespace": "mailing", "query_text": "boost"}),
    )
    .await;
    let nf = h
        .ok(
            "suggest_query_params",
            json!({"namespace": "nope", "user_query": "x"}),
        )
        .await;
    assert_eq!(nf["namespace_found"], false);
    let e = h
        .err("query", json!({"namespace": "nope", "query_text": "x"}))
        .await;
    assert_eq!(
        e["code"], "FLOW_GATE",
        "not-found suggestions do not open the gate"
    );
}

#[tokio::test]
async fn multi_source_lists_aggregates_and_resolves() {
    let h = harness_with(PineconeFake::start().await, PineconeFake::multi_config).await;
    let tools = h.client.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "list_sources"));
    let s = h.ok("list_sources", json!({})).await;
    assert_eq!(
        s,
        json!({"status": "success", "sources": [{"name": "src_a", "description": "public papers"}, {"name": "src_b"}], "default": "src_a"})
    );
    let l = h.ok("list_namespaces", json!({})).await;
    let rows: Vec<(String, String)> = l["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["source"].as_str().unwrap().to_owned(),
                n["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(rows.len(), 4);
    assert!(rows.contains(&("src_b".into(), "internal".into())));
    let e = h
        .err(
            "query",
            json!({"query_text": "x", "namespace": "wg21-papers"}),
        )
        .await;
    assert_eq!(
        e["message"],
        "Namespace \"wg21-papers\" exists on multiple sources. Pass source explicitly."
    );
    assert_eq!(e["field"], "namespace");
    let q = h.ok("query", json!({"query_text": "release planning", "namespace": "internal", "use_reranking": false})).await;
    assert_eq!(q["source"], "src_b");
    assert_eq!(q["results"][0]["source"], "src_b");
    let q = h.ok("query", json!({"query_text": "schedulers", "namespace": "wg21-papers", "source": "src_b", "use_reranking": false})).await;
    assert_eq!(q["results"][0]["document_id"], "P9999R0");
    let e = h
        .err(
            "query",
            json!({"query_text": "x", "namespace": "internal", "source": "src_a"}),
        )
        .await;
    assert_eq!(
        e["message"],
        "Namespace \"internal\" not found on source \"src_a\"."
    );
    let g = h
        .ok(
            "guided_query",
            json!({"user_query": "internal release planning notes"}),
        )
        .await;
    assert_eq!(
        g["experimental"]["decision_trace"]["selected_source"],
        "src_b"
    );
}

#[tokio::test]
async fn multi_source_partial_failure_is_reported_redacted() {
    let h = harness_with(PineconeFake::start().await, |f| {
        let mut c = f.multi_config();
        c.sources[0].namespaces = vec![("api_key=hunter22secret".into(), Default::default())];
        c
    })
    .await;
    h.fake.fail("stats:kb2", 400, 1);
    let l = h.ok("list_namespaces", json!({})).await;
    assert_eq!(l["cache_hit"], false);
    let err = l["source_errors"]["src_b"].as_str().unwrap();
    assert!(err.contains("HTTP 400"), "{err}");
    assert!(!err.contains(pinecone_fake::KEY_B), "{err}");
    let warning = l["config_warnings"][0].as_str().unwrap();
    assert!(!warning.contains("hunter22secret"), "{warning}");
    assert_eq!(l["count"], 2);
    h.fake.fail("stats:kb2", 400, 1);
    // Discovery of src_b is retried (failures are not cached) and fails again.
    let e = h
        .err("query", json!({"query_text": "x", "namespace": "mailing"}))
        .await;
    assert_eq!(e["field"], "source");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with("Namespace discovery is incomplete")
    );
}

#[tokio::test]
async fn error_details_are_redacted() {
    let h = harness_with(PineconeFake::start().await, |f| {
        let mut c = f.config();
        c.error_details = true;
        c
    })
    .await;
    h.fake.fail("stats:kb", 401, 1);
    let e = h.err("list_namespaces", json!({})).await;
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("HTTP 401"), "{m}");
    assert!(!m.contains(KEY_A) && !m.contains("pcsk_"), "{m}");
}

#[tokio::test]
async fn the_server_writes_only_json_rpc_frames() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let fake = PineconeFake::start().await;
    let server = PineconeServer::new(fake.config()).unwrap();
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let (read, mut write) = tokio::io::split(client_io);
    let mut lines = BufReader::new(read).lines();
    let frames = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "list_namespaces", "arguments": {}}}),
    ];
    for frame in frames {
        write
            .write_all(format!("{frame}\n").as_bytes())
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
    {
        let msg: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("non-JSON output ({e}): {line}"));
        assert_eq!(msg["jsonrpc"], "2.0", "{line}");
        let done = msg["id"] == 2;
        seen.push(msg);
        if done {
            break;
        }
    }
    assert_eq!(seen.first().unwrap()["id"], 1);
    assert_eq!(
        seen.last().unwrap()["result"]["structuredContent"]["count"],
        2
    );
}

#[tokio::test]
async fn the_schema_manifest_declares_namespaces_and_its_problems_are_warnings() {
    let h = harness().await;
    h.fake.set_manifest("kb", r#"{"description": "corpus", "namespaces": {"mailing": {"description": "mailing-list threads", "metadata_schema": {"doc_id": "string"}}, "gone": {}}, "record_count": 3}"#);
    let l = h.ok("list_namespaces", json!({})).await;
    let mailing = &l["namespaces"][1];
    assert_eq!(mailing["schema_source"], "declared");
    assert_eq!(mailing["metadata_fields"], json!({"doc_id": "string"}));
    assert_eq!(mailing["description"], "mailing-list threads");
    assert_eq!(l["namespaces"][0]["schema_source"], "sampled");
    assert_eq!(
        l["config_warnings"],
        json!([
            "Declared namespace \"gone\" not found in Pinecone index \"kb\" — schema declaration is stale."
        ])
    );
    assert_eq!(
        h.fake.count("query:kb"),
        1,
        "only the undeclared namespace is sampled"
    );

    let h = harness().await;
    h.fake.set_manifest("kb", "{not json");
    let l = h.ok("list_namespaces", json!({})).await;
    let warning = l["config_warnings"][0].as_str().unwrap();
    assert!(warning.starts_with("Source \"default\": _mcp_config schema manifest in chunk_text is malformed (invalid JSON:"), "{warning}");
    assert_eq!(l["count"], 2);

    let h = harness_with(PineconeFake::start().await, |f| {
        let mut c = f.config();
        c.remote_schema = false;
        c
    })
    .await;
    h.ok("list_namespaces", json!({})).await;
    assert_eq!(h.fake.count("fetch:kb"), 0);
}

// ---------------------------------------------------------------------------
// Namespaces, cancellation, --check-indexes.

#[tokio::test]
async fn namespaces_that_would_change_the_request_path_are_validation_errors() {
    let h = harness().await;
    for bad in [".", "..", "a/b", "../kb"] {
        for (tool, args) in [
            ("query", json!({"query_text": "senders", "namespace": bad})),
            (
                "keyword_search",
                json!({"query_text": "senders", "namespace": bad}),
            ),
            ("count", json!({"query_text": "senders", "namespace": bad})),
            (
                "query_documents",
                json!({"query_text": "senders", "namespace": bad}),
            ),
            (
                "guided_query",
                json!({"user_query": "senders", "namespace": bad}),
            ),
        ] {
            let body = h.err(tool, args).await;
            assert_eq!(body["code"], "VALIDATION", "{tool} {bad:?}: {body}");
            assert_eq!(body["field"], "namespace", "{tool} {bad:?}: {body}");
        }
    }
    assert_eq!(h.fake.count("search:kb"), 0);
    assert_eq!(h.fake.count("search:kb-sparse"), 0);
}

#[tokio::test]
async fn a_cancelled_tool_call_stops_before_its_next_pinecone_call() {
    let fake = PineconeFake::start().await;
    let server = NexusMcp::new().with_pinecone(PineconeServer::new(with_rerank(&fake)).unwrap());
    let metrics = std::sync::Arc::clone(server.metrics());
    let client = crate::support::mcp::connect(server).await;
    fake.delay("search:kb", Duration::from_millis(1500));
    fake.delay("search:kb-sparse", Duration::from_millis(1500));
    let params = |text: &str| {
        CallToolRequestParams::new("query").with_arguments(
            json!({"query_text": text, "namespace": "wg21-papers"})
                .as_object()
                .cloned()
                .unwrap(),
        )
    };
    // Dropping the call makes rmcp's client send notifications/cancelled.
    let outcome = tokio::time::timeout(
        Duration::from_millis(400),
        client.call_tool(params("senders receivers")),
    )
    .await;
    assert!(outcome.is_err(), "the call should still be running");
    assert_eq!(fake.count("search:kb"), 1);
    // Had the call gone on, rerank would follow the searches before the
    // call's end is recorded.
    let ended = crate::support::mcp::ended_call(&metrics, "query", Duration::from_secs(10)).await;
    assert_eq!(ended, "CANCELLED");
    assert_eq!(fake.count("rerank"), 0, "work went on after cancellation");
    // The server still answers.
    fake.delay("search:kb", Duration::ZERO);
    fake.delay("search:kb-sparse", Duration::ZERO);
    let answer = client.call_tool(params("senders")).await.unwrap();
    assert_ne!(answer.is_error, Some(true), "{answer:?}");
    assert_eq!(fake.count("rerank"), 1);
}
