//! Every failpoint on the durability path, with every kind of write: a
//! `nexus-local` process runs the same writes with one failpoint armed
//! (crash, full disk, I/O error), then a clean process on the same data
//! directory checks that every acknowledged write is there, that nothing
//! refused with 503 was applied, that an import is all or nothing, and
//! that `nexus-local verify` finds the directory consistent.

use std::time::Duration;

use crate::support::local::*;
use futures::StreamExt;
use serde_json::{Value, json};

/// What became of one request.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    /// 2xx, with its body.
    Ok(Value),
    /// 503: not applied.
    NotApplied,
    /// Any other answer, or none (the process died): either outcome.
    Unknown,
}

impl Answer {
    fn ok(&self) -> Option<&Value> {
        match self {
            Answer::Ok(v) => Some(v),
            _ => None,
        }
    }
}

/// The files of the archive every run uploads.
const ARCHIVE_FILES: [(&str, &str); 3] = [
    (
        "docs/lighthouse.md",
        "# Lighthouse\n\nThe keeper counts 42 ships every night.\n",
    ),
    (
        "docs/tea.md",
        "# Tea\n\nGreen tea steeps for two minutes.\n",
    ),
    (
        "docs/bread.md",
        "# Bread\n\nThe dough rests for one hour.\n",
    ),
];

fn archive() -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (path, text) in ARCHIVE_FILES {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, path, text.as_bytes()).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

async fn answer(resp: Result<reqwest::Response, reqwest::Error>) -> Answer {
    let Ok(resp) = resp else {
        return Answer::Unknown;
    };
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if status.is_success() {
        Answer::Ok(body)
    } else if status == 503 {
        Answer::NotApplied
    } else {
        Answer::Unknown
    }
}

/// What the faulty run did, request by request.
#[derive(Debug, Default)]
struct Run {
    create_alpha: Option<Answer>,
    upload: Option<Answer>,
    curate: Option<Answer>,
    /// The curate task's end as polled (terminal states only).
    curate_end: Option<String>,
    query: Option<Answer>,
    /// The id of a streamed turn whose closing frame arrived, if it did.
    streamed: Option<(String, String)>,
    delete_beta: Option<Answer>,
    create_gamma: Option<Answer>,
}

async fn writes(base: &str) -> Run {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(45))
        .build()
        .unwrap();
    let mut run = Run::default();
    let post = |path: &str, body: Value| http.post(format!("{base}{path}")).json(&body).send();
    run.create_alpha =
        Some(answer(post("/contexts", json!({"slug": "alpha", "name": "Alpha"})).await).await);
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(archive()).file_name("docs.tar.gz"),
    );
    run.upload = Some(
        answer(
            http.post(format!("{base}/contexts/alpha/import/upload"))
                .multipart(form)
                .send()
                .await,
        )
        .await,
    );
    let curate = answer(post("/contexts/alpha/curate", json!({})).await).await;
    if let Some(id) = curate.ok().and_then(|v| v["task_id"].as_str()) {
        // Its end, or none when the server went away first.
        let url = format!("{base}/tasks/{id}");
        let end = crate::support::wait::found_within(Duration::from_secs(30), async || {
            let Ok(resp) = http.get(&url).send().await else {
                return Some(None);
            };
            let Ok(task) = resp.json::<Value>().await else {
                return Some(None);
            };
            let state = task["state"].as_str().unwrap_or("").to_owned();
            ["completed", "failed", "cancelled"]
                .contains(&state.as_str())
                .then_some(Some(state))
        })
        .await;
        run.curate_end = end.flatten();
    }
    run.curate = Some(curate);
    run.query = Some(
        answer(
            post(
                "/query",
                json!({"ask": "How many ships?", "scope": ["alpha"]}),
            )
            .await,
        )
        .await,
    );
    if let Ok(resp) = post(
        "/query",
        json!({"ask": "How long does tea steep?", "scope": ["alpha"], "stream": true}),
    )
    .await
        && resp.status() == 200
    {
        run.streamed = closing_frame(resp).await;
    }
    let _ = post("/contexts", json!({"slug": "beta", "name": "Beta"})).await;
    run.delete_beta = Some(answer(http.delete(format!("{base}/contexts/beta")).send().await).await);
    run.create_gamma =
        Some(answer(post("/contexts", json!({"slug": "gamma", "name": "Gamma"})).await).await);
    run
}

/// The `(id, status)` of a stream's closing `query` frame, if it came.
async fn closing_frame(resp: reqwest::Response) -> Option<(String, String)> {
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    while let Some(Ok(bytes)) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&bytes));
    }
    let raw = buf.split("\n\n").find(|f| f.contains("event: query"))?;
    let data = raw.lines().find_map(|l| l.strip_prefix("data: "))?;
    let q: Value = serde_json::from_str(data).ok()?;
    Some((
        q["id"].as_str()?.to_owned(),
        q["status"].as_str()?.to_owned(),
    ))
}

