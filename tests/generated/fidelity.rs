//! Every schema of the spec survives a decode and encode through its
//! generated type: instances generated from the schema itself (every union
//! branch, required and optional fields, `null`s, known and unknown enum
//! values, maps and undeclared fields where allowed) come back as the same
//! JSON, up to the one normalisation stated in `support/fidelity.rs`.
//!
//! 128 cases per schema; `PROPTEST_CASES` sets another number.

use crate::support::fidelity::{self, component_schemas, loss, registry, spec};
use proptest::test_runner::{Config, TestError, TestRunner};
use serde_json::{Value, json};

#[test]
fn every_schema_has_a_generated_type() {
    let spec = spec();
    let registered: Vec<&str> = registry().iter().map(|(n, _)| *n).collect();
    let schemas = component_schemas(&spec);
    let unregistered: Vec<&String> = schemas
        .keys()
        .filter(|n| !registered.contains(&n.as_str()))
        .collect();
    assert!(
        unregistered.is_empty(),
        "schemas without an entry in support/fidelity.rs `registry`: {unregistered:?}"
    );
    let unknown: Vec<&&str> = registered
        .iter()
        .filter(|n| !schemas.contains_key(**n))
        .collect();
    assert!(
        unknown.is_empty(),
        "registered but not in the spec: {unknown:?}"
    );
}

