//! Instructions per call of the optimised `nexus-mcp`, counted with
//! callgrind: repeatable on a busy machine, where wall-clock times are not.
//!
//! ```text
//! benches/callgrind/run.sh
//! ```
//!
//! The script builds `target/release/nexus-mcp`, then runs this driver
//! (`cargo bench --profile dev --features mcp,local --bench callgrind_calls`;
//! the driver's own speed does not matter, only the server's instructions are
//! counted). For each scenario the driver starts the server under
//! `valgrind --tool=callgrind` twice, makes the same warm-up calls and then
//! `CALLGRIND_FEW` (default 20) or `CALLGRIND_MANY` (default 220) measured
//! calls, one at a time, and reports
//! `(instructions(many) - instructions(few)) / (many - few)`: start-up,
//! warm-up and shutdown cancel out.
//!
//! Scenarios (`CALLGRIND_ONLY=<name>` runs one):
//! - `list_namespaces_stdio`: a cached `list_namespaces` over stdio against
//!   the in-process fake Pinecone of the tests;
//! - `query_fast_stdio`: `query` with `preset: fast` over stdio, same fake;
//! - `list_contexts_stdio` and `list_contexts_http_stateless`: Nexus
//!   `list_contexts` over stdio and over HTTP `--stateless` against
//!   `nexus-local` serving the shipped corpus.
//!
//! `CALLGRIND_OUT_DIR=<dir>` keeps the callgrind files (`<scenario>.<calls>.out`)
//! for `callgrind_annotate`. `NEXUS_MCP_BIN` names another binary (default `target/release/nexus-mcp`).
//! Without `--bench` (as `cargo test --bench '*'` runs it) it only prints how
//! to run it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

#[path = "../tests/support/local.rs"]
mod local_support;
#[path = "../tests/support/pinecone_fake.rs"]
mod pinecone_fake;
#[path = "../tests/support/wait.rs"]
mod wait;

use local_support::LocalBinary;

/// The key `nexus-mcp` is configured with for Nexus.
const NEXUS_KEY: &str = "pcsk_server_key_0123456789abcdefghij";
/// Calls made before anything is measured (both runs make them).
const WARM_UP: usize = 10;

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The server binary measured.
fn server_binary() -> PathBuf {
    std::env::var_os("NEXUS_MCP_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/nexus-mcp"))
}

/// `nexus-mcp` under callgrind, writing its counts to `out`, with `envs`.
fn under_callgrind(out: &Path, envs: &[(&str, String)]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(server_binary())
        .env_clear()
        .env("RUST_LOG", "warn")
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stderr(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// The instruction total callgrind wrote to `out`.
fn total_instructions(out: &Path) -> u64 {
    let text = std::fs::read_to_string(out).expect("the callgrind output");
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("a summary line in the callgrind output")
}

/// One JSON-RPC line out, one line back.
struct LineClient {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    stdout: BufReader<tokio::process::ChildStdout>,
    line: String,
    next_id: u64,
}

impl LineClient {
    async fn start(mut cmd: tokio::process::Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("valgrind starts");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut client = LineClient {
            child,
            stdin,
            stdout,
            line: String::new(),
            next_id: 1,
        };
        let init = json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "callgrind", "version": "0"}
        });
        client.request("initialize", &init).await;
        client
            .send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        client
    }

    async fn send(&mut self, message: &Value) {
        let mut bytes = serde_json::to_vec(message).expect("JSON");
        bytes.push(b'\n');
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(&bytes).await.expect("write to nexus-mcp");
    }

    async fn request(&mut self, method: &str, params: &Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(&message).await;
        self.line.clear();
        tokio::time::timeout(
            Duration::from_secs(120),
            self.stdout.read_line(&mut self.line),
        )
        .await
        .expect("nexus-mcp answers within 120 s")
        .expect("read from nexus-mcp");
        let answer: Value = serde_json::from_str(&self.line).expect("a JSON-RPC line");
        assert_eq!(answer["id"], id, "{answer}");
        answer
    }

    /// Closes stdin and waits for the server to end (and callgrind to write).
    async fn finish(mut self) {
        drop(self.stdin.take());
        let status = tokio::time::timeout(Duration::from_secs(120), self.child.wait())
            .await
            .expect("nexus-mcp ends within 120 s")
            .expect("wait for nexus-mcp");
        assert!(status.success(), "nexus-mcp ended with {status}");
    }
}

