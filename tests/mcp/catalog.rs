//! Resources, prompts and completions of `nexus-mcp`: rmcp's client in
//! process against the local Nexus and the Pinecone fake, and JSON-RPC over
//! Streamable HTTP with two callers' keys against a Nexus that answers each
//! key with its own contexts.

use crate::support::mcp as mcp_support;
use crate::support::pinecone_fake;
use mcp_support::*;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::pinecone::PineconeServer;
use nexus_knowql::mcp::{MAX_KNOWLEDGE_READ_BYTES, NexusMcp, NexusServer};
use pinecone_fake::PineconeFake;
use rmcp::ServerHandler;
use rmcp::model::{
    CompletionContext, GetPromptRequestParams, ReadResourceRequestParams, ResourceContents,
};
use rmcp::service::ServiceError;
use serde_json::{Value, json};
use wiremock::matchers::{header, method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
const KEY_ONE: &str = "pcsk_caller_one_abcdefghijklmnopqrstuvwxyz";
const KEY_TWO: &str = "pcsk_caller_two_abcdefghijklmnopqrstuvwxyz";

async fn local_nexus() -> LocalNexus {
    LocalNexus::builder()
        .context("docs", CORPUS)
        .start()
        .await
        .expect("local nexus starts")
}

/// `(text, mimeType)` of each content of a read.
fn texts(contents: &[ResourceContents]) -> Vec<(String, Option<String>)> {
    contents
        .iter()
        .map(|c| match c {
            ResourceContents::TextResourceContents {
                text, mime_type, ..
            } => (text.clone(), mime_type.clone()),
            other => panic!("expected text contents: {other:?}"),
        })
        .collect()
}

/// The JSON-RPC error code of a failed request.
fn error_code(result: Result<impl std::fmt::Debug, ServiceError>) -> (i32, String) {
    match result {
        Err(ServiceError::McpError(e)) => (e.code.0, e.message.to_string()),
        other => panic!("expected an MCP error: {other:?}"),
    }
}

/// A file of the context's knowledge tree (root or one level down).
async fn some_knowledge_file(client: &nexus_knowql::Client, slug: &str) -> String {
    let root = client.knowledge(slug).list().await.expect("knowledge root");
    if let Some(file) = root.iter().find(|e| e.kind == "file") {
        return file.name.clone();
    }
    for dir in root.iter().filter(|e| e.kind != "file") {
        let entries = client
            .knowledge(slug)
            .list()
            .path(dir.name.clone())
            .await
            .expect("knowledge dir");
        if let Some(file) = entries.iter().find(|e| e.kind == "file") {
            return format!("{}/{}", dir.name, file.name);
        }
    }
    panic!("no knowledge file in {root:?}");
}

#[tokio::test]
async fn resources_prompts_and_completions_over_rmcp() {
    let nexus = local_nexus().await;
    let fake = PineconeFake::start().await;
    let server = NexusMcp::new()
        .with_nexus(NexusServer::new(nexus_client(nexus.base_url())))
        .with_pinecone(PineconeServer::new(fake.config()).expect("pinecone server"));
    let caps = server.get_info().capabilities;
    assert!(caps.resources.is_some() && caps.prompts.is_some() && caps.completions.is_some());
    let client = connect(server).await;

    // resources/list: the context and the namespaces.
    let resources = client.list_all_resources().await.expect("resources/list");
    let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
    assert!(uris.contains(&"nexus://contexts/docs"), "{uris:?}");
    assert!(uris.contains(&"pinecone://kb/wg21-papers"), "{uris:?}");
    assert!(uris.contains(&"pinecone://kb/mailing"), "{uris:?}");
    let docs = resources
        .iter()
        .find(|r| r.uri == "nexus://contexts/docs")
        .unwrap();
    assert!(
        docs.description
            .as_deref()
            .unwrap()
            .contains("status: ready"),
        "{docs:?}"
    );

    // resources/templates/list.
    let templates = client
        .list_all_resource_templates()
        .await
        .expect("templates");
    let names: Vec<&str> = templates.iter().map(|t| t.uri_template.as_str()).collect();
    assert_eq!(
        names,
        [
            "nexus://contexts/{slug}",
            "nexus://contexts/{slug}/knowledge/{path}",
            "pinecone://{index}/{namespace}"
        ]
    );

    // A context reads as JSON, then Markdown.
    let read = client
        .read_resource(ReadResourceRequestParams::new("nexus://contexts/docs"))
        .await
        .expect("read context");
    let parts = texts(&read.contents);
    assert_eq!(parts[0].1.as_deref(), Some("application/json"));
    assert_eq!(parts[1].1.as_deref(), Some("text/markdown"));
    let body: Value = serde_json::from_str(&parts[0].0).unwrap();
    assert_eq!(body["status"], "ready", "{body}");
    assert!(body["last_curated_at"].is_string(), "{body}");
    assert!(body["source_count"].as_i64().unwrap() > 0, "{body}");
    assert!(parts[1].0.contains("- status: ready"), "{}", parts[1].0);

    // A knowledge file reads as the SDK reads it.
    let sdk = nexus_client(nexus.base_url());
    let file = some_knowledge_file(&sdk, "docs").await;
    let expected = sdk.knowledge("docs").read(&file).await.expect("sdk read");
    let uri = format!("nexus://contexts/docs/knowledge/{file}");
    let read = client
        .read_resource(ReadResourceRequestParams::new(uri.clone()))
        .await
        .expect("read knowledge");
    let parts = texts(&read.contents);
    assert_eq!(parts[0].0.as_bytes(), &expected[..], "{uri}");

    // A namespace reads as JSON with its metadata fields.
    let read = client
        .read_resource(ReadResourceRequestParams::new("pinecone://kb/wg21-papers"))
        .await
        .expect("read namespace");
    let body: Value = serde_json::from_str(&texts(&read.contents)[0].0).unwrap();
    assert_eq!(body["record_count"], 4, "{body}");
    assert!(body["metadata_fields"]["title"].is_string(), "{body}");

    // Unknown and invalid URIs are -32002, with no upstream words.
    for uri in [
        "nexus://contexts/nope",
        "nexus://contexts/docs/knowledge/missing.md",
        "pinecone://kb/nope",
        "nexus://contexts/docs/knowledge/../x",
        "bogus://thing",
    ] {
        let (code, message) = error_code(
            client
                .read_resource(ReadResourceRequestParams::new(uri))
                .await,
        );
        assert_eq!(code, -32002, "{uri}");
        assert_eq!(message, "resource not found", "{uri}");
    }

    // prompts/list and prompts/get.
    let prompts = client.list_all_prompts().await.expect("prompts/list");
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["ask_context", "research_namespace"]);
    let args = json!({"context": "docs", "question": "How do I resume a stream?"});
    let got = client
        .get_prompt(
            GetPromptRequestParams::new("ask_context")
                .with_arguments(args.as_object().cloned().unwrap()),
        )
        .await
        .expect("prompts/get");
    let text = serde_json::to_value(&got.messages[0]).unwrap()["content"]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        text.contains("query_context with context=\"docs\""),
        "{text}"
    );
    assert!(text.contains("How do I resume a stream?"), "{text}");
    let args = json!({"index": "kb", "namespace": "wg21-papers", "topic": "senders"});
    let got = client
        .get_prompt(
            GetPromptRequestParams::new("research_namespace")
                .with_arguments(args.as_object().cloned().unwrap()),
        )
        .await
        .expect("prompts/get");
    let text = serde_json::to_value(&got.messages[0]).unwrap()["content"]["text"].clone();
    let text = text.as_str().unwrap();
    assert!(text.contains("It holds 4 records"), "{text}");
    assert!(text.contains("title (string)"), "{text}");
    for (name, args) in [
        ("ask_context", json!({"context": "docs"})),
        ("ask_context", json!({"question": "why?"})),
        ("ask_context", json!({"context": "docs", "question": "  "})),
        (
            "research_namespace",
            json!({"index": "kb", "namespace": "wg21-papers"}),
        ),
        ("no_such_prompt", json!({})),
    ] {
        let (code, _) = error_code(
            client
                .get_prompt(
                    GetPromptRequestParams::new(name)
                        .with_arguments(args.as_object().cloned().unwrap()),
                )
                .await,
        );
        assert_eq!(code, -32602, "{name} {args}");
    }

    // completion/complete from the caller's data.
    let peer = client.peer();
    let got = peer
        .complete_prompt_argument("ask_context", "context", "d", None)
        .await
        .unwrap();
    assert_eq!(got.values, ["docs"]);
    assert_eq!((got.total, got.has_more), (Some(1), Some(false)));
    let got = peer
        .complete_prompt_simple("ask_context", "context", "x")
        .await
        .unwrap();
    assert!(got.is_empty());
    let got = peer
        .complete_resource_simple("pinecone://{index}/{namespace}", "namespace", "")
        .await
        .unwrap();
    assert_eq!(got, ["mailing", "wg21-papers"]);
    let got = peer
        .complete_prompt_simple("research_namespace", "index", "k")
        .await
        .unwrap();
    assert_eq!(got, ["kb"]);
    let only_papers = CompletionContext::with_arguments(
        [("namespace".to_owned(), "wg21-papers".to_owned())].into(),
    );
    let got = peer
        .complete_prompt_argument("research_namespace", "topic", "ti", Some(only_papers))
        .await
        .unwrap();
    assert_eq!(got.values, ["title"]);
    let got = peer
        .complete_resource_simple("nexus://contexts/{slug}", "slug", "")
        .await
        .unwrap();
    assert_eq!(got, ["docs"]);
    // An unknown reference completes to nothing, not to an error (the
    // official conformance scenario asks exactly this).
    let got = peer
        .complete_prompt_argument("test_prompt_with_arguments", "arg1", "test", None)
        .await
        .unwrap();
    assert!(got.values.is_empty());

    client.cancel().await.ok();
    nexus.shutdown().await;
}

