//! A context that does not exist is named the same way by every CLI that
//! takes one (`ask`, `chat`, `nexus`, `worker`), wherever it is named: one
//! line on stderr, exit code 1.

use crate::support::examples::{corpus, example, non_empty_lines, run, runtime};
use nexus_knowql::local::LocalNexus;

/// Every command that names context `nope`, as arguments after the base URL.
fn commands(store: &str, file: &str) -> Vec<(&'static str, Vec<String>)> {
    let owned = |args: &[&str]| args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    vec![
        ("ask", owned(&["--context", "nope", "Anything?"])),
        ("chat", owned(&["--context", "nope"])),
        ("nexus", owned(&["ask", "nope", "Anything?"])),
        ("nexus", owned(&["tasks", "--context", "nope"])),
        ("nexus", owned(&["upload", "nope", file])),
        ("nexus", owned(&["curate", "nope"])),
        ("nexus", owned(&["stats", "nope"])),
        ("nexus", owned(&["manifest", "nope"])),
        ("nexus", owned(&["fork", "nope", "nope-copy"])),
        ("nexus", owned(&["connectors", "--context", "nope"])),
        ("worker", owned(&["--context", "nope"])),
        (
            "worker",
            owned(&["--once", "--store", store, "--context", "nope"]),
        ),
    ]
}

/// Runs every command against `base_url`; returns each one's stderr lines
/// after checking it failed with exit code 1.
fn stderr_of_each(base_url: &str) -> Vec<(String, Vec<String>)> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.md");
    std::fs::write(&file, "# A\n").unwrap();
    let store = dir.path().join("store");
    let store = store.to_str().unwrap();
    let file = file.to_str().unwrap();
    let mut all = Vec::new();
    for (name, args) in commands(store, file) {
        let mut full = vec!["--base-url", base_url];
        full.extend(args.iter().map(String::as_str));
        let out = run(example(name, &full));
        let what = format!("{name} {}", args.join(" "));
        assert_eq!(out.status.code(), Some(1), "{what}: {out:?}");
        all.push((what, non_empty_lines(&out.stderr)));
    }
    all
}

/// A server whose every answer is the API's 404 for a missing context.
#[test]
fn a_missing_context_is_worded_the_same_by_every_cli() {
    use wiremock::matchers::any;
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let rt = runtime();
    let mock = rt.block_on(MockServer::start());
    rt.block_on(
        Mock::given(any())
            .respond_with(
                ResponseTemplate::new(404)
                    .insert_header("x-request-id", "req_nope")
                    .set_body_json(serde_json::json!({
                        "code": "not_found",
                        "message": "context \"nope\" not found",
                    })),
            )
            .mount(&mock),
    );
    let url = format!("{}/api", mock.uri());
    let expected = r#"error: no context named "nope" (404 not_found, request id req_nope)"#;
    for (what, stderr) in stderr_of_each(&url) {
        assert_eq!(stderr, [expected], "{what}");
    }
}

/// The local Nexus: the same line from every CLI, its request id aside.
#[test]
fn a_missing_context_on_the_local_nexus_is_worded_the_same_by_every_cli() {
    let rt = runtime();
    let server = rt
        .block_on(LocalNexus::builder().context("docs", corpus()).start())
        .unwrap();
    let prefix = r#"error: no context named "nope" (404, request id req_"#;
    for (what, stderr) in stderr_of_each(server.base_url()) {
        assert_eq!(stderr.len(), 1, "{what}: {stderr:?}");
        assert!(stderr[0].starts_with(prefix), "{what}: {stderr:?}");
    }
}
