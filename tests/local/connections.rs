//! Silent and slow peers hold no connection for long: an HTTP/2
//! connection that sends nothing, and a request body trickled a byte a
//! second, are both closed within 40 s; idle and silent connections at
//! the connection cap are reclaimed rather than keeping a new client out;
//! one peer's busy connections leave room for another peer, and silent
//! connections cost no other client a request.
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use nexus_knowql::local::LocalNexus;

/// Reads until the server closes the connection; the time it took.
fn until_closed(mut tcp: TcpStream) -> Duration {
    let start = Instant::now();
    tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) | Err(_) => return start.elapsed(),
            Ok(_) => {}
        }
    }
}

/// The pace of a load generator: waits `pace`, or less when `stop` says
/// to stop (a message, or its sender gone); whether to stop.
fn paced_until_stopped(stop: &std::sync::mpsc::Receiver<()>, pace: Duration) -> bool {
    !matches!(
        stop.recv_timeout(pace),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout)
    )
}

/// Catches HTTP/2 connections kept open forever: after the preface and
/// its settings, the client is silent; the server closes the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed() {
    let server = LocalNexus::start().await.unwrap();
    let addr = server.addr();
    let took = tokio::task::spawn_blocking(move || {
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
        // An empty SETTINGS frame.
        tcp.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
        until_closed(tcp)
    })
    .await
    .unwrap();
    assert!(took < Duration::from_secs(40), "open for {took:?}");
    server.shutdown().await;
}

/// Catches a body read with no deadline: a request announcing 1000 bytes
/// and sending one a second is cut within 40 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_cut() {
    let server = LocalNexus::start().await.unwrap();
    let addr = server.addr();
    let took = tokio::task::spawn_blocking(move || {
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.write_all(
            format!(
                "POST /api/contexts HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
        let writer = tcp.try_clone().unwrap();
        // The trickle's pace; it stops once the connection is closed.
        let (closed, trickle_ends) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let mut writer = writer;
            for _ in 0..1000 {
                if writer.write_all(b" ").is_err() {
                    return;
                }
                if paced_until_stopped(&trickle_ends, Duration::from_secs(1)) {
                    return;
                }
            }
        });
        let took = until_closed(tcp);
        drop(closed);
        took
    })
    .await
    .unwrap();
    assert!(took < Duration::from_secs(40), "open for {took:?}");
    server.shutdown().await;
}

/// Opens a connection and completes one keep-alive `GET` on it, leaving
/// the connection open and idle.
fn idle_keep_alive(addr: std::net::SocketAddr) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    keep_alive_get(&mut tcp, addr).unwrap();
    tcp
}

/// One `GET /api/models` on an open connection, read to its end.
fn keep_alive_get(tcp: &mut TcpStream, addr: std::net::SocketAddr) -> std::io::Result<()> {
    tcp.write_all(format!("GET /api/models HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tcp.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_lowercase();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let length = text
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok());
        let complete = match length {
            Some(length) => got.len() >= end + 4 + length,
            // Chunked: the last chunk is empty.
            None => text.ends_with("\r\n0\r\n\r\n"),
        };
        if complete {
            return Ok(());
        }
    }
}

