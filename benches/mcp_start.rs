//! Cold start of `nexus-mcp` over stdio: from spawning the process to reading
//! its answer to the first `tools/list` (after `initialize` and
//! `notifications/initialized`), against spawning a trivial process (`true`)
//! and waiting for it to exit, in the same run.
//!
//! ```text
//! cargo bench --features mcp,local --bench mcp_start -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Two configurations are measured: the Nexus tools alone (`NEXUS_BASE_URL`),
//! and the Nexus tools plus the Pinecone tools (an index configured). No
//! network call happens before `tools/list` is answered. Besides criterion's
//! report, it prints p50/p99 of every start.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use criterion::Criterion;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Spawns `true` and waits for it: the cost of any process start here.
fn spawn_true() -> Duration {
    let start = Instant::now();
    let status = Command::new("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("`true` runs");
    let d = start.elapsed();
    assert!(status.success());
    d
}

/// Spawns `nexus-mcp` with `env`, runs the handshake and `tools/list`, and
/// returns the time until the `tools/list` answer was read (the process is
/// then closed, untimed).
fn start_nexus_mcp(env: &[(&str, &str)], tools: usize) -> Duration {
    let start = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nexus-mcp"));
    cmd.env_clear()
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("nexus-mcp starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let messages = concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}"#,
        "\n",
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        "\n",
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        "\n",
    );
    stdin.write_all(messages.as_bytes()).expect("write");
    stdin.flush().expect("flush");
    let mut line = String::new();
    let answer = loop {
        line.clear();
        let n = stdout.read_line(&mut line).expect("read");
        assert!(n > 0, "nexus-mcp closed stdout before answering tools/list");
        if line.contains(r#""id":2"#) {
            break start.elapsed();
        }
    };
    let listed = line.matches(r#""inputSchema""#).count();
    assert_eq!(listed, tools, "{line}");
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    answer
}

fn main() {
    let nexus_only: &[(&str, &str)] = &[
        ("NEXUS_BASE_URL", "http://127.0.0.1:9/api"),
        ("PINECONE_API_KEY", "pcsk_bench_key"),
    ];
    let with_pinecone: &[(&str, &str)] = &[
        ("NEXUS_BASE_URL", "http://127.0.0.1:9/api"),
        ("PINECONE_API_KEY", "pcsk_bench_key"),
        ("PINECONE_INDEX_NAME", "kb"),
        ("PINECONE_CONTROLLER_HOST", "http://127.0.0.1:9"),
    ];
    let names = ["spawn_true", "nexus_mcp_nexus_tools", "nexus_mcp_all_tools"];
    let starts: [&dyn Fn() -> Duration; 3] =
        [&spawn_true, &|| start_nexus_mcp(nexus_only, 3), &|| {
            start_nexus_mcp(with_pinecone, 12)
        }];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];

    let mut c = Criterion::default()
        .sample_size(30)
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    {
        let mut g = c.benchmark_group("cold_start_to_tools_list");
        for ((name, start), s) in names.iter().zip(starts).zip(samples.iter_mut()) {
            g.bench_function(*name, |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let d = start();
                        s.push(d);
                        total += d;
                    }
                    total
                })
            });
        }
        g.finish();
    }
    c.final_summary();

    eprintln!("\nspawn to first tools/list answer over stdio (every start timed)");
    eprintln!(
        "{:<22} {:>6} {:>10} {:>10} {:>14}",
        "what", "starts", "p50", "p99", "p50 vs true"
    );
    let base = {
        let mut v = samples[0].clone();
        v.sort();
        percentile(&v, 0.5)
    };
    for (name, s) in names.iter().zip(&samples) {
        let mut v = s.clone();
        v.sort();
        let p50 = percentile(&v, 0.5);
        eprintln!(
            "{:<22} {:>6} {:>10.2?} {:>10.2?} {:>14}",
            name,
            v.len(),
            p50,
            percentile(&v, 0.99),
            format!("{:+.2?}", p50.saturating_sub(base)),
        );
    }
}