#[tokio::test]
async fn the_binary_serves_resources_prompts_and_completions_over_stdio() {
    let nexus = fake_nexus(0).await;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_nexus-mcp"));
    cmd.env_clear()
        .env("NEXUS_BASE_URL", nexus.uri())
        .env("PINECONE_API_KEY", SERVER_KEY)
        .env("RUST_LOG", "trace")
        .kill_on_drop(true);
    let (transport, _stderr) = rmcp::transport::TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let client = rmcp::ServiceExt::serve((), transport).await.unwrap();
    let caps = &client.peer_info().unwrap().capabilities;
    assert!(caps.resources.is_some() && caps.prompts.is_some() && caps.completions.is_some());
    let uris: Vec<String> = client
        .list_all_resources()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.uri)
        .collect();
    assert_eq!(
        uris,
        [
            "nexus://contexts/handbook",
            "nexus://contexts/papers",
            "nexus://contexts/drafts",
            "nexus://contexts/fresh"
        ]
    );
    let read = client
        .read_resource(ReadResourceRequestParams::new("nexus://contexts/drafts"))
        .await
        .unwrap();
    let body: Value = serde_json::from_str(&texts(&read.contents)[0].0).unwrap();
    assert_eq!(body["status"], "not_curated", "{body}");
    let (code, _) = error_code(
        client
            .read_resource(ReadResourceRequestParams::new("nexus://contexts/gone"))
            .await,
    );
    assert_eq!(code, -32002);
    let prompts = client.list_all_prompts().await.unwrap();
    assert_eq!(prompts.len(), 1, "Nexus only: {prompts:?}");
    let got = client
        .peer()
        .complete_prompt_simple("ask_context", "context", "")
        .await
        .unwrap();
    assert_eq!(got, ["drafts", "fresh", "handbook", "papers"]);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn nothing_but_tools_is_declared_without_a_family() {
    let caps = NexusMcp::new().get_info().capabilities;
    assert!(caps.resources.is_none() && caps.prompts.is_none() && caps.completions.is_none());
    let fake = PineconeFake::start().await;
    let server =
        NexusMcp::new().with_pinecone(PineconeServer::new(fake.config()).expect("pinecone server"));
    let client = connect(server).await;
    let prompts = client.list_all_prompts().await.expect("prompts/list");
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["research_namespace"],
        "no Nexus prompt without Nexus"
    );
    let templates = client.list_all_resource_templates().await.unwrap();
    assert_eq!(templates.len(), 1);
    let (code, _) = error_code(
        client
            .read_resource(ReadResourceRequestParams::new("nexus://contexts/docs"))
            .await,
    );
    assert_eq!(code, -32002);
}

