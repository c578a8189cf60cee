//! Connectors: the local directory connector's lifecycle (create, list
//! items, enable on a context, import, delete) and its local OAuth flow.

use std::path::PathBuf;

use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde::Deserialize;

use super::Shared;
use super::tree_request::{At, On, Posted};
use crate::local::connectors::{self, ConnectorRecord, ImportPlan, LOCAL_PROVIDER, MAX_CONNECTORS};
use crate::local::error::{ApiJson, ApiQuery, LocalError, LocalResult};
use crate::local::import;
use crate::local::state::AppState;
use crate::local::store::new_id;
use crate::types;

fn not_found(id: &str) -> LocalError {
    LocalError::not_found(format!("connector {id:?} not found"))
}

fn check_provider(provider: &str) -> LocalResult<()> {
    if provider == LOCAL_PROVIDER {
        Ok(())
    } else {
        Err(LocalError::bad_request(format!(
            "provider {provider:?} is not available offline; the local server offers only {LOCAL_PROVIDER:?} (a directory on this machine)"
        )))
    }
}

/// Resolves a directory off the async threads.
async fn resolve(state: &AppState, path: String) -> LocalResult<PathBuf> {
    let roots = state.config.connector_roots.clone();
    tokio::task::spawn_blocking(move || connectors::resolve_root(&path, &roots))
        .await
        .map_err(|e| LocalError::internal("checking a connector directory", e))?
}

/// Records a new connector reading `root` and saves it.
async fn add(
    state: &AppState,
    root: PathBuf,
    label: Option<String>,
) -> LocalResult<ConnectorRecord> {
    let (rec, ticket) = {
        let mut inner = state.store.change();
        if inner.connectors().len() >= MAX_CONNECTORS {
            return Err(LocalError::bad_request(format!(
                "the local server holds at most {MAX_CONNECTORS} connectors; delete one first"
            )));
        }
        let now = Utc::now();
        let rec = ConnectorRecord {
            id: new_id("con"),
            provider: LOCAL_PROVIDER.to_owned(),
            account_label: Some(label.unwrap_or_else(|| root.display().to_string())),
            root,
            created_at: now,
            updated_at: now,
            contexts: Default::default(),
        };
        inner.put_connector(rec.clone());
        (rec, inner.commit())
    };
    state.store.saved(ticket).await?;
    Ok(rec)
}

pub(super) async fn list(State(state): Shared) -> axum::Json<Vec<types::ConnectorView>> {
    let inner = state.store.read();
    axum::Json(inner.connectors().values().map(|c| c.to_view()).collect())
}

pub(super) async fn get(At(state, id, _): On) -> LocalResult<axum::Json<types::ConnectorView>> {
    let inner = state.store.read();
    let c = inner.connectors().get(&id).ok_or_else(|| not_found(&id))?;
    Ok(axum::Json(c.to_view()))
}

pub(super) async fn delete(
    At(state, id, _): On,
) -> LocalResult<axum::Json<types::DeleteConnectorResponse>> {
    let ticket = {
        let mut inner = state.store.change();
        inner.remove_connector(&id).ok_or_else(|| not_found(&id))?;
        inner.commit()
    };
    state.store.saved(ticket).await?;
    Ok(axum::Json(types::DeleteConnectorResponse { deleted: id }))
}

/// Creates a `local` connector: `api_key` names the directory (absolute,
/// or relative to the first connector root), which must lie below a root.
pub(super) async fn create(
    Posted(state, provider, body): Posted<types::CreateConnectorBody>,
) -> LocalResult<axum::Json<types::ConnectorView>> {
    check_provider(&provider)?;
    let root = resolve(&state, body.api_key).await?;
    let label = body.account_label.filter(|l| !l.trim().is_empty());
    Ok(axum::Json(add(&state, root, label).await?.to_view()))
}

/// The path ending of the OAuth callback (a GET that changes state, held
/// to the rules of writes).
pub(super) const OAUTH_CALLBACK_SUFFIX: &str = "/oauth/local/callback";

#[derive(Debug, Deserialize)]
pub(super) struct OauthParams {
    return_to: Option<String>,
}

