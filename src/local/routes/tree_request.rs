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

/// The place of a tree route: `/{owner}/…` and, but on a listing of the
/// top, `/{*path}`.
#[derive(Debug, Deserialize)]
pub(super) struct TreePlace {
    /// The tree's owner: a context slug or a task id.
    #[serde(alias = "slug", alias = "id")]
    owner: String,
    /// The place in the tree; absent for the top.
    #[serde(default)]
    path: String,
}

/// Query parameters of a route that reads none (any are accepted).
#[derive(Debug, Deserialize)]
pub(super) struct NoParams {}

/// A request on what the path `P` names: the server, that path and the
/// query parameters `Q` the route reads.
#[derive(Debug)]
pub(super) struct At<P, Q = NoParams>(pub(super) Arc<AppState>, pub(super) P, pub(super) Q);

/// A request on one named thing (`/{slug}`, `/{id}` or `/{provider}`).
pub(super) type On<Q = NoParams> = At<String, Q>;

/// A request on a place in a file tree: its owner (a context slug or a
/// task id) and the path in the tree (`""` for the top).
pub(super) type TreeAt<Q = NoParams> = At<TreePlace, Q>;

/// A listing of a folder in a file tree, with the page asked for.
pub(super) type Listing = TreeAt<PageParams>;

impl<Q> TreeAt<Q> {
    /// The server, the owner and the path.
    pub(super) fn into_parts(self) -> (Arc<AppState>, String, String) {
        (self.0, self.1.owner, self.1.path)
    }

    /// The server.
    pub(super) fn state(&self) -> &Arc<AppState> {
        &self.0
    }

    /// The tree's owner.
    pub(super) fn owner(&self) -> &str {
        &self.1.owner
    }

    /// The path in the tree.
    pub(super) fn path(&self) -> &str {
        &self.1.path
    }
}

impl Listing {
    /// The page asked for.
    pub(super) fn page(&self) -> &PageParams {
        &self.2
    }
}

impl<P, Q> FromRequestParts<Arc<AppState>> for At<P, Q>
where
    P: DeserializeOwned + Send,
    Q: DeserializeOwned + Send,
{
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let Path(at) = Path::<P>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let ApiQuery(query) = ApiQuery::<Q>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(At(state.clone(), at, query))
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
        let At(app, key, NoParams {}) = On::from_request_parts(&mut parts, state).await?;
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
