//! The Nexus tools driven by rmcp's client, in process over `tokio::io::duplex`,
//! against a scripted Nexus. Every tool result, success or tool error, is
//! checked against the tool's declared `outputSchema`.

use std::time::{Duration, Instant};

use crate::support::mcp as mcp_support;
use crate::support::schema;
use mcp_support::*;
use nexus_knowql::mcp::{NexusMcp, NexusServer};
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use serde_json::{Value, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// Calls `name` with `args` and checks the result against the tool's
/// `outputSchema` (shadows the support module's unchecked `call`).
async fn call(
    client: &RunningService<RoleClient, RecordingClient>,
    name: &'static str,
    args: Value,
) -> CallToolResult {
    let result = mcp_support::call(client, name, args).await;
    let tools = client.list_all_tools().await.unwrap();
    let tool = tools
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} is listed"));
    schema::assert_conforms(tool, &result);
    result
}

#[tokio::test]
async fn initialize_reports_name_version_and_instructions() {
    let nexus = fake_nexus(0).await;
    let client = connect_nexus(&nexus.uri()).await;
    let info = client.peer_info().expect("server info");
    let server = info.server_info.clone().expect("server identity");
    assert_eq!(server.name, "nexus-knowql");
    assert_eq!(server.version, env!("CARGO_PKG_VERSION"));
    let instructions = info.instructions.clone().unwrap_or_default();
    for word in [
        "list_contexts",
        "query_context",
        "get_query",
        "wait_seconds",
    ] {
        assert!(instructions.contains(word), "instructions miss {word}");
    }
    assert!(info.capabilities.tools.is_some());
}

#[tokio::test]
async fn tools_list_has_schemas_and_read_only_annotations() {
    let nexus = fake_nexus(0).await;
    let client = connect_nexus(&nexus.uri()).await;
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["get_query", "list_contexts", "query_context"]);
    for tool in &tools {
        let ann = tool.annotations.as_ref().expect("annotations");
        // query_context starts a new, billed turn on every call.
        let starts_a_turn = tool.name == "query_context";
        assert_eq!(ann.read_only_hint, Some(!starts_a_turn), "{}", tool.name);
        assert_eq!(ann.idempotent_hint, Some(!starts_a_turn), "{}", tool.name);
        assert_eq!(ann.destructive_hint, Some(false), "{}", tool.name);
        assert_eq!(ann.open_world_hint, Some(true), "{}", tool.name);
        let out = tool.output_schema.as_ref().expect("output schema");
        assert_eq!(out["type"], "object", "{}", tool.name);
        assert_eq!(tool.input_schema["type"], "object", "{}", tool.name);
        assert!(tool.description.as_deref().unwrap_or_default().len() > 80);
    }
    let by_name = |n: &str| tools.iter().find(|t| t.name == n).unwrap();

    let q = &by_name("query_context").input_schema;
    assert_eq!(q["required"], json!(["context", "question"]));
    assert_eq!(q["properties"]["question"]["type"], "string");
    let g = &by_name("get_query").input_schema;
    assert_eq!(g["required"], json!(["query_id"]));
    assert_eq!(g["properties"]["wait_seconds"]["maximum"], 60);
    assert_eq!(g["properties"]["wait_seconds"]["minimum"], 0);

    let out = by_name("get_query").output_schema.clone().unwrap();
    let props = out["properties"].as_object().unwrap();
    for key in [
        "query_id",
        "answer",
        "output_json",
        "citations",
        "model",
        "status",
        "error",
    ] {
        assert!(props.contains_key(key), "get_query output lacks {key}");
    }
    let out = by_name("query_context").output_schema.clone().unwrap();
    let keys: Vec<&String> = out["properties"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["query_id", "status", "model"]);

    // The schemas have teeth: a wrong type or a missing field is refused,
    // and an error body must be a whole ToolError.
    let get = by_name("get_query");
    schema::assert_rejects(get, &json!({}));
    schema::assert_rejects(
        get,
        &json!({"query_id": 5, "answer": null, "output_json": null, "citations": [],
                "model": null, "status": "completed", "error": null}),
    );
    schema::assert_rejects(get, &json!({"code": "TIMEOUT", "message": "late"}));
    schema::assert_rejects(
        get,
        &json!({"code": "NO_SUCH_CODE", "message": "m", "recoverable": true}),
    );
    schema::assert_rejects(by_name("query_context"), &json!({"query_id": "q"}));
    schema::assert_rejects(
        by_name("list_contexts"),
        &json!({"contexts": [{"slug": 1}]}),
    );
}

