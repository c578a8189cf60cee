//! `nexus api OPERATION_ID [--param NAME=VALUE ...] [--body FILE|-]`: any
//! operation of the 2026-07 API by its `operationId`, through the generated
//! client (`Client::api`), with its JSON answer on stdout.
//!
//! The table below names every operation with its method, path and
//! parameters; `nexus api --list` prints it. Parameters are checked against
//! it before anything is sent, and the body (JSON from a file or stdin)
//! against the operation's request type.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::process::ExitCode;

use serde::de::DeserializeOwned;

use crate::common::{ServerArgs, error_line};

#[path = "api_calls.rs"]
mod calls;
#[path = "api_stream.rs"]
mod stream;

/// What an operation takes as a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    /// No body.
    None,
    /// A JSON body; `{}` when none is given.
    Json,
    /// A multipart upload: the file named by the `file` parameter.
    File,
}

/// One operation of the API.
#[derive(Debug)]
pub(crate) struct Operation {
    /// The `operationId`.
    pub(crate) id: &'static str,
    /// The HTTP method.
    pub(crate) method: &'static str,
    /// The path template.
    pub(crate) path: &'static str,
    /// Parameters, `!` marking the required ones.
    pub(crate) params: &'static [&'static str],
    /// The body it takes.
    pub(crate) body: Body,
}

macro_rules! op {
    ($id:literal, $method:literal, $path:literal, [$($param:literal),*], $body:ident) => {
        Operation { id: $id, method: $method, path: $path, params: &[$($param),*], body: Body::$body }
    };
}

/// Every operation of `openapi/nexus_2026-07.oas.yaml`, in its order.
#[rustfmt::skip]
pub(crate) const OPERATIONS: &[Operation] = &[
    op!("login", "POST", "/auth/login", [], Json),
    op!("get_identity", "GET", "/auth", [], None),
    op!("get_project", "GET", "/project", [], None),
    op!("list_connectors", "GET", "/connectors", ["kind"], None),
    op!("get_connector", "GET", "/connectors/{id}", ["id!"], None),
    op!("delete_connector", "DELETE", "/connectors/{id}", ["id!"], None),
    op!("start_connector_oauth", "GET", "/connectors/oauth/{provider}/start", ["provider!", "return_to"], None),
    op!("create_connector", "POST", "/connectors/keys/{provider}", ["provider!"], Json),
    op!("list_connector_items", "GET", "/connectors/{id}/items", ["id!", "folder"], None),
    op!("list_context_connectors", "GET", "/contexts/{slug}/connectors", ["slug!"], None),
    op!("update_context_connector", "PUT", "/contexts/{slug}/connectors/{connector_id}", ["slug!", "connector_id!"], Json),
    op!("list_contexts", "GET", "/contexts", [], None),
    op!("create_context", "POST", "/contexts", [], Json),
    op!("get_context", "GET", "/contexts/{slug}", ["slug!"], None),
    op!("update_context", "PUT", "/contexts/{slug}", ["slug!"], Json),
    op!("delete_context", "DELETE", "/contexts/{slug}", ["slug!"], None),
    op!("fork_context", "POST", "/contexts/{slug}/fork", ["slug!"], Json),
    op!("get_context_manifest", "GET", "/contexts/{slug}/manifest", ["slug!"], None),
    op!("get_context_task_stats", "GET", "/contexts/{slug}/tasks/stats", ["slug!"], None),
    op!("curate_context", "POST", "/contexts/{slug}/curate", ["slug!"], Json),
    op!("get_curation_ledger", "GET", "/contexts/{slug}/curate", ["slug!"], None),
    op!("delete_curated_sources", "POST", "/contexts/{slug}/curate/delete-sources", ["slug!"], Json),
    op!("optimize_context", "POST", "/contexts/{slug}/optimize", ["slug!"], Json),
    op!("explore_context", "POST", "/contexts/{slug}/explore", ["slug!"], Json),
    op!("profile_context", "POST", "/contexts/{slug}/profile", ["slug!"], Json),
    op!("import_context_sources", "POST", "/contexts/{slug}/import", ["slug!"], Json),
    op!("upload_context_source", "POST", "/contexts/{slug}/import/upload", ["slug!", "file!", "path"], File),
    op!("list_source_files", "GET", "/contexts/{slug}/source/list", ["slug!", "offset", "limit"], None),
    op!("get_source_stats", "GET", "/contexts/{slug}/source/stats", ["slug!"], None),
    op!("get_source_manifest", "GET", "/contexts/{slug}/source/manifest", ["slug!"], None),
    op!("list_source_files_by_path", "GET", "/contexts/{slug}/source/list/{path}", ["slug!", "path!", "offset", "limit"], None),
    op!("read_source_file", "GET", "/contexts/{slug}/source/read/{path}", ["slug!", "path!"], None),
    op!("delete_source_file", "DELETE", "/contexts/{slug}/source/delete/{path}", ["slug!", "path!"], None),
    op!("list_knowledge", "GET", "/contexts/{slug}/knowledge/list", ["slug!", "offset", "limit"], None),
    op!("get_knowledge_stats", "GET", "/contexts/{slug}/knowledge/stats", ["slug!"], None),
    op!("list_knowledge_by_path", "GET", "/contexts/{slug}/knowledge/list/{path}", ["slug!", "path!", "offset", "limit"], None),
    op!("read_knowledge_file", "GET", "/contexts/{slug}/knowledge/read/{path}", ["slug!", "path!"], None),
    op!("query", "POST", "/query", [], Json),
    op!("get_query", "GET", "/queries/{id}", ["id!"], None),
    op!("cancel_query", "POST", "/queries/{id}/cancel", ["id!"], None),
    op!("get_query_trace", "GET", "/queries/{id}/trace", ["id!"], None),
    op!("stream_query_events", "GET", "/queries/{id}/events", ["id!", "last_event_id"], None),
    op!("create_query_feedback", "POST", "/queries/{id}/feedback", ["id!"], Json),
    op!("list_models", "GET", "/models", [], None),
    op!("list_sessions", "GET", "/sessions", ["limit"], None),
    op!("get_session", "GET", "/sessions/{id}", ["id!"], None),
    op!("delete_session", "DELETE", "/sessions/{id}", ["id!"], None),
    op!("get_project_task_stats", "GET", "/stats", [], None),
    op!("list_manifest_templates", "GET", "/manifest/templates", [], None),
    op!("list_tasks", "GET", "/tasks", ["workflow", "state", "context", "q", "limit", "page", "offset" ], None),
    op!("get_task", "GET", "/tasks/{id}", ["id!"], None),
    op!("cancel_task", "DELETE", "/tasks/{id}", ["id!"], Json),
    op!("get_task_stats", "GET", "/tasks/{id}/stats", ["id!"], None),
    op!("read_task_file", "GET", "/tasks/{id}/files/read/{path}", ["id!", "path!"], None),
    op!("get_task_file_metadata", "GET", "/tasks/{id}/files/metadata/{path}", ["id!", "path!"], None),
    op!("list_task_files_by_path", "GET", "/tasks/{id}/files/list/{path}", ["id!", "path!", "offset", "limit"], None),
    op!("list_task_files", "GET", "/tasks/{id}/files/list", ["id!", "offset", "limit"], None),
    op!("delete_task_file", "DELETE", "/tasks/{id}/files/delete/{path}", ["id!", "path!"], None),
];

