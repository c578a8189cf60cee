//! The web app of `examples/web.rs`: one page, one endpoint that starts a
//! turn, and one that serves its events to the page's `EventSource`
//! through a [`TurnRelay`].

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use nexus_knowql::Client;
use nexus_knowql::web::{TurnRelay, last_event_id};
use serde::Deserialize;

/// The page: a question box and the answer as it streams.
pub(crate) const PAGE: &str = include_str!("index.html");

/// What the app serves.
#[derive(Debug)]
pub(crate) struct App {
    /// The Nexus client that runs the turns.
    pub(crate) client: Client,
    /// The context the questions go to.
    pub(crate) context: String,
    /// The turns being served.
    pub(crate) relay: TurnRelay,
    /// Ends every event connection after this many frames, so the
    /// browser's own reconnect (with `Last-Event-ID`) can be watched.
    pub(crate) cut_after: Option<usize>,
}

#[derive(Debug, Deserialize)]
struct Ask {
    question: String,
}

/// The app's routes: `GET /`, `POST /ask`, `GET /turns/{id}/events`.
pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/ask", post(ask))
        .route("/turns/{id}/events", get(events))
        .with_state(app)
}

/// Starts a turn in a new session and answers with its relay id (what the
/// page reads it by) and its query id.
async fn ask(State(app): State<Arc<App>>, Json(ask): Json<Ask>) -> Response {
    let question = ask.question.trim();
    if question.is_empty() || question.len() > 2000 {
        return (StatusCode::BAD_REQUEST, "ask a question of 1 to 2000 bytes").into_response();
    }
    let started = async {
        let session = app.client.session([app.context.as_str()]).build()?;
        session.ask(question).stream().await
    };
    let turn = match started.await {
        Ok(turn) => turn,
        Err(e) => {
            tracing::warn!(error = %e, "could not start the turn");
            return (StatusCode::BAD_GATEWAY, "could not start the turn").into_response();
        }
    };
    match app.relay.publish(turn).await {
        Ok(published) => Json(serde_json::json!({
            "id": published.relay_id,
            "query_id": published.query_id,
        }))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

/// The turn's events after the browser's `Last-Event-ID` (the header, or
/// the `last_event_id` query parameter of a page that reconnects itself).
async fn events(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let after = match last_event_id(&headers, &uri) {
        Ok(after) => after,
        Err(e) => return e.into_response(),
    };
    let Some(cut_after) = app.cut_after else {
        return app.relay.respond(&id, after);
    };
    match app.relay.subscribe(&id, after) {
        Ok(frames) => axum::response::sse::Sse::new(frames.take(cut_after)).into_response(),
        Err(e) => e.into_response(),
    }
}
