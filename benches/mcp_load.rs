//! Many concurrent callers of `nexus-mcp --stateless`: throughput, latency
//! and the server's CPU time per call, next to a bare HTTP server in the
//! same run.
//!
//! ```text
//! cargo bench --features mcp,cli --bench mcp_load
//! ```
//!
//! Cargo builds the optimised `nexus-mcp` with the bench and this driver
//! runs it (`NEXUS_MCP_BIN` names another build) against the in-process
//! fake Pinecone of the tests (`tests/support/pinecone_fake.rs`). Every
//! caller is one keep-alive HTTP/1.1 connection (reopened when the server
//! closes it) sending a cached `list_namespaces` again as soon as its
//! answer has arrived. The server runs at its defaults (one serving
//! thread, `RUST_LOG=warn`) except for the in-flight caps, which are raised
//! so that no call is refused: `--max-requests-per-caller`,
//! `--max-concurrent-requests` and `--max-connections`.
//!
//! The baseline is a bare hyper HTTP/1.1 server in a process of its own
//! (this binary again), on one thread, answering every POST with the bytes
//! of a real `list_namespaces` answer and keeping each connection open, as
//! `nexus-mcp` does: what any HTTP server on this machine costs per call,
//! with nothing of MCP.
//!
//! Scenarios: one key with 16, 64, 256 and 1,024 callers; 256 callers on
//! 256 keys; the baseline with 16, 256 and 1,024 callers. Each of
//! `MCP_LOAD_ROUNDS` (default 3) rounds runs every scenario once, in a new
//! shuffled order (`MCP_LOAD_ONLY=<text>` keeps the scenarios whose name
//! contains it), for `MCP_LOAD_SECONDS` (default 2) after a warm-up of
//! half a second. Per scenario: calls per second and the server's CPU time
//! per call (user + system time of its process from `/proc`, as `getrusage`
//! counts it, over the calls answered in the window) as the median and
//! range over the rounds, p50/p99 latency over all rounds, and calls per
//! connection opened in the measured windows. Last, the
//! three figures of the bar: CPU per call at 16–256 callers on one key,
//! throughput on 256 keys against one key (per round, same round), and p99
//! at 1,024 callers. The machine's load average is printed before and
//! after: CPU per call is the figure that holds on a shared machine.
//!
//! Without `--bench` (as `cargo test --benches` runs it) it makes a short
//! run with a few callers against the binary of that build, as a check
//! that the driver works.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "../tests/support/pinecone_fake.rs"]
mod pinecone_fake;
#[path = "../tests/support/wait.rs"]
mod wait;

/// The environment variable that makes this binary the baseline server:
/// `<port> <file of the answer's bytes> <requests per connection>`.
const BASELINE_ENV: &str = "MCP_LOAD_BASELINE_SERVER";
/// Requests the baseline serves on one connection before closing it; 0:
/// never, as `nexus-mcp` does (its `--max-requests-per-connection` caps the
/// requests in flight on a connection, not the requests it serves; the
/// driver counts the connections each scenario opens).
const BASELINE_CLOSE_AFTER: usize = 0;
/// The whole run ends within this.
const RUN_LIMIT: Duration = Duration::from_secs(1200);

fn env_number(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if let Ok(spec) = std::env::var(BASELINE_ENV) {
        baseline_server(&spec);
        return;
    }
    let bench = std::env::args().any(|a| a == "--bench");
    std::thread::spawn(|| {
        std::thread::sleep(RUN_LIMIT);
        eprintln!("mcp_load: the run took longer than {RUN_LIMIT:?}");
        std::process::exit(1);
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        if bench {
            full_run().await;
        } else {
            check_run().await;
        }
    });
}

/// The `nexus-mcp` measured.
fn server_binary() -> PathBuf {
    std::env::var_os("NEXUS_MCP_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_nexus-mcp")))
}

/// The caller key of tenant `i` (the fake accepts the prefix).
fn tenant_key(i: usize) -> String {
    format!("pcsk_tenant_{i:04}_0123456789abcdef")
}

