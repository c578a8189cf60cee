//! Conformance of the local Nexus with `openapi/nexus_2026-07.oas.yaml`:
//!
//! - every implemented operation is called through the generated client
//!   (`client.api().<op>(...)`), so its answer decodes with the SDK's types;
//! - every JSON answer (including errors and each SSE frame) is checked
//!   against the spec's schema for that status code;
//! - no operation answers 501 (`conformance_ops` checks the
//!   operations not called here).

use std::collections::BTreeSet;

use crate::support::local as local_support;
use crate::support::openapi;
use local_support::*;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::types;
use openapi::*;
use serde_json::{Value, json};

/// The operations checked here.
const IMPLEMENTED: &[&str] = &[
    "login",
    "get_identity",
    "list_contexts",
    "create_context",
    "get_context",
    "update_context",
    "delete_context",
    "upload_context_source",
    "list_source_files",
    "list_source_files_by_path",
    "read_source_file",
    "curate_context",
    "list_knowledge",
    "list_knowledge_by_path",
    "read_knowledge_file",
    "list_tasks",
    "get_task",
    "cancel_task",
    "list_models",
    "query",
    "get_query",
    "cancel_query",
    "stream_query_events",
    "get_query_trace",
    "create_query_feedback",
    "list_sessions",
    "get_session",
    "delete_session",
];

/// The checker itself fails on what it must reject (an `enum` value it does
/// not list, a `$ref` that does not resolve, a wrong type, a missing field).
#[test]
fn the_schema_checker_rejects_what_the_spec_does_not_allow() {
    let spec = spec();
    let errors = |schema: Value, value: Value| {
        let mut e = Vec::new();
        check(&spec, &schema, &value, "$", &mut e);
        e
    };
    let status = json!({"type": "string", "enum": ["a", "b"]});
    assert!(errors(status.clone(), json!("a")).is_empty());
    assert_eq!(errors(status, json!("c")).len(), 1);
    let kind = json!({"$ref": "#/components/schemas/ContextKind"});
    assert!(errors(kind.clone(), json!("work")).is_empty());
    assert_eq!(errors(kind, json!("play")).len(), 1);
    let missing = json!({"$ref": "#/components/schemas/NoSuchSchema"});
    assert_eq!(errors(missing, json!({})).len(), 1);
    let foreign = json!({"$ref": "other.yaml#/Query"});
    assert_eq!(errors(foreign, json!({})).len(), 1);
    let query = json!({"$ref": "#/components/schemas/Query"});
    assert!(
        !errors(query.clone(), json!({})).is_empty(),
        "required fields"
    );
    assert!(!errors(query, json!("text")).is_empty(), "type");
}

