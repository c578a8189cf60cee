//! Local Nexus performance on a generated corpus of 1,200 Markdown documents.
//!
//! ```text
//! cargo bench --bench local_server --features local
//! ```
//!
//! - `curation/*`: MB of Markdown per second for a full curation (read,
//!   chunk by headings, BM25 index), against a baseline that only reads the
//!   same files and scans them for headings.
//! - `stream_turn/*`: one streamed query turn over loopback (POST to the
//!   closing `query` frame), against a baseline round-trip (`GET /models`).
//!   The p50/p99 of the first text delta and of completion are printed too.
//! - `turn_throughput/*`: turns per second with many sessions asking at
//!   once (synchronous turns, each session one turn at a time), with the
//!   state persisted to a data directory against the same run in memory.
//! - `acknowledged_writes/*`: writes per second that are on disk before
//!   their answer (feedback on a turn, many clients at once), with a data
//!   directory against the same run in memory.
//! - Memory after N turns (printed): the process's resident memory before
//!   and after 2,000 retrieval-only turns with a data directory.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use nexus_knowql::local::LocalNexus;

/// Under `cargo bench`; `cargo test --benches` only checks that the bench
/// runs, on a tenth of the corpus and a few turns.
fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Documents in the generated corpus.
fn docs() -> usize {
    if bench_mode() { 1_200 } else { 120 }
}

/// Streamed turns timed one by one.
fn latency_samples() -> usize {
    if bench_mode() { 200 } else { 5 }
}

/// Sessions asking concurrently, and turns each asks per iteration.
const SESSIONS: usize = 16;
const TURNS_PER_SESSION: usize = 4;

const WORDS: &[&str] = &[
    "stream",
    "session",
    "context",
    "curate",
    "index",
    "resume",
    "event",
    "query",
    "turn",
    "source",
    "archive",
    "chunk",
    "heading",
    "citation",
    "answer",
    "retry",
    "version",
    "token",
    "task",
    "cancel",
    "background",
    "replay",
    "latency",
    "budget",
    "manifest",
    "upload",
    "knowledge",
    "scope",
    "model",
    "extractive",
    "lexical",
    "ranking",
    "document",
    "section",
    "paragraph",
    "delta",
    "frame",
    "server",
    "client",
    "local",
];

/// A deterministic pseudo-random word source (no dependency needed).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as usize
    }

    fn sentence(&mut self, words: usize) -> String {
        let mut s: Vec<&str> = (0..words)
            .map(|_| WORDS[self.next() % WORDS.len()])
            .collect();
        let first = s[0].to_string();
        let cap = first[..1].to_uppercase() + &first[1..];
        s[0] = &cap;
        format!("{}.", s.join(" "))
    }
}

/// Writes the corpus; returns its directory and byte size.
fn corpus(dir: &Path) -> u64 {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("corpus dir");
    let mut rng = Lcg(7);
    let mut total = 0;
    for d in 0..docs() {
        let mut text = format!("# Document {d}\n\n{}\n", rng.sentence(12));
        for s in 0..4 {
            text.push_str(&format!(
                "\n## Section {d}.{s} {}\n\n",
                WORDS[rng.next() % WORDS.len()]
            ));
            for _ in 0..3 {
                let para: Vec<String> = (0..4).map(|_| rng.sentence(10)).collect();
                text.push_str(&para.join(" "));
                text.push_str("\n\n");
            }
        }
        let sub = dir.join(format!("part{}", d % 10));
        std::fs::create_dir_all(&sub).expect("sub dir");
        std::fs::write(sub.join(format!("doc{d}.md")), &text).expect("write doc");
        total += text.len() as u64;
    }
    total
}

/// Baseline: read every file and count its heading lines.
fn scan(dir: &Path) -> usize {
    let mut headings = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let text = std::fs::read_to_string(&p).expect("read doc");
                headings += text.lines().filter(|l| l.starts_with('#')).count();
            }
        }
    }
    headings
}

fn bench_curation(c: &mut Criterion, rt: &tokio::runtime::Runtime, dir: &Path, bytes: u64) {
    let server = rt.block_on(LocalNexus::start()).expect("server");
    let mut g = c.benchmark_group("curation");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(bytes));
    g.bench_function("baseline_read_and_scan", |b| b.iter(|| scan(dir)));
    let mut n = 0u64;
    g.bench_function("curate_full", |b| {
        b.to_async(rt).iter(|| {
            n += 1;
            let slug = format!("bench-{n}");
            let server = &server;
            async move { server.add_context(&slug, dir).await.expect("curate") }
        })
    });
    g.finish();
    rt.block_on(server.shutdown());
}

