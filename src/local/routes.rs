//! The HTTP surface: every path of the 2026-07 API under `/api`, with the
//! version and auth checks in one middleware.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::multipart::MultipartRejection;
use axum::extract::{DefaultBodyLimit, Multipart, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::Deserialize;

use super::error::{ApiJson, ApiQuery, LocalError, LocalResult};
use super::events::{EventLog, Frame};
use super::import::{self, Upload};
use super::state::AppState;
use super::store::{LOCAL_MODEL, LOCAL_PRINCIPAL, LOCAL_PROJECT, LOCAL_PROJECT_NAME};
use super::{curate, turn};
use crate::types;

/// The `X-Pinecone-Api-Version` header.
const VERSION_HEADER: &str = "x-pinecone-api-version";
/// The API key header.
const KEY_HEADER: &str = "x-pinecone-api-key";
/// The version answered when a request names none.
const DEFAULT_VERSION: &str = "2026-07";
/// Longest wait of `POST /queries/{id}/cancel` for the turn to stop.
const CANCEL_WAIT: Duration = Duration::from_secs(5);
/// Pause before an injected stream cut, so earlier frames are flushed.
const CUT_FLUSH: Duration = Duration::from_millis(20);
/// Default and largest page of a directory listing.
const DEFAULT_PAGE: i64 = 100;
const MAX_PAGE: i64 = 1000;

type Shared = State<Arc<AppState>>;

/// The whole application: `/api/...` plus error answers for anything else.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    let upload_limit = state.config.upload_limit.saturating_add(64 * 1024);
    let json_limit = state.config.json_limit;
    let api = Router::new()
        .route("/auth/login", post(login))
        .route("/auth", get(identity))
        .route("/contexts", get(list_contexts).post(create_context))
        .route(
            "/contexts/{slug}",
            get(get_context).put(update_context).delete(delete_context),
        )
        .route(
            "/contexts/{slug}/import/upload",
            post(upload).layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route("/contexts/{slug}/source/list", get(list_sources))
        .route("/contexts/{slug}/source/list/{*path}", get(list_sources_at))
        .route("/contexts/{slug}/source/read/{*path}", get(read_source))
        .route(
            "/contexts/{slug}/curate",
            post(curate_context).get(ni("get_curation_ledger")),
        )
        .route("/contexts/{slug}/knowledge/list", get(list_knowledge))
        .route(
            "/contexts/{slug}/knowledge/list/{*path}",
            get(list_knowledge_at),
        )
        .route(
            "/contexts/{slug}/knowledge/read/{*path}",
            get(read_knowledge),
        )
        .route("/tasks", get(list_tasks))
        .route("/tasks/{id}", get(get_task).delete(cancel_task))
        .route("/models", get(models))
        .route("/query", post(post_query))
        .route("/queries/{id}", get(get_query))
        .route("/queries/{id}/cancel", post(cancel_query))
        .route("/queries/{id}/events", get(query_events))
        .route("/queries/{id}/trace", get(query_trace))
        .route("/queries/{id}/feedback", post(query_feedback))
        .route("/sessions", get(list_sessions))
        .route("/sessions/{id}", get(get_session).delete(delete_session))
        // Operations of the API that the local server does not provide.
        .route("/project", get(ni("get_project")))
        .route("/stats", get(ni("get_project_task_stats")))
        .route("/manifest/templates", get(ni("list_manifest_templates")))
        .route("/connectors", get(ni("list_connectors")))
        .route(
            "/connectors/{id}",
            get(ni("get_connector")).delete(ni("delete_connector")),
        )
        .route("/connectors/{id}/items", get(ni("list_connector_items")))
        .route(
            "/connectors/oauth/{provider}/start",
            get(ni("start_connector_oauth")),
        )
        .route("/connectors/keys/{provider}", post(ni("create_connector")))
        .route(
            "/contexts/{slug}/connectors",
            get(ni("list_context_connectors")),
        )
        .route(
            "/contexts/{slug}/connectors/{connector_id}",
            put(ni("update_context_connector")),
        )
        .route("/contexts/{slug}/fork", post(ni("fork_context")))
        .route("/contexts/{slug}/manifest", get(ni("get_context_manifest")))
        .route(
            "/contexts/{slug}/tasks/stats",
            get(ni("get_context_task_stats")),
        )
        .route(
            "/contexts/{slug}/curate/delete-sources",
            post(ni("delete_curated_sources")),
        )
        .route("/contexts/{slug}/optimize", post(ni("optimize_context")))
        .route("/contexts/{slug}/explore", post(ni("explore_context")))
        .route("/contexts/{slug}/profile", post(ni("profile_context")))
        .route(
            "/contexts/{slug}/import",
            post(ni("import_context_sources")),
        )
        .route("/contexts/{slug}/source/stats", get(ni("get_source_stats")))
        .route(
            "/contexts/{slug}/source/manifest",
            get(ni("get_source_manifest")),
        )
        .route(
            "/contexts/{slug}/source/delete/{*path}",
            delete(ni("delete_source_file")),
        )
        .route(
            "/contexts/{slug}/knowledge/stats",
            get(ni("get_knowledge_stats")),
        )
        .route("/tasks/{id}/stats", get(ni("get_task_stats")))
        .route("/tasks/{id}/files/read/{*path}", get(ni("read_task_file")))
        .route(
            "/tasks/{id}/files/metadata/{*path}",
            get(ni("get_task_file_metadata")),
        )
        .route("/tasks/{id}/files/list", get(ni("list_task_files")))
        .route(
            "/tasks/{id}/files/list/{*path}",
            get(ni("list_task_files_by_path")),
        )
        .route(
            "/tasks/{id}/files/delete/{*path}",
            delete(ni("delete_task_file")),
        )
        .method_not_allowed_fallback(method_not_allowed);
    Router::new()
        .nest("/api", api)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), gate))
        .layer(DefaultBodyLimit::max(json_limit))
        .with_state(state)
}

