//! The CLIs in scripts: tables as tab-separated lines through a pipe,
//! numbers refused rather than adjusted, an unknown context an error,
//! global flags on either side of the subcommand, and `nexus api`'s
//! path form, fields, headers, pages, suggestions and error details.

use crate::support::examples::{corpus, example, non_empty_lines, run, runtime};
use nexus_knowql::local::LocalNexus;

/// A local Nexus serving the shipped corpus as `docs`.
fn docs_server(rt: &tokio::runtime::Runtime) -> LocalNexus {
    rt.block_on(LocalNexus::builder().context("docs", corpus()).start())
        .unwrap()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_piped_table_is_tab_separated_lines_without_rules() {
    let rt = runtime();
    let server = docs_server(&rt);
    let out = run(example(
        "nexus",
        &["--base-url", server.base_url(), "contexts"],
    ));
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0], "\tSLUG\tKIND\tSTATE\tCURATED\tDESCRIPTION",
        "{text}"
    );
    assert!(!text.contains('─') && !text.contains('│'), "{text}");
    for line in &lines {
        assert_eq!(line.split('\t').count(), 6, "{line:?}");
    }
}

#[test]
fn an_unknown_context_for_tasks_is_an_error() {
    let rt = runtime();
    let server = rt.block_on(LocalNexus::builder().start()).unwrap();
    let args = [
        "--base-url",
        server.base_url(),
        "tasks",
        "--context",
        "nope",
    ];
    let out = run(example("nexus", &args));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lines = non_empty_lines(&out.stderr);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("error: no context named \"nope\" (404, request id req_"),
        "{lines:?}"
    );
}

#[test]
fn a_zero_timeout_is_refused() {
    let out = run(example("ask", &["--timeout", "0", "anything?"]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--timeout"), "{err}");
}

#[test]
fn login_goes_after_the_subcommand_and_the_key_before_it() {
    let rt = runtime();
    let server = rt
        .block_on(LocalNexus::builder().api_key("k-script").start())
        .unwrap();
    let args = [
        "--base-url",
        server.base_url(),
        "--api-key",
        "k-script",
        "contexts",
        "--login",
    ];
    let out = run(example("nexus", &args));
    assert!(out.status.success(), "{out:?}");
    let alone = run(example(
        "nexus",
        &["--base-url", server.base_url(), "contexts", "--login"],
    ));
    assert_eq!(alone.status.code(), Some(1), "{alone:?}");
    assert!(String::from_utf8_lossy(&alone.stderr).contains("--login needs an API key"));
}

#[test]
fn nexus_api_takes_paths_fields_headers_and_pages() {
    let rt = runtime();
    let server = docs_server(&rt);
    let url = server.base_url();
    let api = |args: &[&str]| {
        let mut all = vec!["--base-url", url, "api"];
        all.extend_from_slice(args);
        run(example("nexus", &all))
    };

    let head = api(&["-i", "/contexts/docs"]);
    assert!(head.status.success(), "{head:?}");
    let text = stdout(&head);
    assert!(text.starts_with("HTTP 200 OK\n"), "{text}");
    assert!(text.contains("\nx-request-id: req_"), "{text}");
    assert!(text.contains("\"slug\": \"docs\""), "{text}");

    let created = api(&[
        "create_context",
        "-f",
        "slug=kb",
        "-f",
        "name=KB",
        "-F",
        "description=typed",
    ]);
    assert!(created.status.success(), "{created:?}");
    // A null the spec does not allow is refused before anything is sent.
    let null = api(&[
        "create_context",
        "-f",
        "slug=kb-null",
        "-f",
        "name=KB",
        "-F",
        "description=null",
    ]);
    assert_eq!(null.status.code(), Some(1), "{null:?}");
    assert!(
        String::from_utf8_lossy(&null.stderr).contains("`description` cannot be null"),
        "{null:?}"
    );
    assert!(!stdout(&api(&["/contexts/kb-null"])).contains("kb-null"));
    let fetched = api(&["/contexts/kb"]);
    assert!(stdout(&fetched).contains("\"name\": \"KB\""), "{fetched:?}");
    let deleted = api(&["-X", "delete", "/contexts/kb"]);
    assert!(deleted.status.success(), "{deleted:?}");

    let paged = api(&[
        "list_source_files",
        "-p",
        "slug=docs",
        "-p",
        "limit=1",
        "--paginate",
    ]);
    assert!(paged.status.success(), "{paged:?}");
    let all: serde_json::Value = serde_json::from_slice(&paged.stdout).unwrap();
    let one_page = api(&["list_source_files", "-p", "slug=docs", "-p", "limit=1000"]);
    let listing: serde_json::Value = serde_json::from_slice(&one_page.stdout).unwrap();
    assert!(all.as_array().unwrap().len() > 1, "{all}");
    assert_eq!(&all, &listing["entries"]);
}

#[test]
fn nexus_api_suggests_an_operation_and_names_the_request_of_an_error() {
    let rt = runtime();
    let server = rt.block_on(LocalNexus::builder().start()).unwrap();
    let typo = run(example(
        "nexus",
        &["--base-url", server.base_url(), "api", "get_contxt"],
    ));
    assert_eq!(typo.status.code(), Some(1), "{typo:?}");
    let err = String::from_utf8_lossy(&typo.stderr);
    assert!(err.contains("did you mean `get_context`?"), "{err}");

    let missing = run(example(
        "nexus",
        &["--base-url", server.base_url(), "api", "/contexts/nope"],
    ));
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("get_context: server answered 404"), "{err}");
    assert!(err.contains("(request req_"), "{err}");
}