#[tokio::test]
async fn list_contexts_derives_queryable_and_formats_timestamps() {
    let nexus = fake_nexus(0).await;
    let client = connect_nexus(&nexus.uri()).await;
    let result = call(&client, "list_contexts", json!({})).await;
    assert_eq!(result.is_error, Some(false));
    let list = text_json(&result);
    let list = list.as_array().expect("the text block is the array");
    let get = |slug: &str| list.iter().find(|c| c["slug"] == slug).unwrap().clone();
    assert_eq!(get("handbook")["queryable"], true);
    assert_eq!(get("papers")["queryable"], true);
    assert_eq!(get("drafts")["queryable"], false);
    assert_eq!(get("papers")["last_curated_at"], "2026-07-03T10:20:30Z");
    assert_eq!(get("drafts")["last_curated_at"], Value::Null);
    assert_eq!(get("fresh")["is_curating"], true);
    let handbook = get("handbook");
    let keys: Vec<&String> = handbook.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "slug",
            "name",
            "id",
            "description",
            "queryable",
            "is_curating",
            "is_optimizing",
            "last_curated_at",
            "last_optimized_at"
        ]
    );
    let structured = result.structured_content.expect("structured content");
    assert_eq!(&structured["contexts"], &Value::Array(list.clone()));

    // The configured key was sent to Nexus.
    let received = nexus.received_requests().await.unwrap();
    assert!(
        received
            .iter()
            .all(|r| r.headers["x-pinecone-api-key"] == SERVER_KEY)
    );
}

#[tokio::test]
async fn query_context_then_get_query_polls_to_the_answer() {
    let nexus = fake_nexus(2).await;
    let client = connect_nexus(&nexus.uri()).await;
    let started = call(
        &client,
        "query_context",
        json!({"context": "handbook", "question": "How do I install it?"}),
    )
    .await;
    assert_eq!(started.is_error, Some(false), "{started:?}");
    let started = started.structured_content.unwrap();
    assert_eq!(
        started,
        json!({"query_id": "q_1", "status": "in_progress", "model": "nexus-large"})
    );

    // What Nexus was asked: a background turn scoped to the context.
    let posts: Vec<Value> = nexus
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.method.as_str() == "POST")
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0]["background"], true);
    assert_eq!(posts[0]["scope"], json!(["handbook"]));
    assert_eq!(posts[0]["ask"], "How do I install it?");

    let mut polls = 0;
    let done = loop {
        polls += 1;
        let r = call(&client, "get_query", json!({"query_id": "q_1"})).await;
        let v = r.structured_content.clone().unwrap();
        assert_eq!(text_json(&r), v);
        if v["status"] != "in_progress" {
            break v;
        }
        assert_eq!(v["answer"], Value::Null);
        assert!(polls < 10);
    };
    assert_eq!(polls, 3);
    assert_eq!(done["status"], "completed");
    assert_eq!(done["answer"], "Install it with cargo.");
    assert_eq!(done["citations"][0]["source"], "guide.md");
    assert_eq!(
        done["citations"][0]["section_paths"],
        json!([["Setup", "Install"]])
    );
    assert_eq!(done["model"], "nexus-large");
    assert_eq!(done["error"], Value::Null);
}

#[tokio::test]
async fn wait_seconds_waits_and_reports_step_commentary_as_progress() {
    let nexus = fake_nexus(2).await;
    let client = connect_nexus(&nexus.uri()).await;
    let r = call(
        &client,
        "get_query",
        json!({"query_id": "q_1", "wait_seconds": 10}),
    )
    .await;
    let v = r.structured_content.unwrap();
    assert_eq!(v["status"], "completed");
    assert_eq!(v["answer"], "Install it with cargo.");

    // rmcp hands each notification to the client handler on its own task, so
    // the last ones may land just after the response.
    let mut progress = client.service().progress_at_least(3).await;
    let values: Vec<f64> = progress.iter().map(|p| p.progress).collect();
    let mut distinct = values.clone();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    assert_eq!(distinct.len(), values.len(), "{values:?}");
    progress.sort_by(|a, b| a.progress.total_cmp(&b.progress));
    let messages: Vec<&str> = progress
        .iter()
        .filter_map(|p| p.message.as_deref())
        .collect();
    // Each step is reported once, in order, even though it was seen on several polls.
    assert_eq!(
        messages,
        [
            "Searching the handbook",
            "Reading guide.md",
            "Writing the answer"
        ]
    );
    let gets = nexus
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.url.path() == "/queries/q_1")
        .count();
    assert_eq!(gets, 3);
}

