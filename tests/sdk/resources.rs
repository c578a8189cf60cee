//! Resource calls that do more than one request: uploads, directory imports
//! and task waits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nexus_knowql::resources::TaskWait;
use nexus_knowql::{Client, Error, RetryPolicy};
use serde_json::json;
use wiremock::matchers::{method, path, path_regex, query_param};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

fn client(server: &MockServer) -> Client {
    Client::builder()
        .base_url(format!("{}/api", server.uri()))
        .retry(RetryPolicy::never())
        .build()
        .unwrap()
}

fn task(id: &str, state: &str, pct: f64) -> serde_json::Value {
    json!({
        "id": id, "project_id": "p", "created_by": "u", "workflow": "import", "state": state,
        "input": {}, "steps": [], "tokens_prompt": 0, "tokens_completion": 0, "runtime_seconds": 1,
        "created_at": "2026-07-01T10:00:00Z",
        "progress": {"phase": 1, "phases": 1, "pct": pct, "label": "importing"}
    })
}

fn trigger(task_id: &str) -> ResponseTemplate {
    ResponseTemplate::new(200)
        .set_body_json(json!({"task_id": task_id, "state": "importing", "importing": true}))
}

/// `running` for the first `n` polls, then `completed`.
struct CompletesAfter {
    polls: AtomicUsize,
    n: usize,
}

impl Respond for CompletesAfter {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let id = req
            .url
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let seen = self.polls.fetch_add(1, Ordering::SeqCst);
        let (state, pct) = if seen < self.n {
            ("running", 50.0)
        } else {
            ("completed", 100.0)
        };
        ResponseTemplate::new(200).set_body_json(task(&id, state, pct))
    }
}

fn sample_dir() -> tempfile_dir::Dir {
    let d = tempfile_dir::Dir::new("import");
    d.write("README.md", "# Readme\n\nHello.\n");
    d.write("guide/intro.md", "# Intro\n\nText.\n");
    d.write(".hidden/secret.md", "not uploaded");
    d
}

#[tokio::test]
async fn upload_file_sends_multipart_with_the_file() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/contexts/docs/import/upload"))
        .and(query_param("path", "uploads/manuals"))
        .respond_with(trigger("t1"))
        .expect(1)
        .mount(&server)
        .await;
    let dir = sample_dir();
    let r = client(&server)
        .sources("docs")
        .upload_file(dir.path().join("README.md"), Some("uploads/manuals"))
        .await
        .unwrap();
    assert_eq!(r.task_id, "t1");
    let req = &server.received_requests().await.unwrap()[0];
    let ct = req.headers["content-type"].to_str().unwrap();
    assert!(ct.starts_with("multipart/form-data; boundary="), "{ct}");
    let body = String::from_utf8_lossy(&req.body);
    assert!(
        body.contains(
            "name=\"file\"; filename=\"README.md\"\r\nContent-Type: application/octet-stream\r\n"
        ),
        "the file part names its media type: {body}"
    );
    assert!(body.contains("# Readme"));
}

#[tokio::test]
async fn upload_of_a_missing_file_is_an_io_error_and_sends_nothing() {
    let server = MockServer::start().await;
    let err = client(&server)
        .sources("docs")
        .upload_file("/no/such/file.md", None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Io {
                operation: "upload_file",
                action: "open",
                path,
                source,
                ..
            } if path == std::path::Path::new("/no/such/file.md")
                && source.kind() == std::io::ErrorKind::NotFound
        ),
        "{err:?}"
    );
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn import_dir_sends_one_archive_and_waits_for_the_import() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/contexts/docs/import/upload"))
        .respond_with(trigger("t-archive"))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path_regex("^/api/tasks/[^/]+$"))
        .respond_with(CompletesAfter {
            polls: AtomicUsize::new(0),
            n: 2,
        })
        .mount(&server)
        .await;
    let dir = sample_dir();
    let mut progress = Vec::new();
    let tasks = client(&server)
        .sources("docs")
        .import_dir(dir.path(), |p| progress.push((p.files_done, p.files_total)))
        .await
        .unwrap();
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].state.as_str(), "completed");
    assert_eq!(progress, [(2, 2)], "hidden files are skipped");
    let upload = &server.received_requests().await.unwrap()[0];
    let body = &upload.body;
    let needle = b"filename=\"";
    let at = body
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    let name: String = body[at + needle.len()..]
        .iter()
        .take_while(|b| **b != b'"')
        .map(|b| *b as char)
        .collect();
    assert!(name.ends_with(".tar.gz"), "{name}");
    // The archive holds the two visible files under their relative paths.
    let start = body.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let gz = &body[start..];
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(gz));
    let mut names: Vec<String> = archive
        .entries()
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["README.md", "guide/intro.md"]);
}

