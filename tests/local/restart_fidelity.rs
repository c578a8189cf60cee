//! The local Nexus stores and serves what it was given: every persisted
//! document (contexts with their manifest and curation ledger, sources,
//! import and curate tasks with their input and output, task files,
//! sessions, query turns with their traces and events, connectors) reads
//! back the same after a clean restart of `nexus-local` and after a
//! SIGKILL.

use std::process::Command;
use std::time::Duration;

use crate::support::local::{LocalBinary, TempDir, corpus};
use crate::support::wait::until;
use nexus_knowql::Client;
use nexus_knowql::resources::TaskWait;
use serde_json::{Value, json};

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn post(base: &str, path: &str, body: Value) -> Value {
    let resp = http()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "POST {path}: {status} {body}");
    body
}

async fn put(base: &str, path: &str, body: Value) -> Value {
    let resp = http()
        .put(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "PUT {path}: {status} {body}");
    body
}

async fn wait(client: &Client, task_id: &str) {
    client
        .tasks()
        .wait_completed(
            task_id,
            TaskWait::default().interval(Duration::from_millis(20), Duration::from_millis(200)),
        )
        .await
        .unwrap();
}

/// What the server answers for every document it keeps: `(path, status,
/// body)`, the body as JSON, or as text for file reads and event streams.
async fn snapshot(base: &str, paths: &[String]) -> Vec<(String, u16, Value)> {
    let mut out = Vec::new();
    for path in paths {
        let resp = http().get(format!("{base}{path}")).send().await.unwrap();
        let status = resp.status().as_u16();
        let json = resp
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
        let bytes = resp.bytes().await.unwrap();
        let body = if json {
            serde_json::from_slice(&bytes).unwrap()
        } else {
            Value::String(String::from_utf8_lossy(&bytes).into_owned())
        };
        out.push((path.clone(), status, body));
    }
    out
}