#[tokio::test]
async fn wait_seconds_returns_the_pending_turn_when_time_runs_out() {
    let nexus = fake_nexus(u64::MAX).await;
    let client = connect_nexus(&nexus.uri()).await;
    let started = std::time::Instant::now();
    let r = call(
        &client,
        "get_query",
        json!({"query_id": "q_1", "wait_seconds": 1}),
    )
    .await;
    // At least wait_seconds, and not much more: polls answer at once, and
    // the last pause is cut to the deadline (catches a wait that overshoots
    // it, such as a deadline of twice wait_seconds).
    let elapsed = started.elapsed();
    assert!(elapsed >= std::time::Duration::from_secs(1), "{elapsed:?}");
    assert!(
        elapsed < std::time::Duration::from_millis(1800),
        "{elapsed:?}"
    );
    assert_eq!(r.is_error, Some(false));
    let v = r.structured_content.unwrap();
    assert_eq!(v["status"], "in_progress");
    assert_eq!(v["answer"], Value::Null);
}

/// Asserts a VALIDATION error on `field`.
fn assert_validation(result: &rmcp::model::CallToolResult, field: &str) -> Value {
    let body = tool_error(result);
    assert_eq!(body["code"], "VALIDATION", "{body}");
    assert_eq!(body["field"], field, "{body}");
    assert_eq!(body["recoverable"], true, "{body}");
    body
}

