//! Per-call latency of `nexus-mcp` beside the TypeScript Pinecone MCP server
//! (`@pinecone-database/mcp`), both over stdio against the same in-process
//! fake Pinecone, in one run.
//!
//! ```text
//! TS_MCP_DIR=/path/to/pinecone-mcp benches/side_by_side/run.sh
//! ```
//!
//! The script builds `target/release/nexus-mcp` and runs this driver
//! (`cargo bench --features mcp --bench side_by_side`, optimised, so that the
//! fake answers both servers quickly). The driver starts the fake of the
//! tests (`tests/support/pinecone_fake.rs`), then both servers as child
//! processes, and times each call from writing its request line to reading
//! its answer line, with blocking reads on one thread (no runtime between the
//! pipe and the clock). Pairs compared:
//!
//! - a cached `list_namespaces` against `describe-index-stats` (the index's
//!   namespaces and their counts; the TypeScript server asks Pinecone each time);
//! - `query` with `preset: fast` (`top_k` 10) against `search-records`
//!   (`topK` 10) for the same text and namespace.
//!
//! After `SIDE_BY_SIDE_WARM_UP` (default 30) calls per tool per server, each
//! of `SIDE_BY_SIDE_ROUNDS` (default 2) rounds makes `SIDE_BY_SIDE_CALLS`
//! (default 300) calls per tool per server, back to back (all of one
//! server's calls of a tool, then the other's), and prints p50/p90/p99 per
//! tool per server and the ratios. `SIDE_BY_SIDE_ORDER=alternate` alternates
//! between the servers call by call instead, so that each call of one
//! follows a call of the other: both see the same machine, and each server
//! starts every call after a pause as long as the other's call. `TS_MCP_DIR` is the TypeScript project
//! after `npm ci && npm run build` (without it only `nexus-mcp` is measured);
//! `SIDE_BY_SIDE_PAUSE_US=<n>` pauses before each call (idle time, as
//! between a real client's calls). `SIDE_BY_SIDE_STDIO=socket` gives both servers Unix socket pairs for
//! stdin and stdout instead of pipes, as Node-based clients do.
//! `NEXUS_MCP_BIN` names another `nexus-mcp` (default
//! `target/release/nexus-mcp`); `SIDE_BY_SIDE_STDERR=1` shows the servers'
//! logs. Without `--bench` (as `cargo test --bench
//! '*'` runs it) it only prints how to run it.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "../tests/support/pinecone_fake.rs"]
mod pinecone_fake;
#[path = "../tests/support/wait.rs"]
mod wait;

/// Loaded into the TypeScript server: its SDK's control-plane requests go to
/// the fake (that server configures the SDK itself, so the SDK does not read
/// `PINECONE_CONTROLLER_HOST`).
const CONTROLLER_HOST_HOOK: &str = "benches/side_by_side/controller-host.mjs";

/// The whole run ends within this, even if a server stops answering.
const RUN_LIMIT: Duration = Duration::from_secs(900);

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `nexus-mcp` measured.
fn nexus_binary() -> PathBuf {
    std::env::var_os("NEXUS_MCP_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/nexus-mcp"))
}

/// One MCP server over stdio: a request line out, its answer line back.
struct StdioServer {
    name: &'static str,
    child: Child,
    stdin: Option<Box<dyn Write>>,
    stdout: BufReader<Box<dyn Read>>,
    line: String,
    next_id: u64,
    /// From spawning the process to the answer to `initialize`.
    started_in: Duration,
}

