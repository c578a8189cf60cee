use std::time::Duration;

use rmcp::model::JsonObject;
use serde_json::Value;

use super::checks::*;
use super::pool::*;
use super::shapes::*;
use super::*;
use crate::mcp::caller::CallerKey;
use crate::types;

fn args(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

/// Which caller labels each connection served, by connection.
type Served = std::sync::Arc<std::sync::Mutex<Vec<Vec<String>>>>;

/// An HTTP/1.1 server on loopback that answers every request with `[]`
/// and records, per connection, the `x-caller` header of each request.
fn recording_server() -> (String, Served) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let served: Served = std::sync::Arc::default();
    let record = std::sync::Arc::clone(&served);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let record = std::sync::Arc::clone(&record);
            let connection = {
                let mut all = record.lock().unwrap();
                all.push(Vec::new());
                all.len() - 1
            };
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().unwrap();
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                loop {
                    line.clear();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) if line == "\r\n" => {
                            let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n[]";
                            if writer.write_all(answer.as_bytes()).is_err() {
                                return;
                            }
                        }
                        Ok(_) => {
                            if let Some(caller) = line.strip_prefix("x-caller: ") {
                                record.lock().unwrap()[connection].push(caller.trim().to_owned());
                            }
                        }
                    }
                }
            });
        }
    });
    (url, served)
}

/// Sends `calls` requests labelled `caller` with the client `server`
/// picks on this thread.
async fn call_through(server: &NexusServer, url: &str, caller: &str, calls: usize) {
    for _ in 0..calls {
        let http = server.caller_http.get(&server.client);
        let call = async {
            let request = http
                .get(format!("{url}/contexts"))
                .header("x-caller", caller);
            request.send().await?.text().await
        };
        let answer = tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .expect("answered in time (not through another runtime's connection)");
        assert_eq!(answer.unwrap(), "[]");
    }
}

#[test]
fn a_tools_nexus_call_is_a_small_future() {
    // The SDK call is boxed once by `nexus`: the futures above it (the
    // tool's, rmcp's boxed handler) then hold and move a pointer, not
    // kilobytes of request state (about 25 KiB unboxed in a debug build).
    let client = Client::builder()
        .base_url("http://127.0.0.1:9")
        .build()
        .unwrap();
    let server = NexusServer::new(client.clone());
    let contexts = client.contexts();
    let call = server.nexus(Subject::None, contexts.list());
    assert!(
        std::mem::size_of_val(&call) <= 1024,
        "{} bytes",
        std::mem::size_of_val(&call)
    );
    let ct = tokio_util::sync::CancellationToken::new();
    let tool = until_cancelled(&ct, server.nexus(Subject::None, contexts.list()));
    assert!(
        std::mem::size_of_val(&tool) <= 2048,
        "{} bytes",
        std::mem::size_of_val(&tool)
    );
}

