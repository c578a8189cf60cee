//! The `chat` example, driven through a pseudo-terminal as a person would
//! use it: against the embedded local Nexus it starts itself, or against a
//! local Nexus started by the test (slowed down to interrupt a turn).

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use crate::support::examples;
use crate::support::wait::until_blocking;
#[cfg(unix)]
use examples::Pty;
use examples::{corpus, example, non_empty_lines, run, runtime};
use nexus_knowql::local::LocalNexus;

const PROMPT: &str = "› ";

/// What the summary line after an answer says.
#[cfg(unix)]
#[derive(Debug, PartialEq)]
struct Summary {
    query_id: String,
    session_id: String,
    turn: String,
}

/// Asks a question and waits for the answer's summary line; returns it with
/// everything printed before it (the streamed answer and its footnotes).
#[cfg(unix)]
fn ask(chat: &mut Pty, question: &str) -> (Summary, String) {
    chat.expect(PROMPT);
    chat.send_line(question);
    let (before, line) = chat.expect_regex(r"\S+ · session \S+ · turn \d+");
    // "<query id> · session <session id> · turn <n>"
    let parts: Vec<&str> = line.split(" · ").collect();
    let summary = Summary {
        query_id: parts[0].trim().to_owned(),
        session_id: parts[1].trim_start_matches("session ").to_owned(),
        turn: parts[2].trim_start_matches("turn ").to_owned(),
    };
    (summary, before)
}

/// The value of a string field in pretty-printed JSON.
#[cfg(unix)]
fn json_field(text: &str, field: &str) -> Option<String> {
    let key = format!("\"{field}\": \"");
    let start = text.find(&key)? + key.len();
    let len = text[start..].find('"')?;
    Some(text[start..start + len].to_owned())
}

#[cfg(unix)]
#[test]
fn two_turns_stream_answers_in_one_session() {
    // No base URL: the example starts its own local Nexus over the corpus.
    let mut chat = Pty::spawn(example("chat", &[]));

    let (first, answer) = ask(
        &mut chat,
        "How does a stream resume after the connection drops?",
    );
    assert_eq!(first.turn, "1");
    // The answer streamed, then its citations as numbered footnotes.
    let footnotes = answer.find("\n[1] ").expect("citations are footnotes");
    assert!(answer[..footnotes].trim().len() > 20, "answer: {answer:?}");
    assert!(answer[footnotes..].contains(".md"), "{answer:?}");

    let (second, _) = ask(&mut chat, "And which header carries the last event id?");
    assert_eq!(second.turn, "2");
    assert_eq!(second.session_id, first.session_id);
    assert_ne!(second.query_id, first.query_id);

    // The server continued the session: the second turn follows the first.
    chat.expect(PROMPT);
    chat.send_line("/json");
    // The document ends with a closing brace at the start of a line.
    let (json, _) = chat.expect_regex(r"\n\}\r?\n");
    let json = &json[json
        .rfind(&format!("\"id\": \"{}\"", second.query_id))
        .unwrap_or(0)..];
    assert_eq!(
        json_field(json, "session_id"),
        Some(first.session_id.clone())
    );
    assert_eq!(json_field(json, "previous_query_id"), Some(first.query_id));

    // Ctrl-D at an empty prompt leaves.
    chat.expect(PROMPT);
    chat.send_control('d');
    assert_eq!(chat.exit_code(), Some(0));
}

#[cfg(unix)]
#[test]
fn new_starts_a_new_session_with_the_same_scope() {
    let mut chat = Pty::spawn(example("chat", &[]));
    let (first, _) = ask(&mut chat, "What is a context?");
    chat.expect(PROMPT);
    chat.send_line("/new");
    chat.expect("new session");
    let (second, _) = ask(&mut chat, "What is a context?");
    assert_eq!(second.turn, "1");
    assert_ne!(second.session_id, first.session_id);

    chat.expect(PROMPT);
    chat.send_line("/quit");
    assert_eq!(chat.exit_code(), Some(0));
}