/// A port free at the moment.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A server process, killed when dropped.
struct Server {
    child: std::process::Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn nexus_mcp(fake: &pinecone_fake::PineconeFake) -> Server {
        let port = free_port();
        let child = std::process::Command::new(server_binary())
            .args(["--transport", "http", "--stateless", "--bind"])
            .arg(format!("127.0.0.1:{port}"))
            .args([
                "--index-name",
                "kb",
                "--pinecone-controller-host",
                &fake.url,
            ])
            .args(["--max-requests-per-caller", "4096"])
            .args(["--max-concurrent-requests", "4096"])
            .args(["--max-connections", "8192"])
            .env_clear()
            .env("RUST_LOG", "warn")
            .env("PINECONE_DISABLE_SUGGEST_FLOW", "true")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("nexus-mcp starts");
        Server { child, port }
    }

    fn baseline(answer: &[u8]) -> Server {
        let port = free_port();
        let file = std::env::temp_dir().join(format!("mcp_load_answer_{}", std::process::id()));
        std::fs::write(&file, answer).expect("the answer's bytes written");
        let spec = format!("{port} {} {BASELINE_CLOSE_AFTER}", file.display());
        let child = std::process::Command::new(std::env::current_exe().expect("this binary"))
            .env(BASELINE_ENV, spec)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("the baseline server starts");
        Server { child, port }
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", self.port)).await.is_err() {
            assert!(Instant::now() < deadline, "the server did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// User + system CPU time of the process so far.
    fn cpu(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .expect("/proc/<pid>/stat");
        // Fields after the command name (which may hold spaces): state is
        // field 3, utime 14 and stime 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // Clock ticks of 10 ms (USER_HZ is 100 on Linux).
        Duration::from_millis((ticks(11) + ticks(12)) * 10)
    }
}

// ---------------------------------------------------------------------------
// The callers.

/// One request's bytes, for caller `caller` with `key`.
fn request_bytes(port: u16, caller: usize, key: &str) -> Vec<u8> {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":{caller},"method":"tools/call","params":{{"name":"list_namespaces","arguments":{{}}}}}}"#
    );
    format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: 2025-06-18\r\n\
         x-pinecone-api-key: {key}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// An answer read off a connection.
struct Answer {
    status: u16,
    close: bool,
    body: Vec<u8>,
}

/// Reads one HTTP/1.1 answer (with a `content-length`) into `buf`.
async fn read_answer(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Answer> {
    buf.clear();
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let head_end = loop {
        if let Some(at) = memchr::memmem::find(buf, b"\r\n\r\n") {
            break at + 4;
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| bad("head not UTF-8"))?;
    let status = head
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let (mut length, mut close) = (None, false);
    for line in head.split("\r\n").skip(1) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("content-length") {
            length = value.trim().parse::<usize>().ok();
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.trim().eq_ignore_ascii_case("close");
        }
    }
    let length = length.ok_or_else(|| bad("no content-length"))?;
    while buf.len() < head_end + length {
        if stream.read_buf(buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(Answer {
        status,
        close,
        body: buf[head_end..head_end + length].to_vec(),
    })
}

/// Makes one call on `stream` (connected first when `None`).
async fn call(
    port: u16,
    stream: &mut Option<TcpStream>,
    request: &[u8],
    buf: &mut Vec<u8>,
    connects: &mut u64,
) -> std::io::Result<Answer> {
    if stream.is_none() {
        *connects += 1;
        let connected = TcpStream::connect(("127.0.0.1", port)).await?;
        connected.set_nodelay(true)?;
        *stream = Some(connected);
    }
    let Some(open) = stream.as_mut() else {
        unreachable!("connected above");
    };
    open.write_all(request).await?;
    let answer = read_answer(open, buf).await;
    if !matches!(&answer, Ok(a) if !a.close) {
        *stream = None;
    }
    answer
}

/// What one scenario's callers did in the measured window.
#[derive(Default)]
struct Tally {
    calls: u64,
    failures: u64,
    /// Connections opened.
    connects: u64,
    /// Microseconds per call.
    latencies: Vec<u32>,
}

/// Phases of a run: callers count only while measuring.
const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const STOPPED: u8 = 2;

/// One caller: calls until the run stops, counting while measuring.
async fn caller(port: u16, request: Vec<u8>, phase: Arc<AtomicU8>) -> Tally {
    let mut tally = Tally::default();
    let (mut stream, mut buf) = (None, Vec::with_capacity(4096));
    loop {
        let now = phase.load(Ordering::Relaxed);
        if now == STOPPED {
            return tally;
        }
        let start = Instant::now();
        let mut connects = 0;
        let answer = call(port, &mut stream, &request, &mut buf, &mut connects).await;
        let ok = answer.is_ok_and(|a| a.status == 200);
        if now == MEASURING && phase.load(Ordering::Relaxed) == MEASURING {
            tally.calls += 1;
            tally.failures += u64::from(!ok);
            tally.connects += connects;
            let micros = start.elapsed().as_micros();
            tally
                .latencies
                .push(u32::try_from(micros).unwrap_or(u32::MAX));
        }
        if !ok {
            // A refused or cut call: a pause, not a spin.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// One scenario's run: `callers` callers spread over `keys` keys.
struct Scenario {
    name: &'static str,
    baseline: bool,
    callers: usize,
    keys: usize,
}

/// What one round of a scenario measured.
struct Round {
    calls_per_s: f64,
    cpu_us_per_call: f64,
    failures: u64,
    /// Connections opened in the window.
    connects: u64,
    calls: u64,
    latencies: Vec<u32>,
}

async fn run_round(server: &Server, scenario: &Scenario, warm: Duration, span: Duration) -> Round {
    let phase = Arc::new(AtomicU8::new(WARMING));
    let tasks: Vec<_> = (0..scenario.callers)
        .map(|i| {
            let request = request_bytes(server.port, i, &tenant_key(i % scenario.keys));
            tokio::spawn(caller(server.port, request, Arc::clone(&phase)))
        })
        .collect();
    tokio::time::sleep(warm).await;
    let (cpu0, t0) = (server.cpu(), Instant::now());
    phase.store(MEASURING, Ordering::Relaxed);
    tokio::time::sleep(span).await;
    phase.store(STOPPED, Ordering::Relaxed);
    let (cpu1, elapsed) = (server.cpu(), t0.elapsed());
    let mut all = Tally::default();
    for task in tasks {
        let tally = task.await.expect("a caller ends");
        all.calls += tally.calls;
        all.failures += tally.failures;
        all.connects += tally.connects;
        all.latencies.extend(tally.latencies);
    }
    let calls = all.calls.max(1) as f64;
    Round {
        calls_per_s: all.calls as f64 / elapsed.as_secs_f64(),
        cpu_us_per_call: cpu1.saturating_sub(cpu0).as_secs_f64() * 1e6 / calls,
        failures: all.failures,
        connects: all.connects,
        calls: all.calls,
        latencies: all.latencies,
    }
}

// ---------------------------------------------------------------------------
// The baseline server.

/// Serves `spec` (see [`BASELINE_ENV`]) until killed: one thread, every
/// POST answered with the file's bytes as JSON, each connection closed
/// after its last allowed request.
fn baseline_server(spec: &str) {
    use http_body_util::BodyExt;
    let mut parts = spec.split(' ');
    let port: u16 = parts.next().and_then(|p| p.parse().ok()).expect("a port");
    let answer = bytes::Bytes::from(std::fs::read(parts.next().expect("a file")).expect("answer"));
    let per_connection: usize = parts.next().and_then(|n| n.parse().ok()).expect("a count");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("the baseline binds");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let answer = answer.clone();
            let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |request: http::Request<hyper::body::Incoming>| {
                        let answer = answer.clone();
                        let served = served.fetch_add(1, Ordering::Relaxed) + 1;
                        async move {
                            let _ = request.into_body().collect().await;
                            let mut response =
                                http::Response::new(http_body_util::Full::new(answer));
                            let headers = response.headers_mut();
                            headers.insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static("application/json"),
                            );
                            if per_connection > 0 && served >= per_connection {
                                headers.insert(
                                    http::header::CONNECTION,
                                    http::HeaderValue::from_static("close"),
                                );
                            }
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    },
                );
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
}

// ---------------------------------------------------------------------------
// Runs and reports.

/// The fake, `nexus-mcp` with every tenant's listing cached, and the bytes
/// of one answer.
async fn ready_nexus_mcp(keys: usize) -> (pinecone_fake::PineconeFake, Server, Vec<u8>) {
    let fake = pinecone_fake::PineconeFake::start().await;
    fake.accept_keys_starting("pcsk_tenant_");
    let server = Server::nexus_mcp(&fake);
    server.wait_ready().await;
    let mut answer = Vec::new();
    for pass in 0..2 {
        for i in 0..keys {
            let (mut stream, mut buf) = (None, Vec::new());
            let request = request_bytes(server.port, i, &tenant_key(i));
            let got = call(server.port, &mut stream, &request, &mut buf, &mut 0)
                .await
                .expect("nexus-mcp answers");
            let text = String::from_utf8_lossy(&got.body);
            assert_eq!(got.status, 200, "{text}");
            assert!(text.contains(r#""isError":false"#), "{text}");
            // The second pass finds every tenant's listing cached.
            if pass == 1 {
                assert!(text.contains(r#"\"cache_hit\":true"#), "{text}");
                answer = got.body;
            }
        }
    }
    (fake, server, answer)
}

/// A short run with a few callers: the driver works against this build.
async fn check_run() {
    let (_fake, server, answer) = ready_nexus_mcp(2).await;
    let scenario = Scenario {
        name: "check",
        baseline: false,
        callers: 4,
        keys: 2,
    };
    let round = run_round(
        &server,
        &scenario,
        Duration::from_millis(100),
        Duration::from_millis(300),
    )
    .await;
    assert!(round.calls_per_s > 0.0, "no call answered");
    assert_eq!(round.failures, 0, "failed calls");
    let baseline = Server::baseline(&answer);
    baseline.wait_ready().await;
    let round = run_round(
        &baseline,
        &scenario,
        Duration::from_millis(100),
        Duration::from_millis(300),
    )
    .await;
    assert!(
        round.calls_per_s > 0.0 && round.failures == 0,
        "the baseline answers"
    );
    println!(
        "mcp_load: the driver works; measure with cargo bench --features mcp,cli --bench mcp_load"
    );
}

/// The scenarios of a full run.
fn scenarios() -> Vec<Scenario> {
    let nexus = |name, callers, keys| Scenario {
        name,
        baseline: false,
        callers,
        keys,
    };
    let bare = |name, callers| Scenario {
        name,
        baseline: true,
        callers,
        keys: 1,
    };
    vec![
        nexus("nexus-mcp, 1 key, 16 callers", 16, 1),
        nexus("nexus-mcp, 1 key, 64 callers", 64, 1),
        nexus("nexus-mcp, 1 key, 256 callers", 256, 1),
        nexus("nexus-mcp, 256 keys, 256 callers", 256, 256),
        nexus("nexus-mcp, 1 key, 1024 callers", 1024, 1),
        bare("baseline, 16 callers", 16),
        bare("baseline, 256 callers", 256),
        bare("baseline, 1024 callers", 1024),
    ]
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The median and range of `values`.
fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let median = values.get(values.len() / 2).copied().unwrap_or(0.0);
    let first = values.first().copied().unwrap_or(0.0);
    let last = values.last().copied().unwrap_or(0.0);
    (median, first, last)
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    f64::from(sorted[at.min(sorted.len() - 1)]) / 1000.0
}

async fn full_run() {
    let rounds = env_number("MCP_LOAD_ROUNDS", 3.0).max(1.0) as usize;
    let span = Duration::from_secs_f64(env_number("MCP_LOAD_SECONDS", 2.0).max(0.2));
    let warm = Duration::from_millis(500);
    println!("mcp_load: {}", server_binary().display());
    println!("load average before: {}", load_average());
    let (_fake, nexus, answer) = ready_nexus_mcp(256).await;
    let baseline = Server::baseline(&answer);
    baseline.wait_ready().await;
    let scenarios = scenarios();
    let only = std::env::var("MCP_LOAD_ONLY").unwrap_or_default();
    let mut results: Vec<Vec<Round>> = scenarios.iter().map(|_| Vec::new()).collect();
    let mut order: Vec<usize> = (0..scenarios.len()).collect();
    let mut seed: u64 = 0x5eed_1234_abcd_0001;
    for round in 0..rounds {
        // A new order each round (Fisher–Yates, seeded): drift in the
        // machine's speed hits every scenario alike.
        for i in (1..order.len()).rev() {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            order.swap(i, (seed >> 33) as usize % (i + 1));
        }
        for &s in &order {
            let scenario = &scenarios[s];
            if !scenario.name.contains(only.as_str()) {
                continue;
            }
            let server = if scenario.baseline { &baseline } else { &nexus };
            let measured = run_round(server, scenario, warm, span).await;
            eprintln!(
                "round {}: {:<34} {:>9.0} calls/s {:>7.1} µs CPU/call",
                round + 1,
                scenario.name,
                measured.calls_per_s,
                measured.cpu_us_per_call
            );
            results[s].push(measured);
        }
    }
    report(&scenarios, &mut results);
    println!("load average after: {}", load_average());
}

fn report(scenarios: &[Scenario], results: &mut [Vec<Round>]) {
    println!(
        "\n{:<34} {:>24} {:>26} {:>8} {:>8} {:>8} {:>10}",
        "scenario",
        "calls/s median (range)",
        "server CPU µs/call (range)",
        "p50 ms",
        "p99 ms",
        "failed",
        "calls/conn"
    );
    let mut rows = Vec::new();
    for (scenario, rounds) in scenarios.iter().zip(results.iter_mut()) {
        let mut rates: Vec<f64> = rounds.iter().map(|r| r.calls_per_s).collect();
        let mut cpu: Vec<f64> = rounds.iter().map(|r| r.cpu_us_per_call).collect();
        let mut latencies: Vec<u32> = rounds
            .iter_mut()
            .flat_map(|r| std::mem::take(&mut r.latencies))
            .collect();
        latencies.sort_unstable();
        let failed: u64 = rounds.iter().map(|r| r.failures).sum();
        let connects: u64 = rounds.iter().map(|r| r.connects).sum();
        let calls: u64 = rounds.iter().map(|r| r.calls).sum();
        // Calls per connection opened in the windows (connections open
        // from before a window count nowhere: "-" when none was opened).
        let per_conn = if connects == 0 {
            "-".to_owned()
        } else {
            format!("{:.0}", calls as f64 / connects as f64)
        };
        let (rate, rate_lo, rate_hi) = spread(&mut rates);
        let (cpu_mid, cpu_lo, cpu_hi) = spread(&mut cpu);
        let (p50, p99) = (percentile(&latencies, 0.50), percentile(&latencies, 0.99));
        println!(
            "{:<34} {:>8.0} ({:>6.0}–{:<6.0}) {:>10.1} ({:>5.1}–{:<5.1}) {:>8.1} {:>8.1} {:>8} {:>10}",
            scenario.name,
            rate,
            rate_lo,
            rate_hi,
            cpu_mid,
            cpu_lo,
            cpu_hi,
            p50,
            p99,
            failed,
            per_conn
        );
        rows.push((cpu_mid, cpu_hi, p99));
    }
    bar(scenarios, results, &rows);
}

/// The three figures of the bar, from the rows of [`scenarios`].
fn bar(scenarios: &[Scenario], results: &[Vec<Round>], rows: &[(f64, f64, f64)]) {
    let index = |name: &str| {
        scenarios
            .iter()
            .position(|s| s.name == name)
            .expect("a scenario")
    };
    let one_key = [
        "nexus-mcp, 1 key, 16 callers",
        "nexus-mcp, 1 key, 64 callers",
        "nexus-mcp, 1 key, 256 callers",
    ];
    let cpu_worst = one_key.iter().map(|n| rows[index(n)].0).fold(0.0, f64::max);
    let cpu_worst_round = one_key.iter().map(|n| rows[index(n)].1).fold(0.0, f64::max);
    let (one, many) = (
        index("nexus-mcp, 1 key, 256 callers"),
        index("nexus-mcp, 256 keys, 256 callers"),
    );
    let mut ratios: Vec<f64> = results[one]
        .iter()
        .zip(&results[many])
        .map(|(a, b)| b.calls_per_s / a.calls_per_s.max(1.0))
        .collect();
    let (ratio, ratio_lo, ratio_hi) = spread(&mut ratios);
    let p99 = rows[index("nexus-mcp, 1 key, 1024 callers")].2;
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("\nbar:");
    println!(
        "  server CPU per call, 1 key, 16–256 callers: {cpu_worst:.1} µs (worst median; worst round {cpu_worst_round:.1}); bar ≤ 40: {}",
        verdict(cpu_worst <= 40.0)
    );
    println!(
        "  256 keys / 1 key throughput, 256 callers: {:.0}% (rounds {:.0}–{:.0}%); bar ≥ 80%: {}",
        ratio * 100.0,
        ratio_lo * 100.0,
        ratio_hi * 100.0,
        verdict(ratio >= 0.8)
    );
    println!(
        "  p99 at 1024 callers: {p99:.1} ms; bar ≤ 100: {}",
        verdict(p99 <= 100.0)
    );
}