#[test]
fn callers_get_a_connection_pool_per_single_threaded_runtime() {
    let (url, served) = recording_server();
    let client = Client::builder().base_url(&url).build().unwrap();
    let server = NexusServer::new(client);
    let on_own_thread = |server: NexusServer, caller: &'static str| {
        let url = url.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(call_through(&server, &url, caller, 3));
            // The runtime stays up while the next thread runs: its
            // connections stay open, and would be reused if pools were shared.
            rt
        })
        .join()
        .unwrap()
    };
    let first = on_own_thread(server.clone(), "a");
    let second = on_own_thread(server.clone(), "b");
    drop((first, second));
    let served = served.lock().unwrap().clone();
    assert_eq!(served.concat().len(), 6, "{served:?}");
    for callers in &served {
        assert!(
            callers.iter().all(|c| c == &callers[0]),
            "one connection served two serving threads: {served:?}"
        );
    }

    // A multi-threaded runtime shares the configured client's pool.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(call_through(&server, &url, "m", 2));
    assert_eq!(server.caller_http.per_thread.lock().unwrap().len(), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn callers_clients_are_built_once_per_key_and_made_up_keys_evict_only_each_other() {
    let nexus = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({})))
        .mount(&nexus)
        .await;
    let configured = Client::builder()
        .base_url(nexus.uri())
        .api_key("operator")
        .build()
        .unwrap();
    let server = NexusServer::new(configured);
    let caller = |key: &str| {
        let key = CallerKey::new(secrecy::SecretString::from(key.to_owned()));
        server.caller_http.client(&server.client, key).unwrap()
    };
    for key in ["key-a", "key-b", "key-a", "key-b"] {
        // The answer does not matter here; the key the request carried does.
        let _ = caller(key).client.contexts().list().await;
    }
    let sent: Vec<String> = nexus
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            r.headers
                .get(crate::client::API_KEY_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("<none>")
                .to_owned()
        })
        .collect();
    assert_eq!(sent, ["key-a", "key-b", "key-a", "key-b"]);
    // Built once each, and on probation until Nexus accepts them.
    assert_eq!(server.caller_http.clients.sizes(), (0, 2));
    for key in ["key-a", "key-b"] {
        let mut call = caller(key);
        assert!(call.unproven.is_some());
        server.caller_http.accepted(&mut call);
    }
    assert_eq!(server.caller_http.clients.sizes(), (2, 0));

    // Made-up keys that Nexus never accepts fill only the probation pool.
    for i in 0..MAX_CALLER_CLIENTS + 5 {
        let call = caller(&format!("made-up-{i}"));
        assert!(call.unproven.is_some());
    }
    assert_eq!(
        server.caller_http.clients.sizes(),
        (2, MAX_UNPROVEN_CLIENTS)
    );
    // The accepted keys' clients are still there, and answer per key.
    let call = caller("key-a");
    assert!(
        call.unproven.is_none(),
        "an accepted key's client was pushed out"
    );
    let _ = call.client.contexts().list().await;
    let last = nexus.received_requests().await.unwrap().pop().unwrap();
    assert_eq!(
        last.headers.get(crate::client::API_KEY_HEADER).unwrap(),
        "key-a"
    );

    // Accepted keys are bounded too.
    for i in 0..MAX_CALLER_CLIENTS + 5 {
        let mut call = caller(&format!("real-{i}"));
        server.caller_http.accepted(&mut call);
    }
    assert_eq!(server.caller_http.clients.sizes().0, MAX_CALLER_CLIENTS);
}

/// `query_context`'s context slug as the tool reads it.
fn context_arg(v: Value) -> Result<String, ToolError> {
    let read: QueryContextArgs = parse(&args(v))?;
    checked_id(&read.context, "context").map(str::to_owned)
}

/// `get_query`'s id and wait as the tool reads them.
fn get_query_args(v: Value) -> Result<(String, Duration), ToolError> {
    let read: GetQueryArgs = parse(&args(v))?;
    let id = checked_id(&read.query_id, "query_id")?.to_owned();
    Ok((id, checked_wait(read.wait_seconds.as_ref())?))
}

#[test]
fn ids_are_checked_field_by_field() {
    let e = context_arg(serde_json::json!({"context": 5, "question": "q"})).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("context"));
    assert!(e.message.ends_with("expected string"), "{}", e.message);
    let e = get_query_args(serde_json::json!({})).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("query_id"));
    assert!(e.message.contains("missing field"), "{}", e.message);
    let e = get_query_args(serde_json::json!({"query_id": "../x"})).unwrap_err();
    assert!(e.message.contains("not a valid id"));
    assert_eq!(
        context_arg(serde_json::json!({"context": " docs ", "question": "q"})).unwrap(),
        "docs"
    );
}

#[test]
fn wait_seconds_accepts_only_0_to_60() {
    let w = |v: Value| {
        get_query_args(serde_json::json!({"query_id": "q1", "wait_seconds": v})).map(|(_, w)| w)
    };
    assert_eq!(w(Value::Null).unwrap(), Duration::ZERO);
    assert_eq!(w(serde_json::json!(60)).unwrap(), Duration::from_secs(60));
    assert_eq!(w(serde_json::json!(5.0)).unwrap(), Duration::from_secs(5));
    for bad in [
        serde_json::json!(61),
        serde_json::json!(-1),
        serde_json::json!(1.5),
        serde_json::json!("5"),
    ] {
        let e = w(bad.clone()).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("wait_seconds"), "{bad}");
        assert!(e.message.contains("wait_seconds"), "{bad}: {}", e.message);
    }
}

#[test]
fn a_pending_turn_has_no_answer_yet() {
    let q: types::Query = serde_json::from_value(serde_json::json!({
        "id": "q1", "object": "query", "session_id": "s1", "created": 0,
        "status": crate::QueryStatus::InProgress.as_str(), "input": [], "runtime_ms": 0, "steps": [],
        "citations": [], "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
        "output": [{"role": "assistant", "content": [{"type": "output_text", "text": "partial"}]}]
    }))
    .unwrap();
    let out = QueryOutcome::from(&q);
    assert_eq!(out.answer, None);
    assert_eq!(out.status, crate::QueryStatus::InProgress.as_str());
}
