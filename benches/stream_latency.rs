//! Added latency per frame: a server thread writes delta frames one at a
//! time, each carrying the time it was written; the client notes when each
//! reaches the caller, (a) through `QueryTurn` and (b) as raw socket reads
//! scanned for the timestamps (the floor: kernel + wake-up). Prints
//! p50/p90/p99/p99.9/max for both; the difference is what the SDK adds.
//!
//! `cargo bench --bench stream_latency`

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use futures::StreamExt;
use nexus_knowql::{Client, QueryEvent, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Frames per run: 5,000 under `cargo bench`; a few under `cargo test
/// --benches`, which only checks that the bench runs.
fn frames() -> usize {
    if std::env::args().any(|a| a == "--bench") {
        5_000
    } else {
        50
    }
}
const GAP: Duration = Duration::from_micros(200);

fn start_server(base: Instant) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        // Each turn has an id of its own: a session refuses a turn it
        // already had.
        for (turn, sock) in listener.incoming().enumerate() {
            let Ok(mut sock) = sock else { return };
            let id = format!("q_lat_{turn}");
            sock.set_nodelay(true).unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = sock.read(&mut buf).unwrap_or(0);
                if n == 0 {
                    break;
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
            let _ = sock.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
            );
            let _ = sock.write_all(format!("id: 0\nevent: response.created\ndata: {{\"type\":\"response.created\",\"query_id\":\"{id}\",\"session_id\":\"s\"}}\n\n").as_bytes());
            let mut answer = String::new();
            for i in 1..=frames() {
                std::thread::sleep(GAP);
                let ts = base.elapsed().as_nanos();
                answer.push_str(&ts.to_string());
                let frame = format!(
                    "id: {i}\nevent: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"query_id\":\"{id}\",\"delta\":\"{ts}\"}}\n\n"
                );
                if sock.write_all(frame.as_bytes()).is_err() {
                    break;
                }
            }
            let _ = sock.write_all(
                format!(
                    "id: {}\nevent: response.completed\ndata: {{\"query_id\":\"{id}\"}}\n\n",
                    frames() + 1
                )
                .as_bytes(),
            );
            // The final Query holds the streamed text: the SDK checks one
            // against the other.
            let _ = sock.write_all(format!("event: query\ndata: {{\"id\":\"{id}\",\"object\":\"query\",\"session_id\":\"s\",\"created\":1,\"status\":\"completed\",\"input\":[],\"output\":[{{\"role\":\"assistant\",\"content\":[{{\"type\":\"output_text\",\"text\":\"{answer}\"}}]}}],\"citations\":[],\"steps\":[],\"runtime_ms\":1,\"usage\":{{\"input_tokens\":1,\"output_tokens\":1,\"total_tokens\":2}}}}\n\n").as_bytes());
        }
    });
    addr
}

fn report(name: &str, mut lat: Vec<u64>) -> u64 {
    assert_eq!(
        lat.len(),
        frames(),
        "{name}: every frame reached the caller"
    );
    lat.sort_unstable();
    let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q) as usize] as f64 / 1000.0;
    println!(
        "{name:<12} n={} p50={:.1}µs p90={:.1}µs p99={:.1}µs p99.9={:.1}µs max={:.1}µs",
        lat.len(),
        p(0.5),
        p(0.9),
        p(0.99),
        p(0.999),
        *lat.last().unwrap() as f64 / 1000.0
    );
    lat[((lat.len() as f64 - 1.0) * 0.99) as usize]
}

async fn through_query_turn(session: &Session, base: Instant) -> Vec<u64> {
    let mut turn = session.ask("q").stream().await.unwrap();
    let mut lat = Vec::with_capacity(frames());
    while let Some(item) = turn.next().await {
        if let QueryEvent::TextDelta { delta } = item.unwrap() {
            let now = base.elapsed().as_nanos() as u64;
            lat.push(now - delta.parse::<u64>().unwrap());
        }
    }
    lat
}

async fn raw_reads(addr: SocketAddr, base: Instant) -> Vec<u64> {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut carry = Vec::new();
    let mut lat = Vec::with_capacity(frames());
    let needle = b"\"delta\":\"";
    loop {
        let n = sock.read(&mut buf).await.unwrap();
        if n == 0 {
            return lat;
        }
        let now = base.elapsed().as_nanos() as u64;
        carry.extend_from_slice(&buf[..n]);
        let mut consumed = 0;
        while let Some(at) = carry[consumed..]
            .windows(needle.len())
            .position(|w| w == needle)
        {
            let start = consumed + at + needle.len();
            let Some(end) = carry[start..].iter().position(|&b| b == b'"') else {
                break;
            };
            let ts: u64 = std::str::from_utf8(&carry[start..start + end])
                .unwrap()
                .parse()
                .unwrap();
            lat.push(now - ts);
            consumed = start + end;
        }
        carry.drain(..consumed);
    }
}

fn main() {
    let base = Instant::now();
    let addr = start_server(base);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = Client::builder()
        .base_url(format!("http://{addr}"))
        .build()
        .unwrap();
    let session = client.continue_session("s");
    println!(
        "stream_latency: {} frames, one every {GAP:?}, frame write -> caller",
        frames()
    );
    // Warm up the connection pool and the code paths.
    rt.block_on(raw_reads(addr, base));
    let raw = report("raw_socket", rt.block_on(raw_reads(addr, base)));
    rt.block_on(through_query_turn(&session, base));
    let ours = report(
        "query_turn",
        rt.block_on(through_query_turn(&session, base)),
    );
    println!(
        "added p99 (query_turn - raw_socket): {:.1}µs",
        (ours as f64 - raw as f64) / 1000.0
    );
}