/// Every operation that answers JSON has the generated type of its answer
/// registered, so the conformance checks of `nexus-local` run each answer
/// through the SDK (`crate::support::openapi::conforms`); none is skipped.
#[test]
fn every_json_answer_has_a_generated_type() {
    let spec = spec();
    let registered: Vec<&str> = fidelity::answers().iter().map(|(op, _)| *op).collect();
    let mut json_answers = Vec::new();
    for item in spec["paths"].as_object().unwrap().values() {
        for (method, op) in item.as_object().unwrap() {
            if method == "parameters" {
                continue;
            }
            let id = op["operationId"].as_str().unwrap();
            let answers_json = op["responses"]
                .as_object()
                .unwrap()
                .iter()
                .any(|(status, r)| {
                    status.starts_with('2') && !r["content"]["application/json"].is_null()
                });
            if answers_json {
                json_answers.push(id.to_owned());
            }
        }
    }
    let missing: Vec<&String> = json_answers
        .iter()
        .filter(|op| !registered.contains(&op.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "answers without a registered type: {missing:?}"
    );
    let unknown: Vec<&&str> = registered
        .iter()
        .filter(|op| !json_answers.iter().any(|j| j == *op))
        .collect();
    assert!(
        unknown.is_empty(),
        "registered but answering no JSON: {unknown:?}"
    );
}

#[test]
fn every_schema_survives_decode_and_encode() {
    let spec = spec();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(128);
    let mut failures = Vec::new();
    for name in component_schemas(&spec).keys() {
        let schema = json!({ "$ref": format!("#/components/schemas/{name}") });
        let strategy = fidelity::instances(&spec, &schema);
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&strategy, |document| match loss(&spec, name, &document) {
            None => Ok(()),
            Some(why) => Err(proptest::test_runner::TestCaseError::fail(why)),
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(why, document)) => {
                failures.push(format!("{name}: {why}\n  smallest document: {document}"));
            }
            Err(TestError::Abort(why)) => failures.push(format!("{name}: aborted: {why}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} schemas lose data:\n\n{}",
        failures.len(),
        component_schemas(&spec).len(),
        failures.join("\n\n")
    );
}

/// A curate task as `nexus-local` answers it: its input and output come back
/// whole.
#[test]
fn a_curate_task_keeps_its_input_and_output() {
    let task = task(
        "curate",
        json!({ "force": true, "legs": ["chunks"], "scope": "all", "trigger": "api" }),
        json!({
            "status": "completed",
            "flipped": true,
            "versioned": true,
            "mode": "full",
            "scope": "all",
            "images_skipped_no_vision": 0,
            "usage": {
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "total_tokens": 0,
                "by_model": {},
                "embed_by_model": {}
            },
            "sample_queries": [],
            "delta": {
                "new": 3, "changed": 0, "deleted": 0, "processed": 3, "failed": 0,
                "failed_sources": [], "failed_sources_truncated": false,
                "failed_sources_file": "", "corpus_artifacts": 0, "corpus_edges": 0,
                "corpus_artifacts_screened": 0, "screened": 0, "chunks_created": 7,
                "chunks_updated": 0, "artifacts_created": 0, "artifacts_updated": 0,
                "chunks_screened": 0, "artifacts_screened": 0,
                "images_skipped_no_vision": 0, "artifacts_errored": 0,
                "sources_content_truncated": 0
            }
        }),
    );
    assert_survives(&task);
}

/// An import task as `nexus-local` answers it.
#[test]
fn an_import_task_keeps_its_input_and_output() {
    let task = task(
        "import",
        json!({ "raw_archive_key": "uploads/docs.tar.gz", "path": "docs" }),
        json!({
            "status": "imported docs",
            "imported_items": 2,
            "output_files": 2,
            "skipped": 0,
            "failed": 0,
            "manifest_file": "",
            "manifest_sample": [],
            "manifest_truncated": false,
            "skipped_items": []
        }),
    );
    assert_survives(&task);
}

/// A completed search turn and a failed one, each keeping its fields.
#[test]
fn search_task_outputs_keep_their_fields() {
    for output in [
        json!({
            "status": "completed", "query_id": "q_1", "answer": "Tea.",
            "output_json": null, "citations": ["a.md"], "latency_ms": 12
        }),
        json!({ "status": "failed", "query_id": "q_2", "error": "no model" }),
        json!({ "status": "completed", "something_new": [1, 2], "more": { "a": "b" } }),
    ] {
        let task = task("search", json!({}), output);
        assert_survives(&task);
    }
}

/// Words a later API version may send in the open enums decode as `Other`
/// in the typed fields and encode again as they were sent.
#[test]
fn unknown_status_words_decode_as_other_and_encode_unchanged() {
    use nexus_knowql::{QueryStatus, Rating, TaskStatus, ThinkingLevel, Workflow, types};

    let mut task = task("distill", json!({}), json!({}));
    task["state"] = json!("suspended");
    let decoded: types::TaskResponse = serde_json::from_value(task.clone()).expect("decode task");
    assert_eq!(decoded.state, TaskStatus::Other("suspended".to_owned()));
    assert_eq!(decoded.workflow, Workflow::Other("distill".to_owned()));
    assert!(!decoded.is_terminal());
    let encoded = serde_json::to_value(&decoded).expect("encode task");
    assert_eq!(encoded["state"], "suspended");
    assert_eq!(encoded["workflow"], "distill");
    assert_survives(&task);

    let query = json!({
        "id": "q_1", "object": "query", "session_id": "s_1", "created": 0,
        "status": "paused", "input": [], "output": [], "citations": [], "steps": [],
        "runtime_ms": 1, "usage": { "input_tokens": 0, "output_tokens": 0, "total_tokens": 0 },
        "feedback": { "rating": "sideways" }
    });
    let decoded: types::Query = serde_json::from_value(query.clone()).expect("decode query");
    assert_eq!(decoded.status, QueryStatus::Other("paused".to_owned()));
    let rating = decoded.feedback.as_ref().map(|f| f.rating.clone());
    assert_eq!(rating, Some(Rating::Other("sideways".to_owned())));
    assert!(!decoded.is_terminal());
    let encoded = serde_json::to_value(&decoded).expect("encode query");
    assert_eq!(encoded["status"], "paused");
    assert_eq!(encoded["feedback"]["rating"], "sideways");
    if let Some(why) = loss(&spec(), "Query", &query) {
        panic!("Query {why}");
    }

    let request = json!({ "ask": "?", "workflow": "search_graph", "thinking_level": "max" });
    let decoded: types::QueryRequest =
        serde_json::from_value(request.clone()).expect("decode request");
    assert_eq!(
        decoded.workflow,
        Some(Workflow::Other("search_graph".to_owned()))
    );
    assert_eq!(
        decoded.thinking_level,
        Some(ThinkingLevel::Other("max".to_owned()))
    );
    let encoded = serde_json::to_value(&decoded).expect("encode request");
    assert_eq!(encoded["workflow"], "search_graph");
    assert_eq!(encoded["thinking_level"], "max");
}

fn task(workflow: &str, input: Value, output: Value) -> Value {
    json!({
        "id": "tsk_1",
        "project_id": "local",
        "context_id": "ctx_1",
        "created_by": "local",
        "workflow": workflow,
        "state": "completed",
        "input": input,
        "output": output,
        "steps": [],
        "tokens_prompt": 0,
        "tokens_completion": 0,
        "runtime_seconds": 1,
        "created_at": "2026-07-01T10:00:00Z"
    })
}

fn assert_survives(task: &Value) {
    let spec = spec();
    if let Some(why) = loss(&spec, "TaskResponse", task) {
        panic!("TaskResponse {why}");
    }
}

/// The normalisation equates what it states (optional `null`, default and
/// empty collections, date-time and number spellings) and nothing else.
#[test]
fn the_normalisation_allows_only_what_it_states() {
    let spec = spec();
    let schema = json!({
        "type": "object",
        "required": ["a", "n"],
        "properties": {
            "a": {"type": "string", "nullable": true},
            "b": {"type": "string", "nullable": true},
            "c": {"type": "array", "items": {"type": "string"}},
            "d": {"type": "integer", "default": 5},
            "t": {"type": "string", "format": "date-time"},
            "n": {"type": "number"}
        }
    });
    let same = |a: Value, b: Value| {
        fidelity::normalise(&spec, &schema, &a) == fidelity::normalise(&spec, &schema, &b)
    };
    assert!(same(
        json!({"a": null, "n": 1}),
        json!({"a": null, "b": null, "c": [], "d": 5, "n": 1.0})
    ));
    assert!(same(
        json!({"a": "x", "n": 1, "t": "2026-07-01T12:00:00+02:00"}),
        json!({"a": "x", "n": 1, "t": "2026-07-01T10:00:00.000Z"})
    ));
    assert!(
        !same(json!({"a": null, "n": 1}), json!({"n": 1})),
        "a required null"
    );
    assert!(!same(json!({"a": "x", "n": 1}), json!({"a": "y", "n": 1})));
    assert!(!same(
        json!({"a": "x", "n": 1, "c": ["v"]}),
        json!({"a": "x", "n": 1})
    ));
    assert!(!same(
        json!({"a": "x", "n": 1, "d": 6}),
        json!({"a": "x", "n": 1})
    ));
    assert!(!same(
        json!({"a": "x", "n": 1.5}),
        json!({"a": "x", "n": 1})
    ));
    assert!(!same(
        json!({"a": "x", "n": 1, "t": "2026-07-01T12:00:00+02:00"}),
        json!({"a": "x", "n": 1, "t": "2026-07-01T12:00:00Z"})
    ));
    assert!(
        !same(json!({"a": "x", "n": 1, "e": 1}), json!({"a": "x", "n": 1})),
        "an undeclared field"
    );
}
