//! One request, one outcome: what an answer says was saved is what a
//! restart finds, and a request that went away leaves nothing behind.

use std::time::Duration;

use crate::support::local::{LocalBinary, TempDir, corpus, get_json, http, post_json};
use nexus_knowql::local::LocalNexus;
use serde_json::json;

/// A background turn cancelled while its end waits for a slow commit: the
/// cancel answers only once the end it reports is on disk, so a SIGKILL
/// right after the answer and a restart find the same end.
#[test]
fn a_cancel_answers_the_end_a_restart_finds() {
    let corpus = corpus();
    let data = TempDir::new("cancel-saved");
    let dir = data.path().to_str().unwrap().to_owned();
    let seed = format!("docs={}", corpus.path().display());
    let slow = [(nexus_knowql::local::ENV_FAILPOINTS, "db.commit=delay(1500)")];
    let server = LocalBinary::start(&["--data", &dir, "--context", &seed], &slow);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (id, answered) = rt.block_on(async {
        let (status, started) = post_json(
            &format!("{}/query", server.url),
            json!({"ask": "What is in the docs?", "scope": ["docs"], "background": true}),
        )
        .await;
        assert_eq!(status, 202, "{started}");
        let id = started["id"].as_str().unwrap().to_owned();
        let (status, answer) =
            post_json(&format!("{}/queries/{id}/cancel", server.url), json!({})).await;
        (id, (status, answer))
    });
    server.kill();
    let (status, answer) = answered;
    let server = LocalBinary::start(&["--data", &dir], &[]);
    let (found_status, found) = rt.block_on(get_json(&format!("{}/queries/{id}", server.url)));
    assert_eq!(found_status, 200, "{found}");
    if status == 200 {
        assert_eq!(
            answer["status"], found["status"],
            "the cancel answered {answer}, the restart found {found}"
        );
    } else {
        assert_eq!(answer["code"], "cancel_pending", "{answer}");
    }
}

/// Builds a context of `n` small files under `dir`.
fn many_files(dir: &TempDir, n: usize) {
    for i in 0..n {
        dir.write(
            &format!("d{}/f{i}.md", i % 50),
            &format!("# File {i}\n\nline {i}\n"),
        );
    }
}

/// A fork whose client goes away mid-copy leaves nothing that blocks a
/// retry: no fork stuck `is_importing`, no 409 for the same slug.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_whose_client_goes_away_leaves_nothing_and_its_retry_succeeds() {
    let files = TempDir::new("fork-files");
    many_files(&files, 1500);
    let data = TempDir::new("fork-away");
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .context("big", files.path())
        .start()
        .await
        .unwrap();
    let base = server.base_url().to_owned();
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(30))
        .build()
        .unwrap();
    let gone = impatient
        .post(format!("{base}/contexts/big/fork"))
        .json(&json!({"target_slug": "copy"}))
        .send()
        .await;
    assert!(gone.is_err(), "the fork answered within 30 ms: {gone:?}");
    // Whatever the copy left running, the fork is never seen half made.
    let (status, seen) = get_json(&format!("{base}/contexts/copy")).await;
    assert!(
        status == 404 || seen["is_importing"] != true,
        "a fork half made is visible: {status} {seen}"
    );
    // While the first copy still runs, its slug is busy (retryable).
    let answer = crate::support::wait::until_some(
        Duration::from_secs(10),
        "the fork's slug no longer busy",
        async || {
            let answer = post_json(
                &format!("{base}/contexts/big/fork"),
                json!({"target_slug": "copy"}),
            )
            .await;
            (answer.0 != 503 || answer.1["code"] != "busy").then_some(answer)
        },
    )
    .await;
    let (status, body) = answer;
    assert_eq!(status, 200, "the retry of a fork that went away: {body}");
    server.shutdown().await;
}

