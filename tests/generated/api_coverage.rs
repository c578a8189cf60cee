//! Every operation of `openapi/nexus_2026-07.oas.yaml` is callable: the
//! generated client reaches 57 of them, `Sources::upload_file` the multipart
//! upload. Each call must produce exactly the request the spec describes.
//!
//! This file lists one call per operationId; the test also checks that the
//! list and the spec name the same operations, so a new operation in the spec
//! fails the test until it is reachable.

use std::collections::BTreeSet;

use nexus_knowql::{Client, RetryPolicy, types};
use serde_json::json;
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

fn body<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("minimal body decodes")
}

/// The spec's operations as `(operationId, METHOD, path template)`.
fn spec_operations() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/openapi/nexus_2026-07.oas.yaml"
    ))
    .expect("spec is in the repository");
    let spec: serde_yaml::Value = serde_yaml::from_str(&text).expect("spec parses");
    let mut out = Vec::new();
    for (path, item) in spec["paths"].as_mapping().expect("paths") {
        for (method, op) in item.as_mapping().expect("path item") {
            let method = method.as_str().expect("method");
            if method == "parameters" {
                continue;
            }
            let id = op["operationId"].as_str().expect("operationId").to_owned();
            out.push((
                id,
                method.to_uppercase(),
                path.as_str().expect("path").to_owned(),
            ));
        }
    }
    out
}

/// Fills a path template with the values the calls below use; `{path}` is
/// greedy and its `/` travels percent-encoded.
fn expected_path(template: &str) -> String {
    template
        .replace("{slug}", "ctx-1")
        .replace("{id}", "id-1")
        .replace("{path}", "dir%2Ffile.md")
        .replace("{provider}", "box")
        .replace("{connector_id}", "conn-1")
}

