//! Round-trip overhead of the MCP server for `list_contexts`, over stdio (the
//! real `nexus-mcp` binary as a child process) and over Streamable HTTP (an
//! in-process axum server on loopback), against calling the SDK directly in
//! the same run. Nexus is an in-process `LocalNexus` serving the shipped corpus.
//!
//! ```text
//! cargo bench --features mcp,local --bench mcp_overhead -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Besides criterion's report, it prints p50/p99 of every individual call.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::Criterion;
use nexus_knowql::mcp::http::{self, HttpOptions};
use nexus_knowql::mcp::{NexusMcp, NexusServer};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[path = "../tests/support/mcp.rs"]
mod mcp_support;
use mcp_support::{HttpMcp, SERVER_KEY, nexus_client};
use nexus_knowql::local::LocalNexus;

/// Every call's duration, per benchmark.
type Samples = Arc<Mutex<Vec<Duration>>>;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Runs `call` `iters` times, recording each duration; returns the total.
async fn timed<F, Fut>(iters: u64, samples: &Samples, mut call: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut total = Duration::ZERO;
    let mut local = Vec::with_capacity(iters as usize);
    for _ in 0..iters {
        let start = Instant::now();
        call().await;
        let d = start.elapsed();
        total += d;
        local.push(d);
    }
    samples.lock().unwrap().extend(local);
    total
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let nexus = rt
        .block_on(
            LocalNexus::builder()
                .context(
                    "docs",
                    concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus"),
                )
                .start(),
        )
        .expect("local nexus starts");
    let base = nexus.base_url().to_owned();

    // Direct SDK.
    let sdk = nexus_client(&base);

    // Stdio: the binary, driven by rmcp's client.
    let stdio = rt.block_on(async {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_nexus-mcp"));
        cmd.env_clear()
            .env("NEXUS_BASE_URL", &base)
            .env("PINECONE_API_KEY", SERVER_KEY)
            .env("RUST_LOG", "warn");
        let (transport, _) = TokioChildProcess::builder(cmd)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        ().serve(transport).await.unwrap()
    });

    // HTTP: in-process server, reqwest 0.12 client with a session.
    let shutdown = CancellationToken::new();
    let http_client = rt.block_on(async {
        let server = NexusMcp::new().with_nexus(NexusServer::new(nexus_client(&base)));
        let listener = http::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let url = format!(
            "http://{}{}",
            listener.local_addr().unwrap(),
            http::MCP_PATH
        );
        let token = shutdown.clone();
        tokio::spawn(
            async move { http::serve(listener, server, &HttpOptions::default(), token).await },
        );
        let mut mcp = HttpMcp::new(url).header("X-Pinecone-Api-Key", SERVER_KEY);
        mcp.initialize().await;
        Arc::new(tokio::sync::Mutex::new(mcp))
    });

    let names = ["sdk_direct", "mcp_stdio", "mcp_http"];
    let samples: Vec<Samples> = names.iter().map(|_| Samples::default()).collect();

    let mut c = Criterion::default()
        .sample_size(60)
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    {
        let mut g = c.benchmark_group("list_contexts");
        g.bench_function(names[0], |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let sdk = sdk.clone();
                let s = samples[0].clone();
                async move {
                    timed(iters, &s, || async {
                        assert_eq!(
                            sdk.contexts().list().await.unwrap().len(),
                            1,
                            "the corpus context"
                        );
                    })
                    .await
                }
            })
        });
        g.bench_function(names[1], |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let s = samples[1].clone();
                let stdio = &stdio;
                async move {
                    timed(iters, &s, || async {
                        let r = stdio
                            .call_tool(CallToolRequestParams::new("list_contexts"))
                            .await
                            .unwrap();
                        assert_eq!(r.is_error, Some(false));
                    })
                    .await
                }
            })
        });
        g.bench_function(names[2], |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let s = samples[2].clone();
                let http_client = http_client.clone();
                async move {
                    let mut mcp = http_client.lock().await;
                    let mut total = Duration::ZERO;
                    let mut local = Vec::with_capacity(iters as usize);
                    for _ in 0..iters {
                        let start = Instant::now();
                        let r = mcp.call("list_contexts", json!({})).await;
                        let d = start.elapsed();
                        assert_eq!(r["isError"], false);
                        total += d;
                        local.push(d);
                    }
                    s.lock().unwrap().extend(local);
                    total
                }
            })
        });
        g.finish();
    }
    c.final_summary();

    let mut rows = Vec::new();
    for (name, s) in names.iter().zip(&samples) {
        let mut v = s.lock().unwrap().clone();
        v.sort();
        rows.push((*name, v.len(), percentile(&v, 0.50), percentile(&v, 0.99)));
    }
    let base_p50 = rows[0].2;
    let base_p99 = rows[0].3;
    eprintln!("\nlist_contexts round trip against an in-process LocalNexus (every call timed)");
    eprintln!(
        "{:<11} {:>7} {:>10} {:>10} {:>16} {:>16}",
        "path", "calls", "p50", "p99", "p50 overhead", "p99 overhead"
    );
    for (name, n, p50, p99) in rows {
        eprintln!(
            "{:<11} {:>7} {:>10.1?} {:>10.1?} {:>16} {:>16}",
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

    shutdown.cancel();
    rt.block_on(async move {
        let _ = stdio.cancel().await;
    });
}

fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        0.0
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}