/// A minimal HTTP/1.1 client on one keep-alive connection: a POST out, the
/// `Content-Length` body back.
struct HttpClient {
    stream: BufReader<tokio::net::TcpStream>,
    port: u16,
    next_id: u64,
    /// The last answer said `connection: close`.
    closed: bool,
}

impl HttpClient {
    async fn connect(port: u16) -> Self {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        HttpClient {
            stream: BufReader::new(stream),
            port,
            next_id: 1,
            closed: false,
        }
    }

    async fn call(&mut self, name: &str, arguments: &Value) -> Value {
        if self.closed {
            // The server closes a connection after its per-connection
            // request limit: open the next, as a keep-alive client would.
            let next_id = self.next_id;
            *self = HttpClient::connect(self.port).await;
            self.next_id = next_id;
        }
        let id = self.next_id;
        self.next_id += 1;
        let body = serde_json::to_vec(&json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}
        }))
        .expect("JSON");
        let head = format!(
            "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{}\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\nmcp-protocol-version: 2025-06-18\r\n\
             x-pinecone-api-key: {NEXUS_KEY}\r\ncontent-length: {}\r\n\r\n",
            self.port,
            body.len()
        );
        let stream = self.stream.get_mut();
        stream.write_all(head.as_bytes()).await.expect("write");
        stream.write_all(&body).await.expect("write");
        let answer = tokio::time::timeout(Duration::from_secs(120), self.read_answer())
            .await
            .expect("nexus-mcp answers within 120 s");
        assert_eq!(answer["id"], id, "{answer}");
        answer
    }

    async fn read_answer(&mut self) -> Value {
        let mut length = None;
        let mut status = String::new();
        self.stream.read_line(&mut status).await.expect("status");
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        loop {
            let mut line = String::new();
            self.stream.read_line(&mut line).await.expect("header");
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse::<usize>().ok();
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("connection")
                && value.trim().eq_ignore_ascii_case("close")
            {
                self.closed = true;
            }
        }
        let mut body = vec![0; length.expect("a Content-Length answer")];
        self.stream.read_exact(&mut body).await.expect("body");
        serde_json::from_slice(&body).expect("a JSON answer")
    }
}

/// A call over stdio and the check of its answer.
struct StdioCall {
    tool: &'static str,
    arguments: Value,
}

async fn run_stdio(envs: &[(&str, String)], call: &StdioCall, calls: usize, out: &Path) -> u64 {
    let mut client = LineClient::start(under_callgrind(out, envs)).await;
    let params = json!({"name": call.tool, "arguments": call.arguments});
    for _ in 0..WARM_UP + calls {
        let answer = client.request("tools/call", &params).await;
        assert_eq!(answer["result"]["isError"], false, "{answer}");
    }
    client.finish().await;
    total_instructions(out)
}

