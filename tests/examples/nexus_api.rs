//! `nexus api OPERATION_ID`: every operation of the spec by its id, bad
//! input as one line and exit code 1, event streams as JSON lines that
//! match the spec's event schema.

use std::io::Write as _;
use std::process::Stdio;

use crate::support::examples::{corpus, example, non_empty_lines, run, runtime};
use crate::support::openapi;
use nexus_knowql::local::LocalNexus;
use serde_json::Value;

#[test]
fn list_names_every_operation_of_the_spec() {
    let out = run(example("nexus", &["api", "--list", "--json"]));
    assert!(out.status.success(), "{out:?}");
    let listed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut listed: Vec<(String, String, String)> = listed
        .iter()
        .map(|op| {
            (
                op["operation_id"].as_str().unwrap().to_owned(),
                op["method"].as_str().unwrap().to_owned(),
                op["path"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut expected = openapi::operations(&openapi::spec());
    listed.sort();
    expected.sort();
    assert_eq!(listed, expected);
    assert_eq!(listed.len(), 58);

    let plain = run(example("nexus", &["api", "--list"]));
    assert_eq!(non_empty_lines(&plain.stdout).len(), 58);
}

/// Runs `nexus ARGS` with `input` on stdin; returns (exit code, stdout, stderr lines).
fn nexus_with(args: &[&str], input: &str) -> (Option<i32>, String, Vec<String>) {
    let mut cmd = example("nexus", args);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        non_empty_lines(&out.stderr),
    )
}

#[test]
fn bad_input_is_one_line_and_exit_code_1() {
    let rt = runtime();
    let server = rt.block_on(LocalNexus::builder().start()).unwrap();
    let url = server.base_url().to_owned();
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &["api", "no_such_op"],
            "",
            "error: unknown operation `no_such_op`",
        ),
        (
            &["api", "get_context"],
            "",
            "error: get_context needs --param slug=VALUE",
        ),
        (
            &["api", "get_context", "-p", "slug=a", "-p", "colour=red"],
            "",
            "error: get_context takes no parameter `colour`",
        ),
        (
            &["api", "get_context", "-p", "slug"],
            "",
            "error: --param `slug`: expected NAME=VALUE",
        ),
        (
            &[
                "api",
                "list_source_files",
                "-p",
                "slug=a",
                "-p",
                "limit=ten",
            ],
            "",
            "error: --param limit: `ten` is not an integer",
        ),
        (
            &["api", "create_context", "--body", "-"],
            "{not json",
            "error: the body in stdin is not JSON",
        ),
        (
            &["api", "create_context", "--body", "-"],
            r#"{"slug": "x"}"#,
            "error: invalid body for create_context: missing field `name`",
        ),
        (
            &["api", "get_context", "-p", "slug=a", "--body", "-"],
            "{}",
            "error: get_context takes no JSON body",
        ),
        (
            &["api", "get_context", "-p", "slug=nope"],
            "",
            "error: get_context: ",
        ),
    ];
    for (args, input, expected) in cases {
        let mut all = vec!["--base-url", url.as_str()];
        all.extend_from_slice(args);
        let (code, stdout, stderr) = nexus_with(&all, input);
        assert_eq!(code, Some(1), "{args:?}: {stderr:?}");
        assert_eq!(stdout, "", "{args:?}");
        assert_eq!(stderr.len(), 1, "{args:?}: {stderr:?}");
        assert!(stderr[0].starts_with(expected), "{args:?}: {stderr:?}");
    }
}

/// Checks JSON lines of events against the spec's event-stream schema (a
/// `QueryEvent` whose `type` is the event's name, or the final `query`
/// event's `Query`); returns the names of the `QueryEvent`s and the text of
/// their deltas.
fn checked_events(spec: &Value, stdout: &str) -> (Vec<String>, String) {
    let mut names = Vec::new();
    let mut text = String::new();
    for line in stdout.lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        let name = event["event"].as_str().unwrap().to_owned();
        let data = &event["data"];
        let schema = if name == "query" {
            "Query"
        } else {
            "QueryEvent"
        };
        let mut errors = Vec::new();
        openapi::check(
            spec,
            &serde_json::json!({"$ref": format!("#/components/schemas/{schema}")}),
            data,
            &name,
            &mut errors,
        );
        assert!(errors.is_empty(), "{name}: {errors:?}");
        if name == "query" {
            continue;
        }
        assert_eq!(data["type"].as_str(), Some(name.as_str()));
        if let Some(delta) = data["delta"].as_str() {
            text.push_str(delta);
        }
        names.push(name);
    }
    (names, text)
}

