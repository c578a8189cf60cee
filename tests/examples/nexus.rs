//! The `nexus` example, driven as a person and a script would: through a
//! pseudo-terminal and through pipes, against a local Nexus started by the
//! test (and a scripted server where the local one cannot fail on demand).

use std::path::Path;

use crate::support::examples;
#[cfg(unix)]
use examples::Pty;
use examples::{corpus, example, nexus_ok, non_empty_lines, run, runtime};
use nexus_knowql::local::LocalNexus;
use serde_json::Value;

/// The corpus the examples ship.
fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A directory of sources with one fact no other source states.
fn sources_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "guide/keys.md",
        "# Key rotation\n\nThe zanzibar gateway rotates its signing keys every ninety days.\n",
    );
    write(
        dir.path(),
        "guide/deep/travel.md",
        "# Travel\n\nTravel requests are approved by the team lead before booking.\n",
    );
    write(
        dir.path(),
        "notes.md",
        "# Notes\n\nThe office plants are watered on Fridays.\n",
    );
    // Hidden files stay home.
    write(dir.path(), ".secret", "not for upload");
    dir
}

fn line_with<'a>(text: &'a str, needle: &str) -> Option<&'a str> {
    text.lines().find(|l| l.contains(needle))
}

#[cfg(unix)]
#[test]
fn upload_of_a_directory_then_curate_wait_then_ask_answers_from_it() {
    let rt = runtime();
    let server = rt.block_on(LocalNexus::builder().start()).unwrap();
    let url = server.base_url().to_owned();
    let dir = sources_dir();

    nexus_ok(&url, &["create", "kb", "--description", "Team knowledge"]);
    let listed = nexus_ok(&url, &["contexts"]);
    let row = line_with(&listed, "\tkb\t").expect("kb is listed");
    assert!(!row.contains('✓'), "not queryable before curation: {row}");

    let mut upload = Pty::spawn(example(
        "nexus",
        &[
            "--base-url",
            &url,
            "upload",
            "kb",
            dir.path().to_str().unwrap(),
        ],
    ));
    upload.expect("uploaded 3 files");
    assert_eq!(upload.exit_code(), Some(0));

    let mut curate = Pty::spawn(example(
        "nexus",
        &["--base-url", &url, "curate", "kb", "--wait"],
    ));
    curate.expect("curated `kb`");
    assert_eq!(curate.exit_code(), Some(0));

    let listed = nexus_ok(&url, &["contexts"]);
    let row = line_with(&listed, "\tkb\t").expect("kb is listed");
    assert!(row.contains('✓'), "queryable after curation: {row}");

    // Directories keep their layout on the server.
    let client = server.client().unwrap();
    let deep = rt
        .block_on(
            client
                .sources("kb")
                .list()
                .path("uploads/guide/deep")
                .into_future(),
        )
        .unwrap();
    let deep = serde_json::to_string(&deep).unwrap();
    assert!(deep.contains("travel.md"), "{deep}");

    let out = run(example(
        "nexus",
        &[
            "--base-url",
            &url,
            "ask",
            "kb",
            "How often does the zanzibar gateway rotate its signing keys?",
        ],
    ));
    assert!(out.status.success(), "{out:?}");
    let answer = String::from_utf8(out.stdout).unwrap();
    assert!(answer.contains("ninety days"), "answer: {answer}");
    // stdout holds just the answer; the footnotes went to stderr.
    assert!(answer.ends_with('\n'), "{answer:?}");
    assert!(!answer.lines().any(|l| l.starts_with("[1] ")), "{answer:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[1] ") && stderr.contains("keys.md"),
        "{stderr}"
    );
}