/// The write lock of `dir/state.db` taken from another connection (as a
/// `sqlite3` shell would) until the returned sender fires; joined by
/// [`release`].
fn hold_write_lock(
    dir: &std::path::Path,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let conn = rusqlite::Connection::open(dir.join("state.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let _ = rx.recv();
        let _ = conn.execute_batch("COMMIT");
    });
    (tx, holder)
}

fn release((tx, holder): (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)) {
    tx.send(()).unwrap();
    holder.join().unwrap();
}

/// A plain turn whose end cannot be saved is answered `not_saved`, and a
/// restart finds nothing of it: no session, no failed turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_answered_not_saved_leaves_no_session_behind() {
    let corpus = corpus();
    let data = TempDir::new("turn-not-saved");
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .context("docs", corpus.path())
        .frame_delay(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let base = server.base_url().to_owned();
    let asked = tokio::spawn({
        let base = base.clone();
        async move {
            post_json(
                &format!("{base}/query"),
                json!({"ask": "What is in the docs?", "scope": ["docs"]}),
            )
            .await
        }
    });
    // The turn is accepted (its session is listed) before the database
    // is locked; its end comes frames later.
    let listed = async || {
        let (_, listed) = get_json(&format!("{base}/sessions")).await;
        listed["sessions"].as_array().is_some_and(|s| !s.is_empty())
    };
    crate::support::wait::until(
        Duration::from_secs(30),
        "the turn's session is listed",
        listed,
    )
    .await;
    let lock = hold_write_lock(data.path());
    let (status, body) = asked.await.unwrap();
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("not_saved")),
        "{body}"
    );
    tokio::time::timeout(Duration::from_secs(30), server.failed())
        .await
        .expect("the server did not stop after a lost write");
    release(lock);
    server.shutdown().await;
    let again = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .unwrap();
    let (_, listed) = get_json(&format!("{}/sessions", again.base_url())).await;
    assert_eq!(
        listed["sessions"],
        json!([]),
        "a turn answered not_saved left its session"
    );
    again.shutdown().await;
}

/// An import's files and its task's end are saved together: at every
/// commit a crash may stop, a restart lists the uploaded file only with
/// its import task `completed`, and a task `failed` only without it.
#[test]
fn an_import_is_listed_only_with_its_task_completed() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for k in 2..=6 {
        let data = TempDir::new("import-crash");
        let dir = data.path().to_str().unwrap().to_owned();
        {
            let spec = format!("db.commit=crash@{k}");
            let server = LocalBinary::start(
                &["--data", &dir],
                &[(nexus_knowql::local::ENV_FAILPOINTS, spec.as_str())],
            );
            rt.block_on(async {
                let base = server.url.clone();
                let _ = http()
                    .post(format!("{base}/contexts"))
                    .json(&json!({"slug": "c", "name": "C"}))
                    .send()
                    .await;
                let form = reqwest::multipart::Form::new().part(
                    "file",
                    reqwest::multipart::Part::bytes(b"# A\n\nwords\n".to_vec()).file_name("a.md"),
                );
                let _ = http()
                    .post(format!("{base}/contexts/c/import/upload"))
                    .multipart(form)
                    .send()
                    .await;
            });
            server.kill();
        }
        let server = LocalBinary::start(&["--data", &dir], &[]);
        rt.block_on(async {
            let base = server.url.clone();
            let (status, manifest) = get_json(&format!("{base}/contexts/c/source/manifest")).await;
            let listed =
                status == 200 && manifest["files"].as_array().is_some_and(|f| !f.is_empty());
            let (_, tasks) = get_json(&format!("{base}/tasks")).await;
            let imports: Vec<&serde_json::Value> = tasks
                .as_array()
                .or_else(|| tasks["tasks"].as_array())
                .into_iter()
                .flatten()
                .filter(|t| t["workflow"] == "import")
                .collect();
            for t in &imports {
                let completed = t["state"] == "completed";
                assert_eq!(
                    listed, completed,
                    "crash at commit {k}: file listed {listed}, import task {t}"
                );
            }
        });
    }
}
