//! The `nexus-mcp` binary's stdin and stdout as pipes and as Unix socket
//! pairs (as Node-based clients start a server): both are read and written
//! on the server's one thread, with no blocking thread behind them, and the
//! server ends in order when stdin ends.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::Stdio;
use std::time::Duration;

use crate::support::mcp::{SERVER_KEY, fake_nexus};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::process::Command;

const LIMIT: Duration = Duration::from_secs(20);

/// How the client hands the server its stdin and stdout.
#[derive(Clone, Copy, Debug)]
enum Ends {
    Pipes,
    UnixSockets,
}

/// Starts `nexus-mcp` with `ends`, exchanges a few messages, and returns how
/// many threads the server had after answering them.
async fn threads_after_a_few_calls(ends: Ends) -> usize {
    let nexus = fake_nexus(0).await;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nexus-mcp"));
    cmd.env_clear()
        .env("NEXUS_BASE_URL", nexus.uri())
        .env("PINECONE_API_KEY", SERVER_KEY)
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let (mut child, input, output): (_, Box<dyn AsyncWrite + Unpin>, Box<dyn AsyncRead + Unpin>) =
        match ends {
            Ends::Pipes => {
                cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
                let mut child = cmd.spawn().unwrap();
                let input = Box::new(child.stdin.take().unwrap());
                let output = Box::new(child.stdout.take().unwrap());
                (child, input, output)
            }
            Ends::UnixSockets => {
                let (to_server, server_stdin) = UnixStream::pair().unwrap();
                let (from_server, server_stdout) = UnixStream::pair().unwrap();
                cmd.stdin(OwnedFd::from(server_stdin))
                    .stdout(OwnedFd::from(server_stdout));
                let child = cmd.spawn().unwrap();
                to_server.set_nonblocking(true).unwrap();
                from_server.set_nonblocking(true).unwrap();
                let input = Box::new(tokio::net::UnixStream::from_std(to_server).unwrap());
                let output = Box::new(tokio::net::UnixStream::from_std(from_server).unwrap());
                (child, input, output)
            }
        };
    // The server's ends close here, so that it alone holds them.
    drop(cmd);
    let mut input = input;
    let mut lines = BufReader::new(output).lines();
    let messages = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "stdio-ends", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}}),
    ];
    for m in &messages {
        input.write_all(format!("{m}\n").as_bytes()).await.unwrap();
        input.flush().await.unwrap();
        if m.get("id").is_none() {
            continue;
        }
        let line = tokio::time::timeout(LIMIT, lines.next_line())
            .await
            .expect("an answer in time")
            .unwrap()
            .expect("stdout still open");
        let answer: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(answer["id"], m["id"], "{ends:?}: {line}");
        assert!(answer.get("result").is_some(), "{ends:?}: {line}");
    }
    let pid = child.id().expect("running");
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count();
    // Stdin ends: the server stops in order.
    drop(input);
    let status = tokio::time::timeout(LIMIT, child.wait())
        .await
        .expect("the server ends in time")
        .unwrap();
    assert!(status.success(), "{ends:?}: {status:?}");
    threads
}

#[tokio::test]
async fn pipes_are_served_on_the_server_thread() {
    assert_eq!(threads_after_a_few_calls(Ends::Pipes).await, 1);
}

#[tokio::test]
async fn unix_sockets_are_served_on_the_server_thread() {
    assert_eq!(threads_after_a_few_calls(Ends::UnixSockets).await, 1);
}