/// Runs one streamed turn; returns (first delta, completion) latencies.
async fn stream_turn(http: &reqwest::Client, base: &str, ask: &str) -> (Duration, Duration) {
    let started = Instant::now();
    let resp = http
        .post(format!("{base}/query"))
        .json(&serde_json::json!({"ask": ask, "scope": ["bench"], "stream": true}))
        .send()
        .await
        .expect("post");
    let mut body = resp.bytes_stream();
    let mut first = None;
    let mut seen = String::new();
    while let Some(chunk) = body.next().await {
        seen.push_str(&String::from_utf8_lossy(&chunk.expect("body")));
        if first.is_none() && seen.contains("event: response.output_text.delta") {
            first = Some(started.elapsed());
        }
        if seen.contains("event: query") {
            break;
        }
        if seen.len() > 64 * 1024 {
            // Keep only the tail: frame names never span more than that.
            seen.drain(..seen.len() - 256);
        }
    }
    let done = started.elapsed();
    (first.unwrap_or(done), done)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn bench_turns(c: &mut Criterion, rt: &tokio::runtime::Runtime, dir: &Path) {
    let server = rt
        .block_on(LocalNexus::builder().context("bench", dir).start())
        .expect("server");
    let base = server.base_url().to_owned();
    let http = reqwest::Client::new();
    let asks = [
        "how do I resume a stream after a cut",
        "which task cancels curation of a context",
        "citation of a heading in a section",
        "latency budget of the server",
    ];

    let (firsts, dones) = rt.block_on(async {
        let mut firsts = Vec::with_capacity(latency_samples());
        let mut dones = Vec::with_capacity(latency_samples());
        for i in 0..latency_samples() {
            let (f, d) = stream_turn(&http, &base, asks[i % asks.len()]).await;
            firsts.push(f);
            dones.push(d);
        }
        (firsts, dones)
    });
    let mut firsts = firsts;
    let mut dones = dones;
    firsts.sort();
    dones.sort();
    eprintln!(
        "stream turn over {} docs, {} turns: first delta p50 {:?} p99 {:?}; completion p50 {:?} p99 {:?}",
        docs(),
        latency_samples(),
        percentile(&firsts, 0.5),
        percentile(&firsts, 0.99),
        percentile(&dones, 0.5),
        percentile(&dones, 0.99),
    );

    let mut g = c.benchmark_group("stream_turn");
    g.bench_function("baseline_get_models", |b| {
        b.to_async(rt).iter(|| {
            let http = &http;
            let base = &base;
            async move {
                http.get(format!("{base}/models"))
                    .send()
                    .await
                    .expect("get")
                    .bytes()
                    .await
                    .expect("body")
            }
        })
    });
    let mut i = 0;
    g.bench_function("stream_turn_complete", |b| {
        b.to_async(rt).iter(|| {
            i += 1;
            let ask = asks[i % asks.len()];
            let http = &http;
            let base = &base;
            async move { stream_turn(http, base, ask).await }
        })
    });
    g.finish();
    rt.block_on(server.shutdown());
}

/// One synchronous turn on a session; panics unless it completes.
async fn sync_turn(http: &reqwest::Client, base: &str, body: serde_json::Value) -> String {
    let resp = http
        .post(format!("{base}/query"))
        .json(&body)
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 200, "turn refused");
    let q: serde_json::Value = resp.json().await.expect("query");
    q["session_id"].as_str().expect("session id").to_owned()
}

