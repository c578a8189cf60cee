//! The `ask` example against servers that bend the streaming contract: it
//! prints the exact answer and exits 0, or fails with a one-line reason,
//! never a wrong answer with exit code 0.

use std::process::Output;

use crate::support::examples;
use crate::support::sse_server;
use examples::{example, run};
use sse_server::{Reply, SseServer, Step, Turn, query_json};

const DELTAS: &[&str] = &["Travel ", "is approved ", "by your ", "manager."];

// Ids of `Turn::completed` with four deltas: 1 created, 2 step, 3..=6
// deltas, 7 step, 8 rollup, 9 completed, then the `query` frame.

fn frames(turn: &Turn, from: u64, to: u64) -> String {
    turn.frames
        .iter()
        .filter(|(id, _)| id.is_some_and(|i| i >= from && i <= to))
        .map(|(_, f)| f.as_str())
        .collect()
}

/// A server whose POST sends events 1 to `cut`, whose event resumes are
/// answered by `resume` and whose stored turn is `stored`.
async fn server(turn: &Turn, cut: u64, resume: Reply, stored: Reply) -> SseServer {
    let t = turn.clone();
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(frames(&t, 1, cut).into_bytes())])
        } else if req.method == "GET" && req.path == t.events_path() {
            resume.clone()
        } else if req.is("GET", &format!("/queries/{}", t.query_id)) {
            stored.clone()
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await
}

async fn ask(server: &SseServer) -> Output {
    let cmd = example(
        "ask",
        &[
            "--base-url",
            &server.url,
            "--api-key",
            "pcsk_test",
            "--context",
            "handbook",
            "Who approves travel?",
        ],
    );
    tokio::task::spawn_blocking(move || run(cmd)).await.unwrap()
}

fn stored(turn: &Turn, answer: &str) -> Reply {
    Reply::json(
        200,
        &[],
        &query_json(&turn.query_id, &turn.session_id, "completed", answer),
    )
}

fn not_found() -> Reply {
    Reply::json(404, &[], &serde_json::json!({"message": "expired"}))
}

fn assert_exact_answer(out: &Output, answer: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{answer}\n"));
}

/// Exit code 1, and the last line on stderr is the one-line reason.
fn assert_one_line_failure(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    assert!(last.starts_with("error: "), "{stderr}");
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_prints_the_exact_answer_or_a_one_line_reason() {
    let turn = Turn::completed("q_a1", "s_a1", DELTAS);

    // A trimmed replay (resumed at 4, replayed from 6) with the stored turn
    // continuing the delivered text: the exact answer.
    let trimmed = Reply::sse(vec![Step::Write(frames(&turn, 6, 99).into_bytes())]);
    let s = server(&turn, 4, trimmed.clone(), stored(&turn, &turn.answer)).await;
    assert_exact_answer(&ask(&s).await, &turn.answer);

    // The same gap, and a stored answer that does not continue the text.
    let s = server(&turn, 4, trimmed, stored(&turn, "Nobody.")).await;
    let out = ask(&s).await;
    let reason = assert_one_line_failure(&out);
    assert!(
        reason.contains("q_a1") && reason.contains("event 4"),
        "{reason}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("manager."));

    // The events are gone (404) after the terminal event: a completed turn.
    let s = server(&turn, 9, not_found(), stored(&turn, &turn.answer)).await;
    assert_exact_answer(&ask(&s).await, &turn.answer);

    // The events are gone mid-answer: recovered from the stored turn...
    let s = server(&turn, 4, not_found(), stored(&turn, &turn.answer)).await;
    assert_exact_answer(&ask(&s).await, &turn.answer);

    // ...or, when the stored turn is gone too, a reason that names the
    // query, not the context.
    let s = server(&turn, 4, not_found(), not_found()).await;
    let reason = assert_one_line_failure(&ask(&s).await);
    assert!(reason.contains("q_a1"), "{reason}");
    assert!(!reason.contains("unknown context"), "{reason}");
}
