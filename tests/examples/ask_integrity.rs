//! The `ask` example against servers whose ids jump, whose replays start
//! early, and that send only keep-alives after the terminal event: the exact
//! answer (printed as it arrives) or exit 1 with one line, and never a wait
//! without an end.

use std::io::Read;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::examples;
use crate::support::sse_server;
use examples::{example, run};
use sse_server::{Reply, SseServer, Step, Turn, query_json};

const DELTAS: &[&str] = &["Travel ", "is approved ", "by your ", "manager."];
// Ids of `Turn::completed` with four deltas: 1 created, 2 step, 3..=6
// deltas, 7 step, 8 rollup, 9 completed, then the `query` frame.

fn frames(turn: &Turn, from: u64, to: u64, with_query: bool) -> String {
    turn.frames
        .iter()
        .filter(|(id, _)| match id {
            Some(i) => *i >= from && *i <= to,
            None => with_query,
        })
        .map(|(_, f)| f.as_str())
        .collect()
}

async fn server(turn: &Turn, post: Reply, resume: Reply, stored_answer: &str) -> SseServer {
    let t = turn.clone();
    let stored = query_json(&t.query_id, &t.session_id, "completed", stored_answer);
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            post.clone()
        } else if req.method == "GET" && req.path == t.events_path() {
            resume.clone()
        } else if req.is("GET", &format!("/queries/{}", t.query_id)) {
            Reply::json(200, &[], &stored)
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await
}

fn args(server: &SseServer) -> Vec<String> {
    [
        "--base-url",
        &server.url,
        "--api-key",
        "pcsk_test",
        "--context",
        "handbook",
        "Who approves travel?",
    ]
    .map(str::to_owned)
    .to_vec()
}

async fn ask(server: &SseServer) -> Output {
    let args = args(server);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(example("ask", &args))
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_that_jump_give_the_exact_answer_or_one_line() {
    let turn = Turn::completed("q_x1", "s_x1", DELTAS);
    let jumped = format!(
        "{}{}",
        frames(&turn, 1, 4, false),
        frames(&turn, 7, 9, true)
    );
    let post = Reply::sse(vec![Step::Write(jumped.into_bytes())]);

    // The log still holds the skipped events: the exact answer.
    let replay = Reply::sse(vec![Step::Write(frames(&turn, 4, 9, true).into_bytes())]);
    let s = server(&turn, post.clone(), replay, &turn.answer).await;
    let out = ask(&s).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", turn.answer)
    );
    assert_eq!(s.count("POST", "/query"), 1);

    // The log skips them too, and the final answer does not continue the
    // text: exit 1 with one line naming the query.
    let skipping = format!(
        "{}{}",
        frames(&turn, 4, 4, false),
        frames(&turn, 7, 9, true)
    );
    let replay = Reply::sse(vec![Step::Write(skipping.into_bytes())]);
    let s = server(&turn, post, replay, "Nobody approves travel.").await;
    let out = ask(&s).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains("q_x1"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("manager."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_replay_keeps_printing_as_events_arrive() {
    let turn = Turn::completed("q_x2", "s_x2", DELTAS);
    // The POST is cut after event 3; the replay starts at event 1, brings
    // event 4 ("is approved ") at once and the rest only after a pause.
    let post = Reply::sse(vec![
        Step::Write(frames(&turn, 1, 3, false).into_bytes()),
        Step::Reset,
    ]);
    let pause = Duration::from_secs(3);
    let replay = Reply::sse(vec![
        Step::Write(frames(&turn, 1, 4, false).into_bytes()),
        Step::Sleep(pause),
        Step::Write(frames(&turn, 5, 9, true).into_bytes()),
    ]);
    let s = server(&turn, post, replay, &turn.answer).await;
    let args = args(&s);
    let (printed_early, stdout, status) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut child = example("ask", &args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let started = Instant::now();
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        let mut printed_early = None;
        loop {
            let n = out.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            if printed_early.is_none() && String::from_utf8_lossy(&seen).contains("is approved ") {
                printed_early = Some(started.elapsed());
            }
        }
        let ended = started.elapsed();
        let status = child.wait().unwrap();
        let early = printed_early.map(|at| ended.saturating_sub(at));
        (early, String::from_utf8_lossy(&seen).into_owned(), status)
    })
    .await
    .unwrap();
    assert!(status.success());
    assert_eq!(stdout, format!("{}\n", turn.answer));
    // Event 4 was printed from the replay as it came, before the pause (not
    // with the rest at the end); the stored turn was never needed.
    let before_end = printed_early.expect("the early text was printed");
    assert!(
        before_end >= pause - Duration::from_millis(500),
        "{before_end:?}"
    );
    assert_eq!(s.count("GET", "/queries/q_x2"), 0);
    assert_eq!(s.last_event_ids(), vec![Some("3".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_after_the_terminal_event_end_within_seconds() {
    let turn = Turn::completed("q_x3", "s_x3", DELTAS);
    let mut steps = vec![Step::Write(frames(&turn, 1, 9, false).into_bytes())];
    for _ in 0..3000 {
        steps.push(Step::Sleep(Duration::from_millis(100)));
        steps.push(Step::Write(b": keep-alive\n\n".to_vec()));
    }
    let replay = Reply::sse(vec![Step::Write(frames(&turn, 9, 9, true).into_bytes())]);
    let s = server(&turn, Reply::sse(steps), replay, &turn.answer).await;
    let started = Instant::now();
    let out = ask(&s).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", turn.answer)
    );
    // The default wait for the final Query is 5 s; the server would go on
    // for 300 s.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(s.count("GET", "/queries/q_x3"), 1);
}
