//! Parse + decode cost of a recorded stream of 10,000
//! `response.output_text.delta` frames, fed from memory in 64 B, 1 KiB and
//! 16 KiB chunks: the SDK's decoder against the naive baseline
//! (eventsource-stream + serde_json into the owned generated `QueryEvent`)
//! and a raw read (the same chunks copied into a buffer and split at frame
//! ends, nothing decoded), in the same run.
//!
//! `cargo bench --bench sse_decode -- --warm-up-time 1 --measurement-time 3`

// criterion's macros generate undocumented public items.
#![allow(missing_docs)]

#[path = "support/recorded.rs"]
mod support;

use std::convert::Infallible;
use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use nexus_knowql::QueryEvent;
use nexus_knowql::query::EventDecoder;

fn ours(chunks: &[Bytes]) -> usize {
    let mut decoder = EventDecoder::new();
    let mut n = 0;
    for chunk in chunks {
        decoder.feed(chunk);
        while let Ok(Some((id, event))) = decoder.next_event() {
            if let QueryEvent::TextDelta { delta } = &event {
                n += delta.len();
            }
            black_box((id, event));
        }
    }
    n
}

/// The raw-read baseline: each chunk appended to a buffer, frames split at
/// their blank line with memchr's `memmem`, nothing parsed or decoded.
fn raw(chunks: &[Bytes]) -> usize {
    let frame_end = memchr::memmem::Finder::new(b"\n\n");
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut frames = 0;
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(i) = frame_end.find(&buf[start..]) {
            frames += 1;
            black_box(&buf[start..start + i]);
            start += i + 2;
        }
        buf.drain(..start);
    }
    frames
}

fn naive(chunks: &[Bytes]) -> usize {
    let input = futures::stream::iter(chunks.iter().cloned().map(Ok::<_, Infallible>));
    let mut events = input.eventsource();
    futures::executor::block_on(async {
        let mut n = 0;
        while let Some(Ok(ev)) = events.next().await {
            if let Ok(e) = serde_json::from_str::<nexus_knowql::types::QueryEvent>(&ev.data) {
                n += e.delta.as_deref().map_or(0, str::len);
                black_box(e);
            }
            black_box(ev.id);
        }
        n
    })
}

fn decode(c: &mut Criterion) {
    let recorded = support::deltas_only();
    assert_eq!(
        ours(&[Bytes::from(recorded.clone())]),
        naive(&[Bytes::from(recorded.clone())])
    );
    assert_eq!(raw(&[Bytes::from(recorded.clone())]), support::DELTAS);
    for size in [64usize, 1024, 16 * 1024] {
        let chunks: Vec<Bytes> = recorded.chunks(size).map(Bytes::copy_from_slice).collect();
        let mut group = c.benchmark_group(format!("decode_10k_deltas/{size}B_chunks"));
        group.throughput(Throughput::Elements(support::DELTAS as u64));
        group.bench_function("nexus_knowql", |b| b.iter(|| ours(black_box(&chunks))));
        group.bench_function("naive_eventsource_serde", |b| {
            b.iter(|| naive(black_box(&chunks)))
        });
        group.bench_function("raw_read", |b| b.iter(|| raw(black_box(&chunks))));
        group.finish();
    }
}

criterion_group!(benches, decode);
criterion_main!(benches);
