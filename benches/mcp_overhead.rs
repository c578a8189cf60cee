//! Round-trip overhead of `nexus-mcp` for `list_contexts`, over stdio and over
//! Streamable HTTP (the real binary as a child process in both cases),
//! against calling the SDK directly in the same run. Nexus is `nexus-local`
//! serving the shipped corpus in its own process, as a real Nexus is never in
//! its caller's process: the SDK and `nexus-mcp` reach it the same way.
//!
//! ```text
//! cargo bench --features mcp,local --bench mcp_overhead -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Rows:
//! - `sdk_direct`: `client.contexts().list()`, the baseline;
//! - `http_hop`: one HTTP round trip of the same test client to a bare axum
//!   handler answering a fixed JSON-RPC result: what one extra HTTP hop
//!   costs here, before any MCP or Nexus work;
//! - `stdio_rmcp`: `tools/call list_contexts` through rmcp's client;
//! - `stdio_line`: the same call with a minimal client (one JSON line out,
//!   one line back); `stdio_line_ping`, a `ping` the same way, and
//!   `stdio_line_no_nexus`, a `tools/call` answered without calling Nexus
//!   (a `get_query` argument error): the transport and dispatch alone;
//! - `http_sessions`, `http_stateless`: `nexus-mcp --transport http` (one
//!   serving thread), with a session and with `--stateless`;
//!   `..._per_core` adds `--worker-threads` with one thread per core;
//! - every HTTP row with reqwest (`HttpMcp`), and with `_min`, with a
//!   minimal client: one HTTP/1.1 connection driven by hyper's connection
//!   API (`http_hop_min` likewise).
//!
//! Besides criterion's report, it prints p50/p99 per row from rounds that
//! call every path once, in a new shuffled order each round
//! (`MCP_OVERHEAD_ROUNDS`, default 3000), so that drift in the machine's
//! speed and the warmth a call leaves behind hit every row alike, and each
//! row's p50/p99 overhead over `sdk_direct`.
//!
//! With `MCP_OVERHEAD_BASELINE_BIN=/path/to/another/nexus-mcp` (an older
//! build, say), that binary's HTTP rows (`http_sessions_baseline`,
//! `http_stateless_baseline`, each also `_min`) join the same rounds, and
//! the bench prints this build's p50/p99 minus the baseline's, with their
//! spread over blocks of consecutive rounds and the median of the per-round
//! differences: a before/after comparison under the same noise.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use nexus_knowql::mcp::http::MCP_PATH;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

#[path = "../tests/support/local.rs"]
mod local_support;
#[path = "../tests/support/mcp.rs"]
mod mcp_support;
#[path = "../tests/support/wait.rs"]
mod wait;
use local_support::LocalBinary;
use mcp_support::{HttpMcp, SERVER_KEY, nexus_client};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        0.0
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}

/// `nexus-mcp` with the Nexus tools on `base`, quiet, no inherited env.
fn nexus_mcp(base: &str) -> tokio::process::Command {
    nexus_mcp_at(env!("CARGO_BIN_EXE_nexus-mcp"), base)
}

/// The `nexus-mcp` binary at `program`, set up as [`nexus_mcp`] does.
fn nexus_mcp_at(program: &str, base: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.env_clear()
        .env("NEXUS_BASE_URL", base)
        .env("PINECONE_API_KEY", SERVER_KEY)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true);
    cmd
}

/// A minimal stdio client: one JSON-RPC line out, one line back.
struct LineClient {
    _child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::BufReader<tokio::process::ChildStdout>,
    line: String,
    next_id: u64,
}

