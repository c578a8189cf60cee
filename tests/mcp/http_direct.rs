//! A stateless `tools/call` gets one answer whatever else the request
//! carries: its status, the headers the MCP service sets, every byte of a
//! JSON body and every event of a stream are those of the same call with
//! an allowed `Origin` header (or an empty `_meta`), and those of the same
//! call answered by rmcp's service (an `Accept` with weights, which the
//! server's own dispatch leaves to rmcp).

use std::time::Duration;

use crate::support::mcp as mcp_support;
use mcp_support::*;
use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::{NexusMcp, NexusServer};
use serde_json::{Value, json};

const CALLER_KEY: &str = "pcsk_caller_key_abcdefghijklmnopqrstuv";

#[derive(Debug, PartialEq)]
struct Raw {
    status: u16,
    content_type: Option<String>,
    cache_control: Option<String>,
    accel_buffering: Option<String>,
    body: String,
}

/// Posts `body` with the caller's key and `headers` (absent values left
/// out), and reads the answer.
async fn post_raw(url: &str, body: String, headers: &[(&str, Option<&str>)]) -> Raw {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("x-pinecone-api-key", CALLER_KEY)
        .body(body);
    for (name, value) in headers {
        if let Some(value) = value {
            request = request.header(*name, *value);
        }
    }
    let response = request.send().await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    Raw {
        status: response.status().as_u16(),
        content_type: header("content-type"),
        cache_control: header("cache-control"),
        accel_buffering: header("x-accel-buffering"),
        body: response.text().await.unwrap(),
    }
}

/// Posts `message` as a plain client does, with `origin` if any.
async fn post(url: &str, message: &Value, origin: Option<&str>) -> Raw {
    post_accepting(url, message, origin, "application/json, text/event-stream").await
}

/// [`post`] with `accept`.
async fn post_accepting(url: &str, message: &Value, origin: Option<&str>, accept: &str) -> Raw {
    let headers = [
        ("content-type", Some("application/json")),
        ("accept", Some(accept)),
        ("mcp-protocol-version", Some("2025-06-18")),
        ("origin", origin),
    ];
    post_raw(url, message.to_string(), &headers).await
}

/// The events of an event stream, as their data; a log note's data with
/// its text taken out (a slow-call note names the duration).
fn events(body: &str) -> Vec<String> {
    assert!(body.ends_with("\n\n"), "{body:?}");
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|event| {
            let data = event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("one data line: {event:?}"));
            assert!(!data.contains('\n'), "{event:?}");
            let mut message: Value = serde_json::from_str(data).unwrap();
            if message["method"] == "notifications/message" {
                message["params"]["data"] = Value::Null;
                return message.to_string();
            }
            data.to_owned()
        })
        .collect()
}

/// An `Accept` rmcp reads as the plain one, with weights.
const WEIGHTED: &str = "application/json;q=1, text/event-stream;q=1";

async fn compare(slow_call: Option<Duration>) {
    // Never completed here: every request of a call sees the same turn.
    let nexus = fake_nexus(1_000).await;
    let mut server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(caller_keys(false)),
    );
    if let Some(threshold) = slow_call {
        server = server.with_slow_call_threshold(threshold);
    }
    let served = serve(server, HttpOptions::default().stateless(true)).await;
    let origin = format!("http://localhost:{}", served.addr.port());
    let calls = [
        json!({"name": "list_contexts", "arguments": {}}),
        json!({"name": "list_contexts"}),
        json!({"name": "query_context", "arguments": {"context": "papers", "question": "What is new?"}}),
        json!({"name": "get_query", "arguments": {"query_id": "q_1"}}),
        json!({"name": "get_query", "arguments": {"query_id": "q_unknown"}}),
        json!({"name": "get_query", "arguments": {"query_id": 7}}),
        json!({"name": "no_such_tool", "arguments": {}}),
        json!({"name": "list_contexts", "arguments": {"limit": "many"}, "extra": true}),
    ];
    for (n, params) in calls.iter().enumerate() {
        for id in [json!(n), json!(format!("call-{n}"))] {
            let message =
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
            let without = post(&served.url, &message, None).await;
            let with_origin = post(&served.url, &message, Some(&origin)).await;
            let by_rmcp = post_accepting(&served.url, &message, None, WEIGHTED).await;
            assert_eq!(without.status, 200, "{params}: {without:?}");
            let streamed = without
                .content_type
                .as_deref()
                .is_some_and(|t| t.starts_with("text/event-stream"));
            // A tool's answer comes after its note when every call is slow
            // (a protocol error sends no note).
            if n == 0 {
                assert_eq!(streamed, slow_call.is_some(), "{params}: {without:?}");
            }
            if streamed {
                assert_eq!(
                    (
                        &without.status,
                        &without.content_type,
                        &without.cache_control,
                        &without.accel_buffering
                    ),
                    (
                        &with_origin.status,
                        &with_origin.content_type,
                        &with_origin.cache_control,
                        &with_origin.accel_buffering
                    ),
                    "{params}"
                );
                let (a, b) = (events(&without.body), events(&with_origin.body));
                assert_eq!(a, b, "{params}");
                assert_eq!(a.len(), 2, "a note, then the answer: {a:?}");
                assert_eq!(
                    (
                        &without.content_type,
                        &without.cache_control,
                        &without.accel_buffering
                    ),
                    (
                        &by_rmcp.content_type,
                        &by_rmcp.cache_control,
                        &by_rmcp.accel_buffering
                    ),
                    "{params}"
                );
                assert_eq!(a, events(&by_rmcp.body), "{params}: dispatched and by rmcp");
            } else {
                assert_eq!(without, with_origin, "{params}");
                assert_eq!(without, by_rmcp, "{params}: dispatched and by rmcp");
            }
        }
    }
    // A call with an empty `_meta`: the same answer as without.
    let plain = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "list_contexts", "arguments": {}}});
    let with_meta = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "list_contexts", "arguments": {}, "_meta": {}}});
    let (a, b) = (
        post(&served.url, &plain, None).await,
        post(&served.url, &with_meta, None).await,
    );
    if slow_call.is_none() {
        assert_eq!(a, b);
    } else {
        assert_eq!(events(&a.body), events(&b.body));
    }
}