/// Status and body of a GET on the restarted server.
async fn get(base: &str, path: &str) -> (u16, Value) {
    let resp = reqwest::get(format!("{base}{path}")).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// A context created by `answer` is there when acknowledged, absent when
/// refused with 503.
async fn check_created(base: &str, slug: &str, answer: &Option<Answer>, case: &str) {
    let (status, _) = get(base, &format!("/contexts/{slug}")).await;
    match answer {
        Some(Answer::Ok(_)) => assert_eq!(status, 200, "{case}: acknowledged {slug} lost"),
        Some(Answer::NotApplied) => {
            assert_eq!(status, 404, "{case}: {slug} refused with 503 but applied")
        }
        _ => {}
    }
}

async fn check(base: &str, run: &Run, case: &str) {
    check_created(base, "alpha", &run.create_alpha, case).await;
    check_created(base, "gamma", &run.create_gamma, case).await;
    // The archive: all of it or none of it; all of it once acknowledged.
    let mut present = 0;
    for (path, text) in ARCHIVE_FILES {
        let resp = reqwest::get(format!("{base}/contexts/alpha/source/read/uploads/{path}"))
            .await
            .unwrap();
        if resp.status() == 200 {
            assert_eq!(resp.text().await.unwrap(), text, "{case}: {path} torn");
            present += 1;
        }
    }
    assert!(
        present == 0 || present == ARCHIVE_FILES.len(),
        "{case}: {present} of {} files of one import applied",
        ARCHIVE_FILES.len()
    );
    match &run.upload {
        Some(Answer::Ok(_)) => assert_eq!(present, 3, "{case}: acknowledged upload lost"),
        Some(Answer::NotApplied) => assert_eq!(present, 0, "{case}: refused upload applied"),
        _ => {}
    }
    if let Some(id) = run
        .curate
        .as_ref()
        .and_then(Answer::ok)
        .and_then(|v| v["task_id"].as_str())
    {
        let (status, task) = get(base, &format!("/tasks/{id}")).await;
        assert_eq!(status, 200, "{case}: acknowledged curate task lost");
        let state = task["state"].as_str().unwrap_or("");
        assert!(
            ["completed", "failed", "cancelled"].contains(&state),
            "{case}: curate task {state} after a restart"
        );
        // A task's end seen by polling is written behind, not acknowledged:
        // a crash right after it may leave the task failed ("the server
        // stopped while the task ran"), never running.
    }
    if let Some(q) = run.query.as_ref().and_then(Answer::ok) {
        let id = q["id"].as_str().unwrap();
        let (status, stored) = get(base, &format!("/queries/{id}")).await;
        assert_eq!(status, 200, "{case}: acknowledged turn lost");
        assert_eq!(stored["status"], q["status"], "{case}: turn's end changed");
    }
    if let Some((id, end)) = &run.streamed {
        let (status, stored) = get(base, &format!("/queries/{id}")).await;
        assert_eq!(status, 200, "{case}: streamed turn lost");
        assert_eq!(
            stored["status"].as_str(),
            Some(end.as_str()),
            "{case}: streamed end changed"
        );
    }
    if let Some(Answer::Ok(_)) = &run.delete_beta {
        let (status, _) = get(base, "/contexts/beta").await;
        assert_eq!(status, 404, "{case}: acknowledged delete undone");
    }
}

/// Waits for the process to end (a crash or a stop on a failed write),
/// else kills it: a crash after the last write.
fn end(mut server: LocalBinary, limit: Duration) {
    let ended =
        crate::support::wait::holds_within(limit, || server.child.try_wait().unwrap().is_some());
    if !ended {
        server.kill();
    }
}

/// Stops a server with SIGTERM (a clean stop) and waits.
fn stop(mut server: LocalBinary) {
    let pid = server.child.id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let stopped = || server.child.try_wait().unwrap().is_some();
    let what = "the server stopping on SIGTERM";
    crate::support::wait::until_blocking(Duration::from_secs(20), what, stopped);
}

fn verify(dir: &str) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nexus-local"))
        .args(["verify", "--data", dir])
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn one_case(rt: &tokio::runtime::Runtime, spec: &str) {
    let data = TempDir::new("failpoint");
    let dir = data.path().to_str().unwrap().to_owned();
    let faulty = LocalBinary::start(
        &["--data", &dir],
        &[(nexus_knowql::local::ENV_FAILPOINTS, spec)],
    );
    let run = rt.block_on(writes(&faulty.url));
    end(faulty, Duration::from_secs(20));
    let clean = LocalBinary::start(&["--data", &dir], &[]);
    rt.block_on(check(&clean.url, &run, spec));
    stop(clean);
    let (ok, report) = verify(&dir);
    assert!(ok, "{spec}: verify found problems:\n{report}\nrun: {run:?}");
}

/// Each failpoint, at several moments of the run (the N-th time it is
/// reached), with each way it can fail.
#[test]
fn every_failpoint_keeps_what_was_acknowledged_and_nothing_half_applied() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut cases: Vec<String> = Vec::new();
    for n in [1, 3, 5, 8, 12] {
        cases.push(format!("db.commit=enospc@{n}"));
    }
    for n in [2, 4, 7, 10] {
        cases.push(format!("db.commit=crash@{n}"));
    }
    cases.push("db.commit=eio@6".to_owned());
    for n in [3, 9] {
        cases.push(format!("db.committed=crash@{n}"));
    }
    for action in ["crash", "enospc"] {
        cases.push(format!("file.write={action}"));
    }
    for action in ["crash@2", "eio@2"] {
        cases.push(format!("file.move={action}"));
    }
    for action in ["crash", "eio", "crash@1;db.commit=enospc@2"] {
        cases.push(format!("staging.write={action}"));
        cases.push(format!("index.swap={action}"));
    }
    cases.push("db.commit=delay(20);file.move=delay(20)".to_owned());
    for spec in &cases {
        one_case(&rt, spec);
    }
}