impl LineClient {
    async fn start(base: &str) -> Self {
        let mut child = nexus_mcp(base)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nexus-mcp starts");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = tokio::io::BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut client = LineClient {
            _child: child,
            stdin,
            stdout,
            line: String::new(),
            next_id: 1,
        };
        let init = json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"}
        });
        client.request("initialize", init).await;
        client
            .send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        client
    }

    async fn send(&mut self, message: &Value) {
        let mut bytes = serde_json::to_vec(message).expect("JSON");
        bytes.push(b'\n');
        self.stdin
            .write_all(&bytes)
            .await
            .expect("write to nexus-mcp");
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(&message).await;
        self.line.clear();
        tokio::time::timeout(
            Duration::from_secs(10),
            self.stdout.read_line(&mut self.line),
        )
        .await
        .expect("nexus-mcp answers within 10 s")
        .expect("read from nexus-mcp");
        let answer: Value = serde_json::from_str(&self.line).expect("a JSON-RPC line");
        assert_eq!(answer["id"], id, "{answer}");
        answer
    }
}

/// A minimal Streamable HTTP client: one HTTP/1.1 connection driven by
/// hyper's connection API (no pool, no redirects, no middleware), one POST
/// per call, the answer read whole (JSON, or the `data:` lines of an event
/// stream). What the server adds is measured without a heavy client's own
/// cost on top, as `stdio_line` does for stdio.
struct HyperMcp {
    sender: hyper::client::conn::http1::SendRequest<axum::body::Body>,
    authority: String,
    path: String,
    session: Option<String>,
    next_id: u64,
}

impl HyperMcp {
    async fn connect(url: &str, session: Option<String>) -> Self {
        let url = url::Url::parse(url).expect("an http URL");
        let authority = format!(
            "{}:{}",
            url.host_str().expect("a host"),
            url.port().expect("a port")
        );
        HyperMcp {
            sender: Self::open(&authority).await,
            authority,
            path: url.path().to_owned(),
            session,
            next_id: 1_000_000,
        }
    }

    async fn open(authority: &str) -> hyper::client::conn::http1::SendRequest<axum::body::Body> {
        let stream = tokio::net::TcpStream::connect(authority)
            .await
            .expect("connect");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("HTTP/1.1 handshake");
        tokio::spawn(connection);
        sender
    }

    /// `tools/call` of `name` with no arguments; returns the JSON-RPC result.
    async fn call(&mut self, name: &str) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": {}}
        });
        let mut request = hyper::Request::post(&self.path)
            .header("host", &self.authority)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .header("x-pinecone-api-key", SERVER_KEY);
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        let request = request
            .body(axum::body::Body::from(
                serde_json::to_vec(&message).expect("JSON"),
            ))
            .expect("a request");
        // The server closes a connection after its per-connection request
        // limit; open the next one as any keep-alive client would.
        if self.sender.ready().await.is_err() {
            self.sender = Self::open(&self.authority).await;
            self.sender.ready().await.expect("connection ready");
        }
        let response = tokio::time::timeout(Duration::from_secs(10), async {
            let response = self.sender.send_request(request).await.expect("an answer");
            assert_eq!(response.status(), 200);
            let sse = response
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 1 << 20)
                .await
                .expect("the body");
            (sse, body)
        })
        .await
        .expect("nexus-mcp answers within 10 s");
        let (sse, body) = response;
        let answer: Value = if sse {
            let text = std::str::from_utf8(&body).expect("UTF-8");
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .find(|m| m["id"] == id)
                .expect("the answer in the event stream")
        } else {
            serde_json::from_slice(&body).expect("a JSON answer")
        };
        assert_eq!(answer["id"], id, "{answer}");
        answer["result"].clone()
    }
}

/// Starts the `nexus-mcp` at `program` with `--transport http` on a free
/// loopback port and `extra` arguments, waits until it accepts connections
/// and opens a client (with a session unless `--stateless`).
async fn http_binary(
    program: &str,
    base: &str,
    extra: &[&str],
) -> (tokio::process::Child, HttpMcp) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = nexus_mcp_at(program, base)
        .args([
            "--transport",
            "http",
            "--bind",
            &format!("127.0.0.1:{port}"),
        ])
        .args(extra)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("nexus-mcp starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "nexus-mcp did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut mcp = HttpMcp::new(format!("http://127.0.0.1:{port}{MCP_PATH}"))
        .header("X-Pinecone-Api-Key", SERVER_KEY);
    mcp.initialize().await;
    (child, mcp)
}

