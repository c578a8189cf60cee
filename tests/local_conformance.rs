//! Conformance of the local Nexus with `openapi/nexus_2026-07.oas.yaml`:
//!
//! - every implemented operation is called through the generated client
//!   (`client.api().<op>(...)`), so its answer decodes with the SDK's types;
//! - every JSON answer (including errors and each SSE frame) is checked
//!   against the spec's schema for that status code;
//! - every other operation of the spec answers 501 with the Error envelope.
#![cfg(feature = "local")]

mod support;
use support::local as local_support;

use std::collections::BTreeSet;

use local_support::*;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::types;
use serde_json::{Value, json};

/// The operations the local server provides.
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

fn spec() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/openapi/nexus_2026-07.oas.yaml"
    ))
    .unwrap();
    let yaml: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    serde_json::to_value(yaml).unwrap()
}

/// `(operationId, METHOD, path template)` of every spec operation.
fn operations(spec: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if method == "parameters" {
                continue;
            }
            out.push((
                op["operationId"].as_str().unwrap().to_owned(),
                method.to_uppercase(),
                path.clone(),
            ));
        }
    }
    out
}

/// A minimal JSON Schema (OpenAPI 3.0 subset) checker: `$ref`, `allOf`,
/// `anyOf`/`oneOf`, `type`, `nullable`, `enum`/`x-enum`, `required`, `properties`,
/// `items`, `additionalProperties`, `format: date-time`. A `$ref` that does
/// not resolve is an error, never a schema that accepts anything.
fn check(spec: &Value, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let target = r
            .strip_prefix("#/components/schemas/")
            .and_then(|name| spec["components"]["schemas"].get(name));
        match target {
            Some(target) => check(spec, target, value, at, errors),
            None => errors.push(format!("{at}: unresolved $ref {r:?}")),
        }
        return;
    }
    if value.is_null() {
        let nullable = schema.get("nullable").and_then(Value::as_bool) == Some(true)
            || schema.as_object().is_some_and(|o| o.is_empty());
        if !nullable {
            errors.push(format!("{at}: null where the schema is not nullable"));
        }
        return;
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            check(spec, s, value, at, errors);
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(any) = schema.get(key).and_then(Value::as_array) {
            let ok = any.iter().any(|s| {
                let mut e = Vec::new();
                check(spec, s, value, at, &mut e);
                e.is_empty()
            });
            if !ok {
                errors.push(format!("{at}: matches none of {key}"));
            }
        }
    }
    let ty = schema.get("type").and_then(Value::as_str);
    let type_ok = match ty {
        None => true,
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some(_) => true,
    };
    if !type_ok {
        errors.push(format!("{at}: expected {ty:?}, got {value}"));
        return;
    }
    // The spec lists known values as `x-enum` (open for clients, which must
    // accept new ones); the local server sends only values it lists.
    if let Some(allowed) = schema
        .get("enum")
        .or_else(|| schema.get("x-enum"))
        .and_then(Value::as_array)
        && !allowed.contains(value)
    {
        errors.push(format!("{at}: {value} is not one of {allowed:?}"));
    }
    if schema.get("format").and_then(Value::as_str) == Some("date-time")
        && let Some(s) = value.as_str()
        && chrono::DateTime::parse_from_rfc3339(s).is_err()
    {
        errors.push(format!("{at}: {s:?} is not an RFC 3339 date-time"));
    }
    if let Some(obj) = value.as_object() {
        if let Some(req) = schema.get("required").and_then(Value::as_array) {
            for r in req.iter().filter_map(Value::as_str) {
                if !obj.contains_key(r) {
                    errors.push(format!("{at}: missing required field {r:?}"));
                }
            }
        }
        let props = schema.get("properties").and_then(Value::as_object);
        for (k, v) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(s) => check(spec, s, v, &format!("{at}.{k}"), errors),
                None => {
                    if let Some(extra) =
                        schema.get("additionalProperties").filter(|a| a.is_object())
                    {
                        check(spec, extra, v, &format!("{at}.{k}"), errors);
                    }
                }
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array()) {
        for (i, v) in arr.iter().enumerate() {
            check(spec, items, v, &format!("{at}[{i}]"), errors);
        }
    }
}

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

/// Checks a raw answer against the spec's response for its status.
async fn conforms(spec: &Value, op_path: &str, method: &str, resp: reqwest::Response) -> Value {
    let status = resp.status().as_u16().to_string();
    let op = &spec["paths"][op_path][method.to_lowercase()];
    let declared = &op["responses"][&status];
    assert!(
        !declared.is_null(),
        "{method} {op_path}: status {status} is not declared"
    );
    let ctype = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let bytes = resp.bytes().await.unwrap();
    let content = &declared["content"];
    if content.is_null() {
        return Value::Null;
    }
    if ctype.starts_with("text/event-stream") {
        assert!(
            !content["text/event-stream"].is_null(),
            "{op_path}: SSE not declared"
        );
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let mut frames = Vec::new();
        for raw in text.split("\n\n").filter(|f| f.contains("data:")) {
            let event = raw
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_default();
            let data: Value =
                serde_json::from_str(raw.lines().find_map(|l| l.strip_prefix("data: ")).unwrap())
                    .unwrap();
            let schema = if event == "query" {
                json!({"$ref": "#/components/schemas/Query"})
            } else {
                json!({"$ref": "#/components/schemas/QueryEvent"})
            };
            let mut errors = Vec::new();
            check(spec, &schema, &data, event, &mut errors);
            assert!(errors.is_empty(), "{op_path} frame {event}: {errors:#?}");
            frames.push(data);
        }
        return Value::Array(frames);
    }
    if ctype.starts_with("application/octet-stream") {
        assert!(
            !content["application/octet-stream"].is_null(),
            "{op_path}: bytes not declared"
        );
        return Value::Null;
    }
    assert!(
        ctype.starts_with("application/json"),
        "{op_path}: content type {ctype}"
    );
    let value: Value = serde_json::from_slice(&bytes).unwrap();
    let mut errors = Vec::new();
    check(
        spec,
        &content["application/json"]["schema"],
        &value,
        "$",
        &mut errors,
    );
    assert!(
        errors.is_empty(),
        "{method} {op_path} {status}: {errors:#?}\n{value:#}"
    );
    value
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
        .login(&types::LoginBody { api_key: None })
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
        &types::CreateQueryFeedbackBody {
            comment: None,
            rating: "down".into(),
        },
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

#[tokio::test]
async fn every_other_operation_answers_501_with_the_error_envelope() {
    let spec = spec();
    let server = LocalNexus::start().await.unwrap();
    let http = reqwest::Client::new();
    let ops = operations(&spec);
    let mut not_implemented = 0;
    for (id, method, template) in &ops {
        if IMPLEMENTED.contains(&id.as_str()) {
            continue;
        }
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
        assert_eq!(resp.status(), 501, "{id}: {method} {path}");
        let body: types::Error = resp.json().await.unwrap();
        assert!(body.message.contains(id.as_str()), "{id}: {}", body.message);
        not_implemented += 1;
    }
    assert_eq!(not_implemented + IMPLEMENTED.len(), ops.len());
    assert_eq!(ops.len(), 58);
}