#[test]
fn json_outputs_parse_as_the_api_documents() {
    let rt = runtime();
    let server = rt
        .block_on(LocalNexus::builder().context("docs", corpus()).start())
        .unwrap();
    let url = server.base_url().to_owned();
    let json = |args: &[&str]| -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = nexus_ok(&url, &all);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    };

    let contexts = json(&["contexts"]);
    let docs = contexts
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["slug"] == "docs")
        .expect("docs is listed");
    assert!(docs["last_curated_at"].is_string());

    let models = json(&["models"]);
    assert!(!models["models"].as_array().unwrap().is_empty());

    let query = json(&["ask", "docs", "How does a stream resume after a cut?"]);
    assert_eq!(query["status"], "completed");
    assert!(!query["output"].as_array().unwrap().is_empty());
    let id = query["id"].as_str().unwrap();
    let session_id = query["session_id"].as_str().unwrap();

    let stored = json(&["query", id]);
    assert_eq!(stored["id"], id);
    assert_eq!(stored["output"], query["output"]);

    let background = json(&["ask", "docs", "What is a session?", "--background"]);
    assert_eq!(background["status"], "completed");
    let sync = json(&["ask", "docs", "What is a context?", "--no-stream"]);
    assert_eq!(sync["status"], "completed");

    let sessions = json(&["sessions"]);
    assert!(
        sessions
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == session_id),
        "{sessions}"
    );

    let created = json(&["create", "scratch"]);
    assert_eq!(created["slug"], "scratch");
    let dir = sources_dir();
    let uploaded = json(&["upload", "scratch", dir.path().to_str().unwrap()]);
    assert_eq!(uploaded["files"], 3);
    assert_eq!(uploaded["tasks"].as_array().unwrap().len(), 3);
    let curated = json(&["curate", "scratch", "--wait"]);
    assert_eq!(curated["state"], "completed");

    let tasks = json(&["tasks", "--context", "scratch"]);
    let workflows: Vec<&str> = tasks
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["workflow"].as_str())
        .collect();
    assert!(workflows.contains(&"curate"), "{tasks}");
}

#[test]
fn unknown_context_is_one_line_on_stderr_and_exit_code_1() {
    let rt = runtime();
    let server = rt.block_on(LocalNexus::builder().start()).unwrap();
    let url = server.base_url().to_owned();
    let dir = sources_dir();
    let cases: [&[&str]; 4] = [
        &["ask", "nope", "anything?"],
        &["upload", "nope", dir.path().to_str().unwrap()],
        &["curate", "nope", "--wait"],
        &["--json", "ask", "nope", "anything?"],
    ];
    for args in cases {
        let mut all = vec!["--base-url", url.as_str()];
        all.extend_from_slice(args);
        let out = run(example("nexus", &all));
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
        let lines = non_empty_lines(&out.stderr);
        assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
        let missing = "error: no context named \"nope\" (404, request id req_";
        assert!(lines[0].starts_with(missing), "{args:?}: {lines:?}");
    }

    let out = run(example(
        "nexus",
        &["--base-url", &url, "query", "q_missing"],
    ));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        non_empty_lines(&out.stderr),
        ["error: unknown query `q_missing`"]
    );

    // A server that is not there: still one line and exit code 1.
    let out = run(example(
        "nexus",
        &["--base-url", "http://127.0.0.1:9/api", "contexts"],
    ));
    assert_eq!(out.status.code(), Some(1));
    let lines = non_empty_lines(&out.stderr);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("cannot connect"), "{lines:?}");
}

#[test]
fn a_failed_curation_exits_non_zero_with_the_reason() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let rt = runtime();
    let mock = rt.block_on(MockServer::start());
    rt.block_on(async {
        Mock::given(method("POST"))
            .and(path("/api/contexts/kb/curate"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(serde_json::json!({"task_id": "t1", "state": "curating"})),
            )
            .expect(1)
            .mount(&mock)
            .await;
        Mock::given(method("GET"))
            .and(path("/api/tasks/t1"))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "id": "t1", "project_id": "p", "created_by": "u", "workflow": "curate",
                "state": "failed", "error": "the index is corrupted",
                "input": {}, "steps": [], "tokens_prompt": 0, "tokens_completion": 0,
                "runtime_seconds": 2, "created_at": "2026-07-01T10:00:00Z",
                "progress": {"phase": 2, "phases": 3, "pct": 40.0, "label": "indexing"}
            })))
            .mount(&mock)
            .await;
    });
    let url = format!("{}/api", mock.uri());
    let out = run(example(
        "nexus",
        &["--base-url", &url, "curate", "kb", "--wait"],
    ));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        non_empty_lines(&out.stderr),
        ["error: curation of `kb` ended failed: the index is corrupted"]
    );
}

