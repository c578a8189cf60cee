//! The `ask` example under Ctrl-C and the `worker` example's crash and
//! restart from its checkpoint store, run as a person would run them.

use std::time::Duration;

use crate::support::examples;
use crate::support::wait::until_blocking;
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
    let stored = || rt.block_on(client.queries().get(&query_id)).unwrap();
    until_blocking(Duration::from_secs(30), "the turn ends", || {
        stored().is_terminal()
    });
    assert_eq!(stored().status, "cancelled");
}

#[test]
fn worker_crashes_mid_answer_and_a_restarted_worker_prints_the_rest() {
    let rt = runtime();
    let server = rt
        .block_on(
            LocalNexus::builder()
                .context("docs", corpus())
                .frame_delay(Duration::from_millis(20))
                .start(),
        )
        .unwrap();
    let store = tempfile::tempdir().unwrap();
    let store_dir = store.path().join("checkpoints");
    let out = run(example(
        "worker",
        &[
            "--base-url",
            server.base_url(),
            "--store",
            &store_dir.display().to_string(),
            "--crash-after",
            "8",
        ],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("worker 1 ended with exit status: 3"),
        "{stderr}"
    );
    let query_id = stderr
        .lines()
        .find_map(|l| l.strip_prefix("worker: turn "))
        .expect("the first worker names its turn")
        .to_owned();
    // The restarted worker continued that turn from the store.
    let resumed = format!("worker: resuming {query_id} after event ");
    let handled: usize = stderr
        .lines()
        .find_map(|l| l.strip_prefix(&resumed))
        .and_then(|rest| rest.split('(').nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no resume line: {stderr}"));
    let stored = rt
        .block_on(server.client().unwrap().queries().get(&query_id))
        .unwrap();
    assert_eq!(stored.status, "completed");
    // Both workers' output together is the stored answer, each part once.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout, format!("{}\n", stored.answer_text()));
    assert!(
        handled > 0 && handled < stored.answer_text().len(),
        "the crash came mid-answer: {handled} bytes of {}",
        stored.answer_text().len()
    );
    // Once the turn ended the store forgot it.
    assert!(
        std::fs::read_dir(&store_dir).unwrap().count() == 0,
        "{stderr}"
    );
}

#[test]
fn a_worker_whose_stdout_closes_cancels_its_turn_and_forgets_it() {
    use std::io::Read;
    let rt = runtime();
    let server = rt
        .block_on(
            LocalNexus::builder()
                .context("docs", corpus())
                .frame_delay(Duration::from_millis(100))
                .start(),
        )
        .unwrap();
    let store = tempfile::tempdir().unwrap();
    let mut child = example(
        "worker",
        &[
            "--once",
            "--base-url",
            server.base_url(),
            "--store",
            &store.path().display().to_string(),
        ],
    )
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // `head -c 5`: five bytes, then the pipe is closed.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 5];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let query_id = stderr
        .lines()
        .find_map(|l| l.strip_prefix("worker: turn "))
        .expect("the worker names its turn")
        .to_owned();
    let stored = rt
        .block_on(server.client().unwrap().queries().get(&query_id))
        .unwrap();
    assert_eq!(stored.status, "cancelled", "{stderr}");
    assert_eq!(std::fs::read_dir(store.path()).unwrap().count(), 0);
}

#[cfg(unix)]
#[test]
fn a_worker_refuses_a_symlinked_checkpoint_without_showing_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "nexus-checkpoint 1 worker-job TOP-SECRET\n").unwrap();
    std::os::unix::fs::symlink(&secret, store.join("worker-job.checkpoint")).unwrap();
    // Nothing is sent before the store is read: any URL will do.
    let out = run(example(
        "worker",
        &[
            "--once",
            "--base-url",
            "http://127.0.0.1:9",
            "--context",
            "docs",
            "--store",
            &store.display().to_string(),
        ],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert!(stderr.contains("remove it"), "{stderr}");
    assert!(!stderr.contains("TOP-SECRET"), "{stderr}");
}