#[cfg(unix)]
#[test]
fn ctrl_c_cancels_a_slow_turn_on_the_server_and_the_prompt_returns() {
    let rt = runtime();
    let server = rt
        .block_on(
            LocalNexus::builder()
                .context("docs", corpus())
                .frame_delay(Duration::from_millis(300))
                .start(),
        )
        .unwrap();
    let url = server.base_url().to_owned();
    let mut chat = Pty::spawn(example("chat", &["--base-url", &url]));

    chat.expect(PROMPT);
    chat.send_line("How are sessions continued across turns?");
    // The turn is under way (the server has it, the spinner shows), then
    // the user gives up.
    chat.expect("thinking");
    chat.send_control('c');
    let (_, line) = chat.expect_regex(r"cancelled \S+ on the server");
    let query_id = line
        .trim_start_matches("cancelled ")
        .trim_end_matches(" on the server")
        .to_owned();
    chat.expect(PROMPT);

    // The server agrees: the turn ended cancelled.
    let client = server.client().unwrap();
    let stored = || rt.block_on(client.queries().get(&query_id)).unwrap();
    until_blocking(Duration::from_secs(30), "the turn ends", || {
        stored().is_terminal()
    });
    assert_eq!(stored().status, "cancelled");

    // The chat goes on: the next turn in the session runs to its end.
    chat.send_line("/background");
    let (next, _) = ask(&mut chat, "What is a context?");
    assert_eq!(next.turn, "2");

    // Ctrl-C at an empty prompt leaves.
    chat.expect(PROMPT);
    chat.send_control('c');
    assert_eq!(chat.exit_code(), Some(0));
}

#[cfg(unix)]
#[test]
fn commands_list_contexts_trace_and_reject_unknown_ones() {
    let mut chat = Pty::spawn(example("chat", &[]));
    chat.expect(PROMPT);
    chat.send_line("/help");
    chat.expect("/background");

    chat.expect(PROMPT);
    chat.send_line("/trace");
    chat.expect("no turn yet");

    chat.expect(PROMPT);
    chat.send_line("/contexts");
    chat.expect_regex(r"✓\s+•");

    chat.expect(PROMPT);
    chat.send_line("/scope nope");
    chat.expect("error: no context named \"nope\" (404, request id req_");

    chat.expect(PROMPT);
    chat.send_line("/frobnicate");
    chat.expect("unknown command /frobnicate");

    let (turn, _) = ask(&mut chat, "What is a context?");
    chat.expect(PROMPT);
    chat.send_line("/trace");
    chat.expect(&format!("trace of {}", turn.query_id));

    chat.expect(PROMPT);
    chat.send_control('d');
    assert_eq!(chat.exit_code(), Some(0));
}

#[test]
fn unknown_context_is_one_line_on_stderr_and_exit_code_1() {
    let rt = runtime();
    let server = rt
        .block_on(LocalNexus::builder().context("docs", corpus()).start())
        .unwrap();
    let url = server.base_url().to_owned();
    let out = run(example("chat", &["--base-url", &url, "--context", "nope"]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lines = non_empty_lines(&out.stderr);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("error: no context named \"nope\" (404, request id req_"),
        "{lines:?}"
    );
}

#[test]
fn without_a_terminal_output_is_plain_lines() {
    let rt = runtime();
    let server = rt
        .block_on(LocalNexus::builder().context("docs", corpus()).start())
        .unwrap();
    let url = server.base_url().to_owned();
    let mut cmd = example("chat", &["--base-url", &url]);
    // Colour is off because nothing is a terminal, not because of NO_COLOR.
    cmd.env_remove("NO_COLOR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"How does a stream resume after the connection drops?\n/quit\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!stdout.contains('\x1b') && !stderr.contains('\x1b'));
    assert!(stdout.contains("[1] "), "{stdout}");
    // Step commentary as plain lines, then the summary line.
    assert!(stderr.lines().any(|l| l.starts_with("· ")), "{stderr}");
    assert!(stderr.contains("· turn 1 ·"), "{stderr}");
}
