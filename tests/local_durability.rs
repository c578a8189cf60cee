//! The local Nexus on disk: one server per data directory, a torn state
//! file never prevents start-up, and a SIGKILL loses nothing acknowledged.
#![cfg(feature = "local")]

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nexus_knowql::local::{LocalNexus, StartError};
use serde_json::{Value, json};
use support::local::*;

fn wait_exit(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the second server did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_second_server_on_the_same_data_directory_exits_with_a_clear_message() {
    let data = TempDir::new("locked");
    let dir = data.path().to_str().unwrap().to_owned();
    let first = LocalBinary::start(&["--data", &dir], &[]);
    let mut second = std::process::Command::new(env!("CARGO_BIN_EXE_nexus-local"))
        .args(["--bind", "127.0.0.1:0", "--data", &dir])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut second, Duration::from_secs(30));
    let out = second.wait_with_output().unwrap();
    assert!(!status.success(), "the second server ran: {status}");
    assert!(out.stdout.is_empty(), "the second server printed a URL");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<_> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected: {stderr}");
    assert!(
        lines[0].contains("in use") && lines[0].contains(&dir),
        "{}",
        lines[0]
    );
    // The first server still serves.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let status = reqwest::get(format!("{}/models", first.url))
            .await
            .unwrap()
            .status();
        assert_eq!(status, 200);
    });
    // Once the first is gone, the directory can be used again.
    first.kill();
    let again = LocalBinary::start(&["--data", &dir], &[]);
    again.kill();
}

#[tokio::test]
async fn in_process_the_lock_is_a_typed_error() {
    let data = TempDir::new("locked-inproc");
    let first = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .unwrap();
    let err = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .unwrap_err();
    assert!(matches!(err, StartError::DataDirLocked { .. }), "{err}");
    first.shutdown().await;
    let again = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .unwrap();
    again.shutdown().await;
}

async fn create_context(client: &nexus_knowql::Client, slug: &str) {
    let req: nexus_knowql::types::CreateContextRequest =
        serde_json::from_value(json!({"slug": slug, "name": slug})).unwrap();
    client.contexts().create(&req).await.unwrap();
}

/// What the burst saw acknowledged.
#[derive(Default)]
struct Seen {
    uploads: Vec<(String, String)>,
    sessions: Vec<String>,
    background: Vec<String>,
}

async fn burst(url: String, seen: Arc<Mutex<Seen>>, stop: Instant) {
    let http = reqwest::Client::new();
    let uploader = {
        let (http, url, seen) = (http.clone(), url.clone(), seen.clone());
        tokio::spawn(async move {
            let mut i = 0u32;
            while Instant::now() < stop {
                let body = format!("# File {i}\n\nThe crash test wrote line {i}.\n");
                let form = reqwest::multipart::Form::new().part(
                    "file",
                    reqwest::multipart::Part::bytes(body.clone().into_bytes())
                        .file_name(format!("f{i}.md")),
                );
                let resp = http
                    .post(format!("{url}/contexts/up/import/upload"))
                    .multipart(form)
                    .send()
                    .await;
                if let Ok(r) = resp
                    && r.status() == 200
                    && r.bytes().await.is_ok()
                {
                    seen.lock()
                        .unwrap()
                        .uploads
                        .push((format!("uploads/f{i}.md"), body));
                    i += 1;
                }
            }
        })
    };
    let mut askers = Vec::new();
    for n in 0..3 {
        let (http, url, seen) = (http.clone(), url.clone(), seen.clone());
        askers.push(tokio::spawn(async move {
            let mut session: Option<String> = None;
            while Instant::now() < stop {
                let mut body = json!({"ask": "green tea lighthouse", "background": n == 0});
                match &session {
                    Some(s) => body["session_id"] = json!(s),
                    None => body["scope"] = json!(["docs"]),
                }
                let Ok(resp) = http.post(format!("{url}/query")).json(&body).send().await else {
                    continue;
                };
                let status = resp.status().as_u16();
                let Ok(q) = resp.json::<Value>().await else {
                    continue;
                };
                if status == 200 || status == 202 {
                    let sid = q["session_id"].as_str().unwrap_or_default().to_owned();
                    let mut seen = seen.lock().unwrap();
                    if session.is_none() {
                        seen.sessions.push(sid.clone());
                        session = Some(sid);
                    }
                    if status == 202 {
                        seen.background
                            .push(q["id"].as_str().unwrap_or_default().to_owned());
                    }
                } else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }));
    }
    let _ = uploader.await;
    for a in askers {
        let _ = a.await;
    }
}

#[test]
fn a_sigkill_mid_burst_loses_nothing_acknowledged_and_leaves_no_session_stuck() {
    let corpus = corpus();
    let data = TempDir::new("crash");
    let dir = data.path().to_str().unwrap().to_owned();
    let seed = format!("docs={}", corpus.path().display());
    let delay = [("NEXUS_LOCAL_FAULT_FRAME_DELAY_MS", "3")];
    let server = LocalBinary::start(&["--data", &dir, "--context", &seed], &delay);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let url = server.url.clone();
    rt.block_on(async {
        let client = nexus_knowql::Client::builder()
            .base_url(&url)
            .build()
            .unwrap();
        create_context(&client, "up").await;
    });
    // The burst runs for 3 s; the server is killed after 1.5 s, mid-burst.
    let stop = Instant::now() + Duration::from_secs(3);
    let burst = rt.spawn(burst(url, seen.clone(), stop));
    std::thread::sleep(Duration::from_millis(1500));
    server.kill();
    rt.block_on(async {
        let _ = burst.await;
    });
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.uploads.len() >= 3,
        "too few uploads acknowledged before the kill: {}",
        seen.uploads.len()
    );
    assert!(!seen.sessions.is_empty());
    eprintln!(
        "acknowledged before the kill: {} uploads, {} sessions, {} background turns",
        seen.uploads.len(),
        seen.sessions.len(),
        seen.background.len()
    );

    let server = LocalBinary::start(&["--data", &dir], &[]);
    rt.block_on(async {
        let client = nexus_knowql::Client::builder()
            .base_url(&server.url)
            .build()
            .unwrap();
        for (path, body) in &seen.uploads {
            let read = client
                .sources("up")
                .read(path)
                .await
                .unwrap_or_else(|e| panic!("acknowledged upload {path} is missing: {e}"));
            assert_eq!(read.as_ref(), body.as_bytes(), "{path}");
        }
        for id in &seen.background {
            let q = client
                .api()
                .get_query(id)
                .await
                .unwrap_or_else(|e| panic!("acknowledged background turn {id} is missing: {e}"))
                .into_inner();
            assert!(q.is_terminal(), "{id} is {}", q.status);
            if q.status == "failed" {
                assert!(
                    q.error.as_deref().unwrap_or("").contains("stopped"),
                    "{:?}",
                    q.error
                );
            }
        }
        let http = reqwest::Client::new();
        for sid in &seen.sessions {
            let s = client.api().get_session(sid).await.unwrap().into_inner();
            assert!(
                s.queries.iter().all(|q| q.status != "in_progress"),
                "a turn of {sid} is still in progress after the restart"
            );
            let resp = http
                .post(format!("{}/query", server.url))
                .json(&json!({"ask": "black tea", "session_id": sid}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "session {sid} is stuck");
        }
        // Nothing of the killed import stays as running work.
        let tasks = client.tasks().list().await.unwrap();
        assert!(
            tasks.iter().all(|t| t.state.as_str() != "running"),
            "a task is still running after the restart"
        );
    });
    server.kill();
}
