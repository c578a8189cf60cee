//! Resident memory of 10,000 concurrently open `QueryTurn`s, idle between
//! events. A child process (this binary with `serve`) answers each
//! `POST /query` with `response.created` and then keeps the stream open, so
//! the figure is the client's alone. Reads RSS from /proc/self/statm.
//!
//! Needs about 10,100 file descriptors per process:
//! `ulimit -n 20000 && cargo bench --bench stream_memory`

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use futures::StreamExt;
use nexus_knowql::{Client, StreamConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Open streams: 10,000 under `cargo bench`; a few under `cargo test
/// --benches`, which only checks that the bench runs.
fn streams() -> usize {
    if std::env::args().any(|a| a == "--bench") {
        10_000
    } else {
        100
    }
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

async fn serve() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("{}", listener.local_addr().unwrap());
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut seen = Vec::new();
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
            // No session id: every stream runs in a session of its own, and
            // a frame naming another session would be refused as another
            // turn's.
            let _ = sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\nid: 0\nevent: response.created\ndata: {\"type\":\"response.created\",\"query_id\":\"q_mem\"}\n\n").await;
            // Idle until the client goes away.
            while sock.read(&mut buf).await.unwrap_or(0) > 0 {}
        });
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("serve") {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(serve());
        return;
    }
    if let Some(limit) = open_files_limit()
        && limit < streams() as u64 + 200
    {
        eprintln!("stream_memory: the open-files limit is {limit}; run `ulimit -n 20000` first");
        std::process::exit(2);
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("serve")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut addr = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut addr)
        .unwrap();
    let url = format!("http://{}", addr.trim());

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = Client::builder().base_url(&url).build().unwrap();
    // Warm up: one turn, so the runtime, TLS-free pool and allocator are set up.
    let (turns, before, after) = rt.block_on(async {
        let session = client.continue_session("warm");
        let mut t = session.ask("q").stream().await.unwrap();
        t.next().await.unwrap().unwrap();
        drop(t);
        let before = rss_bytes();
        let opened = futures::stream::iter(0..streams())
            .map(|i| {
                let client = client.clone();
                async move {
                    // One session per stream: a session runs one turn at a time.
                    let session = client.continue_session(format!("s{i}"));
                    let mut turn = session
                        .ask("q")
                        .stream_config(StreamConfig::default().idle_timeout(None))
                        .stream()
                        .await
                        .unwrap();
                    turn.next().await.unwrap().unwrap();
                    (session, turn)
                }
            })
            .buffer_unordered(256)
            .collect::<Vec<_>>()
            .await;
        let after = rss_bytes();
        (opened, before, after)
    });
    assert_eq!(turns.len(), streams(), "every stream opened");
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "stream_memory: {} open streams: RSS {:.1} MiB before, {:.1} MiB after, {:.1} MiB for the streams ({:.1} KiB each); size_of::<QueryTurn>() = {} B",
        turns.len(),
        mib(before),
        mib(after),
        mib(after - before),
        (after - before) as f64 / 1024.0 / turns.len() as f64,
        std::mem::size_of::<nexus_knowql::QueryTurn>()
    );
    drop(turns);
    let _ = child.kill();
    let _ = child.wait();
}
