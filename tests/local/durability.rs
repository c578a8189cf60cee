//! The local Nexus on disk, durable before acknowledged: a SIGKILL right
//! after an answer or in the middle of a burst loses nothing acknowledged,
//! one server per data directory, a `state.json` directory migrated once, a
//! torn state file never prevents start-up, and a crashed server's scratch
//! directory is removed at the next start.

use std::io::{BufRead, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::local::*;
use nexus_knowql::local::{LocalNexus, StartError};
use serde_json::{Value, json};

fn wait_exit(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let mut status = None;
    let exited = crate::support::wait::holds_within(limit, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    match status {
        Some(status) if exited => status,
        _ => {
            let _ = child.kill();
            panic!("the second server did not exit");
        }
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

/// Uploads and asks until `stop` is set.
async fn burst(url: String, seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) {
    let http = reqwest::Client::new();
    let uploader = {
        let (http, url, seen, stop) = (http.clone(), url.clone(), seen.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
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
        let (http, url, seen, stop) = (http.clone(), url.clone(), seen.clone(), stop.clone());
        askers.push(tokio::spawn(async move {
            let mut session: Option<String> = None;
            while !stop.load(Ordering::Relaxed) {
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
                    // Paces load: a refused ask is sent again after a pause.
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
    // The server is killed mid-burst, once a few uploads and a session
    // are acknowledged; the burst then stops.
    let stop = Arc::new(AtomicBool::new(false));
    let burst = rt.spawn(burst(url, seen.clone(), stop.clone()));
    let answered = || {
        let seen = seen.lock().unwrap();
        seen.uploads.len() >= 3 && !seen.sessions.is_empty()
    };
    let what = "a few answers before the kill";
    crate::support::wait::until_blocking(Duration::from_secs(30), what, answered);
    server.kill();
    stop.store(true, Ordering::Relaxed);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_right_after_an_answer_loses_no_turn_session_task_or_cancel() {
    let corpus = corpus();
    let data = TempDir::new("sigkill");
    let dir = data.path().to_str().unwrap().to_owned();
    let seed = format!("docs={}", corpus.path().display());
    let server = LocalBinary::start(&["--data", &dir, "--context", &seed], &[]);
    let base = server.url.clone();

    // A synchronous turn that answered `completed`, killed at once.
    let (status, turn) = post_json(
        &format!("{base}/query"),
        json!({"ask": "How long does green tea steep?", "scope": ["docs"]}),
    )
    .await;
    assert_eq!(status, 200, "{turn}");
    assert_eq!(turn["status"], "completed");
    let sync_id = turn["id"].as_str().unwrap().to_owned();
    let sync_session = turn["session_id"].as_str().unwrap().to_owned();
    server.kill();

    let server = LocalBinary::start(&["--data", &dir], &[]);
    let base = server.url.clone();
    let (status, q) = get_json(&format!("{base}/queries/{sync_id}")).await;
    assert_eq!(status, 200, "the completed turn is gone: {q}");
    assert_eq!(q["status"], "completed");
    assert!(
        q["output"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("two minutes")
    );
    let (status, s) = get_json(&format!("{base}/sessions/{sync_session}")).await;
    assert_eq!(status, 200, "the new session is gone: {s}");
    assert_eq!(s["queries"][0]["id"], sync_id.as_str());
    // Its events replay from the database.
    let frames = read_frames(get_events(&base, &sync_id, None).await)
        .await
        .unwrap();
    assert!(frames.iter().any(|f| f.event == "response.completed"));
    assert!(text_of(&frames).contains("two minutes"));

    // A streamed turn whose last frame arrived, killed at once.
    let resp = post_stream(
        &base,
        json!({"ask": "What does the lighthouse keeper count?", "scope": ["docs"], "stream": true}),
    )
    .await;
    let frames = read_frames(resp).await.unwrap();
    let last = frames.last().unwrap();
    assert_eq!(last.event, "query");
    let stream_id = last.data["id"].as_str().unwrap().to_owned();
    server.kill();

    let server = LocalBinary::start(&["--data", &dir], &[]);
    let base = server.url.clone();
    let (status, q) = get_json(&format!("{base}/queries/{stream_id}")).await;
    assert_eq!(status, 200, "the streamed turn is gone: {q}");
    assert_eq!(q["status"], "completed");

    // A curate task, and its cancellation, acknowledged then killed.
    let (status, trigger) = post_json(&format!("{base}/contexts/docs/curate"), json!({})).await;
    assert_eq!(status, 200, "{trigger}");
    let task_id = trigger["task_id"].as_str().unwrap().to_owned();
    server.kill();
    let server = LocalBinary::start(&["--data", &dir], &[]);
    let base = server.url.clone();
    let (status, task) = get_json(&format!("{base}/tasks/{task_id}")).await;
    assert_eq!(status, 200, "the acknowledged curate task is gone: {task}");
    server.kill();
}

fn legacy_state(prev_only_context: bool) -> Value {
    let ctx = |id: &str, slug: &str| {
        json!({"id": id, "slug": slug, "name": slug, "kind": "search", "description": null,
               "guide": null, "manifest": null, "created_at": "2026-01-01T00:00:00Z",
               "updated_at": "2026-01-01T00:00:00Z", "last_curated_at": null,
               "last_source_import_at": null, "curate_task_id": null, "import_task_id": null,
               "sample_queries": [], "index_generation": 0, "sources": {}})
    };
    let query = json!({
        "id": "qry_old", "object": "query", "session_id": "ses_old", "created": 0,
        "status": "completed", "input": [{"role": "user", "content": "old question"}],
        "output": [], "citations": [], "steps": [],
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}, "runtime_ms": 3
    });
    let session = json!({
        "session": {"id": "ses_old", "created_at": "2026-01-01T00:00:00Z", "created_by": "local",
                    "models": ["local-extractive"], "project_id": "local", "scope": ["first"],
                    "tools": [], "updated_at": "2026-01-01T00:00:00Z", "last_query_id": "qry_old"},
        "context_ids": ["ctx_first"], "query_ids": ["qry_old"]
    });
    let mut contexts = vec![ctx("ctx_first", "first")];
    if prev_only_context {
        contexts.push(ctx("ctx_second", "second"));
    }
    json!({"contexts": contexts, "tasks": [], "sessions": [session],
           "queries": [{"query": query, "trace": null}]})
}

#[tokio::test]
async fn a_state_json_directory_is_migrated_once_with_one_log_line() {
    let data = TempDir::new("migrate");
    std::fs::write(
        data.path().join("state.json"),
        legacy_state(false).to_string(),
    )
    .unwrap();
    let dir = data.path().to_str().unwrap().to_owned();
    let logged = |dir: &str| -> (LocalBinary, std::thread::JoinHandle<Vec<String>>) {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nexus-local"))
            .args(["--bind", "127.0.0.1:0", "--data", dir])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut url = String::new();
        stdout.read_line(&mut url).unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let lines = std::thread::spawn(move || {
            let mut all = String::new();
            let _ = stderr.read_to_string(&mut all);
            all.lines()
                .filter(|l| l.contains("migrated"))
                .map(str::to_owned)
                .collect()
        });
        (
            LocalBinary {
                child,
                url: url.trim().to_owned(),
            },
            lines,
        )
    };
    let (server, lines) = logged(&dir);
    let base = server.url.clone();
    let (status, ctx) = get_json(&format!("{base}/contexts/first")).await;
    assert_eq!(status, 200, "{ctx}");
    let (status, q) = get_json(&format!("{base}/queries/qry_old")).await;
    assert_eq!(status, 200, "{q}");
    assert_eq!(q["runtime_ms"], 3);
    let (status, s) = get_json(&format!("{base}/sessions/ses_old")).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["queries"][0]["id"], "qry_old");
    server.kill();
    let lines = lines.join().unwrap();
    assert_eq!(lines.len(), 1, "one log line: {lines:?}");
    assert!(!data.path().join("state.json").exists());
    assert!(data.path().join("state.json.migrated").exists());
    assert!(data.path().join("state.db").exists());

    // Once: the next start migrates nothing and still has everything.
    let (server, lines) = logged(&dir);
    let (status, _) = get_json(&format!("{}/queries/qry_old", server.url)).await;
    assert_eq!(status, 200);
    server.kill();
    assert_eq!(lines.join().unwrap(), Vec::<String>::new());
}

#[tokio::test]
async fn a_torn_legacy_state_file_is_migrated_from_its_previous_version() {
    let data = TempDir::new("torn-legacy");
    let full = legacy_state(true).to_string();
    std::fs::write(data.path().join("state.json.prev"), &full).unwrap();
    // The current file torn in the middle, as a crash mid-write would.
    std::fs::write(data.path().join("state.json"), &full[..full.len() / 2]).unwrap();
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .expect("a torn state.json never prevents start-up");
    let client = server.client().unwrap();
    let slugs: Vec<_> = client
        .contexts()
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.slug)
        .collect();
    assert!(slugs.contains(&"second".to_owned()), "{slugs:?}");
    // The torn file is kept aside for inspection.
    let kept = std::fs::read_dir(data.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("state.json.torn")
        });
    assert!(kept);
    server.shutdown().await;
}

#[cfg(unix)]
#[test]
fn the_scratch_directory_is_private_and_a_crashed_one_is_removed_at_the_next_start() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = TempDir::new("scratch");
    let tmpdir = tmp.path().to_str().unwrap().to_owned();
    let scratch_dirs = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&tmpdir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("nexus-local-"))
            .map(|e| e.path())
            .collect()
    };
    let first = LocalBinary::start(&[], &[("TMPDIR", &tmpdir)]);
    let dirs = scratch_dirs();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let mode = std::fs::metadata(&dirs[0]).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "scratch mode {mode:o}");
    first.kill();
    assert!(dirs[0].exists(), "a SIGKILL leaves it behind");
    let second = LocalBinary::start(&[], &[("TMPDIR", &tmpdir)]);
    assert!(!dirs[0].exists(), "the next start removes it");
    assert_eq!(scratch_dirs().len(), 1);
    second.kill();
}

/// Catches an upload acknowledged before its task's end is saved (an
/// injected frame delay used to answer first and end the task after the
/// pause): SIGKILL right after the answer, and the restart must find the
/// file and the import's task `completed`, never `failed`.
#[test]
fn an_upload_answered_under_a_frame_delay_has_its_task_end_saved() {
    let data = TempDir::new("upload-delay");
    let dir = data.path().to_str().unwrap().to_owned();
    let delay = [("NEXUS_LOCAL_FAULT_FRAME_DELAY_MS", "5000")];
    let server = LocalBinary::start(&["--data", &dir], &delay);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = server.url.clone();
    let task = rt.block_on(async {
        let (status, body) = post_json(
            &format!("{url}/contexts"),
            serde_json::json!({"slug": "notes", "name": "Notes"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let form = reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(b"# Kept\n\nacknowledged\n".to_vec())
                .file_name("kept.md"),
        );
        let resp = http()
            .post(format!("{url}/contexts/notes/import/upload"))
            .multipart(form)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body: serde_json::Value = resp.json().await.unwrap();
        body["task_id"].as_str().unwrap().to_owned()
    });
    server.kill();
    let server = LocalBinary::start(&["--data", &dir], &[]);
    let url = server.url.clone();
    rt.block_on(async {
        let (status, body) = get_json(&format!("{url}/tasks/{task}")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["state"], "completed",
            "the acknowledged import's task: {body}"
        );
        let (_, sources) = get_json(&format!("{url}/contexts/notes/source/list")).await;
        assert_eq!(sources["entries"][0]["name"], "uploads", "{sources}");
        assert_eq!(sources["entries"][0]["size"], 21, "{sources}");
    });
    server.kill();
}
