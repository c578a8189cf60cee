//! Errors a model can act on: a key Pinecone refuses is `UNAUTHORIZED`
//! with a hint (as the Nexus tools say it), and with one source an unknown
//! `source` names that source instead of pointing at `list_sources`,
//! which is not served then.
use crate::support::pinecone_fake::PineconeFake;

use nexus_knowql::mcp::pinecone::PineconeServer;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

async fn connect(server: PineconeServer) -> RunningService<RoleClient, ()> {
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_io).await.expect("client connects")
}

async fn error_of(client: &RunningService<RoleClient, ()>, tool: &str, args: Value) -> Value {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    let result = client.call_tool(params).await.expect("answered");
    assert_eq!(result.is_error, Some(true), "{result:?}");
    result.structured_content.expect("structured error")
}

#[tokio::test]
async fn a_refused_pinecone_key_is_unauthorized_with_a_hint() {
    let fake = PineconeFake::start().await;
    let mut config = fake.config();
    config.sources[0].api_key = "pcsk_not_a_key_pinecone_knows_000".to_owned().into();
    let client = connect(PineconeServer::new(config).unwrap()).await;
    for (tool, args) in [
        ("list_namespaces", json!({})),
        (
            "query",
            json!({"query_text": "coroutines", "namespace": "wg21-papers"}),
        ),
    ] {
        let e = error_of(&client, tool, args).await;
        assert_eq!(e["code"], "UNAUTHORIZED", "{tool}: {e}");
        let hint = e["suggestion"].as_str().unwrap_or_default();
        assert!(hint.contains("X-Pinecone-Api-Key"), "{e}");
        assert!(!e.to_string().contains("pcsk_not_a_key"), "{e}");
    }
}

#[tokio::test]
async fn one_source_an_unknown_source_names_it() {
    let fake = PineconeFake::start().await;
    let client = connect(PineconeServer::new(fake.config()).unwrap()).await;
    let e = error_of(
        &client,
        "query",
        json!({"query_text": "x", "namespace": "wg21-papers", "source": "nope"}),
    )
    .await;
    assert_eq!(e["code"], "VALIDATION", "{e}");
    assert!(!e.to_string().contains("list_sources"), "{e}");
    assert!(e["message"].as_str().unwrap().contains("one source"), "{e}");
}