#[tokio::test]
async fn every_spec_operation_is_reachable() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({})))
        .mount(&server)
        .await;
    let client = Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .retry(RetryPolicy::never())
        .build()
        .unwrap();
    let api = client.api();
    let dir = tempdir_with_file();
    let mut called: Vec<&'static str> = Vec::new();
    // Results are ignored: the answers are not valid payloads; what matters
    // is the request each call sends.
    macro_rules! call {
        ($name:literal, $fut:expr) => {{
            let _ = $fut.await;
            called.push($name);
        }};
    }

    call!("login", api.login(&body::<types::LoginBody>(json!({}))));
    call!("get_identity", api.get_identity());
    call!("get_project", api.get_project());
    call!("list_connectors", api.list_connectors(None));
    call!("get_connector", api.get_connector("id-1"));
    call!("delete_connector", api.delete_connector("id-1"));
    call!(
        "start_connector_oauth",
        api.start_connector_oauth("box", None)
    );
    call!(
        "create_connector",
        api.create_connector(
            "box",
            &body::<types::CreateConnectorBody>(json!({"api_key": "x"}))
        )
    );
    call!(
        "list_connector_items",
        api.list_connector_items("id-1", None)
    );
    call!(
        "list_context_connectors",
        api.list_context_connectors("ctx-1")
    );
    call!(
        "update_context_connector",
        api.update_context_connector(
            "ctx-1",
            "conn-1",
            &body::<types::UpdateContextConnectorBody>(json!({"enabled": false}))
        )
    );
    call!("list_contexts", api.list_contexts());
    call!(
        "create_context",
        api.create_context(&body::<types::CreateContextRequest>(
            json!({"slug": "x", "name": "x"})
        ))
    );
    call!("get_context", api.get_context("ctx-1"));
    call!(
        "update_context",
        api.update_context("ctx-1", &body::<types::UpdateContextRequest>(json!({})))
    );
    call!("delete_context", api.delete_context("ctx-1"));
    call!(
        "fork_context",
        api.fork_context(
            "ctx-1",
            &body::<types::ForkContextBody>(json!({"target_slug": "x"}))
        )
    );
    call!("get_context_manifest", api.get_context_manifest("ctx-1"));
    call!(
        "get_context_task_stats",
        api.get_context_task_stats("ctx-1")
    );
    call!(
        "curate_context",
        api.curate_context("ctx-1", &body::<types::CurateContextBody>(json!({})))
    );
    call!("get_curation_ledger", api.get_curation_ledger("ctx-1"));
    call!(
        "delete_curated_sources",
        api.delete_curated_sources(
            "ctx-1",
            &body::<types::DeleteCuratedSourcesBody>(json!({"sources": []}))
        )
    );
    call!(
        "optimize_context",
        api.optimize_context("ctx-1", &body::<types::OptimizeContextBody>(json!({})))
    );
    call!(
        "explore_context",
        api.explore_context("ctx-1", &body::<types::ExploreContextBody>(json!({})))
    );
    call!(
        "profile_context",
        api.profile_context("ctx-1", &body::<types::ProfileContextBody>(json!({})))
    );
    call!(
        "import_context_sources",
        api.import_context_sources(
            "ctx-1",
            &body::<types::ImportContextSourcesBody>(json!({"connector_id": "x"}))
        )
    );
    call!(
        "upload_context_source",
        client
            .sources("ctx-1")
            .upload_file(dir.join("file.md"), None)
    );
    call!(
        "list_source_files",
        api.list_source_files("ctx-1", None, None)
    );
    call!("get_source_stats", api.get_source_stats("ctx-1"));
    call!("get_source_manifest", api.get_source_manifest("ctx-1"));
    call!(
        "list_source_files_by_path",
        api.list_source_files_by_path("ctx-1", "dir/file.md", None, None)
    );
    call!(
        "read_source_file",
        api.read_source_file("ctx-1", "dir/file.md")
    );
    call!(
        "delete_source_file",
        api.delete_source_file("ctx-1", "dir/file.md")
    );
    call!("list_knowledge", api.list_knowledge("ctx-1", None, None));
    call!("get_knowledge_stats", api.get_knowledge_stats("ctx-1"));
    call!(
        "list_knowledge_by_path",
        api.list_knowledge_by_path("ctx-1", "dir/file.md", None, None)
    );
    call!(
        "read_knowledge_file",
        api.read_knowledge_file("ctx-1", "dir/file.md")
    );
    call!(
        "query",
        api.query(&body::<types::QueryRequest>(json!({"ask": "x"})))
    );
    call!("get_query", api.get_query("id-1"));
    call!("cancel_query", api.cancel_query("id-1"));
    call!("get_query_trace", api.get_query_trace("id-1"));
    call!("stream_query_events", api.stream_query_events("id-1", None));
    call!(
        "create_query_feedback",
        api.create_query_feedback(
            "id-1",
            &body::<types::CreateQueryFeedbackBody>(json!({"rating": "up"}))
        )
    );
    call!("list_models", api.list_models());
    call!("list_sessions", api.list_sessions(None));
    call!("get_session", api.get_session("id-1"));
    call!("delete_session", api.delete_session("id-1"));
    call!("get_project_task_stats", api.get_project_task_stats());
    call!("list_manifest_templates", api.list_manifest_templates());
    call!(
        "list_tasks",
        api.list_tasks(None, None, None, None, None, None, None)
    );
    call!("get_task", api.get_task("id-1"));
    call!(
        "cancel_task",
        api.cancel_task("id-1", &body::<types::CancelTaskBody>(json!({})))
    );
    call!("get_task_stats", api.get_task_stats("id-1"));
    call!("read_task_file", api.read_task_file("id-1", "dir/file.md"));
    call!(
        "get_task_file_metadata",
        api.get_task_file_metadata("id-1", "dir/file.md")
    );
    call!(
        "list_task_files_by_path",
        api.list_task_files_by_path("id-1", "dir/file.md", None, None)
    );
    call!("list_task_files", api.list_task_files("id-1", None, None));
    call!(
        "delete_task_file",
        api.delete_task_file("id-1", "dir/file.md")
    );

    let spec = spec_operations();
    assert_eq!(spec.len(), 58, "the spec has 58 operations");
    let spec_ids: BTreeSet<&str> = spec.iter().map(|(id, _, _)| id.as_str()).collect();
    let called_ids: BTreeSet<&str> = called.iter().copied().collect();
    assert_eq!(
        spec_ids, called_ids,
        "every operationId has exactly one call above"
    );
    assert_eq!(called.len(), 58);

    let received = server.received_requests().await.expect("recording is on");
    assert_eq!(received.len(), 58, "one request per operation");
    for ((id, method, template), req) in spec.iter().zip(received.iter()) {
        let want = format!("/api{}", expected_path(template));
        assert_eq!(req.method.as_str(), method, "{id}");
        assert_eq!(req.url.path(), want, "{id}");
        assert_eq!(
            req.headers
                .get("x-pinecone-api-version")
                .map(|v| v.to_str().unwrap()),
            Some("2026-07"),
            "{id} sends the version header"
        );
    }
}

fn tempdir_with_file() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nexus-knowql-coverage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("file.md"), "# Title\n\nBody.\n").unwrap();
    dir
}
