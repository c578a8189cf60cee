//! What every route on a file tree (a context's sources or knowledge, a
//! task's files) is asked, extracted once.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::PageParams;
use crate::local::error::ApiQuery;
use crate::local::state::AppState;

/// The path of a tree route: `/{owner}/…` and, but on a listing of the
/// top, `/{*path}`.
#[derive(Debug, Deserialize)]
struct TreePath {
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