/// A bare axum handler answering every POST with a fixed tool result for the
/// request's id: one HTTP hop and nothing else.
async fn http_hop() -> HttpMcp {
    let app = axum::Router::new().route(
        MCP_PATH,
        axum::routing::post(|axum::Json(request): axum::Json<Value>| async move {
            axum::Json(json!({
                "jsonrpc": "2.0",
                "id": request["id"],
                "result": {"content": [{"type": "text", "text": "[]"}], "isError": false}
            }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!(
        "http://{}{MCP_PATH}",
        listener.local_addr().expect("local address")
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    HttpMcp::new(url).header("X-Pinecone-Api-Key", SERVER_KEY)
}

/// One way of making the call.
enum Path {
    Sdk(nexus_knowql::Client),
    Rmcp(rmcp::service::RunningService<rmcp::RoleClient, ()>),
    Line(Box<LineClient>, &'static str),
    Http(HttpMcp),
    Hyper(HyperMcp),
}

impl Path {
    async fn call(&mut self) {
        match self {
            Path::Sdk(sdk) => {
                let contexts = sdk.contexts().list().await.expect("list contexts");
                assert_eq!(contexts.len(), 1, "the corpus context");
            }
            Path::Rmcp(service) => {
                let result = service
                    .call_tool(CallToolRequestParams::new("list_contexts"))
                    .await
                    .expect("tools/call");
                assert_eq!(result.is_error, Some(false));
            }
            Path::Line(client, "ping") => {
                let answer = client.request("ping", json!({})).await;
                assert!(answer.get("result").is_some(), "{answer}");
            }
            Path::Line(client, "bad") => {
                let params = json!({"name": "get_query", "arguments": {}});
                let answer = client.request("tools/call", params).await;
                assert_eq!(answer["result"]["isError"], true, "{answer}");
            }
            Path::Line(client, tool) => {
                let params = json!({"name": *tool, "arguments": {}});
                let answer = client.request("tools/call", params).await;
                assert_eq!(answer["result"]["isError"], false, "{answer}");
            }
            Path::Http(mcp) => {
                let result = mcp.call("list_contexts", json!({})).await;
                assert_eq!(result["isError"], false, "{result}");
            }
            Path::Hyper(mcp) => {
                let result = mcp.call("list_contexts").await;
                assert_eq!(result["isError"], false, "{result}");
            }
        }
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
    let nexus = LocalBinary::start(
        &["--context", &format!("docs={corpus}")],
        &[("RUST_LOG", "warn")],
    );
    let base = nexus.url.clone();
    // Another build of `nexus-mcp` (an older version, say) whose HTTP rows
    // join the same rounds, so the two are compared under the same noise.
    let baseline = std::env::var("MCP_OVERHEAD_BASELINE_BIN")
        .ok()
        .filter(|path| !path.is_empty());

    let mut children = Vec::new();
    let paths: Vec<(&str, Path)> = rt.block_on(async {
        let rmcp_client = {
            let (transport, _) = TokioChildProcess::builder(nexus_mcp(&base))
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("nexus-mcp starts");
            ().serve(transport).await.expect("initialize")
        };
        let mut paths = vec![
            ("sdk_direct", Path::Sdk(nexus_client(&base))),
            ("http_hop", Path::Http(http_hop().await)),
            ("http_hop_min", {
                let hop = http_hop().await;
                Path::Hyper(HyperMcp::connect(&hop.url, None).await)
            }),
            ("stdio_rmcp", Path::Rmcp(rmcp_client)),
            (
                "stdio_line",
                Path::Line(Box::new(LineClient::start(&base).await), "list_contexts"),
            ),
            (
                "stdio_line_ping",
                Path::Line(Box::new(LineClient::start(&base).await), "ping"),
            ),
            (
                "stdio_line_no_nexus",
                Path::Line(Box::new(LineClient::start(&base).await), "bad"),
            ),
        ];
        let cores = std::thread::available_parallelism()
            .map_or(1, usize::from)
            .to_string();
        let this = env!("CARGO_BIN_EXE_nexus-mcp");
        let mut servers = vec![
            ("http_sessions", this, vec![]),
            ("http_stateless", this, vec!["--stateless"]),
            (
                "http_sessions_per_core",
                this,
                vec!["--worker-threads", &cores],
            ),
            (
                "http_stateless_per_core",
                this,
                vec!["--stateless", "--worker-threads", &cores],
            ),
        ];
        if let Some(baseline) = &baseline {
            servers.push(("http_sessions_baseline", baseline.as_str(), vec![]));
            servers.push((
                "http_stateless_baseline",
                baseline.as_str(),
                vec!["--stateless"],
            ));
        }
        for (name, program, extra) in servers {
            let (child, mcp) = http_binary(program, &base, &extra).await;
            children.push(child);
            let minimal = HyperMcp::connect(&mcp.url, mcp.session.clone()).await;
            paths.push((name, Path::Http(mcp)));
            let min_name: &'static str = format!("{name}_min").leak();
            paths.push((min_name, Path::Hyper(minimal)));
        }
        paths
    });
    let names: Vec<&str> = paths.iter().map(|(name, _)| *name).collect();
    let paths: Vec<Arc<tokio::sync::Mutex<Path>>> = paths
        .into_iter()
        .map(|(_, path)| Arc::new(tokio::sync::Mutex::new(path)))
        .collect();

    let mut c = Criterion::default()
        .sample_size(60)
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    {
        let mut g = c.benchmark_group("list_contexts");
        for (name, path) in names.iter().zip(&paths) {
            g.bench_function(*name, |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let path = Arc::clone(path);
                    async move {
                        let mut path = path.lock().await;
                        let start = Instant::now();
                        for _ in 0..iters {
                            path.call().await;
                        }
                        start.elapsed()
                    }
                })
            });
        }
        g.finish();
    }
    c.final_summary();

    // Criterion runs one row after the other, and this machine's speed
    // drifts between them; the table comes from rounds that call every path
    // once in turn, so that each row is measured in the same moments.
    // A few under `cargo test --benches`, which only checks that it runs.
    let default_rounds = if std::env::args().any(|a| a == "--bench") {
        3000
    } else {
        3
    };
    let rounds: usize = std::env::var("MCP_OVERHEAD_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_rounds);
    let interleaved: Vec<Vec<Duration>> = rt.block_on(async {
        let mut guards = Vec::new();
        for path in &paths {
            guards.push(path.lock().await);
        }
        let mut times = vec![Vec::with_capacity(rounds); guards.len()];
        let mut order: Vec<usize> = (0..guards.len()).collect();
        let mut shuffle = Shuffle(0x9E37_79B9_7F4A_7C15);
        for _ in 0..rounds {
            // A fresh order every round: a call right after another call
            // to the same process finds it on a CPU with warm caches, so
            // a fixed order (or a fixed order and its reverse, where the
            // last row follows itself) favours some rows over others.
            shuffle.order(&mut order);
            for &i in &order {
                let start = Instant::now();
                guards[i].call().await;
                times[i].push(start.elapsed());
            }
        }
        times
    });
    let index = |name: &str| names.iter().position(|n| *n == name);
    let mut comparisons = Vec::new();
    if baseline.is_some() {
        for (now, before) in [
            ("http_stateless_min", "http_stateless_baseline_min"),
            ("http_sessions_min", "http_sessions_baseline_min"),
            ("http_stateless", "http_stateless_baseline"),
            ("http_sessions", "http_sessions_baseline"),
        ] {
            if let (Some(a), Some(b)) = (index(now), index(before)) {
                comparisons.push((now, compare(&interleaved[a], &interleaved[b])));
            }
        }
    }
    let mut rows = Vec::new();
    for (name, mut v) in names.iter().zip(interleaved.iter().cloned()) {
        v.sort();
        rows.push((*name, v.len(), percentile(&v, 0.50), percentile(&v, 0.99)));
    }
    let base_p50 = rows[0].2;
    let base_p99 = rows[0].3;
    eprintln!(
        "\nlist_contexts round trip against nexus-local in its own process \
         ({rounds} interleaved rounds, every call timed)"
    );
    eprintln!(
        "{:<23} {:>7} {:>10} {:>10} {:>16} {:>16}",
        "path", "calls", "p50", "p99", "p50 overhead", "p99 overhead"
    );
    for (name, n, p50, p99) in rows {
        eprintln!(
            "{:<23} {:>7} {:>10.1?} {:>10.1?} {:>16} {:>16}",
            name,
            n,
            p50,
            p99,
            format!(
                "{:+.0?} ({:.2}x)",
                p50.saturating_sub(base_p50),
                ratio(p50, base_p50)
            ),
            format!(
                "{:+.0?} ({:.2}x)",
                p99.saturating_sub(base_p99),
                ratio(p99, base_p99)
            ),
        );
    }
    if !comparisons.is_empty() {
        eprintln!(
            "\nthis nexus-mcp minus the baseline binary (MCP_OVERHEAD_BASELINE_BIN), \
             same rounds; spread: lowest..highest over {BLOCKS} consecutive blocks of rounds"
        );
        eprintln!(
            "{:<23} {:>10} {:>18} {:>10} {:>18} {:>12}",
            "path", "p50 diff", "spread", "p99 diff", "spread", "paired p50"
        );
        for (name, c) in comparisons {
            eprintln!(
                "{:<23} {:>10} {:>18} {:>10} {:>18} {:>12}",
                name,
                micros(c.p50),
                format!("{}..{}", micros(c.p50_range.0), micros(c.p50_range.1)),
                micros(c.p99),
                format!("{}..{}", micros(c.p99_range.0), micros(c.p99_range.1)),
                micros(c.paired_p50),
            );
        }
    }
    drop(paths);
    drop(children);
}

/// A seeded Fisher-Yates shuffle (splitmix64): the same orders every run.
struct Shuffle(u64);

impl Shuffle {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn order(&mut self, order: &mut [usize]) {
        for i in (1..order.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
    }
}

/// Blocks of consecutive rounds whose differences give the spread.
const BLOCKS: usize = 10;

/// One row against its baseline row, in microseconds (positive: slower).
struct Comparison {
    /// Difference of the p50s over all rounds.
    p50: f64,
    /// Lowest and highest difference of the p50s within one block.
    p50_range: (f64, f64),
    /// Difference of the p99s over all rounds.
    p99: f64,
    /// Lowest and highest difference of the p99s within one block.
    p99_range: (f64, f64),
    /// Median of the per-round differences (both calls of one round).
    paired_p50: f64,
}

fn micros_of(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn micros(v: f64) -> String {
    format!("{v:+.1}µs")
}

fn sorted(v: &[Duration]) -> Vec<Duration> {
    let mut v = v.to_vec();
    v.sort();
    v
}

fn compare(now: &[Duration], before: &[Duration]) -> Comparison {
    let diff = |a: &[Duration], b: &[Duration], p: f64| {
        micros_of(percentile(&sorted(a), p)) - micros_of(percentile(&sorted(b), p))
    };
    let n = now.len().min(before.len());
    let block = (n / BLOCKS).max(1);
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    for start in (0..n).step_by(block) {
        let end = (start + block).min(n);
        if end - start < block {
            break;
        }
        p50s.push(diff(&now[start..end], &before[start..end], 0.50));
        p99s.push(diff(&now[start..end], &before[start..end], 0.99));
    }
    let range = |v: &[f64]| {
        v.iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
                (lo.min(*x), hi.max(*x))
            })
    };
    let mut paired: Vec<f64> = now
        .iter()
        .zip(before)
        .map(|(a, b)| micros_of(*a) - micros_of(*b))
        .collect();
    paired.sort_by(f64::total_cmp);
    let paired_p50 = paired.get(paired.len() / 2).copied().unwrap_or(0.0);
    Comparison {
        p50: diff(now, before, 0.50),
        p50_range: range(&p50s),
        p99: diff(now, before, 0.99),
        p99_range: range(&p99s),
        paired_p50,
    }
}
