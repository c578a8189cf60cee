//! Which operations start a query turn: one table for the generated calls
//! (every operation of `openapi/nexus_2026-07.oas.yaml`, by operationId) and
//! the names the hand-written calls use. Retry advice
//! ([`Error::is_retryable`](crate::Error::is_retryable),
//! [`Error::may_have_started`](crate::Error::may_have_started)) and the
//! redirect rule read it, nothing else decides.

/// One operation: its name, method, path template and whether the server
/// starts a (billed) query turn when it receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Operation {
    /// The operationId (or the hand-written call's name).
    pub(crate) name: &'static str,
    /// The HTTP method.
    pub(crate) method: &'static str,
    /// The path template, as the spec writes it.
    pub(crate) path: &'static str,
    /// Whether receiving it starts a query turn.
    pub(crate) starts_turn: bool,
}

const fn op(
    name: &'static str,
    method: &'static str,
    path: &'static str,
    starts_turn: bool,
) -> Operation {
    Operation {
        name,
        method,
        path,
        starts_turn,
    }
}

/// Every operation of the spec, in its order.
pub(crate) const SPEC_OPERATIONS: &[Operation] = &[
    op("login", "POST", "/auth/login", false),
    op("get_identity", "GET", "/auth", false),
    op("get_project", "GET", "/project", false),
    op("list_connectors", "GET", "/connectors", false),
    op("get_connector", "GET", "/connectors/{id}", false),
    op("delete_connector", "DELETE", "/connectors/{id}", false),
    op(
        "start_connector_oauth",
        "GET",
        "/connectors/oauth/{provider}/start",
        false,
    ),
    op(
        "create_connector",
        "POST",
        "/connectors/keys/{provider}",
        false,
    ),
    op(
        "list_connector_items",
        "GET",
        "/connectors/{id}/items",
        false,
    ),
    op(
        "list_context_connectors",
        "GET",
        "/contexts/{slug}/connectors",
        false,
    ),
    op(
        "update_context_connector",
        "PUT",
        "/contexts/{slug}/connectors/{connector_id}",
        false,
    ),
    op("list_contexts", "GET", "/contexts", false),
    op("create_context", "POST", "/contexts", false),
    op("get_context", "GET", "/contexts/{slug}", false),
    op("update_context", "PUT", "/contexts/{slug}", false),
    op("delete_context", "DELETE", "/contexts/{slug}", false),
    op("fork_context", "POST", "/contexts/{slug}/fork", false),
    op(
        "get_context_manifest",
        "GET",
        "/contexts/{slug}/manifest",
        false,
    ),
    op(
        "get_context_task_stats",
        "GET",
        "/contexts/{slug}/tasks/stats",
        false,
    ),
    op("curate_context", "POST", "/contexts/{slug}/curate", false),
    op(
        "get_curation_ledger",
        "GET",
        "/contexts/{slug}/curate",
        false,
    ),
    op(
        "delete_curated_sources",
        "POST",
        "/contexts/{slug}/curate/delete-sources",
        false,
    ),
    op(
        "optimize_context",
        "POST",
        "/contexts/{slug}/optimize",
        false,
    ),
    op("explore_context", "POST", "/contexts/{slug}/explore", false),
    op("profile_context", "POST", "/contexts/{slug}/profile", false),
    op(
        "import_context_sources",
        "POST",
        "/contexts/{slug}/import",
        false,
    ),
    op(
        "upload_context_source",
        "POST",
        "/contexts/{slug}/import/upload",
        false,
    ),
    op(
        "list_source_files",
        "GET",
        "/contexts/{slug}/source/list",
        false,
    ),
    op(
        "get_source_stats",
        "GET",
        "/contexts/{slug}/source/stats",
        false,
    ),
    op(
        "get_source_manifest",
        "GET",
        "/contexts/{slug}/source/manifest",
        false,
    ),
    op(
        "list_source_files_by_path",
        "GET",
        "/contexts/{slug}/source/list/{path}",
        false,
    ),
    op(
        "read_source_file",
        "GET",
        "/contexts/{slug}/source/read/{path}",
        false,
    ),
    op(
        "delete_source_file",
        "DELETE",
        "/contexts/{slug}/source/delete/{path}",
        false,
    ),
    op(
        "list_knowledge",
        "GET",
        "/contexts/{slug}/knowledge/list",
        false,
    ),
    op(
        "get_knowledge_stats",
        "GET",
        "/contexts/{slug}/knowledge/stats",
        false,
    ),
    op(
        "list_knowledge_by_path",
        "GET",
        "/contexts/{slug}/knowledge/list/{path}",
        false,
    ),
    op(
        "read_knowledge_file",
        "GET",
        "/contexts/{slug}/knowledge/read/{path}",
        false,
    ),
    op("query", "POST", "/query", true),
    op("get_query", "GET", "/queries/{id}", false),
    op("cancel_query", "POST", "/queries/{id}/cancel", false),
    op("get_query_trace", "GET", "/queries/{id}/trace", false),
    op("stream_query_events", "GET", "/queries/{id}/events", false),
    op(
        "create_query_feedback",
        "POST",
        "/queries/{id}/feedback",
        false,
    ),
    op("list_models", "GET", "/models", false),
    op("list_sessions", "GET", "/sessions", false),
    op("get_session", "GET", "/sessions/{id}", false),
    op("delete_session", "DELETE", "/sessions/{id}", false),
    op("get_project_task_stats", "GET", "/stats", false),
    op(
        "list_manifest_templates",
        "GET",
        "/manifest/templates",
        false,
    ),
    op("list_tasks", "GET", "/tasks", false),
    op("get_task", "GET", "/tasks/{id}", false),
    op("cancel_task", "DELETE", "/tasks/{id}", false),
    op("get_task_stats", "GET", "/tasks/{id}/stats", false),
    op(
        "read_task_file",
        "GET",
        "/tasks/{id}/files/read/{path}",
        false,
    ),
    op(
        "get_task_file_metadata",
        "GET",
        "/tasks/{id}/files/metadata/{path}",
        false,
    ),
    op(
        "list_task_files_by_path",
        "GET",
        "/tasks/{id}/files/list/{path}",
        false,
    ),
    op("list_task_files", "GET", "/tasks/{id}/files/list", false),
    op(
        "delete_task_file",
        "DELETE",
        "/tasks/{id}/files/delete/{path}",
        false,
    ),
];