fn bench_throughput(c: &mut Criterion, rt: &tokio::runtime::Runtime, dir: &Path) {
    let data = std::env::temp_dir().join(format!("nexus-local-bench-data-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let mut g = c.benchmark_group("turn_throughput");
    g.sample_size(10);
    g.throughput(Throughput::Elements((SESSIONS * TURNS_PER_SESSION) as u64));
    for (label, persisted) in [("in_memory", false), ("data_dir", true)] {
        let mut builder = LocalNexus::builder().context("bench", dir);
        if persisted {
            builder = builder.data_dir(&data);
        }
        let server = rt.block_on(builder.start()).expect("server");
        let base = server.base_url().to_owned();
        let http = reqwest::Client::new();
        let sessions: Vec<String> =
            rt.block_on(futures::future::join_all((0..SESSIONS).map(|_| {
                sync_turn(
                    &http,
                    &base,
                    serde_json::json!({"ask": "resume a stream", "scope": ["bench"]}),
                )
            })));
        g.bench_function(label, |b| {
            b.to_async(rt).iter(|| {
                let (http, base, sessions) = (&http, &base, &sessions);
                async move {
                    futures::future::join_all(sessions.iter().map(|sid| async move {
                        for _ in 0..TURNS_PER_SESSION {
                            sync_turn(
                                http,
                                base,
                                serde_json::json!({"ask": "citation of a heading", "session_id": sid}),
                            )
                            .await;
                        }
                    }))
                    .await
                }
            })
        });
        rt.block_on(server.shutdown());
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&data);
}

/// Feedback on a turn: acknowledged only once it is saved.
async fn feedback(http: &reqwest::Client, base: &str, id: &str, n: usize) {
    let resp = http
        .post(format!("{base}/queries/{id}/feedback"))
        .json(&serde_json::json!({"rating": if n.is_multiple_of(2) { "up" } else { "down" }}))
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 204, "feedback refused");
}

fn bench_writes(c: &mut Criterion, rt: &tokio::runtime::Runtime, dir: &Path) {
    let data =
        std::env::temp_dir().join(format!("nexus-local-bench-writes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let mut g = c.benchmark_group("acknowledged_writes");
    g.sample_size(10);
    g.throughput(Throughput::Elements((SESSIONS * TURNS_PER_SESSION) as u64));
    for (label, persisted) in [("in_memory", false), ("data_dir", true)] {
        let mut builder = LocalNexus::builder().context("bench", dir);
        if persisted {
            builder = builder.data_dir(&data);
        }
        let server = rt.block_on(builder.start()).expect("server");
        let base = server.base_url().to_owned();
        let http = reqwest::Client::new();
        let id: String = rt.block_on(async {
            let resp = http
                .post(format!("{base}/query"))
                .json(&serde_json::json!({"ask": "resume a stream", "scope": ["bench"]}))
                .send()
                .await
                .expect("post");
            let q: serde_json::Value = resp.json().await.expect("query");
            q["id"].as_str().expect("id").to_owned()
        });
        g.bench_function(label, |b| {
            b.to_async(rt).iter(|| {
                let (http, base, id) = (&http, &base, &id);
                async move {
                    futures::future::join_all((0..SESSIONS).map(|_| async move {
                        for n in 0..TURNS_PER_SESSION {
                            feedback(http, base, id, n).await;
                        }
                    }))
                    .await
                }
            })
        });
        rt.block_on(server.shutdown());
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&data);
}

/// Resident memory of this process, in KiB (Linux; 0 elsewhere).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Prints resident memory before and after many retrieval-only turns kept
/// in a data directory.
fn report_memory(rt: &tokio::runtime::Runtime, dir: &Path) {
    const TURNS: usize = 2_000;
    let data = std::env::temp_dir().join(format!("nexus-local-bench-mem-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let server = rt
        .block_on(
            LocalNexus::builder()
                .context("bench", dir)
                .data_dir(&data)
                .start(),
        )
        .expect("server");
    let base = server.base_url().to_owned();
    let http = reqwest::Client::new();
    let before = rss_kib();
    let started = Instant::now();
    rt.block_on(futures::future::join_all((0..SESSIONS).map(|_| {
        let (http, base) = (&http, &base);
        async move {
            for _ in 0..TURNS / SESSIONS {
                let resp = http
                    .post(format!("{base}/query"))
                    .json(
                        &serde_json::json!({"ask": "citation of a heading", "scope": ["bench"],
                        "retrieval_only": true, "max_retrieved": 50}),
                    )
                    .send()
                    .await
                    .expect("post");
                assert_eq!(resp.status(), 200, "turn refused");
                let _ = resp.bytes().await;
            }
        }
    })));
    let took = started.elapsed();
    let after = rss_kib();
    eprintln!(
        "memory after {TURNS} retrieval turns (data directory): {:.1} MiB -> {:.1} MiB (+{:.1} MiB) in {:.1} s",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        after.saturating_sub(before) as f64 / 1024.0,
        took.as_secs_f64()
    );
    rt.block_on(server.shutdown());
    let _ = std::fs::remove_dir_all(&data);
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir: PathBuf =
        std::env::temp_dir().join(format!("nexus-local-bench-{}", std::process::id()));
    let bytes = corpus(&dir);
    eprintln!(
        "generated {} documents, {:.1} MB of Markdown",
        docs(),
        bytes as f64 / 1e6
    );
    bench_curation(c, &rt, &dir, bytes);
    bench_turns(c, &rt, &dir);
    // A tenth of the corpus: seeding a data directory writes every file durably.
    bench_throughput(c, &rt, &dir.join("part0"));
    bench_writes(c, &rt, &dir.join("part0"));
    report_memory(&rt, &dir.join("part0"));
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(local, benches);
criterion_main!(local);
