//! The HTTP surface: every path of the 2026-07 API under `/api`, with the
//! Host/Origin, version and auth checks in one middleware. Handlers live
//! in one file per resource.

mod auth;
mod connectors;
mod context_ops;
mod contexts;
mod files;
mod knowledge;
mod project;
mod queries;
mod rate_limit;
mod sessions;
mod sources;
mod task_files;
mod tasks;
mod tree_request;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::constant_time::constant_time_eq;
use super::error::{LocalError, LocalResult};
use super::state::AppState;
use crate::types;

/// The `X-Pinecone-Api-Version` header.
const VERSION_HEADER: &str = "x-pinecone-api-version";
/// The API key header.
const KEY_HEADER: &str = "x-pinecone-api-key";
/// The version answered when a request names none.
const DEFAULT_VERSION: &str = "2026-07";
/// Default and largest page of a directory listing.
const DEFAULT_PAGE: i64 = 100;
const MAX_PAGE: i64 = 1000;

/// The state every handler extracts.
type Shared = State<Arc<AppState>>;

/// The routes below `/contexts`; an upload's body may reach `upload_limit`.
fn context_routes(upload_limit: usize) -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/contexts",
            get(contexts::list_contexts).post(contexts::create_context),
        )
        .route(
            "/contexts/{slug}",
            get(contexts::get_context)
                .put(contexts::update_context)
                .delete(contexts::delete_context),
        )
        .route(
            "/contexts/{slug}/import/upload",
            post(sources::upload).layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route("/contexts/{slug}/source/list", get(sources::list_sources))
        .route(
            "/contexts/{slug}/source/list/{*path}",
            get(sources::list_sources),
        )
        .route(
            "/contexts/{slug}/source/read/{*path}",
            get(sources::read_source),
        )
        .route(
            "/contexts/{slug}/curate",
            post(contexts::curate_context).get(context_ops::curation_ledger),
        )
        .route(
            "/contexts/{slug}/knowledge/list",
            get(knowledge::list_knowledge),
        )
        .route(
            "/contexts/{slug}/knowledge/list/{*path}",
            get(knowledge::list_knowledge),
        )
        .route(
            "/contexts/{slug}/knowledge/read/{*path}",
            get(knowledge::read_knowledge),
        )
        .route(
            "/contexts/{slug}/connectors",
            get(connectors::list_for_context),
        )
        .route(
            "/contexts/{slug}/connectors/{connector_id}",
            put(connectors::update_for_context),
        )
        .route("/contexts/{slug}/fork", post(context_ops::fork))
        .route("/contexts/{slug}/manifest", get(context_ops::manifest))
        .route(
            "/contexts/{slug}/tasks/stats",
            get(project::context_task_stats),
        )
        .route(
            "/contexts/{slug}/curate/delete-sources",
            post(files::delete_curated_sources),
        )
        .route("/contexts/{slug}/optimize", post(context_ops::optimize))
        .route("/contexts/{slug}/explore", post(context_ops::explore))
        .route("/contexts/{slug}/profile", post(context_ops::profile))
        .route("/contexts/{slug}/import", post(connectors::import))
        .route("/contexts/{slug}/source/stats", get(files::source_stats))
        .route(
            "/contexts/{slug}/source/manifest",
            get(files::source_manifest),
        )
        .route(
            "/contexts/{slug}/source/delete/{*path}",
            delete(files::delete_source_file),
        )
        .route(
            "/contexts/{slug}/knowledge/stats",
            get(files::knowledge_stats),
        )
}