/// The listing paths of a file tree (`{root}/list`, `{root}/list/{dir}`)
/// and the read paths of its files, from `dir` down.
async fn walk(base: &str, root: &str, dir: &str, paths: &mut Vec<String>) {
    let list = if dir.is_empty() {
        format!("{root}/list")
    } else {
        format!("{root}/list/{dir}")
    };
    let listing: Value = http()
        .get(format!("{base}{list}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    paths.push(list);
    for entry in listing["entries"].as_array().unwrap() {
        let name = entry["name"].as_str().unwrap();
        let path = if dir.is_empty() {
            name.to_owned()
        } else {
            format!("{dir}/{name}")
        };
        if entry["kind"] == "dir" {
            Box::pin(walk(base, root, &path, paths)).await;
        } else {
            paths.push(format!("{root}/read/{path}"));
        }
    }
}

/// The one difference allowed: the closing `query` frame of an event replay
/// is the turn's document when the log is read, so feedback given after the
/// turn ended is in it once the turn is read back from the database, and not
/// while the log is still in memory. Its `feedback` is left out.
fn without_closing_feedback(path: &str, body: &Value) -> Value {
    let Some(text) = body.as_str().filter(|_| path.ends_with("/events")) else {
        return body.clone();
    };
    let frames: Vec<String> = text
        .split("\n\n")
        .map(|frame| {
            if !frame.starts_with("event: query\n") {
                return frame.to_owned();
            }
            frame
                .lines()
                .map(|line| match line.strip_prefix("data: ") {
                    Some(data) => {
                        let mut doc: Value = serde_json::from_str(data).unwrap();
                        // Rebuilt without the field, so the other keys keep
                        // their order with or without serde_json's
                        // preserve_order (a plain remove would swap the last
                        // key into its place).
                        let object = doc.as_object_mut().unwrap();
                        *object = std::mem::take(object)
                            .into_iter()
                            .filter(|(key, _)| key != "feedback")
                            .collect();
                        format!("data: {doc}")
                    }
                    None => line.to_owned(),
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    Value::String(frames.join("\n\n"))
}

fn assert_same(before: &[(String, u16, Value)], after: &[(String, u16, Value)], when: &str) {
    for ((path, s1, b1), (_, s2, b2)) in before.iter().zip(after) {
        assert_eq!(
            s1, s2,
            "{when}: GET {path} answered {s2}, before {s1}: {b2}"
        );
        let (b1, b2) = (
            &without_closing_feedback(path, b1),
            &without_closing_feedback(path, b2),
        );
        assert!(
            b1 == b2,
            "{when}: GET {path} changed: {}\nbefore: {b1}\nafter:  {b2}",
            crate::support::fidelity::first_difference(b1, b2, "$")
        );
    }
}

/// Stops the process with SIGTERM and waits for it to exit.
fn stop_cleanly(mut server: LocalBinary) {
    let pid = server.child.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success());
    let exit = server.child.wait().unwrap();
    assert!(exit.success(), "nexus-local exited with {exit} on SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kept_document_reads_back_the_same_after_a_restart_and_a_sigkill() {
    let corpus = corpus();
    let roots = TempDir::new("fidelity-roots");
    roots.write("drive/manual/intro.md", "# Intro\n\nThe drive manual.\n");
    let data = TempDir::new("fidelity-data");
    let dir = data.path().to_str().unwrap().to_owned();
    let root = roots.path().to_str().unwrap().to_owned();
    let args = ["--data", &dir, "--connector-root", &root];
    let server = LocalBinary::start(&args, &[]);
    let base = server.url.clone();
    let client = Client::builder().base_url(&base).build().unwrap();

    // A context with a manifest and a guide; its sources imported from a
    // directory (an import task) and curated (a curate task, a ledger).
    post(
        &base,
        "/contexts",
        json!({"slug": "kb", "name": "KB", "description": "d"}),
    )
    .await;
    put(&base, "/contexts/kb", json!({"guide": "Answer briefly."})).await;
    client
        .sources("kb")
        .import_dir(corpus.path(), |_| {})
        .await
        .unwrap();
    let imported = client.tasks().list().context("kb").await.unwrap();
    for t in &imported {
        wait(&client, &t.id).await;
    }
    let curate = post(&base, "/contexts/kb/curate", json!({"force": true})).await;
    let curate_id = curate["task_id"].as_str().unwrap().to_owned();
    wait(&client, &curate_id).await;

    // A connector, enabled on the context and imported from.
    let connector = post(
        &base,
        "/connectors/keys/local",
        json!({"api_key": roots.path().join("drive").to_str().unwrap(), "account_label": "drive"}),
    )
    .await;
    let connector_id = connector["id"].as_str().unwrap().to_owned();
    put(
        &base,
        &format!("/contexts/kb/connectors/{connector_id}"),
        json!({"enabled": true}),
    )
    .await;
    let import = post(
        &base,
        "/contexts/kb/import",
        json!({"connector_id": connector_id, "folder": "manual", "path": "drive"}),
    )
    .await;
    let import_id = import["task_id"].as_str().unwrap().to_owned();
    wait(&client, &import_id).await;

    // Two turns of one session, one with feedback; a background turn.
    let first = post(
        &base,
        "/query",
        json!({"ask": "How long does green tea steep?", "scope": ["kb"]}),
    )
    .await;
    let session = first["session_id"].as_str().unwrap().to_owned();
    let second = post(
        &base,
        "/query",
        json!({"ask": "And black tea?", "scope": ["kb"], "session_id": session}),
    )
    .await;
    post(
        &base,
        &format!("/queries/{}/feedback", first["id"].as_str().unwrap()),
        json!({"rating": "up", "comment": "good"}),
    )
    .await;
    let background = post(
        &base,
        "/query",
        json!({"ask": "What does the lighthouse keeper count?", "scope": ["kb"], "background": true}),
    )
    .await;
    let background_id = background["id"].as_str().unwrap().to_owned();
    until(
        Duration::from_secs(10),
        "the background turn ending",
        async || {
            let q: Value = http()
                .get(format!("{base}/queries/{background_id}"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            q["status"] != "in_progress" && q["status"] != "queued"
        },
    )
    .await;

    let tasks = client.tasks().list().await.unwrap();
    assert!(
        tasks.iter().any(|t| t.workflow.as_str() == "import")
            && tasks.iter().any(|t| t.workflow.as_str() == "curate"),
        "an import and a curate task: {tasks:?}"
    );
    let task_files: Value = http()
        .get(format!("{base}/tasks/{curate_id}/files/list"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut paths: Vec<String> = vec![
        "/contexts".into(),
        "/contexts/kb".into(),
        "/contexts/kb/manifest".into(),
        "/contexts/kb/curate".into(),
        "/contexts/kb/source/manifest".into(),
        "/contexts/kb/connectors".into(),
        "/connectors".into(),
        format!("/connectors/{connector_id}"),
        "/tasks".into(),
        "/sessions".into(),
        format!("/sessions/{session}"),
    ];
    walk(&base, "/contexts/kb/source", "", &mut paths).await;
    walk(&base, "/contexts/kb/knowledge", "", &mut paths).await;
    for t in &tasks {
        paths.push(format!("/tasks/{}", t.id));
        paths.push(format!("/tasks/{}/files/list", t.id));
    }
    for entry in task_files["entries"].as_array().unwrap() {
        let name = entry["name"].as_str().unwrap();
        paths.push(format!("/tasks/{curate_id}/files/read/{name}"));
    }
    for q in [&first, &second, &background] {
        let id = q["id"].as_str().unwrap();
        paths.push(format!("/queries/{id}"));
        paths.push(format!("/queries/{id}/trace"));
        paths.push(format!("/queries/{id}/events"));
    }
    let before = snapshot(&base, &paths).await;
    for (path, status, body) in &before {
        assert_eq!(*status, 200, "GET {path}: {body}");
    }
    let curate_doc = &before
        .iter()
        .find(|(p, _, _)| *p == format!("/tasks/{curate_id}"))
        .unwrap()
        .2;
    assert_eq!(curate_doc["input"]["force"], true, "{curate_doc}");
    assert!(
        curate_doc["output"]["delta"]["chunks_created"]
            .as_i64()
            .unwrap()
            > 0
    );

    // A clean restart.
    stop_cleanly(server);
    let server = LocalBinary::start(&args, &[]);
    let after = snapshot(&server.url, &paths).await;
    assert_same(&before, &after, "after a clean restart");

    // A SIGKILL.
    server.kill();
    let server = LocalBinary::start(&args, &[]);
    let after = snapshot(&server.url, &paths).await;
    assert_same(&before, &after, "after a SIGKILL");
    server.kill();
}
