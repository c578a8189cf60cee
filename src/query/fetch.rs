//! The requests behind a streamed turn: its events
//! (`GET /queries/{id}/events`) and its stored state (`GET /queries/{id}`).

use std::time::Duration;

use super::identity::TurnBinding;
use crate::client::{Poller, WaitPolicy};
use crate::error::{Error, Result};
use crate::status::QueryStatus;
use crate::{Client, types};

/// Percent-encodes one path segment.
pub(crate) fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `GET /queries/{id}/events`, with `Last-Event-ID` when given. The wait
/// for the response headers is bounded by the client's header timeout.
pub(crate) async fn open_events(
    client: &Client,
    query_id: &str,
    last_event_id: Option<u64>,
) -> Result<reqwest::Response> {
    let mut req = client
        .request(
            reqwest::Method::GET,
            &format!("/queries/{}/events", path_segment(query_id)),
        )
        .header(reqwest::header::ACCEPT, "text/event-stream");
    if let Some(n) = last_event_id {
        req = req.header("Last-Event-ID", n.to_string());
    }
    let resp = client
        .send_stream("stream_query_events", req)
        .await
        .map_err(|e| e.for_query(query_id))?;
    expect_event_stream("stream_query_events", Some(query_id), resp)
}

/// Checks that a 2xx answer is an event stream this client can read: its
/// type, and no `Content-Encoding` (gzip, deflate...: this client does not
/// decode them, and would otherwise read compressed bytes as frames).
pub(crate) fn expect_event_stream(
    operation: &'static str,
    query_id: Option<&str>,
    resp: reqwest::Response,
) -> Result<reqwest::Response> {
    if let Some(encoding) = content_encoding(&resp) {
        return Err(Error::Stream {
            query_id: query_id.map(str::to_owned),
            message: format!(
                "{operation}: the event stream is sent with Content-Encoding {encoding:?}, \
                 which this client does not decode"
            ),
        });
    }
    let content_type = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    if content_type.is_empty()
        || crate::transport::media::media_type_is(content_type.as_bytes(), "text/event-stream")
    {
        Ok(resp)
    } else {
        Err(Error::Stream {
            query_id: query_id.map(str::to_owned),
            message: format!("{operation}: expected text/event-stream, got {content_type:?}"),
        })
    }
}

/// The answer's `Content-Encoding`, unless absent or `identity`.
pub(crate) fn content_encoding(resp: &reqwest::Response) -> Option<String> {
    let value = resp.headers().get(reqwest::header::CONTENT_ENCODING)?;
    let text = String::from_utf8_lossy(value.as_bytes());
    let text = text.trim();
    if text.is_empty() || text.eq_ignore_ascii_case("identity") {
        return None;
    }
    Some(text.chars().take(64).collect())
}

/// `GET /queries/{id}` until the turn is terminal, polling with a growing
/// interval (200 ms up to 5 s) for at most `limit`, the last poll landing on
/// `limit` (a turn that ends just before it is not reported as a timeout).
/// Every answer must be
/// the turn `query_id` as `binding` describes it.
///
/// # Errors
/// [`Error::Timeout`] (operation `get_query`) when the turn is still running
/// after `limit`; [`Error::TurnMismatch`] when an answer is about another
/// turn or session; [`Error::UnknownTurnStatus`] for a status word that is
/// not the API's; any error of the polls, naming the query.
pub(crate) async fn stored_terminal(
    client: &Client,
    query_id: &str,
    mut binding: TurnBinding,
    limit: Duration,
) -> Result<types::Query> {
    let mut poller = Poller::new(&WaitPolicy::default().timeout(limit));
    loop {
        let query = client
            .queries()
            .get(query_id)
            .await
            .map_err(|e| e.for_query(query_id))?;
        binding.check_query(&query, "the stored turn")?;
        check_known_status(&query)?;
        if query.is_terminal() {
            return Ok(query);
        }
        if !poller.pause_until_timeout().await {
            return Err(poller.timed_out("get_query"));
        }
    }
}

/// [`Error::UnknownTurnStatus`] for a Query whose status word is not the
/// API's: whether it ended cannot be told.
pub(crate) fn check_known_status(query: &types::Query) -> Result<()> {
    match &query.status {
        QueryStatus::Other(status) => Err(Error::UnknownTurnStatus {
            query_id: query.id.clone(),
            status: status.chars().take(64).collect(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(path_segment("q_1-a.b~"), "q_1-a.b~");
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
    }
}