/// The local OAuth flow, first step: changes nothing. Checks that a
/// connector root exists and answers an authorize URL on this server —
/// its callback with a one-time `state` token, which makes the connector.
pub(super) async fn start_oauth(
    At(state, provider, _): On,
    headers: HeaderMap,
    OriginalUri(uri): OriginalUri,
    ApiQuery(params): ApiQuery<OauthParams>,
) -> LocalResult<axum::Json<types::StartConnectorOauthResponse>> {
    check_provider(&provider)?;
    resolve(&state, first_root(&state)).await?;
    // The Host was checked against the policy before this handler ran.
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| uri.authority().map(|a| a.to_string()))
        .ok_or_else(|| LocalError::bad_request("the request names no Host"))?;
    let token = state
        .oauth
        .start(params.return_to)
        .map_err(|e| LocalError::internal("no random source for an OAuth state", e))?;
    // The callback beside this route, wherever the API is mounted.
    let path = uri.path();
    let base = path.strip_suffix("/start").unwrap_or(path);
    Ok(axum::Json(types::StartConnectorOauthResponse {
        authorize_url: format!("http://{host}{base}/callback?state={token}"),
    }))
}

#[derive(Debug, Deserialize)]
pub(super) struct CallbackParams {
    state: Option<String>,
}

/// The local OAuth flow, second step: with a `state` handed out by the
/// start (once), connects the first connector root (reusing a connector
/// already on it). Answers the connector, or with a `return_to` given at
/// the start, 303 to it with `connector_id` added.
pub(super) async fn oauth_callback(
    At(state, provider, params): On<CallbackParams>,
) -> LocalResult<Response> {
    check_provider(&provider)?;
    let return_to = params
        .state
        .as_deref()
        .and_then(|s| state.oauth.complete(s))
        .ok_or_else(|| {
            LocalError::bad_request(
                "unknown, expired or used OAuth state: start the flow again with GET /connectors/oauth/local/start",
            )
        })?;
    let root = resolve(&state, first_root(&state)).await?;
    let existing = {
        let inner = state.store.read();
        inner
            .connectors()
            .values()
            .find(|c| c.root == root)
            .cloned()
    };
    let rec = match existing {
        Some(rec) => rec,
        None => add(&state, root, None).await?,
    };
    Ok(match return_to {
        Some(to) => {
            let sep = if to.contains('?') { '&' } else { '?' };
            let target = format!("{to}{sep}connector_id={}", rec.id);
            match HeaderValue::try_from(target) {
                Ok(v) => (StatusCode::SEE_OTHER, [(header::LOCATION, v)]).into_response(),
                Err(_) => axum::Json(rec.to_view()).into_response(),
            }
        }
        None => axum::Json(rec.to_view()).into_response(),
    })
}