/// The largest body `--body` reads (a file or stdin).
const MAX_BODY_BYTES: u64 = 16 * 1024 * 1024;

/// What `nexus api` was asked to do.
#[derive(Debug, clap::Args)]
pub(crate) struct ApiArgs {
    /// The operation's `operationId` (see `--list`).
    #[arg(required_unless_present = "list")]
    operation: Option<String>,
    /// A path, query or header parameter, as NAME=VALUE (repeatable).
    #[arg(long = "param", short = 'p', value_name = "NAME=VALUE")]
    params: Vec<String>,
    /// The JSON body: a file, or `-` for stdin (default `{}`).
    #[arg(long, value_name = "FILE|-")]
    body: Option<String>,
    /// List the operations (id, method, path, parameters; `!` = required).
    #[arg(long, conflicts_with = "operation")]
    list: bool,
}

/// Where the raw calls (the streaming `query`) send their credentials.
#[derive(Debug, Clone, Default)]
pub(crate) struct Credentials {
    /// The API key, when one is configured.
    pub(crate) api_key: Option<String>,
    /// Whether the key is exchanged for a bearer token first.
    pub(crate) login: bool,
}

/// One call, its parameters checked against its operation.
#[derive(Debug)]
pub(crate) struct Call {
    op: &'static Operation,
    params: BTreeMap<String, String>,
    body: Option<serde_json::Value>,
    json: bool,
}

impl Call {
    /// The value of a required parameter (checked by [`Call::new`]).
    fn req(&self, name: &str) -> Result<&str, String> {
        self.opt(name)
            .ok_or_else(|| format!("{} needs --param {name}=VALUE", self.op.id))
    }

    /// The value of an optional parameter.
    fn opt(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }

    /// An optional integer parameter.
    fn int(&self, name: &str) -> Result<Option<i64>, String> {
        self.opt(name)
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("--param {name}: `{v}` is not an integer"))
            })
            .transpose()
    }

    /// An optional positive integer parameter.
    fn positive(&self, name: &str) -> Result<Option<std::num::NonZeroU64>, String> {
        self.opt(name)
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("--param {name}: `{v}` is not a positive integer"))
            })
            .transpose()
    }

    /// An optional parameter of one of the API's string enums.
    fn typed<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, String> {
        self.opt(name)
            .map(|v| {
                serde_json::from_value(serde_json::Value::String(v.to_owned()))
                    .map_err(|e| format!("--param {name}: {e}"))
            })
            .transpose()
    }

    /// The body as the operation's request type (`{}` when none was given).
    fn body<T: DeserializeOwned>(&self) -> Result<T, String> {
        let value = self
            .body
            .clone()
            .unwrap_or_else(|| serde_json::Value::Object(serde_json::Map::new()));
        serde_json::from_value(value).map_err(|e| format!("invalid body for {}: {e}", self.op.id))
    }

    /// The body as given, `{}` when none was.
    fn raw_body(&self) -> serde_json::Value {
        self.body
            .clone()
            .unwrap_or_else(|| serde_json::Value::Object(serde_json::Map::new()))
    }
}

