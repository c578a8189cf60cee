//! Silent and slow peers hold no connection for long: an HTTP/2
//! connection that sends nothing, and a request body trickled a byte a
//! second, are both closed within 40 s.
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
        std::thread::spawn(move || {
            let mut writer = writer;
            for _ in 0..1000 {
                if writer.write_all(b" ").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        until_closed(tcp)
    })
    .await
    .unwrap();
    assert!(took < Duration::from_secs(40), "open for {took:?}");
    server.shutdown().await;
}