#[tokio::test]
async fn bad_arguments_are_validation_errors_naming_the_field() {
    let nexus = fake_nexus(0).await;
    let client = connect_nexus(&nexus.uri()).await;
    let cases = [
        (
            "query_context",
            json!({"context": "handbook", "question": ""}),
            "question",
        ),
        (
            "query_context",
            json!({"context": "handbook", "question": "   "}),
            "question",
        ),
        ("query_context", json!({"context": "handbook"}), "question"),
        (
            "query_context",
            json!({"context": "handbook", "question": 42}),
            "question",
        ),
        ("query_context", json!({"question": "why?"}), "context"),
        (
            "query_context",
            json!({"context": "a/b", "question": "why?"}),
            "context",
        ),
        (
            "query_context",
            json!({"context": ["handbook"], "question": "why?"}),
            "context",
        ),
        ("get_query", json!({}), "query_id"),
        ("get_query", json!({"query_id": ""}), "query_id"),
        ("get_query", json!({"query_id": "q 1"}), "query_id"),
        (
            "get_query",
            json!({"query_id": "q_1", "wait_seconds": 61}),
            "wait_seconds",
        ),
        (
            "get_query",
            json!({"query_id": "q_1", "wait_seconds": -1}),
            "wait_seconds",
        ),
        (
            "get_query",
            json!({"query_id": "q_1", "wait_seconds": "5"}),
            "wait_seconds",
        ),
        (
            "get_query",
            json!({"query_id": "q_1", "wait_seconds": 2.5}),
            "wait_seconds",
        ),
    ];
    for (tool, args, field) in cases {
        let r = call(&client, tool, args.clone()).await;
        let body = assert_validation(&r, field);
        assert!(
            body["message"].as_str().unwrap().contains(field),
            "{tool} {args}: {body}"
        );
    }
    let long = "x".repeat(nexus_knowql::mcp::MAX_QUESTION_CHARS + 1);
    let r = call(
        &client,
        "query_context",
        json!({"context": "handbook", "question": long}),
    )
    .await;
    assert_validation(&r, "question");
    // None of them reached Nexus.
    assert!(nexus.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn unknown_context_and_query_are_not_found() {
    let nexus = fake_nexus(0).await;
    let client = connect_nexus(&nexus.uri()).await;
    let r = call(
        &client,
        "query_context",
        json!({"context": "nope", "question": "why?"}),
    )
    .await;
    let body = tool_error(&r);
    assert_eq!(body["code"], "NOT_FOUND");
    assert!(body["message"].as_str().unwrap().contains("nope"));
    assert!(
        body["suggestion"]
            .as_str()
            .unwrap()
            .contains("list_contexts")
    );

    let r = call(&client, "get_query", json!({"query_id": "q_missing"})).await;
    let body = tool_error(&r);
    assert_eq!(body["code"], "NOT_FOUND");
    assert!(body["message"].as_str().unwrap().contains("q_missing"));
}

#[tokio::test]
async fn a_context_never_curated_is_refused_with_a_curation_hint() {
    let nexus = fake_nexus(0).await;
    let client = connect_nexus(&nexus.uri()).await;
    let r = call(
        &client,
        "query_context",
        json!({"context": "drafts", "question": "why?"}),
    )
    .await;
    let body = assert_validation(&r, "context");
    assert!(
        body["message"].as_str().unwrap().contains("not queryable"),
        "{body}"
    );
    assert!(
        body["suggestion"].as_str().unwrap().contains("curate"),
        "{body}"
    );

    let r = call(
        &client,
        "query_context",
        json!({"context": "fresh", "question": "why?"}),
    )
    .await;
    let body = assert_validation(&r, "context");
    assert!(
        body["message"].as_str().unwrap().contains("being curated"),
        "{body}"
    );

    let posts = nexus
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.method.as_str() == "POST")
        .count();
    assert_eq!(
        posts, 0,
        "no turn may start on a context that is not queryable"
    );
}

#[tokio::test]
async fn refused_credentials_are_unauthorized_and_never_echoed() {
    let nexus = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .and(header("x-pinecone-api-key", SERVER_KEY))
        .respond_with(
            ResponseTemplate::new(401)
                .set_body_json(json!({"message": format!("invalid api key {SERVER_KEY}")})),
        )
        .mount(&nexus)
        .await;
    let client = connect_nexus(&nexus.uri()).await;
    let r = call(&client, "list_contexts", json!({})).await;
    let body = tool_error(&r);
    assert_eq!(body["code"], "UNAUTHORIZED");
    assert_eq!(body["recoverable"], false);
    assert!(!body.to_string().contains(SERVER_KEY), "{body}");
}

#[tokio::test]
async fn unreachable_nexus_is_a_recoverable_nexus_error() {
    // A port nothing listens on: bind, note the port, close.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let base = format!("http://127.0.0.1:{port}");
    let client = nexus_knowql::Client::builder()
        .base_url(&base)
        .api_key(SERVER_KEY)
        .retry(nexus_knowql::RetryPolicy::never())
        .build()
        .unwrap();
    let mcp = connect(NexusMcp::new().with_nexus(NexusServer::new(client))).await;
    for (tool, args) in [
        ("list_contexts", json!({})),
        (
            "query_context",
            json!({"context": "handbook", "question": "why?"}),
        ),
        ("get_query", json!({"query_id": "q_1"})),
    ] {
        let r = call(&mcp, tool, args).await;
        let body = tool_error(&r);
        assert_eq!(body["code"], "NEXUS_ERROR", "{tool}: {body}");
        assert_eq!(body["recoverable"], true, "{tool}: {body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("could not reach Nexus")
        );
    }
}

#[tokio::test]
async fn a_failed_turn_is_a_result_with_its_error() {
    let nexus = MockServer::start().await;
    let mut failed = query_json("q_9", "failed", &[], None);
    failed["error"] = json!("model overloaded");
    Mock::given(method("GET"))
        .and(path("/queries/q_9"))
        .respond_with(ResponseTemplate::new(200).set_body_json(failed))
        .mount(&nexus)
        .await;
    let client = connect_nexus(&nexus.uri()).await;
    let r = call(
        &client,
        "get_query",
        json!({"query_id": "q_9", "wait_seconds": 5}),
    )
    .await;
    assert_eq!(r.is_error, Some(false));
    let v = r.structured_content.unwrap();
    assert_eq!(v["status"], "failed");
    assert_eq!(v["error"], "model overloaded");
    assert_eq!(v["answer"], Value::Null);
}

#[tokio::test]
async fn an_unknown_tool_is_a_protocol_error() {
    let nexus = fake_nexus(0).await;
    let client = connect_nexus(&nexus.uri()).await;
    let err = client
        .call_tool(rmcp::model::CallToolRequestParams::new("no_such_tool"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no_such_tool"), "{err}");
}

// ---------------------------------------------------------------------------
// Cancellation and deadlines.

/// A Nexus whose `POST /query` (a background turn `q_7`) answers after
/// `start_delay` and whose `GET /contexts/handbook` answers after
/// `context_delay`; `POST /queries/q_7/cancel` is accepted.
async fn slow_nexus(context_delay: Duration, start_delay: Duration) -> MockServer {
    let nexus = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/contexts/handbook"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(context_json("handbook", "work", false, false))
                .set_delay(context_delay),
        )
        .mount(&nexus)
        .await;
    Mock::given(method("POST"))
        .and(path("/query"))
        .respond_with(
            ResponseTemplate::new(202)
                .set_body_json(query_json("q_7", "in_progress", &[], None))
                .set_delay(start_delay),
        )
        .mount(&nexus)
        .await;
    Mock::given(method("POST"))
        .and(path("/queries/q_7/cancel"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query_json(
            "q_7",
            "cancelled",
            &[],
            None,
        )))
        .mount(&nexus)
        .await;
    nexus
}

/// Requests Nexus received, as `METHOD /path`.
async fn received(nexus: &MockServer) -> Vec<String> {
    nexus
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .map(|r| format!("{} {}", r.method, r.url.path()))
        .collect()
}

/// Starts `query_context` and gives up on it after `after` (rmcp's client
/// sends `notifications/cancelled` when the call is dropped).
async fn cancel_query_context(
    client: &RunningService<RoleClient, RecordingClient>,
    after: Duration,
) {
    let params = CallToolRequestParams::new("query_context").with_arguments(
        json!({"context": "handbook", "question": "How do I install it?"})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let outcome = tokio::time::timeout(after, client.call_tool(params)).await;
    assert!(
        outcome.is_err(),
        "the call should still be running: {outcome:?}"
    );
}

#[tokio::test]
async fn a_query_context_cancelled_while_starting_cancels_the_turn_it_started() {
    let nexus = slow_nexus(Duration::ZERO, Duration::from_millis(1500)).await;
    let client = connect_nexus(&nexus.uri()).await;
    cancel_query_context(&client, Duration::from_millis(400)).await;
    assert!(received(&nexus).await.contains(&"POST /query".to_owned()));
    // The turn's start finishes, then the turn is cancelled by its id.
    let cancelled = async || {
        received(&nexus)
            .await
            .contains(&"POST /queries/q_7/cancel".to_owned())
    };
    let what = "the started turn cancelled";
    crate::support::wait::until(Duration::from_secs(10), what, cancelled).await;
    // The session still works.
    let r = call(&client, "list_contexts", json!({})).await;
    assert_eq!(
        r.is_error,
        Some(true),
        "no /contexts mock: a tool error, not a hang"
    );
}

/// An MCP session with the Nexus tools of `nexus`, and the server's
/// metrics (where a call's end shows).
async fn connect_counted(
    nexus: &MockServer,
) -> (
    RunningService<RoleClient, RecordingClient>,
    std::sync::Arc<nexus_knowql::mcp::Metrics>,
) {
    let server = NexusMcp::new().with_nexus(NexusServer::new(nexus_client(&nexus.uri())));
    let metrics = std::sync::Arc::clone(server.metrics());
    (connect(server).await, metrics)
}

#[tokio::test]
async fn a_query_context_cancelled_before_the_turn_is_sent_starts_none() {
    let nexus = slow_nexus(Duration::from_millis(1500), Duration::ZERO).await;
    let (client, metrics) = connect_counted(&nexus).await;
    cancel_query_context(&client, Duration::from_millis(400)).await;
    // The call's end is recorded once its handler returns: after that it
    // can send nothing more.
    let outcome = ended_call(&metrics, "query_context", Duration::from_secs(10)).await;
    assert_eq!(outcome, "CANCELLED");
    let seen = received(&nexus).await;
    assert_eq!(
        seen,
        ["GET /contexts/handbook"],
        "no turn may start: {seen:?}"
    );
}

#[tokio::test]
async fn a_cancelled_get_query_stops_polling() {
    let nexus = fake_nexus(u64::MAX).await;
    let (client, metrics) = connect_counted(&nexus).await;
    let params = CallToolRequestParams::new("get_query").with_arguments(
        json!({"query_id": "q_1", "wait_seconds": 30})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let outcome = tokio::time::timeout(Duration::from_millis(700), client.call_tool(params)).await;
    assert!(outcome.is_err());
    // Had polling gone on, the call would run for its 30 s wait.
    let ended = ended_call(&metrics, "get_query", Duration::from_secs(10)).await;
    assert_eq!(ended, "CANCELLED", "polling went on after cancellation");
    let polls = received(&nexus).await;
    assert!(
        polls.iter().all(|r| r == "GET /queries/q_1"),
        "only polls: {polls:?}"
    );
    // A later call's request is the last one received: no poll follows.
    call(&client, "list_contexts", json!({})).await;
    let seen = received(&nexus).await;
    assert_eq!(seen.len(), polls.len() + 1, "{seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("GET /contexts"));
}

#[tokio::test]
async fn a_slow_nexus_is_a_timeout_tool_error_after_the_call_deadline() {
    let nexus = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/contexts"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([]))
                .set_delay(Duration::from_secs(20)),
        )
        .mount(&nexus)
        .await;
    Mock::given(method("GET"))
        .and(path("/queries/q_1"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(query_json("q_1", "in_progress", &[], None))
                .set_delay(Duration::from_secs(20)),
        )
        .mount(&nexus)
        .await;
    let server =
        NexusServer::new(nexus_client(&nexus.uri())).with_call_timeout(Duration::from_millis(300));
    assert_eq!(server.call_timeout(), Duration::from_millis(300));
    let client = connect(NexusMcp::new().with_nexus(server)).await;

    let started = Instant::now();
    let r = call(&client, "list_contexts", json!({})).await;
    let body = tool_error(&r);
    assert_eq!(body["code"], "TIMEOUT", "{body}");
    assert_eq!(body["recoverable"], true, "{body}");
    // The 300 ms call deadline, not earlier and not the 20 s answer.
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(290), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");

    // get_query: at most wait_seconds plus the call deadline.
    let started = Instant::now();
    let r = call(
        &client,
        "get_query",
        json!({"query_id": "q_1", "wait_seconds": 1}),
    )
    .await;
    let body = tool_error(&r);
    assert_eq!(body["code"], "TIMEOUT", "{body}");
    // The first poll's 300 ms deadline ends it (it never answers); at most
    // wait_seconds plus the deadline.
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(290), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(1300 + 1000), "{elapsed:?}");
}

#[tokio::test]
async fn get_query_waits_at_most_wait_seconds_plus_the_call_deadline() {
    // Polls answer slowly (but within the deadline): the whole call still
    // ends by wait_seconds + deadline.
    let nexus = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/queries/q_1"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(query_json("q_1", "in_progress", &[], None))
                .set_delay(Duration::from_millis(700)),
        )
        .mount(&nexus)
        .await;
    let server =
        NexusServer::new(nexus_client(&nexus.uri())).with_call_timeout(Duration::from_millis(1000));
    let client = connect(NexusMcp::new().with_nexus(server)).await;
    let started = Instant::now();
    let r = call(
        &client,
        "get_query",
        json!({"query_id": "q_1", "wait_seconds": 2}),
    )
    .await;
    let elapsed = started.elapsed();
    // Waited out wait_seconds (every poll says in_progress), and ended by
    // wait_seconds + deadline (with 1 s for a loaded machine).
    assert!(elapsed >= Duration::from_millis(1990), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(3000 + 1000), "{elapsed:?}");
    // Either the last state (in_progress) or a TIMEOUT of the last poll.
    match r.is_error {
        Some(true) => assert_eq!(tool_error(&r)["code"], "TIMEOUT"),
        _ => assert_eq!(r.structured_content.unwrap()["status"], "in_progress"),
    }
}

#[tokio::test]
async fn get_query_with_a_call_deadline_too_large_for_the_clock_still_answers() {
    // `Duration::MAX` as the per-call deadline means none: the overall end
    // of a waiting get_query saturates instead of overflowing the clock.
    let nexus = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/queries/q_1"))
        .respond_with(ResponseTemplate::new(200).set_body_json(query_json(
            "q_1",
            "completed",
            &[],
            None,
        )))
        .mount(&nexus)
        .await;
    let server = NexusServer::new(nexus_client(&nexus.uri())).with_call_timeout(Duration::MAX);
    let client = connect(NexusMcp::new().with_nexus(server)).await;
    // A handler that panicked would never answer: bound the wait.
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        call(
            &client,
            "get_query",
            json!({"query_id": "q_1", "wait_seconds": 1}),
        ),
    )
    .await
    .expect("get_query answers");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(r.structured_content.unwrap()["status"], "completed");
}