/// The first connector root as configured (empty without one).
fn first_root(state: &AppState) -> String {
    state
        .config
        .connector_roots
        .first()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

#[derive(Debug, Deserialize)]
pub(super) struct ItemParams {
    folder: Option<String>,
}

pub(super) async fn items(
    At(state, id, params): On<ItemParams>,
) -> LocalResult<axum::Json<types::ListConnectorItemsResponse>> {
    let root = {
        let inner = state.store.read();
        inner
            .connectors()
            .get(&id)
            .ok_or_else(|| not_found(&id))?
            .root
            .clone()
    };
    let folder = params.folder.unwrap_or_default();
    let asked = folder.clone();
    let items = tokio::task::spawn_blocking(move || connectors::list_items(&root, &asked))
        .await
        .map_err(|e| LocalError::internal("listing a connector folder", e))?
        .map_err(|e| {
            tracing::debug!(error = %e, "a connector folder could not be listed");
            LocalError::not_found(format!("no folder {folder:?} in the connector"))
        })?;
    Ok(axum::Json(types::ListConnectorItemsResponse {
        folder: folder.trim_matches('/').to_owned(),
        items,
    }))
}

pub(super) async fn list_for_context(
    At(state, slug, _): On,
) -> LocalResult<axum::Json<Vec<types::ContextConnectorView>>> {
    let inner = state.store.read();
    let id = inner.context(&slug)?.id.clone();
    Ok(axum::Json(
        inner
            .connectors()
            .values()
            .map(|c| c.to_context_view(&id))
            .collect(),
    ))
}

pub(super) async fn update_for_context(
    State(state): Shared,
    Path((slug, connector_id)): Path<(String, String)>,
    ApiJson(body): ApiJson<types::UpdateContextConnectorBody>,
) -> LocalResult<axum::Json<types::ContextConnectorView>> {
    let (view, ticket) = {
        let mut guard = state.store.change();
        let inner = &mut *guard;
        let id = inner.context(&slug)?.id.clone();
        let live: std::collections::BTreeSet<String> = inner.contexts().keys().cloned().collect();
        let c = inner
            .connector_mut(&connector_id)
            .ok_or_else(|| not_found(&connector_id))?;
        if body.enabled {
            c.contexts.insert(id.clone(), true);
        } else {
            c.contexts.remove(&id);
        }
        // Contexts deleted since are forgotten.
        c.contexts.retain(|k, _| live.contains(k));
        c.updated_at = Utc::now();
        let view = c.to_context_view(&id);
        (view, guard.commit())
    };
    state.store.saved(ticket).await?;
    Ok(axum::Json(view))
}

/// Imports from a connector enabled on the context: every file below
/// `folder` (or the named `files` in it, or with `item_type: file` the file
/// `folder` names), landing below `path` in the sources; run as an
/// `import` task like an upload.
pub(super) async fn import(
    Posted(state, slug, body): Posted<types::ImportContextSourcesBody>,
) -> LocalResult<axum::Json<types::WorkflowTriggerResponse>> {
    let (root, label) = {
        let inner = state.store.read();
        let ctx = inner.context(&slug)?;
        let c = inner
            .connectors()
            .get(&body.connector_id)
            .ok_or_else(|| not_found(&body.connector_id))?;
        if !c.contexts.get(&ctx.id).copied().unwrap_or(false) {
            return Err(LocalError::conflict(format!(
                "connector {:?} is not enabled on context {:?}; enable it first",
                c.id, ctx.slug
            )));
        }
        if ctx.importing {
            return Err(LocalError::conflict(format!(
                "an import is already running on context {:?}",
                ctx.slug
            )));
        }
        (c.root.clone(), c.account_label.clone().unwrap_or_default())
    };
    let mut folder = body.folder.unwrap_or_default().trim_matches('/').to_owned();
    let mut files = body.files;
    if body.item_type == "file" && files.is_empty() {
        let (parent, leaf) = match folder.rsplit_once('/') {
            Some((p, l)) => (p.to_owned(), l.to_owned()),
            None => (String::new(), folder.clone()),
        };
        folder = parent;
        files = vec![leaf];
    } else if !matches!(body.item_type.as_str(), "file" | "folder") {
        return Err(LocalError::bad_request(format!(
            "unknown item_type {:?}: use folder or file",
            body.item_type
        )));
    }
    let dest = match body.path.as_deref().map(|p| p.trim_matches('/')) {
        None | Some("") => String::new(),
        Some(p) => import::safe_path(p)
            .ok_or_else(|| LocalError::bad_request(format!("unsafe path {p:?}")))?,
    };
    let plan = ImportPlan {
        folder,
        files,
        dest,
        limit: state.config.context_bytes_limit,
        sync: state.store.is_persistent(),
    };
    // Owned by this request until the import takes it over: every way out
    // before that removes what was staged.
    let staging = import::StagingRoot::new(state.store.staging_dir());
    let dest = plan.dest.clone();
    // The task that writes the files owns the staging root, so a request
    // that goes away meanwhile removes them after they are written.
    let (staging, files) = tokio::task::spawn_blocking(move || {
        let files_dir = import::Staged::files_dir(staging.path());
        let files = connectors::stage(&root, &plan, &files_dir);
        (staging, files)
    })
    .await
    .map_err(|e| LocalError::internal("staging the connector's files", e))?;
    let files = files?;
    let staged = import::Staged {
        name: format!("connector {label}"),
        dir: dest,
        root: staging,
        files,
        skipped: Vec::new(),
        skipped_count: 0,
    };
    Ok(axum::Json(import::start(&state, &slug, staged).await?))
}