#[tokio::test]
async fn implemented_operations_decode_with_the_sdk_and_match_the_spec() {
    let spec = spec();
    let (server, client, dir) = seeded(LocalNexus::builder()).await;
    let api = client.api();
    let base = server.base_url().to_owned();
    let http = reqwest::Client::new();
    let mut seen = BTreeSet::new();

    // Through the generated client: every answer decodes into its type.
    let login = api
        .login(&types::LoginBody::builder().try_into().unwrap())
        .await
        .unwrap()
        .into_inner();
    assert!(!login.token.is_empty());
    api.get_identity().await.unwrap();
    let created = api
        .create_context(&serde_json::from_value(json!({"slug": "c2", "name": "C2"})).unwrap())
        .await
        .unwrap()
        .into_inner();
    api.list_contexts().await.unwrap();
    api.get_context("c2").await.unwrap();
    api.update_context(
        "c2",
        &serde_json::from_value(json!({"guide": "g"})).unwrap(),
    )
    .await
    .unwrap();
    let upload = client
        .sources("c2")
        .upload_bytes("a.md", b"# A\n\nalpha words here.\n".to_vec(), Some("docs"))
        .await
        .unwrap();
    client
        .tasks()
        .wait_completed(&upload.task_id, Default::default())
        .await
        .unwrap();
    api.list_source_files("c2", None, None).await.unwrap();
    api.list_source_files_by_path("c2", "docs", Some(10), Some(0))
        .await
        .unwrap();
    api.read_source_file("c2", "docs/a.md").await.unwrap();
    let curate = api
        .curate_context("c2", &serde_json::from_value(json!({})).unwrap())
        .await
        .unwrap()
        .into_inner();
    client
        .tasks()
        .wait_completed(&curate.task_id, Default::default())
        .await
        .unwrap();
    api.get_task(&curate.task_id).await.unwrap();
    api.list_tasks(Some("c2"), None, None, None, None, None, None)
        .await
        .unwrap();
    api.list_knowledge("c2", None, None).await.unwrap();
    api.list_knowledge_by_path("c2", "chunks", None, None)
        .await
        .unwrap();
    api.read_knowledge_file("c2", "chunks/docs/a.md")
        .await
        .unwrap();
    api.list_models().await.unwrap();
    let q = api
        .query(&request(json!({"ask": "alpha", "scope": ["c2"]})))
        .await
        .unwrap()
        .into_inner();
    api.get_query(&q.id).await.unwrap();
    api.get_query_trace(&q.id).await.unwrap();
    api.stream_query_events(&q.id, Some("2")).await.unwrap();
    api.create_query_feedback(
        &q.id,
        &types::CreateQueryFeedbackBody::builder()
            .rating("down")
            .try_into()
            .unwrap(),
    )
    .await
    .unwrap();
    api.cancel_query(&q.id).await.unwrap();
    api.list_sessions(None).await.unwrap();
    api.get_session(&q.session_id).await.unwrap();
    api.delete_session(&q.session_id).await.unwrap();
    let bg = reqwest::Client::new()
        .post(format!("{base}/query"))
        .json(&json!({"ask": "alpha", "scope": ["c2"], "background": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(bg.status(), 202);
    api.cancel_task(&upload.task_id, &Default::default())
        .await
        .unwrap();
    api.delete_context("c2").await.unwrap();
    assert_eq!(created.slug, "c2");

    // Raw: each answer against the spec's schema for its status.
    let cases: Vec<(&str, &str, &str, String, Option<Value>)> = vec![
        (
            "login",
            "POST",
            "/auth/login",
            "/auth/login".into(),
            Some(json!({})),
        ),
        ("get_identity", "GET", "/auth", "/auth".into(), None),
        (
            "list_contexts",
            "GET",
            "/contexts",
            "/contexts".into(),
            None,
        ),
        (
            "create_context",
            "POST",
            "/contexts",
            "/contexts".into(),
            Some(json!({"slug": "c3", "name": "C3"})),
        ),
        (
            "create_context",
            "POST",
            "/contexts",
            "/contexts".into(),
            Some(json!({"slug": "c3", "name": "C3"})),
        ),
        (
            "create_context",
            "POST",
            "/contexts",
            "/contexts".into(),
            Some(json!({"slug": "Bad Slug", "name": "x"})),
        ),
        (
            "get_context",
            "GET",
            "/contexts/{slug}",
            "/contexts/docs".into(),
            None,
        ),
        (
            "get_context",
            "GET",
            "/contexts/{slug}",
            "/contexts/missing".into(),
            None,
        ),
        (
            "update_context",
            "PUT",
            "/contexts/{slug}",
            "/contexts/c3".into(),
            Some(json!({"name": "C3b"})),
        ),
        (
            "list_source_files",
            "GET",
            "/contexts/{slug}/source/list",
            "/contexts/docs/source/list".into(),
            None,
        ),
        (
            "list_source_files_by_path",
            "GET",
            "/contexts/{slug}/source/list/{path}",
            "/contexts/docs/source/list/guide".into(),
            None,
        ),
        (
            "read_source_file",
            "GET",
            "/contexts/{slug}/source/read/{path}",
            "/contexts/docs/source/read/notes.txt".into(),
            None,
        ),
        (
            "read_source_file",
            "GET",
            "/contexts/{slug}/source/read/{path}",
            "/contexts/docs/source/read/none.txt".into(),
            None,
        ),
        (
            "curate_context",
            "POST",
            "/contexts/{slug}/curate",
            "/contexts/c3/curate".into(),
            Some(json!({})),
        ),
        (
            "list_knowledge",
            "GET",
            "/contexts/{slug}/knowledge/list",
            "/contexts/docs/knowledge/list".into(),
            None,
        ),
        (
            "list_knowledge_by_path",
            "GET",
            "/contexts/{slug}/knowledge/list/{path}",
            "/contexts/docs/knowledge/list/chunks/guide".into(),
            None,
        ),
        (
            "read_knowledge_file",
            "GET",
            "/contexts/{slug}/knowledge/read/{path}",
            "/contexts/docs/knowledge/read/chunks/guide/tea.md".into(),
            None,
        ),
        ("list_tasks", "GET", "/tasks", "/tasks?limit=5".into(), None),
        (
            "get_task",
            "GET",
            "/tasks/{id}",
            format!("/tasks/{}", curate.task_id),
            None,
        ),
        ("get_task", "GET", "/tasks/{id}", "/tasks/nope".into(), None),
        ("list_models", "GET", "/models", "/models".into(), None),
        (
            "query",
            "POST",
            "/query",
            "/query".into(),
            Some(json!({"ask": "green tea", "scope": ["docs"]})),
        ),
        (
            "query",
            "POST",
            "/query",
            "/query".into(),
            Some(json!({"ask": "green tea", "scope": ["docs"], "stream": true})),
        ),
        (
            "query",
            "POST",
            "/query",
            "/query".into(),
            Some(json!({"ask": "green tea", "scope": ["docs"], "background": true})),
        ),
        (
            "query",
            "POST",
            "/query",
            "/query".into(),
            Some(json!({"ask": "", "scope": ["docs"]})),
        ),
        (
            "query",
            "POST",
            "/query",
            "/query".into(),
            Some(json!({"ask": "x", "scope": ["missing"]})),
        ),
        (
            "query",
            "POST",
            "/query",
            "/query".into(),
            Some(json!({"ask": "x", "scope": ["c3"]})),
        ),
        (
            "list_sessions",
            "GET",
            "/sessions",
            "/sessions?limit=3".into(),
            None,
        ),
        (
            "delete_session",
            "DELETE",
            "/sessions/{id}",
            "/sessions/unknown".into(),
            None,
        ),
        (
            "get_session",
            "GET",
            "/sessions/{id}",
            "/sessions/unknown".into(),
            None,
        ),
        (
            "get_query",
            "GET",
            "/queries/{id}",
            "/queries/unknown".into(),
            None,
        ),
    ];
    let mut query_ids = Vec::new();
    for (op, method, template, path, body) in cases {
        let mut req = http.request(method.parse().unwrap(), format!("{base}{path}"));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let value = conforms(&spec, template, method, req.send().await.unwrap()).await;
        if op == "query"
            && let Some(id) = value.get("id").and_then(Value::as_str)
        {
            query_ids.push(id.to_owned());
        }
        seen.insert(op);
    }
    for id in &query_ids {
        for (op, method, template, path) in [
            (
                "get_query",
                "GET",
                "/queries/{id}",
                format!("/queries/{id}"),
            ),
            (
                "stream_query_events",
                "GET",
                "/queries/{id}/events",
                format!("/queries/{id}/events"),
            ),
            (
                "cancel_query",
                "POST",
                "/queries/{id}/cancel",
                format!("/queries/{id}/cancel"),
            ),
            (
                "get_query_trace",
                "GET",
                "/queries/{id}/trace",
                format!("/queries/{id}/trace"),
            ),
        ] {
            let resp = http
                .request(method.parse().unwrap(), format!("{base}{path}"))
                .send()
                .await
                .unwrap();
            conforms(&spec, template, method, resp).await;
            seen.insert(op);
        }
        let fb = http
            .post(format!("{base}/queries/{id}/feedback"))
            .json(&json!({"rating": "sideways"}))
            .send()
            .await
            .unwrap();
        conforms(&spec, "/queries/{id}/feedback", "POST", fb).await;
        seen.insert("create_query_feedback");
        let q = client.queries().get(id).await.unwrap();
        let s = http
            .get(format!("{base}/sessions/{}", q.session_id))
            .send()
            .await
            .unwrap();
        conforms(&spec, "/sessions/{id}", "GET", s).await;
    }
    let up = http
        .post(format!("{base}/contexts/c3/import/upload?path=more"))
        .multipart(reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(b"# Three\n\ntext".to_vec()).file_name("three.md"),
        ))
        .send()
        .await
        .unwrap();
    let trigger = conforms(&spec, "/contexts/{slug}/import/upload", "POST", up).await;
    seen.insert("upload_context_source");
    let task_id = trigger["task_id"].as_str().unwrap();
    client
        .tasks()
        .wait(task_id, Default::default())
        .await
        .unwrap();
    let cancel = http
        .delete(format!("{base}/tasks/{task_id}"))
        .send()
        .await
        .unwrap();
    conforms(&spec, "/tasks/{id}", "DELETE", cancel).await;
    seen.insert("cancel_task");
    let del = http
        .delete(format!("{base}/contexts/c3"))
        .send()
        .await
        .unwrap();
    conforms(&spec, "/contexts/{slug}", "DELETE", del).await;
    seen.insert("delete_context");

    let expected: BTreeSet<&str> = IMPLEMENTED.iter().copied().collect();
    assert_eq!(seen, expected, "every implemented operation was checked");
    drop(dir);
}

/// No operation of the spec answers 501 or any 5xx, even called with
/// names that do not exist and an empty body: each answers, or refuses
/// with the Error envelope.
#[tokio::test]
async fn every_operation_is_served() {
    let spec = spec();
    let server = LocalNexus::start().await.unwrap();
    let http = reqwest::Client::new();
    let ops = operations(&spec);
    for (id, method, template) in &ops {
        let path = template
            .replace("{slug}", "ctx")
            .replace("{id}", "id1")
            .replace("{path}", "a/b.md")
            .replace("{provider}", "box")
            .replace("{connector_id}", "c1");
        let resp = http
            .request(
                method.parse().unwrap(),
                format!("{}{path}", server.base_url()),
            )
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        assert!(!status.is_server_error(), "{id}: {method} {path}: {status}");
        if status.is_client_error() {
            let body: types::Error = resp.json().await.unwrap();
            assert!(!body.message.is_empty(), "{id}");
        }
    }
    assert_eq!(ops.len(), 58);
}
