//! End to end over loopback: a local server streams a whole turn (created,
//! 10,000 deltas, completed, the `query` frame) and the client reads it
//! (a) through `QueryTurn`, (b) with the naive client a user would write
//! (reqwest bytes stream + eventsource-stream + serde_json into owned
//! structs, no resume, no accumulation) and (c) as raw bytes from the socket,
//! the limit of the machine. Throughput is in events; the bytes per turn are
//! printed once so MB/s can be derived.
//!
//! `cargo bench --bench stream_loopback -- --warm-up-time 1 --measurement-time 3`

// criterion's macros generate undocumented public items.
#![allow(missing_docs)]

#[path = "support/recorded.rs"]
mod support;

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use nexus_knowql::{Client, QueryEvent};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves `body` after an SSE head to every connection, on its own thread.
fn start_server(body: Arc<Vec<u8>>) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                let body = body.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut seen = Vec::new();
                    // Read the request head (and a small JSON body, if any).
                    loop {
                        let n = sock.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
                            let len = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if seen.len() >= end + 4 + len {
                                break;
                            }
                        }
                    }
                    let _ = sock.write_all(support::SSE_HEAD).await;
                    let _ = sock.write_all(&body).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
    });
    rx.recv().unwrap()
}

async fn raw(addr: SocketAddr) -> usize {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(b"GET /raw HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0;
    loop {
        let n = sock.read(&mut buf).await.unwrap();
        if n == 0 {
            return total;
        }
        total += n;
    }
}

async fn naive(http: &reqwest::Client, url: &str) -> usize {
    let resp = http
        .post(url)
        .body("{\"ask\":\"q\",\"scope\":[\"b\"],\"stream\":true}")
        .send()
        .await
        .unwrap();
    let mut events = resp.bytes_stream().eventsource();
    let mut n = 0;
    while let Some(Ok(ev)) = events.next().await {
        if let Ok(e) = serde_json::from_str::<nexus_knowql::types::QueryEvent>(&ev.data) {
            black_box(&e);
        }
        n += 1;
    }
    n
}

async fn ours(client: &Client) -> usize {
    // The recorded turn has one id: a session refuses a turn it already
    // had, so each run continues the session afresh.
    let session = client.continue_session("sess_1");
    let mut turn = session.ask("q").stream().await.unwrap();
    let mut n = 0;
    while let Some(item) = turn.next().await {
        let event = item.unwrap();
        if let QueryEvent::TextDelta { delta } = &event {
            black_box(delta);
        }
        n += 1;
    }
    assert!(!turn.text().is_empty());
    n
}

fn loopback(c: &mut Criterion) {
    let body = Arc::new(support::whole_turn());
    let events = support::DELTAS as u64 + 3;
    eprintln!(
        "stream_loopback: {} bytes per turn, {} events, {:.1} bytes/event",
        body.len() + support::SSE_HEAD.len(),
        events,
        body.len() as f64 / events as f64
    );
    let addr = start_server(body);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("http://{addr}");
    let client = Client::builder().base_url(&url).build().unwrap();
    let http = reqwest::Client::new();
    let query_url = format!("{url}/query");
    assert_eq!(rt.block_on(ours(&client)), events as usize);
    assert_eq!(rt.block_on(naive(&http, &query_url)), events as usize);

    let mut group = c.benchmark_group("loopback_turn_10k_deltas");
    group.throughput(Throughput::Elements(events));
    group.bench_function("query_turn", |b| b.to_async(&rt).iter(|| ours(&client)));
    group.bench_function("naive_reqwest_eventsource_serde", |b| {
        b.to_async(&rt).iter(|| naive(&http, &query_url))
    });
    group.bench_function("raw_socket_read", |b| b.to_async(&rt).iter(|| raw(addr)));
    group.finish();
}

criterion_group!(benches, loopback);
criterion_main!(benches);
