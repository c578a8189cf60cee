//! The Nexus tools end to end: rmcp's client (in process) and JSON-RPC over
//! Streamable HTTP, against an in-process `LocalNexus` serving the shipped
//! corpus.

use std::time::Duration;

use crate::support::mcp as mcp_support;
use crate::support::wait::until_some;
use mcp_support::*;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::mcp::http::{self, HttpOptions};
use nexus_knowql::mcp::{KeyPolicy, NexusMcp, NexusServer};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");

async fn local_nexus() -> LocalNexus {
    LocalNexus::builder()
        .context("docs", CORPUS)
        // Slow the turn a little so a wait observes it in progress.
        .frame_delay(Duration::from_millis(20))
        .start()
        .await
        .expect("local nexus starts")
}

#[tokio::test]
async fn tools_over_rmcp_answer_from_the_local_nexus() {
    let nexus = local_nexus().await;
    let client = connect_nexus(nexus.base_url()).await;

    let listed = call(&client, "list_contexts", json!({})).await;
    let contexts = text_json(&listed);
    let docs = contexts
        .as_array()
        .and_then(|a| a.iter().find(|c| c["slug"] == "docs"))
        .expect("docs is listed");
    assert_eq!(
        docs["queryable"], true,
        "a curated search context is queryable"
    );
    assert!(docs["last_curated_at"].is_string());

    let started = call(
        &client,
        "query_context",
        json!({"context": "docs", "question": "How do I resume a stream?"}),
    )
    .await;
    let started = started.structured_content.expect("structured content");
    let query_id = started["query_id"].as_str().expect("query id").to_owned();
    assert_eq!(started["model"], "local-extractive");

    // Poll the way the tool description tells agents to.
    let done = until_some(Duration::from_secs(5), "the turn ending", async || {
        let r = call(&client, "get_query", json!({"query_id": query_id})).await;
        let v = r.structured_content.expect("structured content");
        if v["status"] != "in_progress" {
            return Some(v);
        }
        assert!(v["answer"].is_null(), "no answer before completion");
        None
    })
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    let answer = done["answer"].as_str().expect("an answer");
    assert!(answer.contains("Last-Event-ID"), "{answer}");
    let citations = done["citations"].as_array().expect("citations");
    assert!(
        citations.iter().any(|c| c["source"] == "streaming.md"),
        "{citations:?}"
    );

    let missing = call(&client, "get_query", json!({"query_id": "qry_nope"})).await;
    assert_eq!(tool_error(&missing)["code"], "NOT_FOUND");
    let unknown = call(
        &client,
        "query_context",
        json!({"context": "nope", "question": "anything"}),
    )
    .await;
    assert_eq!(tool_error(&unknown)["code"], "NOT_FOUND");
    nexus.shutdown().await;
}

#[tokio::test]
async fn http_wait_seconds_streams_the_local_turns_steps() {
    let nexus = local_nexus().await;
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(nexus.base_url())).with_key_policy(KeyPolicy::Caller {
            fallback_to_configured: false,
        }),
    );
    let listener = http::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let url = format!(
        "http://{}{}",
        listener.local_addr().unwrap(),
        http::MCP_PATH
    );
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    tokio::spawn(
        async move { http::serve(listener, server, &HttpOptions::default(), token).await },
    );

    let mut mcp =
        HttpMcp::new(&url).header("X-Pinecone-Api-Key", "pcsk_local_caller_key_0123456789");
    mcp.initialize().await;
    let started = mcp
        .call(
            "query_context",
            json!({"context": "docs", "question": "Which header resumes a stream?"}),
        )
        .await;
    let query_id = started["structuredContent"]["query_id"]
        .as_str()
        .expect("query id")
        .to_owned();
    let (id, answer) = mcp
        .request(
            "tools/call",
            json!({
                "name": "get_query",
                "arguments": {"query_id": query_id, "wait_seconds": 30},
                "_meta": {"progressToken": "p-1"}
            }),
        )
        .await;
    let result = &answer.response(id)["result"]["structuredContent"];
    assert_eq!(result["status"], "completed", "{result}");
    assert!(result["answer"].as_str().is_some_and(|a| !a.is_empty()));
    let progress = answer.notifications("notifications/progress");
    assert!(!progress.is_empty(), "the wait reported the turn's steps");
    assert!(progress.iter().all(|p| {
        p["params"]["progressToken"] == "p-1"
            && p["params"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
    }));
    shutdown.cancel();
    nexus.shutdown().await;
}