/// Runs `nexus api ...`: the invocation is checked before a server is
/// contacted (or the embedded one started).
pub(crate) async fn run(
    server: &ServerArgs,
    json: bool,
    args: ApiArgs,
) -> Result<ExitCode, String> {
    if args.list {
        return list(json);
    }
    let call = prepare(args, json)?;
    let conn = server.connect().await?;
    if conn.local {
        crate::local_note();
    }
    let credentials = Credentials {
        api_key: server
            .api_key
            .as_deref()
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_owned),
        login: server.login,
    };
    calls::dispatch(&conn.client, &credentials, &call).await
}

/// Checks an invocation against its operation.
fn prepare(args: ApiArgs, json: bool) -> Result<Call, String> {
    let name = args.operation.unwrap_or_default();
    let op = find(&name)?;
    let mut params = BTreeMap::new();
    for pair in &args.params {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(format!("--param `{pair}`: expected NAME=VALUE"));
        };
        let known = op.params.iter().any(|p| p.trim_end_matches('!') == key);
        if !known {
            return Err(format!(
                "{} takes no parameter `{key}` (it takes: {})",
                op.id,
                takes(op)
            ));
        }
        if params.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(format!("--param {key} given twice"));
        }
    }
    for required in op.params.iter().filter_map(|p| p.strip_suffix('!')) {
        if !params.contains_key(required) {
            return Err(format!("{} needs --param {required}=VALUE", op.id));
        }
    }
    let body = match (&args.body, op.body) {
        (None, _) => None,
        (Some(_), Body::None | Body::File) => {
            return Err(format!("{} takes no JSON body", op.id));
        }
        (Some(source), Body::Json) => Some(read_body(source)?),
    };
    Ok(Call {
        op,
        params,
        body,
        json,
    })
}

/// The operation named `name`, or why there is none.
fn find(name: &str) -> Result<&'static Operation, String> {
    OPERATIONS.iter().find(|op| op.id == name).ok_or_else(|| {
        format!(
            "unknown operation `{name}` (`nexus api --list` names the {})",
            OPERATIONS.len()
        )
    })
}

/// The parameters an operation takes, for an error message.
fn takes(op: &Operation) -> String {
    if op.params.is_empty() {
        "none".to_owned()
    } else {
        let names: Vec<String> = op
            .params
            .iter()
            .map(|p| match p.strip_suffix('!') {
                Some(name) => format!("{name} (required)"),
                None => (*p).to_owned(),
            })
            .collect();
        names.join(", ")
    }
}

/// Reads and parses a JSON body from a file or `-` (stdin), bounded.
fn read_body(source: &str) -> Result<serde_json::Value, String> {
    let mut bytes = Vec::new();
    let read = if source == "-" {
        std::io::stdin()
            .take(MAX_BODY_BYTES + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(source).and_then(|f| f.take(MAX_BODY_BYTES + 1).read_to_end(&mut bytes))
    };
    let name = if source == "-" { "stdin" } else { source };
    read.map_err(|e| format!("cannot read the body from {name}: {e}"))?;
    if bytes.len() as u64 > MAX_BODY_BYTES {
        return Err(format!(
            "the body in {name} is over {} MiB",
            MAX_BODY_BYTES / 1024 / 1024
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("the body in {name} is not JSON: {e}"))
}

/// `nexus api --list`: one operation per line (ids only with `--json`).
fn list(json: bool) -> Result<ExitCode, String> {
    if json {
        let all: Vec<_> = OPERATIONS
            .iter()
            .map(|op| {
                serde_json::json!({
                    "operation_id": op.id,
                    "method": op.method,
                    "path": op.path,
                    "params": op.params,
                })
            })
            .collect();
        println!("{}", crate::common::to_json(&all));
        return Ok(ExitCode::SUCCESS);
    }
    for op in OPERATIONS {
        println!(
            "{:<26} {:<6} {:<45} {}",
            op.id,
            op.method,
            op.path,
            op.params.join(" ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One line for a failed generated call: the server's message and status
/// when it answered, the transport's reason otherwise.
fn failure<E: serde::Serialize + std::fmt::Debug + 'static>(
    op: &str,
    error: nexus_knowql::api::Error<E>,
) -> String {
    use nexus_knowql::api::Error as E;
    match error {
        E::ErrorResponse(answer) => {
            let status = answer.status().as_u16();
            let body = serde_json::to_value(answer.into_inner()).unwrap_or_default();
            match body.get("message").and_then(|m| m.as_str()) {
                Some(message) => format!("{op}: {message} (HTTP {status})"),
                None => format!("{op}: the server answered {status}"),
            }
        }
        E::UnexpectedResponse(answer) => {
            format!("{op}: the server answered {}", answer.status().as_u16())
        }
        other => format!("{op}: {}", error_line(&other)),
    }
}
