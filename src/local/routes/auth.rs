//! `POST /auth/login` and `GET /auth`: bearer tokens and the caller's identity.

use axum::extract::State;

use super::Shared;
use crate::local::constant_time::constant_time_eq;
use crate::local::error::{ApiJson, LocalError, LocalResult};
use crate::local::store::{LOCAL_PRINCIPAL, LOCAL_PROJECT, LOCAL_PROJECT_NAME};
use crate::types;

pub(super) async fn login(
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
        token: state.issue_token().await?,
    }))
}

pub(super) async fn identity() -> axum::Json<types::GetIdentityResponse> {
    axum::Json(types::GetIdentityResponse {
        project_id: LOCAL_PROJECT.to_owned(),
        project_name: Some(LOCAL_PROJECT_NAME.to_owned()),
        user: LOCAL_PRINCIPAL.to_owned(),
    })
}
