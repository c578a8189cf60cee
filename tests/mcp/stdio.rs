//! The `nexus-mcp` binary over stdio: rmcp's client through a child process,
//! and stdout purity checked line by line.

use std::process::Stdio;
use std::time::Duration;

use crate::support::mcp as mcp_support;
use mcp_support::*;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

fn nexus_mcp(nexus_url: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nexus-mcp"));
    cmd.env_clear()
        .env("NEXUS_BASE_URL", nexus_url)
        .env("PINECONE_API_KEY", SERVER_KEY)
        // Plenty of logging, so that any of it reaching stdout would show.
        .env("RUST_LOG", "trace")
        .kill_on_drop(true);
    cmd
}

#[tokio::test]
async fn rmcp_client_drives_the_binary_over_stdio() {
    let nexus = fake_nexus(0).await;
    let (transport, _stderr) = TokioChildProcess::builder(nexus_mcp(&nexus.uri()))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = ().serve(transport).await.unwrap();
    let info = client.peer_info().unwrap();
    assert_eq!(info.server_info.as_ref().unwrap().name, "nexus-knowql");
    let tools = client.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 3);
    let result = client
        .call_tool(CallToolRequestParams::new("list_contexts"))
        .await
        .unwrap();
    assert_eq!(result.is_error, Some(false));
    assert_eq!(text_json(&result).as_array().unwrap().len(), 4);
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn stdio_stdout_holds_nothing_but_json_rpc() {
    let nexus = fake_nexus(0).await;
    let mut child = nexus_mcp(&nexus.uri())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = child.stderr.take().unwrap();

    let messages = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "stdio-test", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "list_contexts", "arguments": {}}}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
            "params": {"name": "query_context", "arguments": {"context": "nope", "question": "x"}}}),
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "query_context", "arguments": {"context": "handbook", "question": ""}}}),
    ];
    let mut lines: Vec<String> = Vec::new();
    for m in &messages {
        stdin.write_all(format!("{m}\n").as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
        if m.get("id").is_some() {
            // Read until this request's response arrives.
            loop {
                let line = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
                    .await
                    .expect("a response in time")
                    .unwrap()
                    .expect("stdout still open");
                let is_answer =
                    serde_json::from_str::<Value>(&line).is_ok_and(|v| v["id"] == m["id"]);
                lines.push(line);
                if is_answer {
                    break;
                }
            }
        }
    }
    // Closing stdin ends the session; whatever else was printed is read too.
    drop(stdin);
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_secs(20), stdout.next_line()).await
    {
        lines.push(line);
    }
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");

    assert!(lines.len() >= 5);
    for line in &lines {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line:?}"));
        assert_eq!(v["jsonrpc"], "2.0", "{line}");
    }
    let find = |id: u64| {
        lines
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|v| v["id"] == id)
            .unwrap()
    };
    assert_eq!(find(1)["result"]["serverInfo"]["name"], "nexus-knowql");
    assert_eq!(find(3)["result"]["isError"], false);
    let error_code = |id: u64| {
        let result = find(id)["result"].clone();
        assert_eq!(result["isError"], true);
        let body: Value =
            serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
        body["code"].clone()
    };
    assert_eq!(error_code(4), "NOT_FOUND");
    assert_eq!(error_code(5), "VALIDATION");

    // The logs went to stderr, without colour codes and without the key.
    let mut logs = String::new();
    stderr.read_to_string(&mut logs).await.unwrap();
    assert!(logs.contains("serving MCP over stdio"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "ANSI escape in logs");
    assert!(!logs.contains(SERVER_KEY), "the key leaked into the logs");
}

#[tokio::test]
async fn help_documents_flags_and_env_without_showing_the_key() {
    let out = Command::new(env!("CARGO_BIN_EXE_nexus-mcp"))
        .arg("--help")
        .env("PINECONE_API_KEY", SERVER_KEY)
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "--transport",
        "--bind",
        "NEXUS_BASE_URL",
        "PINECONE_API_KEY",
        "NEXUS_API_VERSION",
        "--log-level",
        "--log-format",
        "--allow-server-key",
        "--allow-origin",
    ] {
        assert!(help.contains(needle), "--help lacks {needle}");
    }
    assert!(!help.contains(SERVER_KEY));
}
