//! `nexus api OPERATION_ID [--param NAME=VALUE ...] [--body FILE|-]`: any
//! operation of the 2026-07 API by its `operationId`, through the generated
//! client (`Client::api`), with its JSON answer on stdout.
//!
//! The table below names every operation with its method, path and
//! parameters; `nexus api --list` prints it. Parameters are checked against
//! it before anything is sent, and the body (JSON from a file or stdin, or
//! fields) against the operation's request schema; the body is sent as
//! given, fields the generated types do not name included.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::process::ExitCode;

use serde::de::DeserializeOwned;

use crate::common::{ServerArgs, error_line};

#[path = "api_body.rs"]
mod body;
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
    /// The operation: its `operationId` (see `--list`), or a path such as
    /// `/contexts/docs` or `/tasks?limit=5` (its parameters taken from the
    /// path and the query string).
    #[arg(required_unless_present = "list", value_name = "OPERATION|PATH")]
    operation: Option<String>,
    /// The HTTP method of a PATH (default GET, or POST with a body or fields).
    #[arg(long, short = 'X', value_name = "METHOD")]
    method: Option<String>,
    /// A path, query or header parameter, as NAME=VALUE (repeatable).
    #[arg(long = "param", short = 'p', value_name = "NAME=VALUE")]
    params: Vec<String>,
    /// The JSON body: a file, or `-` for stdin (default `{}`).
    #[arg(long, value_name = "FILE|-")]
    body: Option<String>,
    /// A body field with a string value, KEY=VALUE (repeatable).
    #[arg(
        long = "raw-field",
        short = 'f',
        value_name = "KEY=VALUE",
        conflicts_with = "body"
    )]
    raw_fields: Vec<String>,
    /// A body field with a typed value, KEY=VALUE: `true`, `false`, `null`,
    /// a number or JSON (`[..]`, `{..}`); anything else a string (repeatable).
    #[arg(
        long = "field",
        short = 'F',
        value_name = "KEY=VALUE",
        conflicts_with = "body"
    )]
    fields: Vec<String>,
    /// Print the answer's status line and headers before its body.
    #[arg(long, short = 'i')]
    include: bool,
    /// Follow every page of a listing (`offset` and `limit`, or `page`)
    /// and print its items as one JSON array.
    #[arg(long)]
    paginate: bool,
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
    /// Print the status line and headers first (`-i`).
    include: bool,
    /// Follow every page (`--paginate`).
    paginate: bool,
    /// While following pages: the answer of the page just fetched, kept
    /// here instead of printed.
    page: std::cell::RefCell<Option<serde_json::Value>>,
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
    let mut call = prepare(args, json)?;
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
    if call.paginate {
        return calls::paginate(&conn.client, &credentials, &mut call).await;
    }
    calls::dispatch(&conn.client, &credentials, &call).await
}

/// Checks an invocation against its operation.
fn prepare(args: ApiArgs, json: bool) -> Result<Call, String> {
    let name = args.operation.clone().unwrap_or_default();
    let has_fields = !args.raw_fields.is_empty() || !args.fields.is_empty();
    let (op, mut params) = if name.starts_with('/') {
        let method = match &args.method {
            Some(m) => m.to_ascii_uppercase(),
            None if args.body.is_some() || has_fields => "POST".to_owned(),
            None => "GET".to_owned(),
        };
        find_path(&method, &name)?
    } else {
        if args.method.is_some() {
            return Err("--method goes with a PATH; an operation id names its method".into());
        }
        (find(&name)?, BTreeMap::new())
    };
    if let Some(key) = params.keys().find(|key| {
        !op.params
            .iter()
            .any(|p| p.trim_end_matches('!') == key.as_str())
    }) {
        return Err(format!(
            "{} takes no parameter `{key}` (it takes: {})",
            op.id,
            takes(op)
        ));
    }
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
        (None, _) if has_fields => {
            if op.body != Body::Json {
                return Err(format!("{} takes no JSON body", op.id));
            }
            Some(fields_body(&args.raw_fields, &args.fields)?)
        }
        (None, _) => None,
        (Some(_), Body::None | Body::File) => {
            return Err(format!("{} takes no JSON body", op.id));
        }
        (Some(source), Body::Json) => Some(read_body(source)?),
    };
    let paginate = args.paginate;
    if paginate && !pages(op) {
        return Err(format!("{} is not a listing with pages", op.id));
    }
    let call = Call {
        op,
        params,
        body,
        json,
        include: args.include,
        paginate,
        page: std::cell::RefCell::new(None),
    };
    if op.body == Body::Json {
        body::validate(&call)?;
    }
    Ok(call)
}

/// Whether an operation's listing has pages `--paginate` can follow.
pub(crate) fn pages(op: &Operation) -> bool {
    op.params.contains(&"offset") && op.params.contains(&"limit")
}