/// A Nexus that answers each of two keys with its own contexts, and serves
/// a knowledge file larger than a read returns.
async fn two_project_nexus() -> MockServer {
    let server = MockServer::start().await;
    for (key, slug) in [(KEY_ONE, "alpha-notes"), (KEY_TWO, "beta-notes")] {
        Mock::given(method("GET"))
            .and(path("/contexts"))
            .and(header("x-pinecone-api-key", key))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!([context_json(slug, "search", true, false)])),
            )
            .mount(&server)
            .await;
    }
    let big = "x".repeat(MAX_KNOWLEDGE_READ_BYTES + 10_000);
    Mock::given(method("GET"))
        .and(path_regex(
            r"^/contexts/alpha-notes/knowledge/read/big\.md$",
        ))
        .and(header("x-pinecone-api-key", KEY_ONE))
        .respond_with(ResponseTemplate::new(200).set_body_string(big))
        .mount(&server)
        .await;
    server
}

async fn serve_callers(nexus_url: &str, stateless: bool) -> Served {
    let server = NexusMcp::new()
        .with_nexus(NexusServer::new(nexus_client(nexus_url)).with_key_policy(caller_keys(false)));
    serve(server, HttpOptions::default().stateless(stateless)).await
}

/// The `result` (or `error`) of one request.
async fn rpc(mcp: &mut HttpMcp, method_name: &str, params: Value) -> Value {
    let (id, answer) = mcp.request(method_name, params).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.response(id).clone()
}

