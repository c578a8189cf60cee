//! The `ask` and `worker` examples against scripted servers that bend the
//! contract: a final frame that is not terminal, a JSON body that stalls,
//! endless deltas and steps, a key with a trailing newline, a closed
//! stdout, a header timeout after the POST, and an event log that expired
//! while a worker was down. Each ends in the exact answer or one line on
//! stderr, in time, without a panic.
use crate::support::examples;
use crate::support::sse_server;

use std::io::Read;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use examples::{example, run};
use sse_server::{Reply, SseServer, Step, frame, query_json};

const Q: &str = "q_cli";
const S: &str = "s_cli";

fn created(id: u64) -> String {
    frame(
        Some(id),
        "response.created",
        &serde_json::json!({"type": "response.created", "query_id": Q, "session_id": S}),
    )
}

fn delta(id: u64, text: &str) -> String {
    frame(
        Some(id),
        "response.output_text.delta",
        &serde_json::json!({"type": "response.output_text.delta", "query_id": Q, "delta": text}),
    )
}

fn step(id: u64, step_id: &str) -> String {
    frame(
        Some(id),
        "response.step",
        &serde_json::json!({"type": "response.step", "query_id": Q, "step_id": step_id,
            "status": "running", "commentary": "thinking about it"}),
    )
}

fn completed(id: u64) -> String {
    frame(
        Some(id),
        "response.completed",
        &serde_json::json!({"type": "response.completed", "query_id": Q}),
    )
}

fn final_query(status: &str, answer: &str) -> String {
    frame(None, "query", &query_json(Q, S, status, answer))
}

/// A server: `post` answers `POST /query`, `events` the events requests,
/// and the stored turn is completed with `stored`.
async fn server(
    post: impl Fn() -> Reply + Send + Sync + 'static,
    events: impl Fn() -> Reply + Send + Sync + 'static,
    stored: &str,
) -> SseServer {
    let stored = query_json(Q, S, "completed", stored);
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            post()
        } else if req.is("GET", &format!("/queries/{Q}/events")) {
            events()
        } else if req.is("GET", &format!("/queries/{Q}")) {
            Reply::json(200, &[], &stored)
        } else if req.is("POST", &format!("/queries/{Q}/cancel")) {
            Reply::json(200, &[], &query_json(Q, S, "cancelled", ""))
        } else if req.method == "GET" && req.path.split('?').next() == Some("/sessions") {
            // No sessions before the turn: what a worker records as its
            // intent before posting.
            Reply::json(200, &[], &serde_json::json!({"sessions": []}))
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await
}

fn ask_args(server: &SseServer, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["--base-url", &server.url, "--context", "handbook"]
        .map(str::to_owned)
        .to_vec();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args.push("Who approves travel?".to_owned());
    args
}

async fn ask(args: Vec<String>, env: Vec<(&'static str, String)>) -> (Output, Duration) {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut cmd = example("ask", &args);
        cmd.env("PINECONE_API_KEY", "pcsk_test");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let started = Instant::now();
        let out = run(cmd);
        (out, started.elapsed())
    })
    .await
    .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The one line `ask` ends with on failure.
