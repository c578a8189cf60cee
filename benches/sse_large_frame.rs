//! One large final `query` frame (4 MiB and 32 MiB of answer text) delivered
//! in 8 KiB chunks: the SDK's decoder (SSE framing plus decoding the Query)
//! against a raw `memchr` scan for line endings over the same chunks, in the
//! same run. The ratio shows the parser scans each byte a bounded number of
//! times, however many chunks a frame spans.
//!
//! `cargo bench --bench sse_large_frame -- --warm-up-time 1 --measurement-time 3`

// criterion's macros generate undocumented public items.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nexus_knowql::QueryEvent;
use nexus_knowql::query::EventDecoder;

const CHUNK: usize = 8 * 1024;

/// The wire bytes of one `query` frame whose answer has `text_bytes` bytes.
fn query_frame(text_bytes: usize) -> Vec<u8> {
    let answer = "All travel is approved by a manager. ".repeat(text_bytes / 37 + 1);
    let answer = &answer[..text_bytes];
    let query = serde_json::json!({
        "id": "q_1", "object": "query", "session_id": "s_1", "created": 1_780_000_000,
        "status": "completed", "input": [],
        "output": [{"role": "assistant", "content": [{"type": "output_text", "text": answer}]}],
        "citations": [], "steps": [], "runtime_ms": 1,
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
    });
    format!("event: query\ndata: {query}\n\n").into_bytes()
}

fn ours(chunks: &[&[u8]]) -> usize {
    let mut decoder = EventDecoder::with_max_frame_bytes(64 * 1024 * 1024);
    let mut n = 0;
    for chunk in chunks {
        decoder.feed(chunk);
        while let Ok(Some((_, event))) = decoder.next_event() {
            if let QueryEvent::Query(q) = &event {
                n += q.output.len();
            }
            black_box(event);
        }
    }
    n
}

fn memchr_scan(chunks: &[&[u8]]) -> usize {
    let mut n = 0;
    for chunk in chunks {
        n += memchr::memchr2_iter(b'\n', b'\r', black_box(chunk)).count();
    }
    n
}

fn large_frame(c: &mut Criterion) {
    for mib in [4usize, 32] {
        let wire = query_frame(mib * 1024 * 1024);
        let chunks: Vec<&[u8]> = wire.chunks(CHUNK).collect();
        assert_eq!(ours(&chunks), 1, "the frame decodes to a Query");
        let mut group = c.benchmark_group(format!("query_frame_{mib}MiB/8KiB_chunks"));
        group.sample_size(10);
        group.throughput(Throughput::Bytes(wire.len() as u64));
        group.bench_function("nexus_knowql", |b| b.iter(|| ours(black_box(&chunks))));
        group.bench_function("memchr_scan", |b| {
            b.iter(|| memchr_scan(black_box(&chunks)))
        });
        group.finish();
    }
}

criterion_group!(benches, large_frame);
criterion_main!(benches);
