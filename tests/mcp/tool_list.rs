//! `tools/list` a model can afford, and the operator's allow-list of the
//! tools exposed (`--tools`).

use std::process::Stdio;
use std::time::Duration;

use crate::support::mcp::{SERVER_KEY, connect, fake_nexus, nexus_client};
use crate::support::pinecone_fake::PineconeFake;
use nexus_knowql::mcp::pinecone::PineconeServer;
use nexus_knowql::mcp::{NexusMcp, NexusServer, ToolAllowListError};
use rmcp::model::CallToolRequestParams;
use serde_json::Value;
use tokio::process::Command;

/// The most bytes of the whole compact `tools/list` (both tool families).
const MAX_TOOLS_LIST_BYTES: usize = 32 * 1024;
/// The most bytes of one tool in it.
const MAX_TOOL_BYTES: usize = 6 * 1024;

async fn every_tool(nexus_url: &str, pinecone: &PineconeFake) -> NexusMcp {
    NexusMcp::new()
        .with_nexus(NexusServer::new(nexus_client(nexus_url)))
        .with_pinecone(PineconeServer::new(pinecone.config()).expect("server"))
}

/// Whether `schema` has a `description` on any of its subschemas.
fn has_descriptions(schema: &Value) -> bool {
    match schema {
        Value::Object(map) => map.iter().any(|(key, value)| match key.as_str() {
            "description" => value.is_string(),
            "properties" | "$defs" => value
                .as_object()
                .is_some_and(|named| named.values().any(has_descriptions)),
            "enum" | "const" | "required" => false,
            _ => has_descriptions(value),
        }),
        Value::Array(items) => items.iter().any(has_descriptions),
        _ => false,
    }
}

#[tokio::test]
async fn tools_list_fits_a_models_context() {
    let nexus = fake_nexus(0).await;
    let pinecone = PineconeFake::start().await;
    let client = connect(every_tool(&nexus.uri(), &pinecone).await).await;
    let tools = client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 12);
    let listed = serde_json::to_string(&tools).unwrap();
    assert!(
        listed.len() <= MAX_TOOLS_LIST_BYTES,
        "tools/list is {} bytes",
        listed.len()
    );
    for tool in &tools {
        let bytes = serde_json::to_string(tool).unwrap().len();
        assert!(bytes <= MAX_TOOL_BYTES, "{} is {bytes} bytes", tool.name);
        // What a tool returns is said once, in its description.
        let output = Value::Object((*tool.output_schema.clone().unwrap()).clone());
        assert!(!has_descriptions(&output), "{}: {output}", tool.name);
        assert!(tool.description.as_deref().is_some_and(|d| !d.is_empty()));
    }
}

#[tokio::test]
async fn an_allow_list_hides_the_other_tools_as_unknown_ones() {
    let nexus = fake_nexus(0).await;
    let pinecone = PineconeFake::start().await;
    let server = every_tool(&nexus.uri(), &pinecone)
        .await
        .with_tool_allow_list(["list_contexts", "count", " list_contexts"])
        .unwrap();
    let client = connect(server).await;
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| &*t.name).collect();
    assert_eq!(names, ["list_contexts", "count"]);

    let exposed = client
        .call_tool(CallToolRequestParams::new("list_contexts"))
        .await
        .unwrap();
    assert_eq!(exposed.is_error, Some(false), "{exposed:?}");
    let call_error = |name: &'static str| {
        let client = &client;
        async move {
            let err = client
                .call_tool(CallToolRequestParams::new(name))
                .await
                .expect_err("refused");
            match err {
                rmcp::ServiceError::McpError(data) => {
                    (data.code, data.message.replace(name, "NAME"))
                }
                other => panic!("{other}"),
            }
        }
    };
    let hidden = call_error("query_context").await;
    let unknown = call_error("no_such_tool").await;
    assert_eq!(hidden, unknown);
    assert_eq!(call_error("guided_query").await, unknown);
    // Nexus requests were for the exposed call only.
    let paths: Vec<String> = nexus
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.url.path().to_owned())
        .collect();
    assert!(paths.iter().all(|p| !p.contains("/query")), "{paths:?}");
}

#[tokio::test]
async fn an_allow_list_naming_a_tool_not_served_is_refused() {
    let nexus = fake_nexus(0).await;
    let pinecone = PineconeFake::start().await;
    let refused = every_tool(&nexus.uri(), &pinecone)
        .await
        .with_tool_allow_list(["query", "qeury"])
        .unwrap_err();
    let ToolAllowListError::Unknown { unknown, served } = &refused else {
        panic!("{refused}");
    };
    assert_eq!(unknown, &["qeury"]);
    assert_eq!(served.len(), 12);
    let none: [&str; 0] = [];
    let empty = every_tool(&nexus.uri(), &pinecone)
        .await
        .with_tool_allow_list(none)
        .unwrap_err();
    assert_eq!(empty, ToolAllowListError::Empty);
}

#[tokio::test]
async fn the_binary_refuses_an_unknown_tool_name_at_start() {
    let nexus = fake_nexus(0).await;
    let output = Command::new(env!("CARGO_BIN_EXE_nexus-mcp"))
        .env_clear()
        .env("NEXUS_BASE_URL", nexus.uri())
        .env("PINECONE_API_KEY", SERVER_KEY)
        .env("NEXUS_MCP_TOOLS", "query_context,list_context")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(30), output)
        .await
        .expect("the binary exits")
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--tools: no tool is named list_context;")
            && stderr.contains("list_contexts"),
        "{stderr}"
    );
}

/// Every default the TypeScript reference declares in its input schemas
/// is declared in ours (`top_k` is the configured `--top-k`).
#[tokio::test]
async fn input_schemas_declare_the_references_defaults() {
    let pinecone = PineconeFake::start().await;
    let expected = [
        ("namespace_router", "top_n", serde_json::json!(3)),
        ("query", "top_k", serde_json::json!(10)),
        ("query", "preset", serde_json::json!("full")),
        ("keyword_search", "top_k", serde_json::json!(10)),
        ("query_documents", "top_k", serde_json::json!(5)),
        ("guided_query", "top_k", serde_json::json!(10)),
        ("guided_query", "preferred_tool", serde_json::json!("auto")),
        ("guided_query", "enrich_urls", serde_json::json!(true)),
    ];
    let default_of = |server: &PineconeServer, tool: &str, field: &str| {
        let tool = server
            .tools()
            .into_iter()
            .find(|t| t.name == tool)
            .expect("tool");
        tool.input_schema["properties"][field]["default"].clone()
    };
    let server = PineconeServer::new(pinecone.config()).expect("server");
    for (tool, field, default) in &expected {
        assert_eq!(&default_of(&server, tool, field), default, "{tool}.{field}");
    }
    let mut config = pinecone.config();
    config.default_top_k = 25;
    let server = PineconeServer::new(config).expect("server");
    for tool in ["query", "keyword_search", "guided_query"] {
        assert_eq!(default_of(&server, tool, "top_k"), 25, "{tool}");
    }
    assert_eq!(default_of(&server, "query_documents", "top_k"), 5);
}