/// 400 for archives; 409 for the first single-file attempt; then accepts.
struct ArchivesRefused {
    calls: Arc<AtomicUsize>,
}

impl Respond for ArchivesRefused {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let body = String::from_utf8_lossy(&req.body);
        if body.contains(".tar.gz\"") {
            return ResponseTemplate::new(400)
                .set_body_json(json!({"message": "archives are not allowed in preview"}));
        }
        if n == 1 {
            return ResponseTemplate::new(409)
                .set_body_json(json!({"message": "an import is in flight"}));
        }
        trigger(&format!("t{n}"))
    }
}

#[tokio::test]
async fn import_dir_falls_back_to_single_files_and_waits_out_conflicts() {
    let server = MockServer::start().await;
    let calls = Arc::new(AtomicUsize::new(0));
    Mock::given(method("POST"))
        .and(path("/api/contexts/docs/import/upload"))
        .respond_with(ArchivesRefused {
            calls: calls.clone(),
        })
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path_regex("^/api/tasks/[^/]+$"))
        .respond_with(CompletesAfter {
            polls: AtomicUsize::new(0),
            n: 0,
        })
        .mount(&server)
        .await;
    let dir = sample_dir();
    let mut progress = Vec::new();
    let tasks = client(&server)
        .sources("docs")
        .import_dir(dir.path(), |p| {
            progress.push((p.files_done, p.current.clone()))
        })
        .await
        .unwrap();
    assert_eq!(tasks.len(), 2);
    assert_eq!(
        progress,
        [
            (1, "README.md".to_owned()),
            (2, "guide/intro.md".to_owned())
        ]
    );
    // archive (400), README (409), README again, intro.
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    let uploads: Vec<_> = server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.method.as_str() == "POST")
        .collect();
    assert_eq!(
        uploads[3].url.query(),
        Some("path=uploads%2Fguide"),
        "sub-directories are kept"
    );
}

#[tokio::test]
async fn task_wait_reports_progress_and_times_out() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/tasks/t1"))
        .respond_with(CompletesAfter {
            polls: AtomicUsize::new(0),
            n: 3,
        })
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/tasks/stuck"))
        .respond_with(ResponseTemplate::new(200).set_body_json(task("stuck", "running", 10.0)))
        .mount(&server)
        .await;
    let c = client(&server);
    let mut seen = Vec::new();
    let t = c
        .tasks()
        .wait(
            "t1",
            TaskWait::default()
                .interval(Duration::from_millis(5), Duration::from_millis(20))
                .on_progress(|t| seen.push(t.state.as_str().to_owned())),
        )
        .await
        .unwrap();
    assert_eq!(t.state.as_str(), "completed");
    assert_eq!(seen, ["running", "running", "running", "completed"]);

    let err = c
        .tasks()
        .wait(
            "stuck",
            TaskWait::default()
                .interval(Duration::from_millis(10), Duration::from_millis(10))
                .timeout(Duration::from_millis(100)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
}

#[tokio::test]
async fn failed_task_is_an_error_for_wait_completed() {
    let server = MockServer::start().await;
    let mut failed = task("t9", "failed", 40.0);
    failed["error"] = json!("parser crashed");
    Mock::given(method("GET"))
        .and(path("/api/tasks/t9"))
        .respond_with(ResponseTemplate::new(200).set_body_json(failed))
        .mount(&server)
        .await;
    let err = client(&server)
        .tasks()
        .wait_completed("t9", TaskWait::default())
        .await
        .unwrap_err();
    match err {
        Error::TaskFailed(failure) => {
            assert_eq!(
                (
                    failure.task_id.as_str(),
                    failure.state.as_str(),
                    failure.message.as_str()
                ),
                ("t9", "failed", "parser crashed")
            );
        }
        other => panic!("{other:?}"),
    }
}

mod tempfile_dir {
    //! A throwaway directory removed on drop.
    use std::path::{Path, PathBuf};

    pub(crate) struct Dir(PathBuf);

    impl Dir {
        pub(crate) fn new(tag: &str) -> Self {
            static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let p =
                std::env::temp_dir().join(format!("nexus-knowql-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
        pub(crate) fn path(&self) -> &Path {
            &self.0
        }
        pub(crate) fn write(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