/// The routes of login, tasks, turns, sessions, the project and connectors.
fn service_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/auth/login", post(auth::login))
        .route("/auth", get(auth::identity))
        .route("/tasks", get(tasks::list_tasks))
        .route(
            "/tasks/{id}",
            get(tasks::get_task).delete(tasks::cancel_task),
        )
        .route("/models", get(queries::models))
        .route("/query", post(queries::post_query))
        .route("/queries/{id}", get(queries::get_query))
        .route("/queries/{id}/cancel", post(queries::cancel_query))
        .route("/queries/{id}/events", get(queries::query_events))
        .route("/queries/{id}/trace", get(queries::query_trace))
        .route("/queries/{id}/feedback", post(queries::query_feedback))
        .route("/sessions", get(sessions::list_sessions))
        .route(
            "/sessions/{id}",
            get(sessions::get_session).delete(sessions::delete_session),
        )
        .route("/project", get(project::get_project))
        .route("/local/storage", get(project::storage))
        .route("/stats", get(project::project_task_stats))
        .route("/manifest/templates", get(project::manifest_templates))
        .route("/connectors", get(connectors::list))
        .route(
            "/connectors/{id}",
            get(connectors::get).delete(connectors::delete),
        )
        .route("/connectors/{id}/items", get(connectors::items))
        .route(
            "/connectors/oauth/{provider}/start",
            get(connectors::start_oauth),
        )
        .route(
            "/connectors/oauth/{provider}/callback",
            get(connectors::oauth_callback),
        )
        .route("/connectors/keys/{provider}", post(connectors::create))
        .route("/tasks/{id}/stats", get(project::task_stats))
        .route("/tasks/{id}/files/read/{*path}", get(task_files::read))
        .route(
            "/tasks/{id}/files/metadata/{*path}",
            get(task_files::metadata),
        )
        .route("/tasks/{id}/files/list", get(task_files::list))
        .route("/tasks/{id}/files/list/{*path}", get(task_files::list))
        .route(
            "/tasks/{id}/files/delete/{*path}",
            delete(task_files::delete),
        )
}

/// The whole application: `/api/...` plus error answers for anything else.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    let upload_limit = state.config.upload_limit.saturating_add(64 * 1024);
    let json_limit = state.config.json_limit;
    let api = context_routes(upload_limit)
        .merge(service_routes())
        .method_not_allowed_fallback(method_not_allowed);
    let mut api = api;
    if let Some((requests, window)) = state.config.rate_limit {
        let limiter = Arc::new(rate_limit::Limiter::new(requests, window));
        api = api.layer(middleware::from_fn_with_state(
            limiter,
            rate_limit::simulate,
        ));
    }
    Router::new()
        .nest("/api", api)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), gate))
        .layer(DefaultBodyLimit::max(json_limit))
        .layer(middleware::from_fn(rate_limit::request_id))
        .with_state(state)
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
        Ok(()) => {
            // Its body must keep arriving (a trickle is cut).
            let req = req.map(super::serve::paced_body);
            next.run(req).await
        }
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

