//! The local Nexus on its state database: durable before every
//! acknowledgement (SIGKILL right after an answer loses nothing), bounded
//! by bytes, a `state.json` directory migrated once, archives refused early
//! and cheaply, CPU work off the async threads, checked paging, a
//! header-read timeout and a private scratch directory.
#![cfg(feature = "local")]

mod support;

use std::io::{BufRead, Read, Write};
use std::time::{Duration, Instant};

use nexus_knowql::local::LocalNexus;
use serde_json::{Value, json};
use support::local::*;

fn http() -> reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap()
        })
        .clone()
}

async fn get_json(url: &str) -> (u16, Value) {
    let resp = http().get(url).send().await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, body)
}

async fn post_json(url: &str, body: Value) -> (u16, Value) {
    let resp = http().post(url).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, body)
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_right_after_an_answer_loses_no_turn_session_task_or_cancel() {
    let corpus = corpus();
    let data = TempDir::new("sigkill");
    let dir = data.path().to_str().unwrap().to_owned();
    let seed = format!("docs={}", corpus.path().display());
    let server = LocalBinary::start(&["--data", &dir, "--context", &seed], &[]);
    let base = server.url.clone();

    // A synchronous turn that answered `completed`, killed at once.
    let (status, turn) = post_json(
        &format!("{base}/query"),
        json!({"ask": "How long does green tea steep?", "scope": ["docs"]}),
    )
    .await;
    assert_eq!(status, 200, "{turn}");
    assert_eq!(turn["status"], "completed");
    let sync_id = turn["id"].as_str().unwrap().to_owned();
    let sync_session = turn["session_id"].as_str().unwrap().to_owned();
    server.kill();

    let server = LocalBinary::start(&["--data", &dir], &[]);
    let base = server.url.clone();
    let (status, q) = get_json(&format!("{base}/queries/{sync_id}")).await;
    assert_eq!(status, 200, "the completed turn is gone: {q}");
    assert_eq!(q["status"], "completed");
    assert!(
        q["output"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("two minutes")
    );
    let (status, s) = get_json(&format!("{base}/sessions/{sync_session}")).await;
    assert_eq!(status, 200, "the new session is gone: {s}");
    assert_eq!(s["queries"][0]["id"], sync_id.as_str());
    // Its events replay from the database.
    let frames = read_frames(get_events(&base, &sync_id, None).await)
        .await
        .unwrap();
    assert!(frames.iter().any(|f| f.event == "response.completed"));
    assert!(text_of(&frames).contains("two minutes"));

    // A streamed turn whose last frame arrived, killed at once.
    let resp = post_stream(
        &base,
        json!({"ask": "What does the lighthouse keeper count?", "scope": ["docs"], "stream": true}),
    )
    .await;
    let frames = read_frames(resp).await.unwrap();
    let last = frames.last().unwrap();
    assert_eq!(last.event, "query");
    let stream_id = last.data["id"].as_str().unwrap().to_owned();
    server.kill();

    let server = LocalBinary::start(&["--data", &dir], &[]);
    let base = server.url.clone();
    let (status, q) = get_json(&format!("{base}/queries/{stream_id}")).await;
    assert_eq!(status, 200, "the streamed turn is gone: {q}");
    assert_eq!(q["status"], "completed");

    // A curate task, and its cancellation, acknowledged then killed.
    let (status, trigger) = post_json(&format!("{base}/contexts/docs/curate"), json!({})).await;
    assert_eq!(status, 200, "{trigger}");
    let task_id = trigger["task_id"].as_str().unwrap().to_owned();
    server.kill();
    let server = LocalBinary::start(&["--data", &dir], &[]);
    let base = server.url.clone();
    let (status, task) = get_json(&format!("{base}/tasks/{task_id}")).await;
    assert_eq!(status, 200, "the acknowledged curate task is gone: {task}");
    server.kill();
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
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, q) = post_json(
            &format!("{base}/query"),
            json!({"ask": "What is the value of each item in tea units?", "scope": ["docs"],
                   "background": true, "shape": shape, "timeout_seconds": 4}),
        )
        .await;
        assert_eq!(status, 202, "{q}");
        ids.push(q["id"].as_str().unwrap().to_owned());
    }
    // Wait until both turns fill their shape (step 2 under way); these
    // reads must stay fast too.
    let mut during = Vec::new();
    for id in &ids {
        loop {
            let started = Instant::now();
            let (_, q) = get_json(&format!("{base}/queries/{id}")).await;
            during.push(started.elapsed());
            let composing = q["steps"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s["step_id"] == "step_2"));
            if composing || q["status"] != "in_progress" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
        let q = loop {
            let (_, q) = get_json(&format!("{base}/queries/{id}")).await;
            if q["status"] != "in_progress" {
                break q;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
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

fn legacy_state(prev_only_context: bool) -> Value {
    let ctx = |id: &str, slug: &str| {
        json!({"id": id, "slug": slug, "name": slug, "kind": "search", "description": null,
               "guide": null, "manifest": null, "created_at": "2026-01-01T00:00:00Z",
               "updated_at": "2026-01-01T00:00:00Z", "last_curated_at": null,
               "last_source_import_at": null, "curate_task_id": null, "import_task_id": null,
               "sample_queries": [], "index_generation": 0, "sources": {}})
    };
    let query = json!({
        "id": "qry_old", "object": "query", "session_id": "ses_old", "created": 0,
        "status": "completed", "input": [{"role": "user", "content": "old question"}],
        "output": [], "citations": [], "steps": [],
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}, "runtime_ms": 3
    });
    let session = json!({
        "session": {"id": "ses_old", "created_at": "2026-01-01T00:00:00Z", "created_by": "local",
                    "models": ["local-extractive"], "project_id": "local", "scope": ["first"],
                    "tools": [], "updated_at": "2026-01-01T00:00:00Z", "last_query_id": "qry_old"},
        "context_ids": ["ctx_first"], "query_ids": ["qry_old"]
    });
    let mut contexts = vec![ctx("ctx_first", "first")];
    if prev_only_context {
        contexts.push(ctx("ctx_second", "second"));
    }
    json!({"contexts": contexts, "tasks": [], "sessions": [session],
           "queries": [{"query": query, "trace": null}]})
}

#[tokio::test]
async fn a_state_json_directory_is_migrated_once_with_one_log_line() {
    let data = TempDir::new("migrate");
    std::fs::write(
        data.path().join("state.json"),
        legacy_state(false).to_string(),
    )
    .unwrap();
    let dir = data.path().to_str().unwrap().to_owned();
    let logged = |dir: &str| -> (LocalBinary, std::thread::JoinHandle<Vec<String>>) {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nexus-local"))
            .args(["--bind", "127.0.0.1:0", "--data", dir])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut url = String::new();
        stdout.read_line(&mut url).unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let lines = std::thread::spawn(move || {
            let mut all = String::new();
            let _ = stderr.read_to_string(&mut all);
            all.lines()
                .filter(|l| l.contains("migrated"))
                .map(str::to_owned)
                .collect()
        });
        (
            LocalBinary {
                child,
                url: url.trim().to_owned(),
            },
            lines,
        )
    };
    let (server, lines) = logged(&dir);
    let base = server.url.clone();
    let (status, ctx) = get_json(&format!("{base}/contexts/first")).await;
    assert_eq!(status, 200, "{ctx}");
    let (status, q) = get_json(&format!("{base}/queries/qry_old")).await;
    assert_eq!(status, 200, "{q}");
    assert_eq!(q["runtime_ms"], 3);
    let (status, s) = get_json(&format!("{base}/sessions/ses_old")).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["queries"][0]["id"], "qry_old");
    server.kill();
    let lines = lines.join().unwrap();
    assert_eq!(lines.len(), 1, "one log line: {lines:?}");
    assert!(!data.path().join("state.json").exists());
    assert!(data.path().join("state.json.migrated").exists());
    assert!(data.path().join("state.db").exists());

    // Once: the next start migrates nothing and still has everything.
    let (server, lines) = logged(&dir);
    let (status, _) = get_json(&format!("{}/queries/qry_old", server.url)).await;
    assert_eq!(status, 200);
    server.kill();
    assert_eq!(lines.join().unwrap(), Vec::<String>::new());
}

#[tokio::test]
async fn a_torn_legacy_state_file_is_migrated_from_its_previous_version() {
    let data = TempDir::new("torn-legacy");
    let full = legacy_state(true).to_string();
    std::fs::write(data.path().join("state.json.prev"), &full).unwrap();
    // The current file torn in the middle, as a crash mid-write would.
    std::fs::write(data.path().join("state.json"), &full[..full.len() / 2]).unwrap();
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .expect("a torn state.json never prevents start-up");
    let client = server.client().unwrap();
    let slugs: Vec<_> = client
        .contexts()
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.slug)
        .collect();
    assert!(slugs.contains(&"second".to_owned()), "{slugs:?}");
    // The torn file is kept aside for inspection.
    let kept = std::fs::read_dir(data.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("state.json.torn")
        });
    assert!(kept);
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

#[cfg(unix)]
#[test]
fn the_scratch_directory_is_private_and_a_crashed_one_is_removed_at_the_next_start() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = TempDir::new("scratch");
    let tmpdir = tmp.path().to_str().unwrap().to_owned();
    let scratch_dirs = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&tmpdir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("nexus-local-"))
            .map(|e| e.path())
            .collect()
    };
    let first = LocalBinary::start(&[], &[("TMPDIR", &tmpdir)]);
    let dirs = scratch_dirs();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let mode = std::fs::metadata(&dirs[0]).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "scratch mode {mode:o}");
    first.kill();
    assert!(dirs[0].exists(), "a SIGKILL leaves it behind");
    let second = LocalBinary::start(&[], &[("TMPDIR", &tmpdir)]);
    assert!(!dirs[0].exists(), "the next start removes it");
    assert_eq!(scratch_dirs().len(), 1);
    second.kill();
}