/// How long a fresh client takes to get `GET /api/models` answered.
async fn fresh_request(addr: std::net::SocketAddr) -> Duration {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .unwrap();
    let start = Instant::now();
    let resp = client
        .get(format!("http://{addr}/api/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    start.elapsed()
}

/// Catches keep-alive connections locking other clients out: 256
/// connections that each send a `GET` every 2 s (never idle long enough
/// to time out) held every slot, and a new client was not answered
/// within 90 s; between their requests they are idle, so the one idle the
/// longest is reclaimed and the new client is answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_connections_at_the_cap_keep_no_one_out() {
    let server = LocalNexus::start().await.unwrap();
    let addr = server.addr();
    let held = tokio::task::spawn_blocking(move || {
        (0..256).map(|_| idle_keep_alive(addr)).collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let pinger = std::thread::spawn(move || {
        let mut held = held;
        loop {
            // A reclaimed connection is replaced, as a client would.
            for tcp in &mut held {
                if keep_alive_get(tcp, addr).is_err() {
                    *tcp = idle_keep_alive(addr);
                }
            }
            if paced_until_stopped(&stopped, Duration::from_secs(2)) {
                return;
            }
        }
    });
    let took = fresh_request(addr).await;
    drop(stop);
    assert!(took < Duration::from_secs(15), "answered after {took:?}");
    pinger.join().unwrap();
    server.shutdown().await;
}

/// How long a client bound to `local` takes to get `GET /api/models`
/// answered; `None` when it is not answered within 30 s.
async fn request_from(local: std::net::IpAddr, addr: std::net::SocketAddr) -> Option<Duration> {
    let client = reqwest::Client::builder()
        .local_address(local)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let start = Instant::now();
    let resp = client
        .get(format!("http://{addr}/api/models"))
        .send()
        .await
        .ok()?;
    assert_eq!(resp.status(), 200);
    Some(start.elapsed())
}

/// Keeps `n` requests open until `stop`: each announces a JSON body of
/// 1,000,000 bytes and keeps it coming (4 KiB a second), so each holds a
/// connection with a request open; one the server closes is opened again
/// on the next round. Sends on `rounds` after each round.
fn busy_requests(
    addr: std::net::SocketAddr,
    n: usize,
    stop: std::sync::mpsc::Receiver<()>,
    rounds: std::sync::mpsc::Sender<()>,
) -> std::thread::JoinHandle<()> {
    let head = format!(
        "POST /api/contexts HTTP/1.1\r\nHost: {addr}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
    );
    std::thread::spawn(move || {
        let mut open: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        let chunk = vec![b' '; 4 * 1024];
        loop {
            for slot in &mut open {
                let written = match slot {
                    Some(tcp) => tcp.write_all(&chunk).is_ok(),
                    None => TcpStream::connect(addr)
                        .and_then(|mut tcp| {
                            tcp.write_all(head.as_bytes())?;
                            Ok(tcp)
                        })
                        .map(|tcp| *slot = Some(tcp))
                        .is_ok(),
                };
                if !written {
                    *slot = None;
                }
            }
            let _ = rounds.send(());
            if paced_until_stopped(&stop, Duration::from_secs(1)) {
                return;
            }
        }
    })
}

/// Catches one peer taking every connection: 127.0.0.1 keeps 256
/// requests open that keep their bodies coming (every connection busy,
/// none to reclaim) and a client on 127.0.0.2 was not answered at all;
/// with a per-peer cap the first peer holds at most 192 and the other is
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_cannot_take_every_connection() {
    let server = LocalNexus::start().await.unwrap();
    let addr = server.addr();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let (rounds, round_done) = std::sync::mpsc::channel();
    let writer = busy_requests(addr, 256, stopped, rounds);
    // Three rounds: every connection the first peer could keep is busy.
    tokio::task::spawn_blocking(move || {
        for _ in 0..3 {
            round_done.recv().unwrap();
        }
    })
    .await
    .unwrap();
    let other = std::net::IpAddr::from([127, 0, 0, 2]);
    let took = request_from(other, addr).await;
    drop(stop);
    writer.join().unwrap();
    assert!(took.is_some(), "a second peer was not answered within 30 s");
    server.shutdown().await;
}

/// Catches silent connections delaying everyone: 300 connections that
/// sent half a request line or nothing held every slot until their
/// header-read timeout (2 minutes here), and a new client waited for it;
/// they are closed to make room, oldest first, and the client is answered
/// within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_delay_no_one() {
    let server = LocalNexus::builder()
        .header_read_timeout(Duration::from_secs(120))
        .start()
        .await
        .unwrap();
    let addr = server.addr();
    let silent = tokio::task::spawn_blocking(move || {
        (0..300)
            .filter_map(|i| {
                let mut tcp = TcpStream::connect(addr).ok()?;
                if i % 3 != 0 {
                    tcp.write_all(b"GET /api/mod").ok()?;
                }
                Some(tcp)
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let took = request_from(std::net::IpAddr::from([127, 0, 0, 1]), addr).await;
    drop(silent);
    let took = took.expect("not answered within 30 s behind silent connections");
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
    server.shutdown().await;
}
