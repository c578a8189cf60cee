//! Realistic payloads decode with the generated types, including fields and
//! enum values this version of the crate has never heard of.

use nexus_knowql::types;
use serde_json::json;

#[test]
fn query_with_unknown_fields_and_status() {
    let q: types::Query = serde_json::from_value(json!({
        "id": "q_01", "object": "query", "session_id": "s_01", "model": "claude-x", "created": 1_780_000_000,
        "status": "paused_for_review",
        "error": null, "previous_query_id": null,
        "input": [{"role": "user", "content": "What is KnowQL?", "attachments": []}],
        "output": [{"role": "assistant", "content": [
            {"type": "output_text", "text": "KnowQL is "},
            {"type": "output_text", "text": "the query language.", "annotations": [{"kind": "new"}]}
        ]}],
        "output_json": {"answer": 42},
        "citations": [{"source": "docs/knowql.md", "section_paths": [["KnowQL", "Overview"]], "pages": [1], "kind": "chunk", "score": 0.9}],
        "steps": [{"step_id": "st_1", "status": "waiting_on_tool", "commentary": "Searching", "fns": ["search"], "cum_input_tokens": 10, "new_metric": 1}],
        "rollup": {"type": "response.turn_rollup", "n_steps": 1, "by_category": {"search": 1}, "future": true},
        "synthesis": {"status": "done", "tokens_in": 5, "tokens_out": 7},
        "trace_ref": "tr_1",
        "usage": {"input_tokens": 10, "output_tokens": 20, "total_tokens": 30, "reasoning_tokens": 3},
        "runtime_ms": 1234,
        "brand_new_top_level": {"nested": [1, 2, 3]}
    }))
    .expect("forward-compatible decode");
    assert_eq!(q.status, "paused_for_review");
    assert!(!q.is_terminal());
    assert_eq!(q.answer_text(), "KnowQL is the query language.");
    assert_eq!(q.citations[0].section_paths[0], ["KnowQL", "Overview"]);
    assert_eq!(q.steps[0].status, "waiting_on_tool");
    assert_eq!(
        q.output_json.as_ref().and_then(|m| m.get("answer")),
        Some(&json!(42))
    );
}

#[test]
fn context_response_with_unknown_kind_and_fields() {
    let c: types::ContextResponse = serde_json::from_value(json!({
        "id": "6f1c2f7e-0000-4000-8000-000000000001", "slug": "docs", "name": "Docs", "kind": "graph",
        "workspace": "ws", "created_by": "user-1", "description": "Product docs",
        "is_optimizing": false, "optimize_task_id": null, "optimize_score": 0.75, "optimize_iterations": 3,
        "last_optimized_at": null, "last_curated_at": null, "has_sources": true, "last_source_import_at": "2026-07-01T10:00:00Z",
        "is_curating": true, "curate_task_id": "t_1", "is_importing": false, "is_exploring": false,
        "is_restoring": false, "is_grooming": false, "sample_queries": ["How?"],
        "created_at": "2026-07-01T10:00:00Z", "updated_at": "2026-07-02T10:00:00.123456Z",
        "stats": {"tasks_total": 3, "tasks_active": 1, "tasks_completed": 2, "tasks_failed": 0, "tasks_cancelled": 0,
                  "tokens_total": 1000, "runtime_seconds": 60, "unknown_stat": 9},
        "shiny_new_flag": true
    }))
    .expect("forward-compatible decode");
    assert_eq!(c.kind.as_str(), "graph");
    assert!(
        !c.is_queryable(),
        "an uncurated context of an unknown kind is not queryable"
    );
    assert!(c.is_curating);
}

#[test]
fn queryable_rule() {
    let base = json!({
        "id": "1", "slug": "w", "name": "W", "kind": "work", "created_by": "u", "description": "",
        "is_optimizing": false, "has_sources": false, "is_curating": false, "is_importing": false,
        "is_exploring": false, "is_restoring": false, "is_grooming": false,
        "created_at": "2026-07-01T10:00:00Z", "updated_at": "2026-07-01T10:00:00Z"
    });
    let work: types::ContextResponse = serde_json::from_value(base.clone()).unwrap();
    assert!(work.is_queryable(), "work contexts are queryable at once");
    let mut search = base.clone();
    search["kind"] = json!("search");
    let s: types::ContextResponse = serde_json::from_value(search.clone()).unwrap();
    assert!(!s.is_queryable());
    search["last_curated_at"] = json!("2026-07-03T00:00:00Z");
    let s: types::ContextResponse = serde_json::from_value(search).unwrap();
    assert!(s.is_queryable(), "search contexts once curated");
}

#[test]
fn session_with_extra_fields() {
    let s: types::Session = serde_json::from_value(json!({
        "id": "s_01", "project_id": "p", "workspace": "w", "created_by": "u", "scope": ["docs", "faq"],
        "title": null, "system_prompt": "Be brief.", "guardrails": null, "models": ["m"], "tools": [],
        "workflow": "search_graph", "last_query_id": "q_9",
        "created_at": "2026-07-01T10:00:00Z", "updated_at": "2026-07-01T11:00:00Z",
        "archived": false
    }))
    .expect("forward-compatible decode");
    assert_eq!(s.scope, ["docs", "faq"]);
    assert_eq!(s.workflow.as_deref(), Some("search_graph"));
}

#[test]
fn task_response_with_unknown_state_workflow_and_shapes() {
    let t: types::TaskResponse = serde_json::from_value(json!({
        "id": "t_1", "project_id": "p", "context_id": "c", "created_by": "u",
        "workflow": "distill", "state": "hibernating", "error": null,
        "input": {"type": "distill", "level": 3},
        "output": {"type": "distill_result", "ratio": 0.5},
        "steps": [], "tokens_prompt": 0, "tokens_completion": 0, "runtime_seconds": 12,
        "created_at": "2026-07-01T10:00:00Z",
        "progress": {"phase": 1, "phases": 3, "pct": 33.3, "label": "chunking", "eta_seconds": 20, "sub": {}},
        "mystery": [1]
    }))
    .expect("forward-compatible decode");
    assert_eq!(t.state.as_str(), "hibernating");
    assert_eq!(t.workflow.as_str(), "distill");
    let p = t.progress.expect("progress");
    assert_eq!((p.phase, p.phases, p.label.as_str()), (1, 3, "chunking"));
}

#[test]
fn error_envelope_with_unknown_code() {
    let e: types::Error = serde_json::from_value(
        json!({"message": "slow down", "code": "rate_limited_v2", "retry_in": 3}),
    )
    .expect("decode");
    assert_eq!(e.code.as_deref(), Some("rate_limited_v2"));
}