/// Bytes a write request may add to the state database's backlog: its
/// announced body (`Content-Length`), except an upload's, which is staged
/// on disk and never written to the database.
fn database_bytes_of(req: &Request) -> u64 {
    if req.uri().path().ends_with("/import/upload") {
        return 0;
    }
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// Whether a write of `own` bytes, on top of a `backlog` of bytes waiting
/// to be written, passes `limit` while something already waits.
fn backlog_would_overflow(backlog: u64, own: u64, limit: u64) -> bool {
    backlog > 0 && backlog.saturating_add(own) > limit
}

fn check(state: &AppState, req: &Request, asked: Option<&str>) -> LocalResult<()> {
    let headers = req.headers();
    // HTTP/2 carries the host in the request's authority rather than `Host`.
    let host = crate::host_origin::HostPolicy::request_host(req.uri(), headers);
    let origin = headers.get(header::ORIGIN).map(HeaderValue::as_bytes);
    if let Err(refusal) = state.policy.check_request(req.uri(), headers) {
        tracing::warn!(%refusal, "request refused");
        return Err(LocalError::forbidden(refusal.to_string()));
    }
    // What changes state must come from this server's own pages (or an
    // origin allowed explicitly); the OAuth callback changes state too.
    let reads = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let changes = !reads
        || req
            .uri()
            .path()
            .ends_with(connectors::OAUTH_CALLBACK_SUFFIX);
    if changes
        && let Err(refusal) = state.policy.check_write(
            host.unwrap_or_default(),
            origin,
            headers.get("sec-fetch-site").map(HeaderValue::as_bytes),
        )
    {
        tracing::warn!(%refusal, "request refused");
        return Err(LocalError::forbidden(refusal.to_string()));
    }
    if let Some(secs) = state.faults.take_503() {
        return Err(LocalError::unavailable(secs));
    }
    // What is in memory may be ahead of the disk once a write failed: no
    // answer, read or write, comes from it (the server is stopping).
    if state.store.has_failed() {
        return Err(LocalError::not_saved());
    }
    // A write is refused before it changes anything when the database
    // writer is behind and the request's own body would take its backlog
    // past the limit (a write alone fits whatever its size: it can only be
    // served once nothing waits).
    if !reads
        && backlog_would_overflow(
            state.store.write_backlog(),
            database_bytes_of(req),
            state.config.write_backlog_limit,
        )
    {
        return Err(LocalError::write_backlog_full());
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
    let by_key = headers
        .get(KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| constant_time_eq(v.as_bytes(), key.as_bytes()));
    let by_token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .is_some_and(|t| state.knows_token(t));
    if by_key || by_token {
        Ok(())
    } else {
        Err(LocalError::unauthorized(
            "missing or invalid credentials: send X-Pinecone-Api-Key or a bearer token from POST /auth/login",
        ))
    }
}

/// The token of an `Authorization: Bearer <token>` value (scheme matched
/// case-insensitively, as RFC 9110 asks).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
        .filter(|t| !t.is_empty())
}

#[derive(Debug, Deserialize)]
pub(super) struct PageParams {
    offset: Option<i64>,
    limit: Option<i64>,
}

/// The size of a page asked for (`default` when not given), refused
/// outside `1..=max`.
pub(super) fn page_limit(limit: Option<i64>, default: i64, max: i64) -> LocalResult<i64> {
    let limit = limit.unwrap_or(default);
    if !(1..=max).contains(&limit) {
        return Err(LocalError::bad_request(format!("limit must be 1..={max}")));
    }
    Ok(limit)
}

/// `(path, size, mtime)` of every file of a tree.
pub(super) type FileList = Vec<(String, u64, DateTime<Utc>)>;

/// Lists the direct children of `dir` in a flat file list.
pub(super) fn listing(
    files: &FileList,
    dir: &str,
    page: &PageParams,
) -> LocalResult<types::DirListing> {
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
        .skip(usize::try_from(offset).unwrap_or(usize::MAX))
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
    let next = offset.saturating_add(i64::try_from(entries.len()).unwrap_or(i64::MAX));
    Ok(types::DirListing {
        entries,
        limit,
        next_offset: (next < total).then_some(next),
        offset,
        total,
    })
}

/// Refuses (409) a change to the files of `ctx` while an import runs on
/// it; `retry` says when to ask again.
pub(super) fn refuse_while_importing(
    ctx: &crate::local::records::ContextRecord,
    retry: &str,
) -> LocalResult<()> {
    if ctx.importing {
        return Err(LocalError::conflict(format!(
            "an import is running on context {:?}; {retry}",
            ctx.slug
        )));
    }
    Ok(())
}

pub(super) fn leaf(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

pub(super) fn octets(data: bytes::Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use tower::ServiceExt;

    use super::*;

    use axum::http::HeaderMap;

    fn app(api_key: Option<&str>) -> Router {
        router(AppState::for_tests(api_key, 256, 8808))
    }

    async fn call(
        app: Router,
        mut req: axum::http::Request<Body>,
    ) -> (StatusCode, HeaderMap, types::Error) {
        req.headers_mut()
            .entry(header::HOST)
            .or_insert(HeaderValue::from_static("127.0.0.1:8808"));
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
        let (status, _, _) = call(app(None), get("/api/project")).await;
        assert_eq!(status, StatusCode::OK);
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