#[tokio::test]
async fn http_callers_see_only_their_own_resources_and_completions() {
    let nexus = two_project_nexus().await;
    for stateless in [false, true] {
        let served = serve_callers(&nexus.uri(), stateless).await;
        let url = served.url.clone();
        let mut one = HttpMcp::new(&url).header("X-Pinecone-Api-Key", KEY_ONE);
        let mut two = HttpMcp::new(&url).header("X-Pinecone-Api-Key", KEY_TWO);
        let init = one.initialize().await;
        assert!(init["capabilities"]["resources"].is_object(), "{init}");
        assert!(init["capabilities"]["completions"].is_object(), "{init}");
        two.initialize().await;
        for round in 0..2 {
            // Twice: the second answer comes from each caller's cache.
            for (mcp, mine, theirs) in [
                (&mut one, "alpha-notes", "beta-notes"),
                (&mut two, "beta-notes", "alpha-notes"),
            ] {
                let listed = rpc(mcp, "resources/list", json!({})).await;
                let uris: Vec<&str> = listed["result"]["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["uri"].as_str().unwrap())
                    .collect();
                assert_eq!(uris, [format!("nexus://contexts/{mine}")], "round {round}");
                let completed = rpc(
                    mcp,
                    "completion/complete",
                    json!({"ref": {"type": "ref/prompt", "name": "ask_context"},
                           "argument": {"name": "context", "value": ""}}),
                )
                .await;
                let values = &completed["result"]["completion"]["values"];
                assert_eq!(values, &json!([mine]), "round {round}: not {theirs}");
            }
        }
        // The big file is cut at the bound, and says so.
        let read = rpc(
            &mut one,
            "resources/read",
            json!({"uri": "nexus://contexts/alpha-notes/knowledge/big.md"}),
        )
        .await;
        let content = &read["result"]["contents"][0];
        assert_eq!(content["mimeType"], "text/markdown");
        assert_eq!(content["_meta"]["truncated"], true);
        let text = content["text"].as_str().unwrap();
        assert!(text.starts_with(&"x".repeat(MAX_KNOWLEDGE_READ_BYTES)));
        assert!(!text.contains(&"x".repeat(MAX_KNOWLEDGE_READ_BYTES + 1)));
        assert!(
            text.ends_with("bytes of this file are shown]"),
            "{}",
            &text[text.len() - 80..]
        );
        // The other caller cannot read it: Nexus does not answer its key.
        let read = rpc(
            &mut two,
            "resources/read",
            json!({"uri": "nexus://contexts/alpha-notes/knowledge/big.md"}),
        )
        .await;
        assert_eq!(read["error"]["code"], -32002, "{read}");
        // A bad cursor is invalid params.
        let bad = rpc(&mut one, "resources/list", json!({"cursor": "zz"})).await;
        assert_eq!(bad["error"]["code"], -32602, "{bad}");
        drop(served);
    }
    // One contexts call per key and mode: completions reused the listing.
    let requests = nexus.received_requests().await.unwrap();
    let lists = requests
        .iter()
        .filter(|r| r.url.path() == "/contexts")
        .count();
    // Per mode: two resources/list per key (uncached), one completion
    // listing per key (then cached) and each key's one proof.
    assert_eq!(lists, 2 * (2 * 2 + 2 + 2), "{lists}");
}

#[tokio::test]
async fn knowledge_files_are_listed_and_their_paths_complete() {
    let nexus = local_nexus().await;
    let sdk = nexus_client(nexus.base_url());
    let known = some_knowledge_file(&sdk, "docs").await;
    let client = connect(NexusMcp::new().with_nexus(NexusServer::new(sdk))).await;

    let resources = client.list_all_resources().await.expect("resources/list");
    let files: Vec<&str> = resources
        .iter()
        .map(|r| r.uri.as_str())
        .filter(|u| u.starts_with("nexus://contexts/docs/knowledge/"))
        .collect();
    assert!(!files.is_empty(), "knowledge files listed: {resources:?}");
    let read = client
        .read_resource(ReadResourceRequestParams::new(files[0]))
        .await
        .expect("a listed file reads");
    assert!(!texts(&read.contents)[0].0.is_empty());

    // `{path}` completes one directory at a time, directories ending in `/`.
    let docs = CompletionContext::with_arguments([("slug".to_owned(), "docs".to_owned())].into());
    let template = "nexus://contexts/{slug}/knowledge/{path}";
    let root = client
        .complete_resource_argument(template, "path", "", Some(docs.clone()))
        .await
        .expect("complete path");
    assert!(!root.values.is_empty(), "{root:?}");
    let first = known.split('/').next().unwrap();
    assert!(
        root.values
            .iter()
            .any(|v| v == first || v == &format!("{first}/")),
        "{first} in {root:?}"
    );
    if let Some((dir, _)) = known.rsplit_once('/') {
        let inner = client
            .complete_resource_argument(template, "path", &format!("{dir}/"), Some(docs))
            .await
            .expect("complete inner path");
        assert!(inner.values.contains(&known), "{known} in {inner:?}");
    }
    // Without the context there is nothing to complete.
    let none = client
        .complete_resource_argument(template, "path", "", None)
        .await
        .expect("complete without slug");
    assert!(none.values.is_empty(), "{none:?}");
}

/// `--tools` hides what stands for a hidden tool: its resources, prompts,
/// completions and the instructions that name it.
#[tokio::test]
async fn an_allow_list_hides_the_resources_prompts_completions_and_mentions_of_hidden_tools() {
    let nexus = local_nexus().await;
    let fake = PineconeFake::start().await;
    let exposed = ["query_context", "get_query", "count"];
    let server = NexusMcp::new()
        .with_nexus(NexusServer::new(nexus_client(nexus.base_url())))
        .with_pinecone(PineconeServer::new(fake.config()).expect("pinecone server"))
        .with_tool_allow_list(exposed)
        .expect("allow-list");
    let hidden = [
        "list_contexts",
        "list_namespaces",
        "namespace_router",
        "suggest_query_params",
        "query",
        "keyword_search",
        "query_documents",
        "guided_query",
        "generate_urls",
    ];
    let instructions = server.get_info().instructions.unwrap_or_default();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    for tool in hidden {
        let named = instructions.match_indices(tool).any(|(at, _)| {
            !instructions[..at].chars().next_back().is_some_and(word)
                && !instructions[at + tool.len()..]
                    .chars()
                    .next()
                    .is_some_and(word)
        });
        assert!(!named, "the instructions name {tool}: {instructions}");
    }
    for tool in exposed {
        assert!(instructions.contains(tool), "{tool}: {instructions}");
    }
    let client = connect(server).await;

    // No context is served without list_contexts, no namespace without
    // list_namespaces.
    let resources = client.list_all_resources().await.expect("resources/list");
    assert!(resources.is_empty(), "{resources:?}");
    let templates = client
        .list_all_resource_templates()
        .await
        .expect("templates");
    assert!(templates.is_empty(), "{templates:?}");
    for uri in ["nexus://contexts/docs", "pinecone://kb/wg21-papers"] {
        let read = client
            .read_resource(ReadResourceRequestParams::new(uri))
            .await;
        assert!(
            matches!(&read, Err(ServiceError::McpError(e)) if e.code.0 == -32002),
            "{uri}: {read:?}"
        );
    }

    // ask_context's tools are exposed; research_namespace's are not.
    let prompts = client.list_all_prompts().await.expect("prompts/list");
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["ask_context"]);
    let args = json!({"context": "docs", "question": "How do I resume a stream?"});
    let got = client
        .get_prompt(
            GetPromptRequestParams::new("ask_context")
                .with_arguments(args.as_object().cloned().unwrap()),
        )
        .await
        .expect("prompts/get");
    let text = serde_json::to_value(&got.messages[0]).unwrap()["content"]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(text.contains("query_context"), "{text}");
    assert!(!text.contains("nexus://"), "{text}");
    let args = json!({"index": "kb", "namespace": "wg21-papers", "topic": "senders"});
    let refused = client
        .get_prompt(
            GetPromptRequestParams::new("research_namespace")
                .with_arguments(args.as_object().cloned().unwrap()),
        )
        .await;
    assert!(
        matches!(&refused, Err(ServiceError::McpError(e)) if e.code.0 == -32602),
        "{refused:?}"
    );

    // Completions list nothing a hidden tool would.
    let peer = client.peer();
    let none = [
        peer.complete_prompt_simple("ask_context", "context", "d")
            .await,
        peer.complete_prompt_simple("research_namespace", "index", "")
            .await,
        peer.complete_resource_simple("pinecone://{index}/{namespace}", "namespace", "")
            .await,
        peer.complete_resource_simple("nexus://contexts/{slug}", "slug", "")
            .await,
    ];
    for got in none {
        assert!(got.expect("an answer").is_empty());
    }
}