/// Catches `verify` passing everything: a source file removed behind the
/// state's back, and one no row names, are both reported, and it exits 1.
#[test]
fn verify_reports_a_missing_and_an_orphan_source() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let data = TempDir::new("verify");
    let dir = data.path().to_str().unwrap().to_owned();
    let server = LocalBinary::start(&["--data", &dir], &[]);
    let run = rt.block_on(writes(&server.url));
    assert!(matches!(run.upload, Some(Answer::Ok(_))), "{run:?}");
    stop(server);
    assert!(verify(&dir).0, "{}", verify(&dir).1);
    let sources = std::fs::read_dir(data.path().join("contexts"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("sources"))
        .find(|p| p.is_dir())
        .unwrap();
    std::fs::remove_file(sources.join("uploads/docs/tea.md")).unwrap();
    std::fs::write(sources.join("uploads/docs/stray.md"), "# Stray\n").unwrap();
    let (ok, report) = verify(&dir);
    assert!(!ok, "{report}");
    assert!(
        report.contains("docs/tea.md") && report.contains("missing"),
        "{report}"
    );
    assert!(
        report.contains("docs/stray.md") && report.contains("orphan"),
        "{report}"
    );
}

/// Catches a fork stopped between its move into place and its record's
/// commit being kept as someone else's files: it was never acknowledged,
/// so the next start removes its directory (no `quarantine/`), the fork
/// is absent, its retry succeeds, and the context it was made from keeps
/// its files.
#[test]
fn a_fork_stopped_between_its_move_and_its_commit_is_removed() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let files = corpus();
    let data = TempDir::new("fork-publish");
    let dir = data.path().to_str().unwrap().to_owned();
    let seed = format!("docs={}", files.path().display());
    let faulty = LocalBinary::start(
        &["--data", &dir, "--context", &seed],
        &[(nexus_knowql::local::ENV_FAILPOINTS, "fork.publish=crash")],
    );
    let url = faulty.url.clone();
    let forked = rt.block_on(async {
        http()
            .post(format!("{url}/contexts/docs/fork"))
            .json(&json!({"target_slug": "copy"}))
            .send()
            .await
    });
    assert!(forked.is_err(), "the fork answered: {forked:?}");
    end(faulty, Duration::from_secs(20));
    let contexts = |dir: &str| {
        std::fs::read_dir(std::path::Path::new(dir).join("contexts"))
            .unwrap()
            .count()
    };
    assert_eq!(contexts(&dir), 2, "the fork was not moved into place");
    let clean = LocalBinary::start(&["--data", &dir], &[]);
    assert_eq!(
        contexts(&dir),
        1,
        "the unsaved fork's files are still there"
    );
    assert!(
        !data.path().join("quarantine").exists(),
        "the unsaved fork was set aside, not removed"
    );
    let url = clean.url.clone();
    rt.block_on(async {
        let (status, body) = get_json(&format!("{url}/contexts/copy")).await;
        assert_eq!(status, 404, "{body}");
        let (status, body) = post_json(
            &format!("{url}/contexts/docs/fork"),
            json!({"target_slug": "copy"}),
        )
        .await;
        assert_eq!(status, 200, "the retry: {body}");
        for slug in ["docs", "copy"] {
            let (_, sources) = get_json(&format!("{url}/contexts/{slug}/source/list")).await;
            assert!(
                sources.to_string().contains("notes.txt"),
                "{slug}: {sources}"
            );
        }
    });
    stop(clean);
    let (ok, report) = verify(&dir);
    assert!(ok, "verify found problems:\n{report}");
}