#[cfg(unix)]
#[test]
fn fork_manifest_stats_and_connectors_show_the_local_operations() {
    let rt = runtime();
    let shared = sources_dir();
    let server = rt
        .block_on(
            LocalNexus::builder()
                .context("docs", corpus())
                .connector_root(shared.path())
                .start(),
        )
        .unwrap();
    let url = server.base_url().to_owned();
    let nexus = |args: &[&str]| {
        let mut all = vec!["--base-url", url.as_str()];
        all.extend_from_slice(args);
        Pty::spawn(example("nexus", &all))
    };

    let mut fork = nexus(&["fork", "docs", "docs-copy"]);
    fork.expect("forked `docs` into `docs-copy`");
    assert_eq!(fork.exit_code(), Some(0));
    let listed = nexus_ok(&url, &["contexts"]);
    assert!(line_with(&listed, "\tdocs-copy\t").is_some(), "{listed}");

    // Tables are read through a pipe: tab-separated lines.
    let shown = nexus_ok(&url, &["stats", "docs-copy"]);
    assert!(line_with(&shown, "sources").is_some(), "{shown}");
    assert!(line_with(&shown, "knowledge").is_some(), "{shown}");
    assert!(shown.contains("tasks: 0 (0 active"), "{shown}");
    let mut project = nexus(&["stats"]);
    project.expect("tasks: 1 (0 active, 1 completed");
    assert_eq!(project.exit_code(), Some(0));

    let manifest: Value = serde_json::from_str(&nexus_ok(&url, &["manifest", "docs"])).unwrap();
    assert_eq!(
        manifest["curate"]["chunks"]["chunking"]["strategy"],
        "markdown_heading"
    );

    let mut none = nexus(&["connectors"]);
    none.expect("no connectors");
    assert_eq!(none.exit_code(), Some(0));
    let mut connect = nexus(&[
        "connect",
        shared.path().join("guide").to_str().unwrap(),
        "--label",
        "Shared guide",
        "--enable",
        "docs",
    ]);
    connect.expect("connected");
    assert_eq!(connect.exit_code(), Some(0));
    let on = nexus_ok(&url, &["connectors", "--context", "docs"]);
    let row = line_with(&on, "Shared guide").expect("the connector is listed");
    assert!(
        row.contains('✓') && row.contains("local"),
        "enabled on docs: {row}"
    );

    let stats: Value =
        serde_json::from_str(&nexus_ok(&url, &["--json", "stats", "docs-copy"])).unwrap();
    assert_eq!(
        stats["sources"]["file_count"],
        stats["sources"]["used_files"]
    );
    assert!(stats["sources"]["file_count"].as_i64().unwrap() > 0);

    let out = run(example(
        "nexus",
        &["--base-url", &url, "fork", "nope", "other"],
    ));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: no context named \"nope\" (404, request id req_"),
        "{err}"
    );
}

/// `nexus contexts | head -c 0`: the reader is gone before the table is
/// written; the program ends quietly (exit 0, no panic) instead of
/// panicking in `println!`.
#[test]
fn a_closed_stdout_ends_nexus_quietly() {
    let rt = runtime();
    let server = rt
        .block_on(LocalNexus::builder().context("docs", corpus()).start())
        .unwrap();
    let url = server.base_url().to_owned();
    let mut cmd = example("nexus", &["--base-url", &url, "contexts"]);
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    rt.block_on(server.shutdown());
}
