//! `ping` over stdio answers the same for a revision whatever came before
//! it: `{}` at the revisions with `initialize`, `-32601` at 2026-07-28
//! (which has no `ping`), before a tool call and after one alike.

use std::time::Duration;

use crate::support::mcp::{fake_nexus, nexus_client};
use nexus_knowql::mcp::{NexusMcp, NexusServer, stdio};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf};

const LIMIT: Duration = Duration::from_secs(20);

/// A client's ends of an in-process stdio server.
struct Lines {
    input: WriteHalf<DuplexStream>,
    output: BufReader<ReadHalf<DuplexStream>>,
}

impl Lines {
    async fn start(nexus_url: &str) -> Lines {
        let server = NexusMcp::new().with_nexus(NexusServer::new(nexus_client(nexus_url)));
        let (server_io, client_io) = tokio::io::duplex(1 << 16);
        let (server_in, server_out) = tokio::io::split(server_io);
        tokio::spawn(async move {
            let _ = stdio::serve(server, server_in, server_out).await;
        });
        let (output, input) = tokio::io::split(client_io);
        Lines {
            input,
            output: BufReader::new(output),
        }
    }

    async fn send(&mut self, message: Value) {
        let line = format!("{message}\n");
        self.input.write_all(line.as_bytes()).await.unwrap();
        self.input.flush().await.unwrap();
    }

    /// Sends request `id` and reads lines up to its answer.
    async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let read = async {
            loop {
                let mut line = String::new();
                assert!(self.output.read_line(&mut line).await.unwrap() > 0);
                let message: Value = serde_json::from_str(&line).unwrap();
                if message["id"] == id {
                    return message;
                }
            }
        };
        tokio::time::timeout(LIMIT, read).await.expect("an answer")
    }
}

fn meta_2026() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "stdio-ping", "version": "0"},
    })
}

/// What `ping` answered: the result, or the error's code.
fn outcome(answer: &Value) -> Value {
    match answer.get("error") {
        Some(error) => error["code"].clone(),
        None => answer["result"].clone(),
    }
}

#[tokio::test]
async fn ping_at_2026_07_28_answers_the_same_before_and_after_a_tool_call() {
    let nexus = fake_nexus(0).await;
    let mut lines = Lines::start(&nexus.uri()).await;
    let ping = json!({"_meta": meta_2026()});
    let before = lines.request(1, "ping", ping.clone()).await;
    let call = json!({"name": "list_contexts", "arguments": {}, "_meta": meta_2026()});
    let called = lines.request(2, "tools/call", call).await;
    assert_eq!(called["result"]["isError"], false, "{called}");
    let after = lines.request(3, "ping", ping).await;
    // 2026-07-28 has no `ping` method.
    assert_eq!(outcome(&before), json!(-32601), "{before}");
    assert_eq!(outcome(&after), json!(-32601), "{after}");
    assert_eq!(before["error"], after["error"]);
}

#[tokio::test]
async fn ping_in_an_initialized_session_answers_empty_before_and_after_a_tool_call() {
    let nexus = fake_nexus(0).await;
    let mut lines = Lines::start(&nexus.uri()).await;
    let before = lines.request(1, "ping", json!({})).await;
    let init = json!({"protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "stdio-ping", "version": "0"}});
    let initialized = lines.request(2, "initialize", init).await;
    assert!(initialized.get("result").is_some(), "{initialized}");
    lines
        .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let between = lines.request(3, "ping", json!({})).await;
    let call = json!({"name": "list_contexts", "arguments": {}});
    let called = lines.request(4, "tools/call", call).await;
    assert_eq!(called["result"]["isError"], false, "{called}");
    let after = lines.request(5, "ping", json!({})).await;
    for answer in [&before, &between, &after] {
        assert_eq!(outcome(answer), json!({}), "{answer}");
    }
}

/// A `ping` without `_meta` names no revision: it answers `{}` whatever
/// came before it, `server/discover` (which chooses 2026-07-28) included.
#[tokio::test]
async fn a_plain_ping_answers_empty_before_and_after_discovery() {
    let nexus = fake_nexus(0).await;
    let mut lines = Lines::start(&nexus.uri()).await;
    let before = lines.request(1, "ping", json!({})).await;
    let discovered = lines
        .request(2, "server/discover", json!({"_meta": meta_2026()}))
        .await;
    assert!(discovered.get("result").is_some(), "{discovered}");
    let after = lines.request(3, "ping", json!({})).await;
    let call = json!({"name": "list_contexts", "arguments": {}, "_meta": meta_2026()});
    let called = lines.request(5, "tools/call", call).await;
    assert_eq!(called["result"]["isError"], false, "{called}");
    let last = lines.request(6, "ping", json!({})).await;
    for answer in [&before, &after, &last] {
        assert_eq!(outcome(answer), json!({}), "{answer}");
    }
    // A ping that names 2026-07-28 still has no method there.
    let named = lines
        .request(7, "ping", json!({"_meta": meta_2026()}))
        .await;
    assert_eq!(outcome(&named), json!(-32601), "{named}");
}
