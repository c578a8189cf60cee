//! Shaping answers: a session's lone answer sent as JSON, and response
//! streams ended at the request deadline.

use super::refusals::shown_peer;
use std::net::SocketAddr;

use axum::body::Body;
use axum::response::Response;
use futures::{FutureExt, StreamExt};
use http::HeaderMap;
use tokio::time::Instant;

/// Whether the request's `Accept` prefers `application/json` to
/// `text/event-stream`: a higher `q`, or the same `q` and listed first.
pub(super) fn prefers_json(headers: &HeaderMap) -> bool {
    let mut json = None;
    let mut sse = None;
    let ranges = headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for (position, range) in ranges.enumerate() {
        let mut params = range.split(';');
        let media = params.next().unwrap_or_default().trim();
        let q = params
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        let slot = if media.eq_ignore_ascii_case("application/json") {
            &mut json
        } else if media.eq_ignore_ascii_case("text/event-stream") {
            &mut sse
        } else {
            continue;
        };
        slot.get_or_insert((q, position));
    }
    match (json, sse) {
        (Some((qj, pj)), Some((qs, ps))) => qj > qs || (qj == qs && pj < ps),
        (Some((qj, _)), None) => qj > 0.0,
        _ => false,
    }
}

/// Holds back the head of a session's SSE answer while all it carries is a
/// priming event and the answer, until the stream ends or `deadline`
/// passes. A stream that ended with the answer alone is sent as that message
/// in a JSON body, in one write, as without sessions (for a client that
/// prefers JSON, see [`prefers_json`]). Anything else (progress or a request
/// before the answer) is sent at once as the events held followed by the
/// rest of the stream.
pub(super) async fn coalesce_answer(response: Response, deadline: Instant) -> Response {
    if !is_event_stream(&response) {
        return response;
    }
    let (mut parts, mut body) = response.into_parts();
    let mut held: Vec<Result<hyper::body::Frame<bytes::Bytes>, axum::Error>> = Vec::new();
    // The answer, while it is all the held frames carry after the first.
    let mut answer = None;
    let mut ended = false;
    let wait = tokio::time::sleep_until(deadline);
    tokio::pin!(wait);
    loop {
        tokio::select! {
            biased;
            frame = http_body_util::BodyExt::frame(&mut body) => match frame {
                Some(Ok(frame)) => {
                    held.push(Ok(frame));
                    if held.len() >= 2 {
                        answer = lone_answer(&held);
                        if answer.is_none() {
                            break;
                        }
                    }
                }
                Some(Err(e)) => {
                    held.push(Err(e));
                    answer = None;
                    ended = true;
                    break;
                }
                None => {
                    if held.len() < 2 {
                        answer = lone_answer(&held);
                    }
                    ended = true;
                    break;
                }
            },
            () = &mut wait => break,
        }
    }
    if ended && let Some(message) = answer {
        parts.headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        return Response::from_parts(parts, Body::from(message));
    }
    let head = futures::stream::iter(held);
    let body = if ended {
        Body::new(http_body_util::StreamBody::new(head))
    } else {
        Body::new(http_body_util::StreamBody::new(
            head.chain(http_body_util::BodyStream::new(body)),
        ))
    };
    Response::from_parts(parts, body)
}

/// The JSON-RPC response (an `id` and no `method`) that `frames` carry, when
/// they are complete events making an optional priming event (an id and no
/// data) and that one message.
fn lone_answer(frames: &[Result<hyper::body::Frame<bytes::Bytes>, axum::Error>]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Probe {
        id: Option<serde::de::IgnoredAny>,
        method: Option<serde::de::IgnoredAny>,
    }
    let mut text = String::new();
    for frame in frames {
        text.push_str(std::str::from_utf8(frame.as_ref().ok()?.data_ref()?).ok()?);
    }
    if !text.ends_with("\n\n") {
        return None;
    }
    let mut message = None;
    for event in text.split("\n\n").filter(|e| !e.is_empty()) {
        let mut data = None;
        for line in event.split('\n') {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" if data.is_none() => data = Some(value),
                "id" | "retry" => {}
                "event" if value == "message" => {}
                _ => return None,
            }
        }
        match data {
            None | Some("") => {}
            Some(json) if message.is_none() => message = Some(json),
            Some(_) => return None,
        }
    }
    let message = message?;
    // Parsing the whole message also checks that it is JSON.
    let probe = serde_json::from_str::<Probe>(message).ok()?;
    (probe.id.is_some() && probe.method.is_none()).then(|| message.to_owned())
}

fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Ends an SSE response body at `deadline`.
pub(super) fn with_deadline(
    response: Response,
    deadline: Instant,
    peer: Option<SocketAddr>,
) -> Response {
    if !is_event_stream(&response) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let cut = tokio::time::sleep_until(deadline).map(move |()| {
        tracing::warn!(peer = %shown_peer(peer), "request deadline passed: response stream ended");
    });
    let body = Body::from_stream(body.into_data_stream().take_until(cut));
    Response::from_parts(parts, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(chunks: &[&str]) -> Vec<Result<hyper::body::Frame<bytes::Bytes>, axum::Error>> {
        chunks
            .iter()
            .map(|c| Ok(hyper::body::Frame::data(bytes::Bytes::from(c.to_string()))))
            .collect()
    }

    #[test]
    fn one_message_after_a_priming_event_becomes_a_json_body() {
        let answer = r#"{"jsonrpc":"2.0","id":7,"result":{}}"#;
        let held = frames(&[
            "data: \nid: 0/3\nretry: 3000\n\n",
            &format!("data: {answer}\nid: 0/4\n\n"),
        ]);
        assert_eq!(lone_answer(&held).as_deref(), Some(answer));
        // One event split across frames is read whole.
        let held = frames(&["data: {\"jsonrpc\":\"2.0\",", "\"id\":7}\n", "id: 1\n\n"]);
        assert_eq!(
            lone_answer(&held).as_deref(),
            Some(r#"{"jsonrpc":"2.0","id":7}"#)
        );
    }

    #[test]
    fn anything_else_stays_an_event_stream() {
        for chunks in [
            // Two messages (a notification before the answer).
            &["data: {\"method\":\"x\"}\n\n", "data: {\"id\":1}\n\n"][..],
            // An unfinished event.
            &["data: {\"id\":1}\n"][..],
            // A field this reader does not expect, or another event type.
            &["data: {\"id\":1}\nfoo: bar\n\n"][..],
            &["event: ping\ndata: {\"id\":1}\n\n"][..],
            // Data that is not JSON, or split over two data lines.
            &["data: {\"id\":\n\n"][..],
            &["data: {\"id\":\ndata: 1}\n\n"][..],
            // Nothing but a priming event.
            &["data: \nid: 0/1\n\n"][..],
        ] {
            assert_eq!(lone_answer(&frames(chunks)), None, "{chunks:?}");
        }
    }

    #[test]
    fn the_head_is_held_only_while_the_answer_may_come_alone() {
        let priming = "data: \nid: 0/1\nretry: 3000\n\n";
        let answer = "data: {\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{}}\nid: 0/2\n\n";
        let progress = "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\nid: 0/2\n\n";
        let request = "data: {\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"ping\"}\nid: 0/2\n\n";
        // The head waits past the first frame only while the frames held
        // are the answer alone.
        assert!(lone_answer(&frames(&[priming, answer])).is_some());
        assert!(lone_answer(&frames(&[priming, progress])).is_none());
        assert!(lone_answer(&frames(&[priming, request])).is_none());
        assert!(lone_answer(&frames(&[priming, answer, progress])).is_none());
    }

    #[test]
    fn json_is_preferred_by_q_then_by_order() {
        let prefers = |accept: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::ACCEPT, accept.parse().unwrap());
            prefers_json(&headers)
        };
        assert!(prefers("application/json, text/event-stream"));
        assert!(!prefers("text/event-stream, application/json"));
        assert!(prefers("text/event-stream;q=0.5, application/json"));
        assert!(!prefers("application/json;q=0.2, text/event-stream"));
        assert!(prefers("Application/JSON"));
        assert!(!prefers("application/json;q=0"));
        assert!(!prefers("text/event-stream"));
        assert!(!prefers(""));
    }
}
