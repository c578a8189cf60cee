//! A turn is bound to the request that made it, in the examples too:
//! `chat` never prints a replay of the session's first turn as the answer
//! to a follow-up, and `ask --json` never exits 0 with an answer to another
//! question.
use crate::support::examples;
use crate::support::sse_server;

use std::io::Write;
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use examples::{example, run};
use sse_server::{Reply, SseServer, Step, Turn, frame, query_json};

const Q1: &str = "q_turn1";
const S1: &str = "s_bound";
const FIRST: &str = "Who approves travel?";
const FOLLOW_UP: &str = "And for contractors?";
const ANSWER: &[&str] = &["Managers ", "approve ", "travel."];

/// The first turn's event stream; its final Query answers `input`.
fn first_turn(input: &str) -> String {
    let turn = Turn::completed(Q1, S1, ANSWER);
    let mut body: String = turn
        .frames
        .iter()
        .filter(|(id, _)| id.is_some())
        .map(|(_, f)| f.as_str())
        .collect();
    let mut query = query_json(Q1, S1, "completed", &turn.answer);
    query["input"] = serde_json::json!([{"role": "user", "content": input}]);
    query["previous_query_id"] = serde_json::Value::Null;
    body.push_str(&frame(None, "query", &query));
    body
}

/// A server whose every `POST /query` streams the first turn (its final
/// Query answering `input`), with the context `handbook` queryable.
async fn server(input: &'static str) -> SseServer {
    let posts = AtomicUsize::new(0);
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            posts.fetch_add(1, Ordering::SeqCst);
            Reply::sse(vec![Step::Write(first_turn(input).into_bytes())])
        } else if req.is("GET", "/contexts/handbook") {
            Reply::json(
                200,
                &[],
                &serde_json::json!({
                    "id": "id-handbook", "slug": "handbook", "name": "Handbook", "kind": "search",
                    "created_by": "tester", "description": "", "is_optimizing": false,
                    "has_sources": true, "is_curating": false, "is_importing": false,
                    "is_exploring": false, "is_restoring": false, "is_grooming": false,
                    "last_curated_at": "2026-07-03T10:20:30Z",
                    "created_at": "2026-07-01T00:00:00Z", "updated_at": "2026-07-02T00:00:00Z"
                }),
            )
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `chat` asks twice; the follow-up's `POST /query` is answered with a
/// replay of the first turn (its id, question and answer). The old answer
/// is printed once, for the first question only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_never_prints_the_first_turn_as_a_follow_ups_answer() {
    let server = server(FIRST).await;
    let url = server.url.clone();
    let out: Output = tokio::task::spawn_blocking(move || {
        let mut cmd = example("chat", &["--base-url", &url, "--context", "handbook"]);
        cmd.env("PINECONE_API_KEY", "pcsk_test")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let input = format!("{FIRST}\n{FOLLOW_UP}\n/quit\n");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(server.count("POST", "/query"), 2, "{stderr}");
    assert_eq!(
        stdout.matches("Managers approve travel.").count(),
        1,
        "the old answer is printed for the follow-up too: {stdout}"
    );
    assert!(stderr.contains("· turn 1 ·"), "{stderr}");
    assert!(!stderr.contains("· turn 2 ·"), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("error:") && l.contains("not a new turn")),
        "{stderr}"
    );
}

/// `ask --json` (streamed and not) whose final Query answers another
/// question exits 1 with one line naming it, and prints no document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_json_never_exits_0_with_another_questions_answer() {
    let server = server("SOMEONE ELSE'S QUESTION").await;
    for extra in [&["--json"][..], &["--no-stream", "--json"]] {
        let mut args = vec!["--base-url", server.url.as_str(), "--context", "handbook"];
        args.extend_from_slice(extra);
        args.push(FIRST);
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        let out = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut cmd = example("ask", &args);
            cmd.env("PINECONE_API_KEY", "pcsk_test");
            run(cmd)
        })
        .await
        .unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {stdout} {stderr}");
        assert!(!stdout.contains("SOMEONE"), "{extra:?}: {stdout}");
        let last = stderr.lines().last().unwrap_or_default();
        assert!(last.contains("names question"), "{extra:?}: {stderr}");
    }
}