fn last_line(out: &Output) -> String {
    stderr(out).lines().last().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_frame_that_is_not_terminal_gives_the_stored_answer() {
    let whole = "Hello world, this is the whole answer.";
    let post = || {
        let body = format!(
            "{}{}{}",
            created(1),
            delta(2, "Hello"),
            final_query("in_progress", "Hello")
        );
        Reply::sse(vec![Step::Write(body.into_bytes())])
    };
    let s = server(post, || Reply::sse(Vec::new()), whole).await;
    let (out, _) = ask(ask_args(&s, &[]), Vec::new()).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{whole}\n"));
    assert_eq!(s.count("POST", "/query"), 1);

    // A stored answer that does not continue the text: exit 1, one line
    // that names the turn.
    let s = server(post, || Reply::sse(Vec::new()), "Goodbye.").await;
    let (out, _) = ask(ask_args(&s, &[]), Vec::new()).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let last = last_line(&out);
    assert!(
        last.starts_with("error: ") && last.contains(Q),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_json_body_ends_within_the_turn_deadline() {
    let post = || {
        let body = query_json(Q, S, "completed", "All of it.").to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        Reply {
            head,
            steps: vec![
                Step::Write(body.as_bytes()[..10].to_vec()),
                Step::Sleep(Duration::from_secs(600)),
            ],
        }
    };
    let s = server(post, || Reply::sse(Vec::new()), "All of it.").await;
    let (out, took) = ask(ask_args(&s, &["--timeout", "3"]), Vec::new()).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let last = last_line(&out);
    assert!(
        last.contains("No answer in 3 s; the turn may still be running"),
        "{last}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_timeout_after_the_post_may_still_be_running() {
    let post = || Reply {
        head: String::new(),
        steps: vec![Step::Sleep(Duration::from_secs(600))],
    };
    let s = server(post, || Reply::sse(Vec::new()), "x").await;
    let (out, took) = ask(ask_args(&s, &["--timeout", "2"]), Vec::new()).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let last = last_line(&out);
    assert!(
        last.contains("No answer in 2 s; the turn may still be running"),
        "{last}"
    );
    assert!(!last.contains("cannot reach"), "{last}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

/// Runs `ask` with its stdout read (and counted) and its peak memory
/// sampled from `/proc`; returns (exit code, stdout bytes, peak RSS in KiB,
/// time taken).
async fn ask_measured(args: Vec<String>) -> (Option<i32>, usize, u64, Duration, String) {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut child = example("ask", &args)
            .env("PINECONE_API_KEY", "pcsk_test")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let pid = child.id();
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        // Drained as it comes: a full pipe would stall the child.
        let errors = std::thread::spawn(move || {
            let mut err = String::new();
            let _ = stderr.read_to_string(&mut err);
            err
        });
        let reader = std::thread::spawn(move || {
            let mut n = 0;
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(k) = stdout.read(&mut buf) {
                if k == 0 {
                    break;
                }
                n += k;
            }
            n
        });
        let mut peak = 0u64;
        let status = loop {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                && let Some(kb) = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            {
                peak = peak.max(kb);
            }
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                break child.wait().unwrap();
            }
            // Paces the sampling of the child's memory.
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = started.elapsed();
        let err = errors.join().unwrap();
        (status.code(), reader.join().unwrap(), peak, took, err)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_deltas_and_steps_end_soon_after_the_cap_with_bounded_memory() {
    // 64 KiB deltas, far past the 16 MiB default bound on text.
    let text = "x".repeat(64 * 1024);
    let deltas = move || {
        let mut steps = vec![Step::Write(created(1).into_bytes())];
        let chunk: String = (0..16).map(|i| delta(2 + i, &text)).collect();
        let mut id = 2;
        for _ in 0..64 {
            let chunk: String = (0..16).map(|i| delta(id + i, &text)).collect();
            id += 16;
            steps.push(Step::Write(chunk.into_bytes()));
        }
        drop(chunk);
        steps.push(Step::Sleep(Duration::from_secs(600)));
        Reply::sse(steps)
    };
    let s = server(deltas, || Reply::sse(Vec::new()), "x").await;
    let (code, printed, peak_kib, took, err) = ask_measured(ask_args(&s, &[])).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("passed the limit of 16777216 bytes"), "{err}");
    assert!(printed <= 16 * 1024 * 1024 + 1, "{printed}");
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert!(peak_kib < 200 * 1024, "peak RSS {peak_kib} KiB");
    eprintln!("endless deltas: {took:?}, peak RSS {peak_kib} KiB, {printed} bytes printed");

    // Steps with fresh ids, far past the 4 MiB default bound on steps.
    let steps = || {
        let mut out = vec![Step::Write(created(1).into_bytes())];
        let mut id = 2;
        for _ in 0..100 {
            let chunk: String = (0..1000)
                .map(|i| step(id + i, &format!("s{}", id + i)))
                .collect();
            id += 1000;
            out.push(Step::Write(chunk.into_bytes()));
        }
        out.push(Step::Sleep(Duration::from_secs(600)));
        Reply::sse(out)
    };
    let s = server(steps, || Reply::sse(Vec::new()), "x").await;
    let (code, _, peak_kib, took, err) = ask_measured(ask_args(&s, &[])).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("steps passed the limit of 4194304 bytes"),
        "{err}"
    );
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert!(peak_kib < 200 * 1024, "peak RSS {peak_kib} KiB");
    eprintln!("endless steps: {took:?}, peak RSS {peak_kib} KiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_a_trailing_newline_works_and_a_broken_one_is_refused_before_sending() {
    let answer = "Travel is approved.";
    let post = move || {
        let body = format!(
            "{}{}{}{}",
            created(1),
            delta(2, answer),
            completed(3),
            final_query("completed", answer)
        );
        Reply::sse(vec![Step::Write(body.into_bytes())])
    };
    let s = server(post, || Reply::sse(Vec::new()), answer).await;
    let (out, _) = ask(
        ask_args(&s, &[]),
        vec![("PINECONE_API_KEY", "pcsk_test\r\n".to_owned())],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let sent: Vec<_> = s
        .requests()
        .iter()
        .map(|r| r.header("x-pinecone-api-key").map(str::to_owned))
        .collect();
    assert_eq!(sent, vec![Some("pcsk_test".to_owned())]);

    let s = server(post, || Reply::sse(Vec::new()), answer).await;
    let (out, _) = ask(
        ask_args(&s, &[]),
        vec![("PINECONE_API_KEY", "pcsk_te\nst".to_owned())],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let last = last_line(&out);
    assert!(last.contains("PINECONE_API_KEY"), "{last}");
    assert!(!stderr(&out).contains("pcsk_te"), "{}", stderr(&out));
    assert!(s.requests().is_empty(), "{:?}", s.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_cancels_the_turn_and_exits_without_a_panic() {
    let post = || {
        let mut steps = vec![Step::Write(
            format!("{}{}", created(1), delta(2, "Hello, ")).into_bytes(),
        )];
        for i in 0..200 {
            steps.push(Step::Sleep(Duration::from_millis(20)));
            steps.push(Step::Write(delta(3 + i, "and more ").into_bytes()));
        }
        Reply::sse(steps)
    };
    let s = server(post, || Reply::sse(Vec::new()), "x").await;
    let args = ask_args(&s, &[]);
    let (status, err, first) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut child = example("ask", &args)
            .env("PINECONE_API_KEY", "pcsk_test")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // `head -c 5`: five bytes, then the pipe is closed.
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 5];
        stdout.read_exact(&mut first).unwrap();
        drop(stdout);
        let status = child.wait().unwrap();
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        (status, err, first)
    })
    .await
    .unwrap();
    assert_eq!(&first, b"Hello");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(s.count("POST", &format!("/queries/{Q}/cancel")), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_finishes_a_turn_whose_event_log_expired_after_its_crash() {
    let parts = ["Resume ", "with ", "a ", "checkpoint, ", "always."];
    let whole: String = parts.concat();
    let post = move || {
        let mut steps = vec![Step::Write(created(1).into_bytes())];
        for (i, p) in parts.iter().enumerate() {
            steps.push(Step::Write(delta(2 + i as u64, p).into_bytes()));
            steps.push(Step::Sleep(Duration::from_millis(50)));
        }
        steps.push(Step::Write(
            format!(
                "{}{}",
                completed(7),
                final_query("completed", &parts.concat())
            )
            .into_bytes(),
        ));
        Reply::sse(steps)
    };
    // The log has expired by the time the second process asks.
    let gone = Arc::new(AtomicUsize::new(0));
    let g = gone.clone();
    let s = server(
        post,
        move || {
            g.fetch_add(1, Ordering::SeqCst);
            Reply::json(
                410,
                &[],
                &serde_json::json!({"message": "event log expired"}),
            )
        },
        &whole,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store").display().to_string();
    let url = s.url.clone();
    let (first, second) = tokio::task::spawn_blocking(move || {
        let worker = [
            "--once",
            "--base-url",
            &url,
            "--store",
            &store,
            "--context",
            "handbook",
            "q?",
        ];
        let mut crashing = worker.to_vec();
        crashing.extend(["--crash-after", "3"]);
        let first = run(example("worker", &crashing));
        let second = run(example("worker", &worker));
        (first, second)
    })
    .await
    .unwrap();
    assert_eq!(first.status.code(), Some(3), "{}", stderr(&first));
    assert!(second.status.success(), "{}", stderr(&second));
    // The crashed worker printed the events it handled; the restarted one
    // the rest, from the stored turn.
    assert_eq!(String::from_utf8_lossy(&first.stdout), "Resume with ");
    assert_eq!(
        String::from_utf8_lossy(&second.stdout),
        "a checkpoint, always.\n"
    );
    assert_eq!(s.count("POST", "/query"), 1);
    assert!(gone.load(Ordering::SeqCst) >= 1);
}
