//! The `ask` example under Ctrl-C and the `worker` example's crash and
//! resume, run as a person would run them.

use std::time::{Duration, Instant};

use crate::support::examples;
#[cfg(unix)]
use examples::Pty;
use examples::{corpus, example, run, runtime};
use nexus_knowql::local::LocalNexus;

#[cfg(unix)]
#[test]
fn ask_ctrl_c_cancels_the_turn_on_the_server_and_exits_130() {
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
    let mut ask = Pty::spawn(example(
        "ask",
        &[
            "--base-url",
            &url,
            "How are sessions continued across turns?",
        ],
    ));
    // A step line shows the turn is under way; then the user gives up.
    ask.expect("·");
    ask.send_control('c');
    let (_, line) = ask.expect_regex(r"cancelled \S+ on the server");
    let query_id = line
        .trim_start_matches("ask: interrupted; cancelled ")
        .trim_start_matches("cancelled ")
        .trim_end_matches(" on the server")
        .to_owned();
    assert_eq!(ask.exit_code(), Some(130));

    let client = server.client().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let q = rt.block_on(client.queries().get(&query_id)).unwrap();
        if q.is_terminal() || Instant::now() > deadline {
            break q.status;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status, "cancelled");
}

#[test]
fn worker_crashes_mid_answer_and_a_second_process_finishes_it() {
    let out = run(example("worker", &["--crash-after", "8"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("process 1 ended with exit status: 3"),
        "{stderr}"
    );
    assert!(stderr.contains("attaching to"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The answer once, whole: the checkpointed part and the rest.
    assert_eq!(stdout.matches("Last-Event-ID").count(), 1, "{stdout}");
    assert!(stdout.trim_end().ends_with("[1]"), "{stdout}");
}
