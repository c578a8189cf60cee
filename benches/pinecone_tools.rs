//! Per-tool overhead of the Pinecone tools against the in-process fake.
//!
//! Each tool scenario is measured next to its baseline: the same Pinecone
//! requests sent straight to the fake with reqwest (two concurrent searches,
//! plus a rerank when the tool reranks). Tool calls go through an rmcp client
//! over `tokio::io::duplex`, so the figures include JSON-RPC framing.
//! Besides criterion's estimates, p50/p99 of each scenario are printed.
//!
//! `cargo bench --features mcp --bench pinecone_tools`
// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use nexus_knowql::mcp::pinecone::PineconeServer;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

#[path = "../tests/support/pinecone_fake.rs"]
mod pinecone_fake;
#[path = "../tests/support/wait.rs"]
mod wait;

use pinecone_fake::{KEY_A, PineconeFake, Record};

/// Hits per leg, as in the reference benchmark.
const HITS: usize = 20;

struct Setup {
    fake: PineconeFake,
    client: RunningService<RoleClient, ()>,
    http: reqwest::Client,
}

async fn setup() -> Setup {
    let fake = PineconeFake::start().await;
    fake.add(
        (0..HITS)
            .map(|i| Record {
                index: "kb".into(),
                namespace: "bench-papers".into(),
                id: format!("b{i}"),
                fields: json!({"document_number": format!("B{i}"), "title": "bench", "author": ["A"], "url": "https://x", "chunk_text": format!("bench paper number {i} about schedulers")})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            })
            .collect::<Vec<_>>(),
    );
    let mut config = fake.config();
    config.sources[0].rerank_model = Some("bge-reranker-v2-m3".into());
    let server = PineconeServer::new(config).expect("server");
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let client = ().serve(client_io).await.expect("client");
    Setup {
        fake,
        client,
        http: reqwest::Client::new(),
    }
}

async fn call(client: &RunningService<RoleClient, ()>, tool: &str, args: Value) {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    let result = client.call_tool(params).await.expect("call");
    assert_ne!(result.is_error, Some(true), "{tool} failed");
}

async fn wire(setup: &Setup, rerank: bool) {
    let search = |index: &str| {
        setup
            .http
            .post(format!(
                "{}/idx/{index}/records/namespaces/bench-papers/search",
                setup.fake.url
            ))
            .header("Api-Key", KEY_A)
            .json(&json!({"query": {"top_k": HITS, "inputs": {"text": "schedulers paper"}}}))
            .send()
    };
    let (a, b) = tokio::join!(search("kb"), search("kb-sparse"));
    for response in [a, b] {
        response.expect("search").bytes().await.expect("body");
    }
    if rerank {
        let documents: Vec<Value> = (0..HITS)
            .map(|i| json!({"_id": format!("b{i}"), "chunk_text": format!("bench paper number {i} about schedulers")}))
            .collect();
        setup
            .http
            .post(format!("{}/rerank", setup.fake.url))
            .header("Api-Key", KEY_A)
            .json(&json!({"model": "m", "query": "schedulers paper", "documents": documents, "top_n": HITS, "rank_fields": ["chunk_text"]}))
            .send()
            .await
            .expect("rerank")
            .bytes()
            .await
            .expect("body");
    }
}

type Samples = Arc<Mutex<Vec<Duration>>>;
/// Name, tool call (none: the wire baseline), whether the tool reranks.
type Scenario = (&'static str, Option<(&'static str, Value)>, bool);

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
}

fn report(name: &str, samples: &Samples) {
    let mut s = samples.lock().map(|s| s.clone()).unwrap_or_default();
    if s.is_empty() {
        return;
    }
    s.sort();
    eprintln!(
        "{name:<28} n={:<6} p50={:>9.1}µs p99={:>9.1}µs",
        s.len(),
        percentile(&s, 50.0).as_secs_f64() * 1e6,
        percentile(&s, 99.0).as_secs_f64() * 1e6
    );
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let setup = Arc::new(rt.block_on(setup()));
    // Warm the namespace cache and the index hosts.
    rt.block_on(call(&setup.client, "list_namespaces", json!({})));

    let scenarios: Vec<Scenario> = vec![
        ("fake_wire_hybrid", None, false),
        (
            "query_no_rerank",
            Some((
                "query",
                json!({"query_text": "schedulers paper", "namespace": "bench-papers", "top_k": HITS, "use_reranking": false}),
            )),
            false,
        ),
        ("fake_wire_hybrid_rerank", None, true),
        (
            "query_with_rerank",
            Some((
                "query",
                json!({"query_text": "schedulers paper", "namespace": "bench-papers", "top_k": HITS}),
            )),
            true,
        ),
        (
            "guided_query_end_to_end",
            Some((
                "guided_query",
                json!({"user_query": "what do the bench papers say about schedulers", "top_k": HITS}),
            )),
            true,
        ),
    ];
    let mut group = c.benchmark_group("pinecone_tools");
    group.measurement_time(Duration::from_secs(5));
    let mut all: Vec<(&str, Samples)> = Vec::new();
    for (name, tool, rerank) in scenarios {
        let samples: Samples = Arc::new(Mutex::new(Vec::new()));
        let (setup, recorded) = (setup.clone(), samples.clone());
        let runtime = &rt;
        group.bench_function(name, |b| {
            b.to_async(runtime).iter_custom(|iters| {
                let (setup, recorded, tool) = (setup.clone(), recorded.clone(), tool.clone());
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let start = Instant::now();
                        match &tool {
                            Some((name, args)) => call(&setup.client, name, args.clone()).await,
                            None => wire(&setup, rerank).await,
                        }
                        let took = start.elapsed();
                        total += took;
                        if let Ok(mut r) = recorded.lock() {
                            r.push(took);
                        }
                    }
                    total
                }
            })
        });
        all.push((name, samples));
    }
    group.finish();
    for (name, samples) in &all {
        report(name, samples);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
