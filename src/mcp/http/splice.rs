//! Writing a tool result's structured content into its answer: a tool that
//! found an [`EdgeSlot`] in its request kept the JSON text there and left a
//! placeholder in the result (see `crate::mcp::edge_structured`); the
//! answer, a JSON body or an event stream, gets the text in its place.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;

use crate::mcp::edge_structured::{EdgeSlot, splice};

/// `response` with the text `slot` holds written in place of its
/// placeholder; as it is when the slot holds nothing.
pub(super) async fn write_held(response: Response, slot: &EdgeSlot) -> Response {
    let Some(kind) = content_kind(&response) else {
        return response;
    };
    match kind {
        // A JSON answer is sent once the call has ended.
        Kind::Json => {
            let Some(json) = slot.held() else {
                return response;
            };
            let (parts, body) = response.into_parts();
            // rmcp's JSON answer is one complete body, already in memory.
            let bytes = match axum::body::to_bytes(body, usize::MAX).await {
                Ok(bytes) => bytes,
                Err(e) => {
                    let failed = futures::stream::once(async move { Err::<Bytes, _>(e) });
                    return Response::from_parts(parts, Body::from_stream(failed));
                }
            };
            let body = match splice(&bytes, json) {
                Some(spliced) => Body::from(spliced),
                None => Body::from(bytes),
            };
            Response::from_parts(parts, body)
        }
        // An event stream starts while the call runs: the result's event,
        // after the slot is filled, is looked for in each frame. One event
        // is one frame, so the result's event holds the whole placeholder;
        // the text is compact JSON (no line breaks), so the event stays one
        // `data` line.
        Kind::EventStream => {
            let (parts, body) = response.into_parts();
            let slot = slot.clone();
            let frames = body.into_data_stream().map(move |frame| {
                frame.map(
                    |bytes| match slot.held().and_then(|json| splice(&bytes, json)) {
                        Some(spliced) => Bytes::from(spliced),
                        None => bytes,
                    },
                )
            });
            Response::from_parts(parts, Body::from_stream(frames))
        }
    }
}

enum Kind {
    Json,
    EventStream,
}

fn content_kind(response: &Response) -> Option<Kind> {
    let value = response
        .headers()
        .get(http::header::CONTENT_TYPE)?
        .to_str()
        .ok()?;
    if value.starts_with("application/json") {
        Some(Kind::Json)
    } else if value.starts_with("text/event-stream") {
        Some(Kind::EventStream)
    } else {
        None
    }
}