#[tokio::test]
async fn a_stateless_call_gets_one_answer_with_or_without_an_origin() {
    compare(None).await;
}

/// Every call slow: a log note comes first, so both answers are streams.
#[tokio::test]
async fn a_stateless_call_with_a_note_gets_one_stream_with_or_without_an_origin() {
    compare(Some(Duration::ZERO)).await;
}

/// One generated request: headers and a body written as text (so keys can
/// repeat and values can be of any type).
#[derive(Debug, Clone)]
struct Generated {
    accept: Option<&'static str>,
    content_type: Option<&'static str>,
    protocol: Option<&'static str>,
    body: String,
}

fn generated() -> impl proptest::strategy::Strategy<Value = Generated> {
    use proptest::prelude::*;
    let accept = proptest::option::of(proptest::sample::select(vec![
        "application/json, text/event-stream",
        "text/event-stream, application/json",
        "Application/JSON;q=0.5, TEXT/event-stream",
        "application/json;q=0, text/event-stream",
        "application/json, text/event-stream;q=0",
        "application/json, text/event-stream; x=\"a,b\"",
        "application/json",
        "text/event-stream",
        "*/*",
    ]));
    let content_type = proptest::option::of(proptest::sample::select(vec![
        "application/json",
        "application/json; charset=utf-8",
        "APPLICATION/JSON",
        "text/plain",
    ]));
    let protocol = proptest::option::of(proptest::sample::select(vec![
        "2024-11-05",
        "2025-03-26",
        "2025-06-18",
        "2025-11-25",
        "2026-07-28",
        "2099-01-01",
        "garbage",
    ]));
    let jsonrpc =
        proptest::sample::select(vec![r#""2.0""#, r#""2.0""#, r#""2.0""#, r#""1.0""#, "2"]);
    let id = proptest::sample::select(vec![
        Some("1"),
        Some(r#""s-1""#),
        Some("null"),
        Some("1.5"),
        Some("-3"),
        None,
    ]);
    let method = proptest::sample::select(vec![
        r#""tools/call""#,
        r#""tools/call""#,
        r#""tools/call""#,
        r#""tools/list""#,
    ]);
    let params = proptest::option::of(proptest::sample::select(vec![
        r#"{"name":"list_contexts"}"#,
        r#"{"name":"list_contexts","arguments":{}}"#,
        r#"{"name":"list_contexts","arguments":null}"#,
        r#"{"name":"list_contexts","arguments":{},"_meta":{}}"#,
        r#"{"name":"list_contexts","_meta":{"progressToken":1}}"#,
        r#"{"name":"list_contexts","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}"#,
        r#"{"name":"list_contexts","arguments":{},"other":[1,2]}"#,
        r#"{"name":"get_query","arguments":{"query_id":"q_unknown"}}"#,
        r#"{"name":"get_query","arguments":{"query_id":5}}"#,
        r#"{"name":"query_context","arguments":{"context":"papers","question":"Why?"}}"#,
        r#"{"name":"nope"}"#,
        r#"{"name":7}"#,
        r#"{"arguments":{}}"#,
        r#"["list_contexts"]"#,
        r#"{"name":"list_contexts","name":"get_query"}"#,
    ]));
    let extra = proptest::sample::select(vec!["", "", "", r#","extra":{"a":1}"#, r#","id":2"#]);
    (
        accept,
        content_type,
        protocol,
        jsonrpc,
        id,
        method,
        params,
        extra,
    )
        .prop_map(
            |(accept, content_type, protocol, jsonrpc, id, method, params, extra)| {
                let mut body = format!(r#"{{"jsonrpc":{jsonrpc}"#);
                if let Some(id) = id {
                    body.push_str(&format!(r#","id":{id}"#));
                }
                body.push_str(&format!(r#","method":{method}"#));
                if let Some(params) = params {
                    body.push_str(&format!(r#","params":{params}"#));
                }
                body.push_str(extra);
                body.push('}');
                Generated {
                    accept,
                    content_type,
                    protocol,
                    body,
                }
            },
        )
}

async fn send(url: &str, request: &Generated, origin: Option<&str>) -> Raw {
    send_accepting(url, request, origin, request.accept).await
}

/// [`send`] with an `Accept` that rmcp reads as the generated one, with a
/// weight on each range without parameters: answered by rmcp's service.
async fn send_to_rmcp(url: &str, request: &Generated) -> Raw {
    let weighted = request.accept.map(|accept| {
        accept
            .split(',')
            .map(|range| {
                if range.contains(';') {
                    range.to_owned()
                } else {
                    format!("{range};q=1")
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    });
    send_accepting(url, request, None, weighted.as_deref()).await
}

async fn send_accepting(
    url: &str,
    request: &Generated,
    origin: Option<&str>,
    accept: Option<&str>,
) -> Raw {
    let headers = [
        ("accept", accept),
        ("content-type", request.content_type),
        ("mcp-protocol-version", request.protocol),
        ("origin", origin),
    ];
    post_raw(url, request.body.clone(), &headers).await
}

/// Generated requests get the same answer with an allowed `Origin` as
/// without one, and as from rmcp's service.
#[test]
fn generated_requests_get_one_answer_with_or_without_an_origin() {
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (served, _nexus) = runtime.block_on(async {
        let nexus = fake_nexus(2).await;
        let server = NexusMcp::new().with_nexus(
            NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(caller_keys(false)),
        );
        (
            serve(server, HttpOptions::default().stateless(true)).await,
            nexus,
        )
    });
    let origin = format!("http://localhost:{}", served.addr.port());
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96);
    let config = Config {
        source_file: Some(file!()),
        ..crate::support::props::regressions_beside_source(Config::with_cases(cases))
    };
    // The edges named, then generated requests around them.
    let named = [
        (
            None,
            r#"{"name":"list_contexts","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}"#,
        ),
        (
            Some("2025-06-18"),
            r#"{"name":"list_contexts","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}"#,
        ),
        (Some("2026-07-28"), r#"{"name":"list_contexts"}"#),
        (
            Some("2026-07-28"),
            r#"{"name":"list_contexts","arguments":{},"_meta":{}}"#,
        ),
        (
            Some("2025-06-18"),
            r#"{"name":"list_contexts","_meta":{"progressToken":"p"}}"#,
        ),
    ];
    for (protocol, params) in named {
        let request = Generated {
            accept: Some("application/json, text/event-stream"),
            content_type: Some("application/json"),
            protocol,
            body: format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#),
        };
        let (without, with_origin, by_rmcp) = runtime.block_on(async {
            (
                send(&served.url, &request, None).await,
                send(&served.url, &request, Some(&origin)).await,
                send_to_rmcp(&served.url, &request).await,
            )
        });
        assert_eq!(without, with_origin, "{request:?}");
        assert_eq!(without, by_rmcp, "{request:?}");
    }
    let mut runner = TestRunner::new(config);
    let result = runner.run(&generated(), |request| {
        let (without, with_origin, by_rmcp) = runtime.block_on(async {
            (
                send(&served.url, &request, None).await,
                send(&served.url, &request, Some(&origin)).await,
                send_to_rmcp(&served.url, &request).await,
            )
        });
        if without != with_origin {
            return Err(TestCaseError::fail(format!(
                "{without:?} != {with_origin:?}"
            )));
        }
        if without != by_rmcp {
            return Err(TestCaseError::fail(format!(
                "{without:?} != {by_rmcp:?} (by rmcp)"
            )));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
