//! Every example honours `NEXUS_BASE_URL`: run with it naming a local Nexus
//! started by the test, each one exits 0 and leaves its trace on that
//! server (a session, a context or a turn that only it can have made).
//! Without the variable an example starts an embedded server of its own,
//! and the test's server would see nothing.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::support::examples::{corpus, example, runtime};
use nexus_knowql::local::LocalNexus;

/// How long one example may run: generous, for a loaded two-core machine.
const DEADLINE: Duration = Duration::from_secs(180);

/// The test's server: the shipped corpus as `docs`, as the examples expect.
fn server(rt: &tokio::runtime::Runtime) -> LocalNexus {
    rt.block_on(LocalNexus::builder().context("docs", corpus()).start())
        .unwrap()
}

/// The number of sessions on the server.
fn sessions(rt: &tokio::runtime::Runtime, server: &LocalNexus) -> usize {
    let client = server.client().unwrap();
    rt.block_on(client.sessions().list().into_future())
        .unwrap()
        .len()
}

/// An example pointed at `server` by the environment only.
fn pointed_at(server: &LocalNexus, name: &str, args: &[&str]) -> Command {
    let mut cmd = example(name, args);
    cmd.env("NEXUS_BASE_URL", server.base_url());
    cmd
}

/// Runs a command to its end with `input` on stdin, killing it past the
/// deadline.
fn run_with(mut cmd: Command, input: &[u8]) -> Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("the example starts");
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    drop(stdin);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("the example did not end within {DEADLINE:?}");
        }
    }
}

/// Runs an example that asks a question and checks it exited 0 having
/// started a session on `server`.
fn asks_the_named_server(name: &str, args: &[&str], input: &[u8]) {
    let rt = runtime();
    let server = server(&rt);
    let before = sessions(&rt, &server);
    let out = run_with(pointed_at(&server, name, args), input);
    assert!(out.status.success(), "{name}: {out:?}");
    let after = sessions(&rt, &server);
    assert!(
        after > before,
        "{name} made no session on NEXUS_BASE_URL's server ({before} before, {after} after): {out:?}"
    );
}

#[test]
fn ask_uses_nexus_base_url() {
    asks_the_named_server("ask", &["What is a context?"], b"");
}

#[test]
fn chat_with_piped_input_uses_nexus_base_url() {
    asks_the_named_server("chat", &[], b"What is a context?\n/quit\n");
}

#[test]
fn first_question_uses_nexus_base_url() {
    asks_the_named_server("first_question", &[], b"");
}

#[test]
fn background_turn_uses_nexus_base_url() {
    asks_the_named_server("background_turn", &[], b"");
}

#[test]
fn worker_uses_nexus_base_url() {
    let store = tempfile::tempdir().unwrap();
    asks_the_named_server("worker", &["--store", store.path().to_str().unwrap()], b"");
}

#[cfg(feature = "schema")]
#[test]
fn typed_uses_nexus_base_url() {
    asks_the_named_server("typed", &[], b"");
}

#[cfg(feature = "schema")]
#[test]
fn typed_worker_uses_nexus_base_url() {
    asks_the_named_server("typed_worker", &[], b"");
}

#[test]
fn nexus_uses_nexus_base_url() {
    let rt = runtime();
    let server = server(&rt);
    let out = run_with(
        pointed_at(&server, "nexus", &["api", "create_context", "--body", "-"]),
        br#"{"slug": "made-by-nexus", "name": "Made by nexus"}"#,
    );
    assert!(out.status.success(), "{out:?}");
    let client = server.client().unwrap();
    let made = rt.block_on(client.contexts().get("made-by-nexus"));
    assert!(
        made.is_ok(),
        "no context on NEXUS_BASE_URL's server: {out:?}"
    );
}

/// `web` serves its page and starts turns on the named server; Ctrl-C ends
/// it with exit code 0.
#[cfg(all(unix, feature = "web"))]
#[test]
fn web_uses_nexus_base_url() {
    let rt = runtime();
    let server = server(&rt);
    let mut cmd = pointed_at(&server, "web", &[]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("web starts");
    let pid = child.id().to_string();
    let kill = |signal: &str| {
        let _ = Command::new("kill").args([signal, &pid]).status();
    };
    // The page's address, from the line `web: open http://ADDR/` on stderr.
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("web: open ") {
                let _ = tx.send(url.trim_end_matches('/').to_owned());
            }
        }
    });
    let Ok(page) = rx.recv_timeout(DEADLINE) else {
        kill("-9");
        panic!("web printed no address within {DEADLINE:?}");
    };
    let started: serde_json::Value = rt.block_on(async {
        let http = nexus_knowql::reqwest::Client::new();
        let answer = http
            .post(format!("{page}/ask"))
            .json(&serde_json::json!({"question": "What is a context?"}))
            .timeout(DEADLINE)
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success(), "{answer:?}");
        answer.json().await.unwrap()
    });
    let query_id = started["query_id"].as_str().expect("a query id").to_owned();
    let client = server.client().unwrap();
    let turn = rt.block_on(client.queries().get(&query_id));
    kill("-INT");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx.recv_timeout(DEADLINE).map(Result::unwrap);
    if status.is_err() {
        kill("-9");
    }
    assert!(
        turn.is_ok(),
        "turn {query_id} is not on NEXUS_BASE_URL's server"
    );
    assert!(
        status.is_ok_and(|s| s.success()),
        "web did not exit 0 on Ctrl-C"
    );
}