/// A handler for an operation the local server does not provide.
fn ni(
    operation: &'static str,
) -> impl Fn() -> std::future::Ready<LocalError> + Clone + Send + Sync + 'static {
    move || std::future::ready(LocalError::not_implemented(operation))
}

async fn not_found() -> LocalError {
    LocalError::not_found("no such endpoint")
}

async fn method_not_allowed() -> LocalError {
    LocalError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this endpoint",
    )
}

/// Injected faults, version negotiation and authentication, in that order;
/// echoes the version on every answer.
async fn gate(State(state): Shared, req: Request, next: Next) -> Response {
    let asked = req
        .headers()
        .get(VERSION_HEADER)
        .map(|v| v.to_str().unwrap_or("").to_owned());
    let mut resp = match check(&state, &req, asked.as_deref()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    };
    let status = resp.status();
    if status.is_server_error() {
        tracing::warn!(status = status.as_u16(), "request failed");
    } else if status.is_client_error() {
        tracing::debug!(status = status.as_u16(), "request refused");
    }
    let echoed = match asked.as_deref() {
        Some(v @ ("2026-07" | "unstable")) => v,
        _ => DEFAULT_VERSION,
    };
    resp.headers_mut().insert(
        VERSION_HEADER,
        HeaderValue::from_static(static_version(echoed)),
    );
    resp
}

fn static_version(v: &str) -> &'static str {
    if v == "unstable" {
        "unstable"
    } else {
        DEFAULT_VERSION
    }
}

fn check(state: &AppState, req: &Request, asked: Option<&str>) -> LocalResult<()> {
    if let Some(secs) = state.faults.take_503() {
        return Err(LocalError::unavailable(secs));
    }
    match asked {
        None | Some("2026-07") | Some("unstable") => {}
        Some(other) => return Err(LocalError::unsupported_version(other)),
    }
    let Some(key) = state.config.api_key.as_deref() else {
        return Ok(());
    };
    if req.uri().path() == "/api/auth/login" {
        return Ok(());
    }
    let headers = req.headers();
    let by_key = headers
        .get(KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| constant_time_eq(v.as_bytes(), key.as_bytes()));
    let by_token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| state.knows_token(t.trim()));
    if by_key || by_token {
        Ok(())
    } else {
        Err(LocalError::unauthorized(
            "missing or invalid credentials: send X-Pinecone-Api-Key or a bearer token from POST /auth/login",
        ))
    }
}

/// Compares secrets without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

// ---- auth -------------------------------------------------------------------

async fn login(
    State(state): Shared,
    ApiJson(body): ApiJson<types::LoginBody>,
) -> LocalResult<axum::Json<types::LoginResponse>> {
    if let Some(key) = state.config.api_key.as_deref() {
        let given = body.api_key.unwrap_or_default();
        if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
            return Err(LocalError::unauthorized("invalid API key"));
        }
    }
    Ok(axum::Json(types::LoginResponse {
        principal: LOCAL_PRINCIPAL.to_owned(),
        project_id: LOCAL_PROJECT.to_owned(),
        project_name: LOCAL_PROJECT_NAME.to_owned(),
        token: state.issue_token(),
    }))
}

async fn identity() -> axum::Json<types::GetIdentityResponse> {
    axum::Json(types::GetIdentityResponse {
        project_id: LOCAL_PROJECT.to_owned(),
        project_name: Some(LOCAL_PROJECT_NAME.to_owned()),
        user: LOCAL_PRINCIPAL.to_owned(),
    })
}

