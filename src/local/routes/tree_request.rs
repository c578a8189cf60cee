//! What every route on one named thing (a context, a task, a session, a
//! query, a connector) or on a place in a file tree (a context's sources
//! or knowledge, a task's files) is asked, extracted once.

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::PageParams;
use crate::local::error::{ApiJson, ApiQuery, LocalError};
use crate::local::state::AppState;

/// The path of a tree route: `/{owner}/…` and, but on a listing of the
/// top, `/{*path}`.
#[derive(Debug, Deserialize)]
struct TreePath {
    /// The tree's owner, or the thing named: a context slug, an id or a
    /// provider.
    #[serde(alias = "slug", alias = "id", alias = "provider")]
    owner: String,
    /// The place in the tree; absent for the top.
    #[serde(default)]
    path: String,
}

/// Query parameters of a route that reads none (any are accepted).
#[derive(Debug, Deserialize)]
pub(super) struct NoParams {}

/// A request on a place in a file tree: the server, the tree's owner (a
/// context slug or a task id), the path in the tree (`""` for the top)
/// and the query parameters `Q` the route reads.
#[derive(Debug)]
pub(super) struct TreeAt<Q = NoParams> {
    pub(super) state: Arc<AppState>,
    pub(super) owner: String,
    pub(super) path: String,
    pub(super) query: Q,
}

/// A listing of a folder in a file tree, with the page asked for.
pub(super) type Listing = TreeAt<PageParams>;

impl<Q> TreeAt<Q> {
    /// The server, the owner and the path.
    pub(super) fn into_parts(self) -> (Arc<AppState>, String, String) {
        (self.state, self.owner, self.path)
    }
}

impl<Q: DeserializeOwned + Send> FromRequestParts<Arc<AppState>> for TreeAt<Q> {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let Path(at) = Path::<TreePath>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let ApiQuery(query) = ApiQuery::<Q>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(TreeAt {
            state: state.clone(),
            owner: at.owner,
            path: at.path,
            query,
        })
    }
}

/// A request on one named thing (`/{slug}`, `/{id}` or `/{provider}`): the
/// server, the name and the query parameters `Q` the route reads.
#[derive(Debug)]
pub(super) struct On<Q = NoParams>(pub(super) Arc<AppState>, pub(super) String, pub(super) Q);

impl<Q: DeserializeOwned + Send> FromRequestParts<Arc<AppState>> for On<Q> {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let at = TreeAt::<Q>::from_request_parts(parts, state).await?;
        Ok(On(at.state, at.owner, at.query))
    }
}

/// A request posting a JSON body `B` to one named thing: the server, the
/// name and the body.
#[derive(Debug)]
pub(super) struct Posted<B>(pub(super) Arc<AppState>, pub(super) String, pub(super) B);

impl<B: DeserializeOwned> FromRequest<Arc<AppState>> for Posted<B> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let On(app, key, NoParams {}) = On::from_request_parts(&mut parts, state).await?;
        let ApiJson(body) = ApiJson::<B>::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Posted(app, key, body))
    }
}

/// A JSON body that may be left out: an empty (or blank) body reads as
/// `{}`, so every field takes its default.
#[derive(Debug)]
pub(super) struct OptionalJson<B>(pub(super) B);

impl<B: DeserializeOwned> FromRequest<Arc<AppState>> for OptionalJson<B> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(text)
            .map(OptionalJson)
            .map_err(|e| LocalError::bad_request(format!("invalid JSON body: {e}")).into_response())
    }
}