impl StdioServer {
    /// Starts `cmd` with pipes, or Unix socket pairs with `sockets` (as
    /// Node-based clients start their servers).
    fn start(name: &'static str, mut cmd: Command, sockets: bool) -> StdioServer {
        let started = Instant::now();
        let mut ends: Option<(Box<dyn Write>, Box<dyn Read>)> = None;
        if sockets {
            let (to_child, child_stdin) = UnixStream::pair().expect("a socket pair");
            let (from_child, child_stdout) = UnixStream::pair().expect("a socket pair");
            cmd.stdin(OwnedFd::from(child_stdin))
                .stdout(OwnedFd::from(child_stdout));
            ends = Some((Box::new(to_child), Box::new(from_child)));
        } else {
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        }
        let mut child = cmd
            .stderr(if std::env::var_os("SIDE_BY_SIDE_STDERR").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .unwrap_or_else(|e| panic!("{name} does not start: {e}"));
        let (stdin, stdout) = match ends {
            Some(ends) => ends,
            None => (
                Box::new(child.stdin.take().expect("piped stdin")) as Box<dyn Write>,
                Box::new(child.stdout.take().expect("piped stdout")) as Box<dyn Read>,
            ),
        };
        let (stdin, stdout) = (Some(stdin), BufReader::new(stdout));
        let mut server = StdioServer {
            name,
            child,
            stdin,
            stdout,
            line: String::new(),
            next_id: 1,
            started_in: Duration::ZERO,
        };
        let init = json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "side-by-side", "version": "0"}
        });
        server.request("initialize", &init);
        server.started_in = started.elapsed();
        server.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        server
    }

    fn send(&mut self, message: &Value) {
        let mut bytes = serde_json::to_vec(message).expect("JSON");
        bytes.push(b'\n');
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(&bytes).expect("write a request");
        stdin.flush().expect("flush a request");
    }

    /// Sends one request and reads lines until its answer (notifications,
    /// such as log messages, are skipped).
    fn request(&mut self, method: &str, params: &Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            self.line.clear();
            let read = self.stdout.read_line(&mut self.line).expect("read a line");
            assert!(read > 0, "{} closed its stdout", self.name);
            let answer: Value = serde_json::from_str(&self.line)
                .unwrap_or_else(|e| panic!("{}: not a JSON line ({e}): {}", self.name, self.line));
            if answer.get("id") == Some(&json!(id)) {
                return answer;
            }
        }
    }

    /// One tool call, timed from writing the request to reading the answer.
    fn call(&mut self, call: &ToolCall) -> Duration {
        if let Some(pause) = pause_between_calls() {
            std::thread::sleep(pause);
        }
        let params = json!({"name": call.tool, "arguments": call.arguments});
        let started = Instant::now();
        let answer = self.request("tools/call", &params);
        let took = started.elapsed();
        let result = &answer["result"];
        assert!(
            result.is_object() && result["isError"] != json!(true),
            "{} {}: {answer}",
            self.name,
            call.tool
        );
        took
    }

    /// Closes stdin and waits for the process to end.
    fn finish(mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// `SIDE_BY_SIDE_PAUSE_US`: an idle pause before each call, as between the
/// calls of a real client.
fn pause_between_calls() -> Option<Duration> {
    static PAUSE: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *PAUSE.get_or_init(|| {
        let micros = env_count("SIDE_BY_SIDE_PAUSE_US", 0);
        (micros > 0).then(|| Duration::from_micros(micros as u64))
    })
}

/// A tool and its arguments.
struct ToolCall {
    tool: &'static str,
    arguments: Value,
}

/// The same question put to both servers.
struct Pair {
    label: &'static str,
    nexus: ToolCall,
    typescript: ToolCall,
}

fn pairs() -> Vec<Pair> {
    vec![
        Pair {
            label: "namespaces",
            nexus: ToolCall {
                tool: "list_namespaces",
                arguments: json!({}),
            },
            typescript: ToolCall {
                tool: "describe-index-stats",
                arguments: json!({"name": "kb"}),
            },
        },
        Pair {
            label: "search",
            nexus: ToolCall {
                tool: "query",
                arguments: json!({
                    "query_text": "coroutines", "namespace": "wg21-papers",
                    "preset": "fast", "top_k": 10
                }),
            },
            typescript: ToolCall {
                tool: "search-records",
                arguments: json!({
                    "name": "kb", "namespace": "wg21-papers",
                    "query": {"topK": 10, "inputs": {"text": "coroutines"}}
                }),
            },
        },
    ]
}

/// p50, p90 and p99 (nearest rank) of `times`.
fn percentiles(times: &mut [Duration]) -> [Duration; 3] {
    times.sort_unstable();
    let at = |p: usize| times[(times.len() * p).div_ceil(100).saturating_sub(1)];
    [at(50), at(90), at(99)]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn print_row(server: &str, tool: &str, p: &[Duration; 3]) {
    println!(
        "  {server:<13} {tool:<22} {:>8} {:>8} {:>8}",
        ms(p[0]),
        ms(p[1]),
        ms(p[2])
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("side_by_side: run benches/side_by_side/run.sh (TS_MCP_DIR=<pinecone-mcp>)");
        return;
    }
    let nexus = nexus_binary();
    assert!(
        nexus.exists(),
        "{} is missing: cargo build --release --features mcp,cli --bin nexus-mcp",
        nexus.display()
    );
    let typescript = std::env::var_os("TS_MCP_DIR").map(|d| PathBuf::from(d).join("dist/index.js"));
    if let Some(entry) = &typescript {
        assert!(
            entry.exists(),
            "{} is missing: npm ci && npm run build in TS_MCP_DIR",
            entry.display()
        );
    }
    let warm_up = env_count("SIDE_BY_SIDE_WARM_UP", 30);
    let calls = env_count("SIDE_BY_SIDE_CALLS", 300).max(1);
    let rounds = env_count("SIDE_BY_SIDE_ROUNDS", 2).max(1);
    let alternate = std::env::var("SIDE_BY_SIDE_ORDER").is_ok_and(|v| v == "alternate");
    std::thread::spawn(|| {
        std::thread::sleep(RUN_LIMIT);
        eprintln!("side_by_side: the run took longer than {RUN_LIMIT:?}");
        std::process::exit(1);
    });

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env_count("SIDE_BY_SIDE_FAKE_THREADS", 1).max(1))
        .enable_all()
        .build()
        .expect("runtime");
    let fake = rt.block_on(pinecone_fake::PineconeFake::start());

    let mut ours = Command::new(&nexus);
    ours.env_clear()
        .env("RUST_LOG", "warn")
        .env("PINECONE_API_KEY", pinecone_fake::KEY_A)
        .env("PINECONE_INDEX_NAME", "kb")
        .env("PINECONE_CONTROLLER_HOST", &fake.url)
        .env("PINECONE_DISABLE_SUGGEST_FLOW", "true");
    let sockets = std::env::var("SIDE_BY_SIDE_STDIO").is_ok_and(|v| v == "socket");
    let mut ours = StdioServer::start("nexus-mcp", ours, sockets);
    let mut theirs = typescript.as_ref().map(|entry| {
        let hook = Path::new(env!("CARGO_MANIFEST_DIR")).join(CONTROLLER_HOST_HOOK);
        let mut cmd = Command::new("node");
        cmd.arg("--import")
            .arg(format!("file://{}", hook.display()))
            .arg(entry)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("PINECONE_API_KEY", pinecone_fake::KEY_A)
            .env("PINECONE_CONTROLLER_HOST", &fake.url);
        StdioServer::start("pinecone-mcp", cmd, sockets)
    });

    println!(
        "side by side over stdio ({}): {} vs {}",
        if sockets {
            "Unix socket pairs"
        } else {
            "pipes"
        },
        nexus.display(),
        typescript
            .as_ref()
            .map_or("(TS_MCP_DIR not set)".to_owned(), |p| p
                .display()
                .to_string())
    );
    print!("start to initialized: nexus-mcp {} ms", ms(ours.started_in));
    match &theirs {
        Some(t) => println!(", pinecone-mcp {} ms", ms(t.started_in)),
        None => println!(),
    }

    let pairs = pairs();
    for pair in &pairs {
        for _ in 0..warm_up {
            ours.call(&pair.nexus);
            if let Some(t) = theirs.as_mut() {
                t.call(&pair.typescript);
            }
        }
    }
    for round in 1..=rounds {
        println!(
            "round {round}: {calls} calls per tool per server, {}, after {warm_up} warm-up \
             calls (ms)",
            if alternate {
                "alternating"
            } else {
                "back to back"
            }
        );
        println!(
            "  {:<13} {:<22} {:>8} {:>8} {:>8}",
            "server", "tool", "p50", "p90", "p99"
        );
        for pair in &pairs {
            let mut our_times = Vec::with_capacity(calls);
            let mut their_times = Vec::with_capacity(calls);
            if alternate {
                for _ in 0..calls {
                    our_times.push(ours.call(&pair.nexus));
                    if let Some(t) = theirs.as_mut() {
                        their_times.push(t.call(&pair.typescript));
                    }
                }
            } else {
                our_times.extend((0..calls).map(|_| ours.call(&pair.nexus)));
                if let Some(t) = theirs.as_mut() {
                    their_times.extend((0..calls).map(|_| t.call(&pair.typescript)));
                }
            }
            let our_p = percentiles(&mut our_times);
            print_row("nexus-mcp", pair.nexus.tool, &our_p);
            if theirs.is_some() {
                let their_p = percentiles(&mut their_times);
                print_row("pinecone-mcp", pair.typescript.tool, &their_p);
                let ratio = |i: usize| their_p[i].as_secs_f64() / our_p[i].as_secs_f64();
                println!(
                    "  {:<13} {:<22} {:>7.2}x {:>7.2}x {:>7.2}x",
                    "ratio",
                    pair.label,
                    ratio(0),
                    ratio(1),
                    ratio(2)
                );
            }
        }
    }
    ours.finish();
    if let Some(t) = theirs {
        t.finish();
    }
    drop(fake);
}