// ---- contexts ---------------------------------------------------------------

async fn list_contexts(State(state): Shared) -> axum::Json<Vec<types::ContextResponse>> {
    let inner = state.store.lock();
    axum::Json(inner.contexts.values().map(|c| c.to_response()).collect())
}

async fn create_context(
    State(state): Shared,
    ApiJson(req): ApiJson<types::CreateContextRequest>,
) -> LocalResult<axum::Json<types::ContextResponse>> {
    let rec = state.store.lock().create_context(req)?;
    state.store.persist().await;
    Ok(axum::Json(rec.to_response()))
}

async fn get_context(
    State(state): Shared,
    Path(slug): Path<String>,
) -> LocalResult<axum::Json<types::ContextResponse>> {
    Ok(axum::Json(state.store.lock().context(&slug)?.to_response()))
}

async fn update_context(
    State(state): Shared,
    Path(slug): Path<String>,
    ApiJson(req): ApiJson<types::UpdateContextRequest>,
) -> LocalResult<axum::Json<types::ContextResponse>> {
    let resp = {
        let mut inner = state.store.lock();
        let id = inner.context(&slug)?.id.clone();
        if let Some(new_slug) = &req.slug {
            if !super::store::valid_slug(new_slug) {
                return Err(LocalError::bad_request(format!(
                    "invalid slug {new_slug:?}"
                )));
            }
            if inner.context_id(new_slug).is_some_and(|other| other != id) {
                return Err(LocalError::conflict(format!(
                    "context {new_slug:?} already exists"
                )));
            }
        }
        if req.name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            return Err(LocalError::bad_request("name must not be empty"));
        }
        let ctx = inner.context_mut(&id)?;
        if let Some(v) = req.slug {
            ctx.slug = v;
        }
        if let Some(v) = req.name {
            ctx.name = v;
        }
        if let Some(v) = req.description {
            ctx.description = Some(v);
        }
        if let Some(v) = req.guide {
            ctx.guide = Some(v);
        }
        if let Some(v) = req.manifest {
            ctx.manifest = Some(v);
        }
        ctx.updated_at = Utc::now();
        ctx.to_response()
    };
    state.store.persist().await;
    Ok(axum::Json(resp))
}

async fn delete_context(State(state): Shared, Path(slug): Path<String>) -> LocalResult<StatusCode> {
    let (rec, tokens) = state.store.lock().delete_context(&slug)?;
    for t in tokens {
        t.cancel();
    }
    if let Some(dir) = state.store.context_dir(&rec.id) {
        let _ = tokio::fs::remove_dir_all(dir).await;
    }
    state.store.persist().await;
    Ok(StatusCode::OK)
}

// ---- sources ----------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct UploadParams {
    path: Option<String>,
}

async fn upload(
    State(state): Shared,
    Path(slug): Path<String>,
    ApiQuery(params): ApiQuery<UploadParams>,
    multipart: Result<Multipart, MultipartRejection>,
) -> LocalResult<axum::Json<types::WorkflowTriggerResponse>> {
    {
        let inner = state.store.lock();
        let ctx = inner.context(&slug)?;
        if ctx.importing {
            return Err(LocalError::conflict(format!(
                "an import is already running on context {:?}",
                ctx.slug
            )));
        }
    }
    let dir = match params.path.as_deref().map(str::trim) {
        None | Some("") => "uploads".to_owned(),
        Some(p) => import::safe_path(p)
            .ok_or_else(|| LocalError::bad_request(format!("unsafe upload path {p:?}")))?,
    };
    let mut multipart = multipart.map_err(|e| LocalError::new(e.status(), e.body_text()))?;
    let limit = state.config.upload_limit;
    let multipart_error = |e: axum::extract::multipart::MultipartError| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            LocalError::too_large(format!("the upload exceeds the {limit} byte limit"))
        } else {
            LocalError::new(e.status(), e.body_text())
        }
    };
    while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
        if field.name() != Some("file") {
            continue;
        }
        let name = field.file_name().unwrap_or("").to_owned();
        import::check_file_name(&name)?;
        let mut data = Vec::new();
        while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
            if data.len() + chunk.len() > limit {
                return Err(LocalError::too_large(format!(
                    "the upload exceeds the {limit} byte limit"
                )));
            }
            data.extend_from_slice(&chunk);
        }
        let trigger = import::start(
            &state,
            &slug,
            Upload {
                name,
                dir,
                data: data.into(),
            },
        )?;
        return Ok(axum::Json(trigger));
    }
    Err(LocalError::bad_request("the form has no `file` part"))
}

#[derive(Debug, Deserialize)]
struct PageParams {
    offset: Option<i64>,
    limit: Option<i64>,
}

/// `(path, size, mtime)` of every file of a tree.
type FileList = Vec<(String, u64, DateTime<Utc>)>;

