//! `list_namespaces` keeps the part of its text that depends only on the
//! cached discovery while the cache entry lives: the text follows the entry
//! (a refreshed entry is written anew) and its per-call fields still change.

use std::time::Duration;

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

/// The text of a `list_namespaces` answer, parsed.
async fn list(client: &RunningService<RoleClient, ()>) -> Value {
    let result = client
        .call_tool(
            CallToolRequestParams::new("list_namespaces")
                .with_arguments(json!({}).as_object().cloned().unwrap_or_default()),
        )
        .await
        .expect("list_namespaces answered");
    assert_eq!(result.is_error, Some(false));
    let text = result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .expect("text content");
    let body: Value = serde_json::from_str(&text).expect("JSON text");
    assert_eq!(result.structured_content.as_ref(), Some(&body));
    body
}

fn names(body: &Value) -> Vec<&str> {
    body["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect()
}

#[tokio::test]
async fn the_kept_listing_follows_its_cache_entry() {
    let fake = PineconeFake::start().await;
    let mut config = fake.config();
    // The cache reads tokio's clock, which the test moves past the
    // entry's lifetime: a long lifetime keeps the "still cached" call
    // inside it however loaded the machine.
    let ttl = Duration::from_secs(600);
    config.cache_ttl = ttl;
    let client = connect(PineconeServer::new(config).expect("server")).await;

    let first = list(&client).await;
    assert_eq!(first["cache_hit"], false);
    assert_eq!(names(&first), ["wg21-papers", "mailing"]);

    // While the entry lives, the answer is the entry's, with its per-call
    // fields.
    fake.add_empty_namespace("kb", "fresh", 3);
    let cached = list(&client).await;
    assert_eq!(cached["cache_hit"], true);
    assert_eq!(cached["count"], 2);
    assert_eq!(names(&cached), ["wg21-papers", "mailing"]);

    // A refreshed entry is written anew.
    crate::support::mcp::jump_clock(ttl + Duration::from_secs(1)).await;
    let refreshed = list(&client).await;
    assert_eq!(refreshed["cache_hit"], false);
    assert_eq!(refreshed["count"], 3);
    assert!(names(&refreshed).contains(&"fresh"), "{refreshed}");
    let again = list(&client).await;
    assert_eq!(again["cache_hit"], true);
    assert_eq!(again["count"], 3);
    assert_eq!(again["namespaces"], refreshed["namespaces"]);
}