/// The names hand-written calls give the operations they send:
/// `create_query` is [`Session::ask`](crate::Session::ask)'s `POST /query`,
/// `query_turn` a whole turn (its timeout).
pub(crate) const HAND_WRITTEN: &[Operation] = &[
    op("create_query", "POST", "/query", true),
    op("query_turn", "POST", "/query", true),
];

/// Whether the operation named `name` starts a query turn when the server
/// receives it (unknown names start none).
pub(crate) fn starts_turn(name: &str) -> bool {
    SPEC_OPERATIONS
        .iter()
        .chain(HAND_WRITTEN)
        .any(|op| op.starts_turn && op.name == name)
}

/// The turn-starting operation of the spec at `url_path`, for an error
/// that arrived without an answer naming its call (a `reqwest` error knows
/// its URL, not its method; no other operation shares such a path).
pub(crate) fn turn_start_at(url_path: &str) -> Option<&'static str> {
    SPEC_OPERATIONS
        .iter()
        .find(|op| {
            op.starts_turn
                && !op.path.contains('{')
                && url_path.trim_end_matches('/').ends_with(op.path)
        })
        .map(|op| op.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_starts_are_named_by_the_table() {
        for name in ["query", "create_query", "query_turn"] {
            assert!(starts_turn(name), "{name}");
        }
        for name in [
            "get_query",
            "cancel_query",
            "stream_query_events",
            "api",
            "",
        ] {
            assert!(!starts_turn(name), "{name}");
        }
        assert_eq!(turn_start_at("/v1/query"), Some("query"));
        assert_eq!(turn_start_at("/queries/q1/cancel"), None);
        assert_eq!(turn_start_at("/contexts/query/x"), None);
    }
}