/// Lists the direct children of `dir` in a flat file list.
fn listing(files: &FileList, dir: &str, page: &PageParams) -> LocalResult<types::DirListing> {
    let offset = page.offset.unwrap_or(0);
    let limit = page.limit.unwrap_or(DEFAULT_PAGE);
    if offset < 0 || !(1..=MAX_PAGE).contains(&limit) {
        return Err(LocalError::bad_request(format!(
            "offset must be >= 0 and limit 1..={MAX_PAGE}"
        )));
    }
    let dir = dir.trim_matches('/');
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    let mut children: BTreeMap<String, (bool, u64, DateTime<Utc>)> = BTreeMap::new();
    for (path, size, mtime) in files {
        if !dir.is_empty() && path == dir {
            children.insert(leaf(path).to_owned(), (false, *size, *mtime));
            continue;
        }
        let Some(rest) = path.strip_prefix(&prefix) else {
            continue;
        };
        match rest.split_once('/') {
            Some((child, _)) => {
                let e = children
                    .entry(child.to_owned())
                    .or_insert((true, 0, *mtime));
                e.1 += size;
                e.2 = e.2.max(*mtime);
            }
            None => {
                children.insert(rest.to_owned(), (false, *size, *mtime));
            }
        }
    }
    if children.is_empty() && !dir.is_empty() {
        return Err(LocalError::not_found(format!("no such path {dir:?}")));
    }
    let total = children.len() as i64;
    let entries: Vec<_> = children
        .into_iter()
        .skip(offset as usize)
        .take(limit as usize)
        .map(
            |(name, (is_dir, size, mtime))| types::DirListingEntriesItem {
                kind: if is_dir { "dir" } else { "file" }.to_owned(),
                mtime: mtime.to_rfc3339(),
                name,
                size: size as i64,
            },
        )
        .collect();
    let next = offset + entries.len() as i64;
    Ok(types::DirListing {
        entries,
        limit,
        next_offset: (next < total).then_some(next),
        offset,
        total,
    })
}

