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
    // No argument sends the model to `list_sources`, which is not served.
    let tools = client.list_all_tools().await.expect("tools/list");
    assert!(tools.iter().all(|t| t.name != "list_sources"));
    for tool in &tools {
        let schema = serde_json::to_string(&tool.input_schema).unwrap();
        assert!(
            !schema.contains("from `list_sources`"),
            "{}: {schema}",
            tool.name
        );
    }
}

fn params(tool: &str, args: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().cloned().unwrap_or_default())
}

async fn ok_of(client: &RunningService<RoleClient, ()>, tool: &str, args: Value) -> Value {
    let result = client
        .call_tool(params(tool, args))
        .await
        .expect("answered");
    assert_eq!(result.is_error, Some(false), "{result:?}");
    result.structured_content.expect("structured result")
}

#[tokio::test]
async fn a_namespace_that_does_not_exist_finds_nothing_and_names_those_that_do() {
    let fake = PineconeFake::start().await;
    let client = connect(PineconeServer::new(fake.config()).unwrap()).await;
    let q = ok_of(
        &client,
        "query",
        json!({"query_text": "coroutines", "namespace": "wg21-paper"}),
    )
    .await;
    assert_eq!(q["result_count"], 0, "{q}");
    let hint = q["hint"].as_str().unwrap_or_else(|| panic!("a hint: {q}"));
    assert!(hint.contains("\"wg21-paper\" does not exist"), "{hint}");
    assert!(
        hint.contains("wg21-papers") && hint.contains("mailing"),
        "{hint}"
    );
    let c = ok_of(
        &client,
        "count",
        json!({"query_text": "coroutines", "namespace": "wg21-paper"}),
    )
    .await;
    assert_eq!(c["count"], 0, "{c}");
    assert!(
        c["hint"]
            .as_str()
            .unwrap_or_default()
            .contains("wg21-papers"),
        "{c}"
    );
    // A namespace that exists has no hint.
    let q = ok_of(
        &client,
        "query",
        json!({"query_text": "coroutines", "namespace": "wg21-papers"}),
    )
    .await;
    assert!(q.get("hint").is_none(), "{q}");
}

#[tokio::test]
async fn a_default_query_without_a_rerank_model_says_nothing_of_configuration() {
    let fake = PineconeFake::start().await;
    let client = connect(PineconeServer::new(fake.config()).unwrap()).await;
    let q = ok_of(
        &client,
        "query",
        json!({"query_text": "coroutines", "namespace": "wg21-papers"}),
    )
    .await;
    assert!(q.get("experimental").is_none(), "nothing to report: {q}");
    // Asked for explicitly, the skip is reported, without telling the model
    // how the operator would configure a model.
    let q = ok_of(
        &client,
        "query",
        json!({"query_text": "coroutines", "namespace": "wg21-papers", "use_reranking": true}),
    )
    .await;
    assert_eq!(
        q["experimental"]["rerank_skipped_reason"], "no_model",
        "{q}"
    );
    let text = q["experimental"].to_string();
    for operator_words in ["PINECONE_RERANK_MODEL", "--rerank-model", "config file"] {
        assert!(!text.contains(operator_words), "{text}");
    }
    assert_eq!(fake.count("rerank"), 0);
}

/// Three sources, two of which hold the same index and namespaces (as
/// projects built from one template do).
fn three_sources(fake: &PineconeFake) -> nexus_knowql::mcp::pinecone::PineconeConfig {
    let mut config = fake.multi_config();
    let twin = nexus_knowql::mcp::pinecone::SourceConfig {
        name: "src_c".into(),
        ..config.sources[0].clone()
    };
    config.sources.push(twin);
    config
}

#[tokio::test]
async fn several_sources_have_distinct_namespace_uris_and_a_research_prompt_that_works() {
    use crate::support::mcp::connect as connect_mcp;
    use nexus_knowql::mcp::NexusMcp;
    use rmcp::model::{GetPromptRequestParams, ReadResourceRequestParams};
    let fake = PineconeFake::start().await;
    let server = NexusMcp::new().with_pinecone(PineconeServer::new(three_sources(&fake)).unwrap());
    let client = connect_mcp(server).await;

    let resources = client.list_all_resources().await.expect("resources/list");
    let mut uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
    let listed = uris.len();
    assert!(listed >= 4, "{uris:?}");
    uris.sort_unstable();
    uris.dedup();
    assert_eq!(uris.len(), listed, "every namespace its own URI: {uris:?}");
    for uri in [
        "pinecone://src_a/kb/wg21-papers",
        "pinecone://src_c/kb/wg21-papers",
    ] {
        assert!(uris.contains(&uri), "{uri} in {uris:?}");
    }
    let templates = client
        .list_all_resource_templates()
        .await
        .expect("templates");
    assert!(
        templates
            .iter()
            .any(|t| t.uri_template == "pinecone://{source}/{index}/{namespace}"),
        "{templates:?}"
    );
    let read = client
        .read_resource(ReadResourceRequestParams::new(
            "pinecone://src_c/kb/wg21-papers",
        ))
        .await
        .expect("read namespace");
    let body = serde_json::to_value(&read.contents[0]).unwrap();
    let body: Value = serde_json::from_str(body["text"].as_str().unwrap()).unwrap();
    assert_eq!(body["source"], "src_c", "{body}");
    let sources = client
        .complete_resource_simple("pinecone://{source}/{index}/{namespace}", "source", "")
        .await
        .expect("complete source");
    assert_eq!(sources, ["src_a", "src_b", "src_c"]);

    // The research prompt names the source its steps need; following them
    // works where the namespace alone is ambiguous.
    let mut args = serde_json::Map::new();
    for (k, v) in [
        ("source", "src_c"),
        ("index", "kb"),
        ("namespace", "wg21-papers"),
        ("topic", "coroutines"),
    ] {
        args.insert(k.into(), Value::from(v));
    }
    let prompt = client
        .get_prompt(GetPromptRequestParams::new("research_namespace").with_arguments(args))
        .await
        .expect("prompts/get");
    let message = serde_json::to_value(&prompt.messages[0]).unwrap();
    let text = message["content"]["text"].as_str().expect("a text prompt");
    assert!(
        text.contains(r#"namespace="wg21-papers", source="src_c""#),
        "{text}"
    );
    assert!(text.contains("pinecone://src_c/kb/wg21-papers"), "{text}");
    let ambiguous = client
        .call_tool(params(
            "suggest_query_params",
            json!({"namespace": "wg21-papers", "user_query": "coroutines"}),
        ))
        .await
        .expect("answered");
    assert_eq!(ambiguous.is_error, Some(true), "{ambiguous:?}");
    for tool in ["suggest_query_params", "query"] {
        let args = if tool == "query" {
            json!({"namespace": "wg21-papers", "source": "src_c", "query_text": "coroutines"})
        } else {
            json!({"namespace": "wg21-papers", "source": "src_c", "user_query": "coroutines"})
        };
        let result = client
            .call_tool(params(tool, args))
            .await
            .expect("answered");
        assert_eq!(result.is_error, Some(false), "{tool}: {result:?}");
    }
}
