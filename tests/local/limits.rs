//! The local Nexus's limits: state bounded by bytes, archives refused early
//! and cheaply, CPU work off the async threads, checked paging and a
//! header-read timeout.

use std::io::{BufRead, Read, Write};
use std::time::{Duration, Instant};

use crate::support::local::*;
use nexus_knowql::local::LocalNexus;
use serde_json::{Value, json};

/// The peak and current resident memory of a process, in KiB (Linux).
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap()
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn timed_get(url: &str) -> Duration {
    let started = Instant::now();
    let resp = http().get(url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.bytes().await.unwrap();
    started.elapsed()
}

#[tokio::test]
async fn paging_numbers_that_overflow_are_refused_with_400() {
    let server = LocalBinary::start(&[], &[]);
    let base = server.url.clone();
    for query in [
        format!("page={}", i64::MAX),
        format!("page={}&limit=1000", i64::MAX / 2),
        format!("page={}&limit=2", i64::MAX / 2 + 2),
    ] {
        let (status, body) = get_json(&format!("{base}/tasks?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.to_string().contains("too large"), "{body}");
    }
    // The largest page that fits still answers (empty).
    let (status, body) = get_json(&format!("{base}/tasks?page={}&limit=1", i64::MAX)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["items"], json!([]));
    let (status, body) = get_json(&format!("{base}/tasks?offset={}&limit=1", i64::MAX)).await;
    assert_eq!(status, 200, "{body}");
    server.kill();
}

/// A `.tar.gz` of `n` hidden empty files.
fn hidden_tar_gz(n: usize) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for i in 0..n {
        let mut header = tar::Header::new_gnu();
        header.set_size(0);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        tar.append_data(&mut header, format!(".h/{i}"), std::io::empty())
            .unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

#[tokio::test]
async fn an_archive_of_250000_hidden_entries_is_refused_with_bounded_memory() {
    let archive = hidden_tar_gz(250_000);
    let server = LocalBinary::start(&[], &[]);
    let base = server.url.clone();
    let (status, _) = post_json(
        &format!("{base}/contexts"),
        json!({"slug": "bomb", "name": "bomb"}),
    )
    .await;
    assert_eq!(status, 200);
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(archive).file_name("many.tar.gz"),
    );
    let resp = http()
        .post(format!("{base}/contexts/bomb/import/upload"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.text().await.unwrap();
    assert_eq!(status, 413, "{body}");
    assert!(
        body.contains("100000 entries"),
        "the limit is named: {body}"
    );
    let (peak, _) = memory_kib(server.child.id());
    assert!(peak < 200 * 1024, "peak memory {peak} KiB");
    server.kill();
}

#[tokio::test]
async fn an_upload_announced_larger_than_the_limit_is_refused_before_it_is_read() {
    let server = LocalBinary::start(&["--upload-limit-mb", "1"], &[]);
    let base = server.url.clone();
    let (status, _) = post_json(
        &format!("{base}/contexts"),
        json!({"slug": "big", "name": "big"}),
    )
    .await;
    assert_eq!(status, 200);
    // Only the head is sent: the answer cannot wait for the body.
    let addr = base
        .trim_start_matches("http://")
        .trim_end_matches("/api")
        .to_owned();
    let answer = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            tcp,
            "POST /api/contexts/big/import/upload HTTP/1.1\r\nHost: {addr}\r\nContent-Type: multipart/form-data; boundary=x\r\nContent-Length: 104857600\r\n\r\n"
        )
        .unwrap();
        let mut reader = std::io::BufReader::new(tcp);
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        line
    })
    .await
    .unwrap();
    assert!(answer.contains(" 413 "), "{answer}");
    server.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_shape_turns_leave_other_requests_fast() {
    // Many sentences for every shape property to rank.
    let corpus = TempDir::new("shape-corpus");
    for f in 0..20 {
        let mut text = format!("# File {f}\n\n");
        for i in 0..400 {
            text.push_str(&format!(
                "The value of item {i} in file {f} is {} units of tea. ",
                i * 7 + f
            ));
        }
        corpus.write(&format!("f{f}.md"), &text);
    }
    let seed = format!("docs={}", corpus.path().display());
    let server = LocalBinary::start(&["--context", &seed], &[]);
    let base = server.url.clone();
    let models = format!("{base}/models");
    let mut before = Vec::new();
    for _ in 0..7 {
        before.push(timed_get(&models).await);
    }
    let properties: serde_json::Map<String, Value> = (0..2000)
        .map(|i| {
            (
                format!("item_{i}_value"),
                json!({"type": "string", "description": format!("value of item {i} in tea units")}),
            )
        })
        .collect();
    let shape = json!({"type": "object", "properties": properties});
    // Filling the largest shape takes seconds (about 4 s on a loaded 2-core
    // machine); a 1 s limit ends it mid-way on any machine.
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, q) = post_json(
            &format!("{base}/query"),
            json!({"ask": "What is the value of each item in tea units?", "scope": ["docs"],
                   "background": true, "shape": shape, "timeout_seconds": 1}),
        )
        .await;
        assert_eq!(status, 202, "{q}");
        ids.push(q["id"].as_str().unwrap().to_owned());
    }
    // Wait until both turns fill their shape (step 2 under way); these
    // reads must stay fast too.
    let mut during = Vec::new();
    for id in &ids {
        crate::support::wait::until(
            Duration::from_secs(60),
            "the turn composing (step 2)",
            async || {
                let started = Instant::now();
                let (_, q) = get_json(&format!("{base}/queries/{id}")).await;
                during.push(started.elapsed());
                let composing = q["steps"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|s| s["step_id"] == "step_2"));
                composing || q["status"] != "in_progress"
            },
        )
        .await;
    }
    for _ in 0..7 {
        during.push(timed_get(&models).await);
    }
    let before = median(before);
    let worst = during.iter().max().copied().unwrap();
    assert!(
        worst < (before * 50).max(Duration::from_secs(1)),
        "requests took up to {worst:?} during two big-shape turns, GET /models {before:?} before"
    );
    // `timeout_seconds` ends the shape filling.
    for id in &ids {
        let q = crate::support::wait::until_some(
            Duration::from_secs(30),
            "the turn ending",
            async || {
                let (_, q) = get_json(&format!("{base}/queries/{id}")).await;
                (q["status"] != "in_progress").then_some(q)
            },
        )
        .await;
        assert_eq!(q["status"], "failed", "{q}");
        assert!(q["error"].as_str().unwrap().contains("timed out"), "{q}");
    }
    let started = Instant::now();
    let (_, q) = get_json(&format!("{base}/queries/{}", ids[0])).await;
    assert!(started.elapsed() < Duration::from_secs(5), "{q}");
    server.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_retrieval_turns_leave_memory_and_context_reads_flat() {
    let corpus = TempDir::new("flat-corpus");
    for f in 0..30 {
        let mut text = format!("# Topic {f}\n\n");
        for i in 0..60 {
            text.push_str(&format!(
                "## Part {i}\n\nTea note {i} of topic {f}: green tea, black tea and oolong tea steep differently. {}\n\n",
                "Water temperature matters for tea. ".repeat(20)
            ));
        }
        corpus.write(&format!("t{f}.md"), &text);
    }
    let data = TempDir::new("flat");
    let dir = data.path().to_str().unwrap().to_owned();
    let seed = format!("docs={}", corpus.path().display());
    let server = LocalBinary::start(&["--data", &dir, "--context", &seed], &[]);
    let base = server.url.clone();
    let pid = server.child.id();
    let ctx = format!("{base}/contexts/docs");
    let turn = json!({"ask": "tea water temperature", "scope": ["docs"], "retrieval_only": true,
                      "max_retrieved": 100, "max_retrieved_chars": 2000});
    let run = |n: usize| {
        let base = base.clone();
        let turn = turn.clone();
        async move {
            for _ in 0..n {
                let (status, q) = post_json(&format!("{base}/query"), turn.clone()).await;
                assert_eq!(status, 200, "{q}");
            }
        }
    };
    run(50).await;
    let mut early = Vec::new();
    for _ in 0..9 {
        early.push(timed_get(&ctx).await);
    }
    let (_, rss_early) = memory_kib(pid);
    run(150).await;
    let mut late = Vec::new();
    for _ in 0..9 {
        late.push(timed_get(&ctx).await);
    }
    let (_, rss_late) = memory_kib(pid);
    let (early, late) = (median(early), median(late));
    assert!(
        late.as_secs_f64() < early.as_secs_f64() * 5.0 + 0.005,
        "GET /contexts/docs: {early:?} after 50 turns, {late:?} after 200"
    );
    let grown = rss_late.saturating_sub(rss_early);
    assert!(
        grown < 24 * 1024,
        "memory grew by {grown} KiB over 150 turns ({rss_early} -> {rss_late} KiB)"
    );
    server.kill();
}

#[tokio::test]
async fn kept_turns_are_bounded_by_bytes_oldest_first() {
    let (server, client, _corpus) = seeded(
        LocalNexus::builder()
            .query_bytes_limit(200 * 1024)
            .query_limit(1_000),
    )
    .await;
    let base = server.base_url().to_owned();
    let mut ids = Vec::new();
    for _ in 0..60 {
        let turn = client
            .api()
            .query(&request(
                json!({"ask": "tea", "scope": ["docs"], "retrieval_only": true,
                                "max_retrieved": 100, "max_retrieved_chars": 2000}),
            ))
            .await
            .unwrap()
            .into_inner();
        ids.push(turn.id);
    }
    // The newest are kept, with their events; the oldest are forgotten.
    let (status, _) = get_json(&format!("{base}/queries/{}", ids[59])).await;
    assert_eq!(status, 200);
    let (status, _) = get_json(&format!("{base}/queries/{}", ids[0])).await;
    assert_eq!(status, 404, "the oldest turn is still kept");
    let frames = read_frames(get_events(&base, &ids[59], None).await)
        .await
        .unwrap();
    assert!(frames.iter().any(|f| f.event == "response.completed"));
    server.shutdown().await;
}

#[tokio::test]
async fn a_silent_peer_loses_its_connection_after_the_header_read_timeout() {
    let server = LocalNexus::builder()
        .header_read_timeout(Duration::from_millis(300))
        .start()
        .await
        .unwrap();
    let addr = server.addr();
    let closed = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        // Half a request head, then silence.
        tcp.write_all(b"GET /api/models HTTP/1.1\r\nHost: 127.0")
            .unwrap();
        let mut buf = [0u8; 1024];
        // The server answers (408) or closes; either way the read ends.
        let mut got = Vec::new();
        loop {
            match tcp.read(&mut buf) {
                Ok(0) => return Ok(got),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return Err(e.kind()),
            }
        }
    })
    .await
    .unwrap();
    assert!(closed.is_ok(), "the connection stayed open: {closed:?}");
    server.shutdown().await;
}