#[test]
fn event_streams_print_one_json_line_per_event() {
    let rt = runtime();
    let server = rt
        .block_on(LocalNexus::builder().context("docs", corpus()).start())
        .unwrap();
    let url = server.base_url().to_owned();
    let spec = openapi::spec();

    let body = r#"{"ask": "How do I resume a stream?", "scope": ["docs"], "stream": true}"#;
    let (code, stdout, stderr) = nexus_with(
        &["--base-url", &url, "--json", "api", "query", "--body", "-"],
        body,
    );
    assert_eq!(code, Some(0), "{stderr:?}");
    let (names, streamed) = checked_events(&spec, &stdout);
    assert_eq!(names.first().map(String::as_str), Some("response.created"));
    assert_eq!(names.last().map(String::as_str), Some("response.completed"));
    let first: Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    let query_id = first["data"]["query_id"].as_str().unwrap().to_owned();

    // The stored turn is the reference for the text and the replay.
    let client = server.client().unwrap();
    let stored = rt.block_on(client.queries().get(&query_id)).unwrap();
    assert_eq!(streamed, stored.answer_text());

    let (code, replay, stderr) = nexus_with(
        &[
            "--base-url",
            &url,
            "--json",
            "api",
            "stream_query_events",
            "-p",
            &format!("id={query_id}"),
        ],
        "",
    );
    assert_eq!(code, Some(0), "{stderr:?}");
    let (replayed, text) = checked_events(&spec, &replay);
    assert_eq!(replayed, names);
    assert_eq!(text, streamed);

    // Without --json: one `[id] event: data` line per event.
    let (code, plain, _) = nexus_with(
        &[
            "--base-url",
            &url,
            "api",
            "stream_query_events",
            "-p",
            &format!("id={query_id}"),
        ],
        "",
    );
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = plain.lines().collect();
    assert_eq!(lines.len(), replay.lines().count());
    assert!(lines[0].starts_with("[1] response.created: {"), "{plain}");
}

#[test]
fn upload_and_read_back_through_the_api_form() {
    let rt = runtime();
    let server = rt.block_on(LocalNexus::builder().start()).unwrap();
    let url = server.base_url().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.md");
    std::fs::write(&file, "# Keys\n\nRotated every ninety days.\n").unwrap();
    let base = ["--base-url", url.as_str(), "--json", "api"];
    let with = |args: &[&str], input: &str| {
        let mut all = base.to_vec();
        all.extend_from_slice(args);
        nexus_with(&all, input)
    };
    let (code, _, err) = with(
        &["create_context", "--body", "-"],
        r#"{"slug": "kb", "name": "KB"}"#,
    );
    assert_eq!(code, Some(0), "{err:?}");
    let file_param = format!("file={}", file.display());
    let (code, out, err) = with(
        &["upload_context_source", "-p", "slug=kb", "-p", &file_param],
        "",
    );
    assert_eq!(code, Some(0), "{err:?}");
    let trigger: Value = serde_json::from_str(&out).unwrap();
    let task = trigger["task_id"].as_str().unwrap().to_owned();
    let client = server.client().unwrap();
    rt.block_on(client.tasks().wait_completed(&task, Default::default()))
        .unwrap();
    let (code, read, err) = with(
        &[
            "read_source_file",
            "-p",
            "slug=kb",
            "-p",
            "path=uploads/keys.md",
        ],
        "",
    );
    assert_eq!(code, Some(0), "{err:?}");
    assert_eq!(read, "# Keys\n\nRotated every ninety days.\n");
}

/// A body the user built reaches the server as built: fields the generated
/// request type does not name (the spec allows them) included, nested ones
/// too; the answer is printed as the server sent it. The fields the type
/// names are still checked against the schema before anything is sent.
#[test]
fn a_body_reaches_the_server_with_fields_beyond_the_generated_types() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let rt = runtime();
    let mock = rt.block_on(MockServer::start());
    let answer = serde_json::json!({"slug": "kb", "name": "KB", "tier": "gold"});
    rt.block_on(
        Mock::given(method("POST"))
            .and(path("/api/contexts"))
            .respond_with(ResponseTemplate::new(201).set_body_json(&answer))
            .mount(&mock),
    );
    let url = format!("{}/api", mock.uri());
    let with = |args: &[&str], input: &str| {
        let mut all = vec!["--base-url", url.as_str(), "api", "create_context"];
        all.extend_from_slice(args);
        nexus_with(&all, input)
    };

    let (code, out, err) = with(
        &[
            "-f",
            "slug=kb",
            "-f",
            "name=KB",
            "-F",
            "retention_days=30",
            "-F",
            r#"labels={"team": "docs"}"#,
        ],
        "",
    );
    assert_eq!(code, Some(0), "{err:?}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), answer);

    let body = r#"{"slug": "kb", "name": "KB", "manifest": {"future": [1, 2]}, "x-trace": true}"#;
    let (code, _, err) = with(&["--body", "-"], body);
    assert_eq!(code, Some(0), "{err:?}");

    let (code, _, err) = with(&["-f", "slug=kb", "-F", "name=3"], "");
    assert_eq!(code, Some(1));
    assert!(
        err[0].starts_with("error: invalid body for create_context: invalid type"),
        "{err:?}"
    );

    let received = rt.block_on(mock.received_requests()).unwrap();
    let bodies: Vec<Value> = received
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    let expected = [
        serde_json::json!({"slug": "kb", "name": "KB", "retention_days": 30,
            "labels": {"team": "docs"}}),
        serde_json::from_str(body).unwrap(),
    ];
    assert_eq!(bodies, expected);
}
