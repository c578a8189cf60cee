//! Query turns: accepting them, their documents, event streams, traces
//! and feedback; and the model catalog.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;

use super::Shared;
use super::tree_request::{At, On, Posted};
use crate::local::error::{ApiJson, LocalError, LocalResult};
use crate::local::events::{EventLog, Frame};
use crate::local::state::AppState;
use crate::local::store::{LOCAL_MODEL, QueryView, Store};
use crate::local::turn;
use crate::types;

/// Longest wait of `POST /queries/{id}/cancel` for the turn to stop.
const CANCEL_WAIT: Duration = Duration::from_secs(5);
/// Pause before an injected stream cut, so earlier frames are flushed.
const CUT_FLUSH: Duration = Duration::from_millis(20);

pub(super) async fn models() -> axum::Json<types::ModelCatalog> {
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

pub(super) async fn post_query(
    State(state): Shared,
    ApiJson(req): ApiJson<types::QueryRequest>,
) -> LocalResult<Response> {
    let stream = req.stream == Some(true);
    let background = req.background == Some(true);
    // From here the turn runs on its own task: whatever happens to this
    // request, it ends, closes its log and frees its session.
    let previous_session = turn::previous_session(&state, &req).await?;
    let started = turn::start(&state, req, previous_session)?;
    let log = started.log;
    let query_id = started.query.id.clone();
    if stream {
        return Ok(sse(&state, log, 1));
    }
    if background {
        // A background turn's id must survive a crash once acknowledged.
        state.store.saved(started.accepted).await?;
        return Ok((StatusCode::ACCEPTED, axum::Json(started.query)).into_response());
    }
    log.wait_finished().await;
    if !log.saved() {
        return Err(LocalError::not_saved());
    }
    let query = current_query(&state, &query_id).await?;
    if query.status == crate::status::word::FAILED
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

/// A turn's document, read on the blocking pool (it may be only in the
/// database).
pub(super) async fn current_query(state: &AppState, id: &str) -> LocalResult<types::Query> {
    read_query(state, id, Store::query_doc).await
}

/// A turn with its trace and log, read on the blocking pool.
async fn stored_query(state: &AppState, id: &str) -> LocalResult<QueryView> {
    read_query(state, id, Store::query).await
}

/// What `read` finds of turn `id`, read on the blocking pool; 404 when
/// there is no such turn.
async fn read_query<T: Send + 'static>(
    state: &AppState,
    id: &str,
    read: fn(&Store, &str) -> Option<T>,
) -> LocalResult<T> {
    let owned = id.to_owned();
    state
        .store
        .blocking(move |s| read(s, &owned))
        .await?
        .ok_or_else(|| LocalError::not_found(format!("query {id:?} not found")))
}

/// The SSE answer following `log` from sequence `from`; the configured
/// fault cuts the connection after N frames.
pub(super) fn sse(state: &AppState, log: Arc<EventLog>, from: u64) -> Response {
    let cut = state.faults.cut_after_frames();
    let frames = log
        .follow(from)
        .enumerate()
        .then(move |(i, frame)| async move {
            // The turn's end is not on disk: cut, so the client resumes.
            let frame = frame.map_err(|_| std::io::Error::other("the turn's end was not saved"))?;
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

pub(super) fn sse_event(frame: &Frame) -> Event {
    let event = Event::default().event(&frame.event).data(&frame.data);
    match frame.seq {
        Some(seq) => event.id(seq.to_string()),
        None => event,
    }
}

pub(super) async fn get_query(At(state, id, _): On) -> LocalResult<axum::Json<types::Query>> {
    current_query(&state, &id).await.map(axum::Json)
}

pub(super) async fn cancel_query(At(state, id, _): On) -> LocalResult<axum::Json<types::Query>> {
    let q = stored_query(&state, &id).await?;
    // A turn ends in memory before its end is committed: whether the log
    // is closed, not the document's status, says whether the end is saved.
    if !q.log.is_finished()
        && let Some(cancel) = q.cancel
    {
        // The turn's end is on disk once its log is closed as saved; the
        // answer never shows an end that is not.
        cancel.cancel();
        let _ = tokio::time::timeout(CANCEL_WAIT, q.log.wait_finished()).await;
        if !q.log.is_finished() {
            return Err(cancel_pending());
        }
        if !q.log.saved() {
            return Err(LocalError::not_saved());
        }
    }
    current_query(&state, &id).await.map(axum::Json)
}

/// A cancel whose turn has not ended within [`CANCEL_WAIT`] (its end is
/// not on disk yet): 503, code `cancel_pending`, with `Retry-After`. The
/// turn stops; read it, or cancel again, to learn how it ended.
fn cancel_pending() -> LocalError {
    LocalError {
        code: Some("cancel_pending"),
        retry_after: Some(1),
        ..LocalError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the turn is stopping but its end is not saved yet; read the turn or cancel again",
        )
    }
}

pub(super) async fn query_events(
    At(state, id, _): On,
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
    let log = stored_query(&state, &id).await?.log;
    Ok(sse(&state, log, from))
}

pub(super) async fn query_trace(At(state, id, _): On) -> LocalResult<axum::Json<types::Trace>> {
    let q = stored_query(&state, &id).await?;
    q.trace
        .map(axum::Json)
        .ok_or_else(|| LocalError::not_found("the trace is available once the turn has ended"))
}

#[derive(Debug, Deserialize)]
pub(super) struct FeedbackBody {
    rating: String,
    comment: Option<String>,
}

pub(super) async fn query_feedback(
    Posted(state, id, body): Posted<FeedbackBody>,
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
    let feedback = types::QueryFeedback {
        comment: body.comment,
        rating: body.rating.into(),
    };
    let ticket = state
        .store
        .blocking(move |s| s.set_feedback(&id, feedback))
        .await??;
    state.store.saved(ticket).await?;
    Ok(StatusCode::NO_CONTENT)
}