/// A JSON object from `-f` (string) and `-F` (typed) fields.
fn fields_body(raw: &[String], typed: &[String]) -> Result<serde_json::Value, String> {
    let mut body = serde_json::Map::new();
    let all = raw
        .iter()
        .map(|f| (f, false))
        .chain(typed.iter().map(|f| (f, true)));
    for (field, is_typed) in all {
        let Some((key, value)) = field.split_once('=') else {
            return Err(format!("field `{field}`: expected KEY=VALUE"));
        };
        if key.is_empty() {
            return Err(format!("field `{field}`: the key is empty"));
        }
        let value = match is_typed {
            true => typed_value(value),
            false => serde_json::Value::String(value.to_owned()),
        };
        if body.insert(key.to_owned(), value).is_some() {
            return Err(format!("field {key} given twice"));
        }
    }
    Ok(serde_json::Value::Object(body))
}

/// `-F`'s value: `true`, `false`, `null`, a number, a JSON array or
/// object; anything else a string.
fn typed_value(value: &str) -> serde_json::Value {
    let json_like = matches!(value, "true" | "false" | "null")
        || value.starts_with(['[', '{'])
        || value.parse::<f64>().is_ok_and(f64::is_finite);
    match json_like {
        true => serde_json::from_str(value)
            .unwrap_or_else(|_| serde_json::Value::String(value.to_owned())),
        false => serde_json::Value::String(value.to_owned()),
    }
}

/// The operation a method and a path name, with the parameters the path
/// and its query string carry.
fn find_path(
    method: &str,
    target: &str,
) -> Result<(&'static Operation, BTreeMap<String, String>), String> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let path = path
        .strip_prefix("/api")
        .filter(|p| p.starts_with('/'))
        .unwrap_or(path);
    let mut matched = OPERATIONS
        .iter()
        .filter_map(|op| match_template(op.path, path).map(|params| (op, params)));
    let Some((op, mut params)) = matched.clone().find(|(op, _)| op.method == method) else {
        return Err(match matched.next() {
            Some(_) => {
                let methods: Vec<&str> = OPERATIONS
                    .iter()
                    .filter(|op| match_template(op.path, path).is_some())
                    .map(|op| op.method)
                    .collect();
                format!(
                    "{method} {path}: no such operation (the path takes {})",
                    methods.join(", ")
                )
            }
            None => format!(
                "{method} {path}: no operation has this path (`nexus api --list` names the {})",
                OPERATIONS.len()
            ),
        });
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if params.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(format!("{key} given twice"));
        }
    }
    Ok((op, params))
}

/// The parameters of `path` when it fits `template` (`{name}` is one
/// segment; a last `{path}` is the rest of the path).
fn match_template(template: &str, path: &str) -> Option<BTreeMap<String, String>> {
    let mut params = BTreeMap::new();
    let mut given = path.trim_start_matches('/').split('/');
    let mut parts = template.trim_start_matches('/').split('/').peekable();
    while let Some(part) = parts.next() {
        match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
            Some("path") if parts.peek().is_none() => {
                let rest: Vec<&str> = given.by_ref().collect();
                if rest.is_empty() || rest.iter().any(|s| s.is_empty()) {
                    return None;
                }
                params.insert("path".to_owned(), rest.join("/"));
            }
            Some(name) => {
                let value = given.next().filter(|s| !s.is_empty())?;
                params.insert(name.to_owned(), value.to_owned());
            }
            None => {
                if given.next()? != part {
                    return None;
                }
            }
        }
    }
    given.next().is_none().then_some(params)
}

/// The operation named `name`, or why there is none.
fn find(name: &str) -> Result<&'static Operation, String> {
    OPERATIONS.iter().find(|op| op.id == name).ok_or_else(|| {
        let nearest = OPERATIONS
            .iter()
            .map(|op| (edit_distance(name, op.id), op.id))
            .min()
            .filter(|(distance, id)| *distance <= (id.len() / 3).max(2));
        let hint = match nearest {
            Some((_, id)) => format!("did you mean `{id}`? "),
            None => String::new(),
        };
        format!(
            "unknown operation `{name}` ({hint}`nexus api --list` names the {})",
            OPERATIONS.len()
        )
    })
}

/// The Levenshtein distance between two operation ids.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
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

/// One line for a failed generated call, worded as every other error of
/// the CLIs: the operation, the status, the server's code and message, its
/// request id and `Retry-After` (through the SDK's own error, whatever
/// status the spec lists for the operation); the transport's reason when
/// no answer came.
fn failure<E>(op: &str, error: nexus_knowql::api::Error<E>) -> String
where
    nexus_knowql::Error: From<nexus_knowql::api::Error<E>>,
{
    let error = nexus_knowql::Error::from(error);
    let line = error_line(&error);
    // The conversion cannot name the operation of a call that never got
    // an answer; the CLI knows it.
    match line.strip_prefix("api: ") {
        Some(rest) => format!("{op}: {rest}"),
        None => line,
    }
}