async fn run_http(envs: &[(&str, String)], calls: usize, out: &Path) -> u64 {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut child = under_callgrind(out, envs)
        .args(["--transport", "http", "--stateless", "--bind"])
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("valgrind starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "nexus-mcp did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut client = HttpClient::connect(port).await;
    for _ in 0..WARM_UP + calls {
        let answer = client.call("list_contexts", &json!({})).await;
        assert_eq!(answer["result"]["isError"], false, "{answer}");
    }
    drop(client);
    let pid = child.id().expect("a running child");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
        .await
        .expect("nexus-mcp ends within 120 s")
        .expect("wait for nexus-mcp");
    assert!(status.success(), "nexus-mcp ended with {status}");
    total_instructions(out)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("callgrind_calls: run benches/callgrind/run.sh (needs valgrind)");
        return;
    }
    assert!(
        server_binary().exists(),
        "{} is missing: cargo build --release --features mcp,cli --bin nexus-mcp",
        server_binary().display()
    );
    let few = env_count("CALLGRIND_FEW", 20);
    let many = env_count("CALLGRIND_MANY", 220);
    assert!(many > few, "CALLGRIND_MANY must exceed CALLGRIND_FEW");
    let only = std::env::var("CALLGRIND_ONLY").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let temp = tempfile::tempdir().expect("a temporary directory");
    // `CALLGRIND_OUT_DIR` keeps the callgrind files, for `callgrind_annotate`.
    let dir =
        std::env::var_os("CALLGRIND_OUT_DIR").map_or_else(|| temp.path().to_owned(), PathBuf::from);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "instructions per call ({} - {few} calls after {WARM_UP} warm-up calls), {}",
        many,
        server_binary().display()
    );
    rt.block_on(async {
        let fake = pinecone_fake::PineconeFake::start().await;
        let pinecone = vec![
            ("PINECONE_API_KEY", pinecone_fake::KEY_A.to_owned()),
            ("PINECONE_INDEX_NAME", "kb".to_owned()),
            ("PINECONE_CONTROLLER_HOST", fake.url.clone()),
            ("PINECONE_DISABLE_SUGGEST_FLOW", "true".to_owned()),
        ];
        let stdio = [
            (
                "list_namespaces_stdio",
                StdioCall {
                    tool: "list_namespaces",
                    arguments: json!({}),
                },
            ),
            (
                "query_fast_stdio",
                StdioCall {
                    tool: "query",
                    arguments: json!({
                        "query_text": "coroutines", "namespace": "wg21-papers",
                        "preset": "fast", "top_k": 10
                    }),
                },
            ),
        ];
        for (name, call) in &stdio {
            if !wanted(name) {
                continue;
            }
            let out = |n: usize| dir.join(format!("{name}.{n}.out"));
            let low = run_stdio(&pinecone, call, few, &out(few)).await;
            let high = run_stdio(&pinecone, call, many, &out(many)).await;
            report(name, low, high, many - few);
        }
        let nexus_names = ["list_contexts_stdio", "list_contexts_http_stateless"];
        if nexus_names.iter().any(|n| wanted(n)) {
            let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
            let nexus = LocalBinary::start(
                &["--context", &format!("docs={corpus}")],
                &[("RUST_LOG", "warn")],
            );
            let envs = vec![
                ("NEXUS_BASE_URL", nexus.url.clone()),
                ("PINECONE_API_KEY", NEXUS_KEY.to_owned()),
            ];
            let [stdio_name, http_name] = nexus_names;
            if wanted(stdio_name) {
                let call = StdioCall {
                    tool: "list_contexts",
                    arguments: json!({}),
                };
                let out = |n: usize| dir.join(format!("{stdio_name}.{n}.out"));
                let low = run_stdio(&envs, &call, few, &out(few)).await;
                let high = run_stdio(&envs, &call, many, &out(many)).await;
                report(stdio_name, low, high, many - few);
            }
            if wanted(http_name) {
                let out = |n: usize| dir.join(format!("{http_name}.{n}.out"));
                let low = run_http(&envs, few, &out(few)).await;
                let high = run_http(&envs, many, &out(many)).await;
                report(http_name, low, high, many - few);
            }
        }
    });
}

fn report(name: &str, low: u64, high: u64, calls: usize) {
    let per_call = high.saturating_sub(low) / calls as u64;
    println!("{name:<30} {per_call:>10} instructions/call  (totals {low} / {high})");
}
