//! The harness of the Pinecone tool tests: an rmcp client over
//! `tokio::io::duplex` talking to `PineconeServer`, which talks to the
//! in-process Pinecone fake.

use crate::support::pinecone_fake;
use crate::support::schema;
use nexus_knowql::mcp::pinecone::{PineconeConfig, PineconeServer};
use pinecone_fake::{PineconeFake, Record};
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
pub(crate) struct Harness {
    pub(crate) fake: PineconeFake,
    pub(crate) client: RunningService<RoleClient, ()>,
}

pub(crate) async fn connect(server: PineconeServer) -> RunningService<RoleClient, ()> {
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_io).await.expect("client connects")
}

pub(crate) async fn harness_with(
    fake: PineconeFake,
    config: impl FnOnce(&PineconeFake) -> PineconeConfig,
) -> Harness {
    let server = PineconeServer::new(config(&fake)).expect("server");
    let client = connect(server).await;
    Harness { fake, client }
}

pub(crate) async fn harness() -> Harness {
    harness_with(PineconeFake::start().await, PineconeFake::config).await
}

pub(crate) fn with_rerank(f: &PineconeFake) -> PineconeConfig {
    let mut c = f.config();
    c.sources[0].rerank_model = Some("bge-reranker-v2-m3".into());
    c
}

pub(crate) fn gated(f: &PineconeFake) -> PineconeConfig {
    let mut c = with_rerank(f);
    c.suggest_flow = true;
    c
}

impl Harness {
    /// Calls a tool; returns (isError, JSON body).
    pub(crate) async fn call(&self, tool: &str, args: Value) -> (bool, Value) {
        let params = CallToolRequestParams::new(tool.to_owned())
            .with_arguments(args.as_object().cloned().unwrap_or_default());
        let result = self
            .client
            .call_tool(params)
            .await
            .expect("tool call answered");
        let text = result
            .content
            .first()
            .and_then(|c| c.as_text())
            .map(|t| t.text.clone())
            .expect("text content");
        let body: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        assert_eq!(
            result.structured_content.as_ref(),
            Some(&body),
            "structured content mirrors the text"
        );
        // Success or tool error, the structured content matches the
        // tool's declared outputSchema.
        let tools = self.client.list_all_tools().await.expect("tools/list");
        let listed = tools
            .iter()
            .find(|t| t.name == tool)
            .unwrap_or_else(|| panic!("{tool} is listed"));
        schema::assert_conforms(listed, &result);
        (result.is_error.unwrap_or(false), body)
    }

    pub(crate) async fn ok(&self, tool: &str, args: Value) -> Value {
        let (err, body) = self.call(tool, args).await;
        assert!(!err, "{tool} failed: {body}");
        body
    }

    pub(crate) async fn err(&self, tool: &str, args: Value) -> Value {
        let (err, body) = self.call(tool, args).await;
        assert!(err, "{tool} should fail: {body}");
        body
    }
}

pub(crate) fn ids(results: &Value) -> Vec<String> {
    results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["document_id"].as_str().unwrap_or("").to_owned())
        .collect()
}

pub(crate) fn many_chunks(ns: &str, n: usize, text: &str) -> Vec<Record> {
    (0..n)
        .map(|i| Record {
            index: "kb".into(),
            namespace: ns.into(),
            id: format!("{ns}-{i}"),
            fields: json!({"document_number": format!("DOC{}", i % 3), "chunk_index": i, "chunk_text": text}).as_object().cloned().unwrap(),
        })
        .collect()
}