fn leaf(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn source_files(state: &AppState, slug: &str) -> LocalResult<FileList> {
    let inner = state.store.lock();
    let ctx = inner.context(slug)?;
    Ok(ctx
        .sources
        .iter()
        .map(|(p, m)| (p.clone(), m.size, m.mtime))
        .collect())
}

async fn list_sources(
    State(state): Shared,
    Path(slug): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> LocalResult<axum::Json<types::DirListing>> {
    let files = source_files(&state, &slug)?;
    Ok(axum::Json(listing(&files, "", &page)?))
}

async fn list_sources_at(
    State(state): Shared,
    Path((slug, path)): Path<(String, String)>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> LocalResult<axum::Json<types::DirListing>> {
    let files = source_files(&state, &slug)?;
    Ok(axum::Json(listing(&files, &path, &page)?))
}

async fn read_source(
    State(state): Shared,
    Path((slug, path)): Path<(String, String)>,
) -> LocalResult<Response> {
    let data = {
        let inner = state.store.lock();
        let id = inner.context(&slug)?.id.clone();
        inner
            .sources
            .get(&id)
            .and_then(|s| s.get(path.trim_matches('/')))
            .cloned()
            .ok_or_else(|| LocalError::not_found(format!("no source file {path:?}")))?
    };
    Ok(octets(data))
}

fn octets(data: bytes::Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response()
}

// ---- curation and knowledge -------------------------------------------------

async fn curate_context(
    State(state): Shared,
    Path(slug): Path<String>,
    body: axum::body::Bytes,
) -> LocalResult<axum::Json<types::WorkflowTriggerResponse>> {
    // The body is optional: an empty one means the defaults.
    let opts: types::CurateContextBody = if body.iter().all(u8::is_ascii_whitespace) {
        types::CurateContextBody {
            batch_size: None,
            force: false,
            model: None,
            pinecone_api_key: None,
            scope: None,
            trigger: None,
        }
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| LocalError::bad_request(format!("invalid JSON body: {e}")))?
    };
    if let Some(m) = opts.model.as_deref()
        && m != LOCAL_MODEL
    {
        return Err(LocalError::bad_request(format!(
            "model {m:?} is not available locally; the only model is {LOCAL_MODEL:?}"
        )));
    }
    let task = curate::start(&state, &slug, opts.force, opts.scope, false)?;
    state.store.persist().await;
    Ok(axum::Json(types::WorkflowTriggerResponse {
        exploring: None,
        importing: None,
        profiling: None,
        state: "importing".to_owned(),
        task_id: task.id,
    }))
}

/// The curated knowledge of a context: one Markdown file per source under
/// `chunks/` (`.md` added when the source has another extension), listing
/// its chunks under their heading paths.
fn knowledge_files(state: &AppState, slug: &str) -> LocalResult<BTreeMap<String, String>> {
    let (index, curated_at) = {
        let inner = state.store.lock();
        let ctx = inner.context(slug)?;
        (inner.indexes.get(&ctx.id).cloned(), ctx.last_curated_at)
    };
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    if let (Some(index), Some(_)) = (index, curated_at) {
        for c in index.chunks() {
            let name = if c.source.ends_with(".md") {
                format!("chunks/{}", c.source)
            } else {
                format!("chunks/{}.md", c.source)
            };
            let body = files.entry(name).or_default();
            let heading = if c.section_path.is_empty() {
                c.source.clone()
            } else {
                c.section_path.join(" > ")
            };
            body.push_str(&format!("## {heading}\n\n{}\n\n", c.text));
        }
    }
    Ok(files)
}

fn knowledge_list(state: &AppState, slug: &str) -> LocalResult<FileList> {
    let curated_at = state
        .store
        .lock()
        .context(slug)?
        .last_curated_at
        .unwrap_or_else(Utc::now);
    Ok(knowledge_files(state, slug)?
        .into_iter()
        .map(|(p, body)| (p, body.len() as u64, curated_at))
        .collect())
}

async fn list_knowledge(
    State(state): Shared,
    Path(slug): Path<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> LocalResult<axum::Json<types::DirListing>> {
    let files = knowledge_list(&state, &slug)?;
    Ok(axum::Json(listing(&files, "", &page)?))
}

async fn list_knowledge_at(
    State(state): Shared,
    Path((slug, path)): Path<(String, String)>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> LocalResult<axum::Json<types::DirListing>> {
    let files = knowledge_list(&state, &slug)?;
    Ok(axum::Json(listing(&files, &path, &page)?))
}

async fn read_knowledge(
    State(state): Shared,
    Path((slug, path)): Path<(String, String)>,
) -> LocalResult<Response> {
    let body = knowledge_files(&state, &slug)?
        .remove(path.trim_matches('/'))
        .ok_or_else(|| LocalError::not_found(format!("no knowledge file {path:?}")))?;
    Ok(octets(body.into()))
}

// ---- tasks ------------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct TaskParams {
    workflow: Option<String>,
    state: Option<String>,
    context: Option<String>,
    q: Option<String>,
    limit: Option<i64>,
    page: Option<i64>,
    offset: Option<i64>,
}

async fn list_tasks(
    State(state): Shared,
    ApiQuery(p): ApiQuery<TaskParams>,
) -> LocalResult<axum::Json<types::ListTasksResponse>> {
    let limit = p.limit.unwrap_or(30);
    if !(1..=1000).contains(&limit) {
        return Err(LocalError::bad_request("limit must be 1..=1000"));
    }
    let page = p.page.unwrap_or(1);
    if page < 1 || p.offset.is_some_and(|o| o < 0) {
        return Err(LocalError::bad_request("page must be >= 1 and offset >= 0"));
    }
    let offset = p.offset.unwrap_or((page - 1) * limit);
    let inner = state.store.lock();
    let context_id = p
        .context
        .as_ref()
        .map(|c| inner.context_id(c).unwrap_or_else(|| c.clone()));
    let matching: Vec<&types::TaskResponse> = inner
        .tasks
        .values()
        .rev()
        .map(|t| &t.task)
        .filter(|t| {
            p.workflow
                .as_deref()
                .is_none_or(|w| t.workflow.as_str() == w)
        })
        .filter(|t| p.state.as_deref().is_none_or(|s| t.state.as_str() == s))
        .filter(|t| {
            context_id
                .as_deref()
                .is_none_or(|c| t.context_id.as_deref() == Some(c))
        })
        .filter(|t| p.q.as_deref().is_none_or(|q| t.id.contains(q)))
        .collect();
    let total = matching.len() as i64;
    let items = matching
        .into_iter()
        .skip(offset as usize)
        .take(limit as usize)
        .cloned()
        .collect();
    Ok(axum::Json(types::ListTasksResponse {
        items,
        limit,
        offset,
        page: offset / limit + 1,
        pages: (total + limit - 1) / limit,
        total,
    }))
}

async fn get_task(
    State(state): Shared,
    Path(id): Path<String>,
) -> LocalResult<axum::Json<types::TaskResponse>> {
    state
        .store
        .lock()
        .tasks
        .get(&id)
        .map(|t| axum::Json(t.task.clone()))
        .ok_or_else(|| LocalError::not_found(format!("task {id:?} not found")))
}

async fn cancel_task(State(state): Shared, Path(id): Path<String>) -> LocalResult<StatusCode> {
    {
        let mut inner = state.store.lock();
        let entry = inner
            .tasks
            .get(&id)
            .ok_or_else(|| LocalError::not_found(format!("task {id:?} not found")))?;
        entry.cancel.cancel();
        inner.end_task(
            &id,
            "cancelled",
            None,
            Some("cancelled on request".to_owned()),
        );
    }
    state.store.persist().await;
    Ok(StatusCode::OK)
}

// ---- models -----------------------------------------------------------------

async fn models() -> axum::Json<types::ModelCatalog> {
    axum::Json(types::ModelCatalog {
        default: LOCAL_MODEL.to_owned(),
        models: vec![types::ModelCatalogModelsItem {
            available: true,
            id: LOCAL_MODEL.to_owned(),
            label: "Local extractive answers (BM25 retrieval, quoted sentences)".to_owned(),
            provider: "local".to_owned(),
        }],
        phase_defaults: [("query".to_owned(), LOCAL_MODEL.to_owned())].into(),
        supported_curate_models: vec![LOCAL_MODEL.to_owned()],
        tiers: [("local".to_owned(), LOCAL_MODEL.to_owned())].into(),
    })
}

// ---- queries ----------------------------------------------------------------

async fn post_query(
    State(state): Shared,
    ApiJson(req): ApiJson<types::QueryRequest>,
) -> LocalResult<Response> {
    let stream = req.stream == Some(true);
    let background = req.background == Some(true);
    let accepted = turn::accept(&state, req)?;
    let log = accepted.log.clone();
    let query_id = accepted.plan.query_id.clone();
    state.store.persist().await;
    let runner_state = state.clone();
    state.spawn(turn::run(
        runner_state,
        accepted.plan,
        accepted.log,
        accepted.cancel,
    ));
    if stream {
        return Ok(sse(&state, log, 1));
    }
    if background {
        return Ok((StatusCode::ACCEPTED, axum::Json(accepted.query)).into_response());
    }
    log.wait_finished().await;
    let query = current_query(&state, &query_id)?;
    if query.status == "failed"
        && query
            .error
            .as_deref()
            .is_some_and(|e| e.contains("timed out"))
    {
        return Err(LocalError::new(
            StatusCode::GATEWAY_TIMEOUT,
            query.error.unwrap_or_default(),
        ));
    }
    Ok(axum::Json(query).into_response())
}

fn current_query(state: &AppState, id: &str) -> LocalResult<types::Query> {
    state
        .store
        .lock()
        .queries
        .get(id)
        .map(|q| q.query.clone())
        .ok_or_else(|| LocalError::not_found(format!("query {id:?} not found")))
}

/// The SSE answer following `log` from sequence `from`; the configured
/// fault cuts the connection after N frames.
fn sse(state: &AppState, log: Arc<EventLog>, from: u64) -> Response {
    let cut = state.faults.cut_after_frames();
    let frames = log
        .follow(from)
        .enumerate()
        .then(move |(i, frame)| async move {
            if cut.is_some_and(|n| i >= n) {
                // hyper flushes what it has buffered only while the body is
                // pending; pause so the frames before the cut reach the client.
                tokio::time::sleep(CUT_FLUSH).await;
                // An error ends the body without its final chunk: the client
                // sees the connection drop mid-stream, as on a network failure.
                return Err(std::io::Error::other("injected stream cut"));
            }
            Ok::<_, std::io::Error>(sse_event(&frame))
        });
    // Stop polling after the injected error.
    let frames = frames.scan(false, |failed, item| {
        let out = if *failed { None } else { Some(item) };
        if out.as_ref().is_some_and(Result::is_err) {
            *failed = true;
        }
        std::future::ready(out)
    });
    Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

fn sse_event(frame: &Frame) -> Event {
    let event = Event::default().event(&frame.event).data(&frame.data);
    match frame.seq {
        Some(seq) => event.id(seq.to_string()),
        None => event,
    }
}

async fn get_query(
    State(state): Shared,
    Path(id): Path<String>,
) -> LocalResult<axum::Json<types::Query>> {
    current_query(&state, &id).map(axum::Json)
}

async fn cancel_query(
    State(state): Shared,
    Path(id): Path<String>,
) -> LocalResult<axum::Json<types::Query>> {
    let (log, cancel, terminal) = {
        let inner = state.store.lock();
        let q = inner
            .queries
            .get(&id)
            .ok_or_else(|| LocalError::not_found(format!("query {id:?} not found")))?;
        (q.log.clone(), q.cancel.clone(), q.query.is_terminal())
    };
    if !terminal {
        cancel.cancel();
        let _ = tokio::time::timeout(CANCEL_WAIT, log.wait_finished()).await;
    }
    current_query(&state, &id).map(axum::Json)
}

async fn query_events(
    State(state): Shared,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> LocalResult<Response> {
    let from = match headers.get("last-event-id") {
        None => 1,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                LocalError::bad_request("Last-Event-ID must be an event sequence number")
            })?,
    };
    let log = state
        .store
        .lock()
        .queries
        .get(&id)
        .map(|q| q.log.clone())
        .ok_or_else(|| LocalError::not_found(format!("query {id:?} not found")))?;
    Ok(sse(&state, log, from))
}

async fn query_trace(
    State(state): Shared,
    Path(id): Path<String>,
) -> LocalResult<axum::Json<types::Trace>> {
    let inner = state.store.lock();
    let q = inner
        .queries
        .get(&id)
        .ok_or_else(|| LocalError::not_found(format!("query {id:?} not found")))?;
    q.trace
        .clone()
        .map(axum::Json)
        .ok_or_else(|| LocalError::not_found("the trace is available once the turn has ended"))
}

#[derive(Debug, Deserialize)]
struct FeedbackBody {
    rating: String,
    comment: Option<String>,
}

async fn query_feedback(
    State(state): Shared,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<FeedbackBody>,
) -> LocalResult<StatusCode> {
    if !matches!(body.rating.as_str(), "up" | "down") {
        return Err(LocalError::bad_request("rating must be \"up\" or \"down\""));
    }
    if body
        .comment
        .as_ref()
        .is_some_and(|c| c.chars().count() > 2000)
    {
        return Err(LocalError::bad_request(
            "comment must be at most 2000 characters",
        ));
    }
    {
        let mut inner = state.store.lock();
        let q = inner
            .queries
            .get_mut(&id)
            .ok_or_else(|| LocalError::not_found(format!("query {id:?} not found")))?;
        q.query.feedback = Some(types::QueryFeedback {
            comment: body.comment,
            rating: body.rating,
        });
    }
    state.store.persist().await;
    Ok(StatusCode::NO_CONTENT)
}

// ---- sessions ---------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct SessionParams {
    limit: Option<i64>,
}

async fn list_sessions(
    State(state): Shared,
    ApiQuery(p): ApiQuery<SessionParams>,
) -> LocalResult<axum::Json<types::ListSessionsResponse>> {
    let limit = p.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(LocalError::bad_request("limit must be 1..=200"));
    }
    let inner = state.store.lock();
    let mut sessions: Vec<types::Session> =
        inner.sessions.values().map(|s| s.session.clone()).collect();
    sessions.sort_by(|a, b| b.updated_at.cmp(&a.updated_at).then(b.id.cmp(&a.id)));
    sessions.truncate(limit as usize);
    Ok(axum::Json(types::ListSessionsResponse { sessions }))
}

async fn get_session(
    State(state): Shared,
    Path(id): Path<String>,
) -> LocalResult<axum::Json<types::GetSessionResponse>> {
    let inner = state.store.lock();
    let s = inner
        .sessions
        .get(&id)
        .ok_or_else(|| LocalError::not_found(format!("session {id:?} not found")))?;
    let queries = s
        .query_ids
        .iter()
        .filter_map(|q| inner.queries.get(q))
        .map(|q| q.query.clone())
        .collect();
    let s = s.session.clone();
    Ok(axum::Json(types::GetSessionResponse {
        created_at: s.created_at,
        created_by: s.created_by,
        guardrails: s.guardrails,
        id: s.id,
        last_query_id: s.last_query_id,
        models: s.models,
        project_id: s.project_id,
        queries,
        scope: s.scope,
        system_prompt: s.system_prompt,
        title: s.title,
        tools: s.tools,
        updated_at: s.updated_at,
        workflow: s.workflow,
        workspace: s.workspace,
    }))
}

async fn delete_session(
    State(state): Shared,
    Path(id): Path<String>,
) -> axum::Json<types::DeleteSessionResponse> {
    let deleted = {
        let mut inner = state.store.lock();
        match inner.sessions.remove(&id) {
            Some(s) => {
                for q in &s.query_ids {
                    if let Some(entry) = inner.queries.get(q) {
                        entry.cancel.cancel();
                    }
                }
                true
            }
            None => false,
        }
    };
    if deleted {
        state.store.persist().await;
    }
    axum::Json(types::DeleteSessionResponse { deleted })
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use tower::ServiceExt;

    use super::*;
    use crate::local::faults::Faults;
    use crate::local::state::Config;
    use crate::local::store::Store;

    fn app(api_key: Option<&str>) -> Router {
        let config = Config {
            api_key: api_key.map(str::to_owned),
            data_dir: None,
            upload_limit: 1024,
            json_limit: 256,
            context_bytes_limit: 1 << 20,
            events_per_query: 100,
            chunk_chars: 1200,
        };
        let faults = Faults::new(None, Duration::ZERO, 0, 1);
        router(AppState::new(config, Store::in_memory(), faults))
    }

    async fn call(
        app: Router,
        req: axum::http::Request<Body>,
    ) -> (StatusCode, HeaderMap, types::Error) {
        let resp = app.oneshot(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let bytes = axum::body::to_bytes(body, 1 << 16).await.unwrap();
        let err = serde_json::from_slice(&bytes).unwrap_or(types::Error {
            code: None,
            message: String::new(),
        });
        (parts.status, parts.headers, err)
    }

    fn get(uri: &str) -> axum::http::Request<Body> {
        axum::http::Request::get(uri).body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn every_error_is_the_envelope_and_echoes_the_version() {
        let (status, headers, err) = call(app(None), get("/api/nope")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(!err.message.is_empty());
        assert_eq!(headers[VERSION_HEADER], "2026-07");
        let (status, _, err) = call(app(None), get("/elsewhere")).await;
        assert_eq!(
            (status, err.message.is_empty()),
            (StatusCode::NOT_FOUND, false)
        );
        let (status, _, err) = call(
            app(None),
            axum::http::Request::delete("/api/models")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert!(err.message.contains("method"));
        let (status, _, err) = call(app(None), get("/api/project")).await;
        assert_eq!(status, StatusCode::NOT_IMPLEMENTED);
        assert!(err.message.contains("get_project"));
    }

    #[tokio::test]
    async fn versions_are_checked_before_anything_else() {
        let req = axum::http::Request::get("/api/models")
            .header(VERSION_HEADER, "unstable")
            .body(Body::empty())
            .unwrap();
        let (status, headers, _) = call(app(None), req).await;
        assert_eq!(
            (status, &headers[VERSION_HEADER]),
            (StatusCode::OK, &HeaderValue::from_static("unstable"))
        );
        let req = axum::http::Request::get("/api/models")
            .header(VERSION_HEADER, "2020-01")
            .body(Body::empty())
            .unwrap();
        let (status, _, err) = call(app(Some("k")), req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(err.code.as_deref(), Some("unsupported_api_version"));
    }

    #[tokio::test]
    async fn a_configured_key_is_required_except_for_login() {
        let (status, _, _) = call(app(Some("k")), get("/api/models")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let req = axum::http::Request::get("/api/models")
            .header(KEY_HEADER, "k")
            .body(Body::empty())
            .unwrap();
        assert_eq!(call(app(Some("k")), req).await.0, StatusCode::OK);
        let login = |key: &str| {
            axum::http::Request::post("/api/auth/login")
                .header("content-type", "application/json")
                .body(Body::from(format!("{{\"api_key\":\"{key}\"}}")))
                .unwrap()
        };
        assert_eq!(
            call(app(Some("k")), login("wrong")).await.0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(call(app(Some("k")), login("k")).await.0, StatusCode::OK);
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd") && !constant_time_eq(b"abc", b"ab"));
    }

    #[tokio::test]
    async fn json_bodies_are_checked_and_bounded() {
        let post = |body: String| {
            axum::http::Request::post("/api/contexts")
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap()
        };
        let (status, _, err) = call(app(None), post("{oops".into())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(!err.message.is_empty());
        let (status, _, err) = call(app(None), post(r#"{"slug": 1}"#.into())).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(!err.message.is_empty());
        let big = format!(r#"{{"slug":"a","name":"{}"}}"#, "x".repeat(1000));
        assert_eq!(
            call(app(None), post(big)).await.0,
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }

    #[test]
    fn listings_show_direct_children_with_paging() {
        let now = Utc::now();
        let files: FileList = vec![
            ("a/x.md".into(), 3, now),
            ("a/y.md".into(), 4, now),
            ("a/sub/z.md".into(), 5, now),
            ("top.txt".into(), 1, now),
        ];
        let page = PageParams {
            offset: None,
            limit: None,
        };
        let root = listing(&files, "", &page).unwrap();
        let names: Vec<_> = root
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.kind.as_str(), e.size))
            .collect();
        assert_eq!(names, [("a", "dir", 12), ("top.txt", "file", 1)]);
        let paged = listing(
            &files,
            "a",
            &PageParams {
                offset: Some(1),
                limit: Some(1),
            },
        )
        .unwrap();
        assert_eq!(
            (
                paged.total,
                paged.next_offset,
                paged.entries[0].name.as_str()
            ),
            (3, Some(2), "x.md")
        );
        assert_eq!(
            listing(&files, "nope", &page).unwrap_err().status,
            StatusCode::NOT_FOUND
        );
        assert!(
            listing(
                &files,
                "",
                &PageParams {
                    offset: None,
                    limit: Some(0)
                }
            )
            .is_err()
        );
    }
}
