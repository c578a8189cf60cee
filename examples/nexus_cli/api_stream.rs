//! Event streams in `nexus api`: `stream_query_events` and `query` with
//! `"stream": true` print one line per Server-Sent Event (a JSON object
//! `{"id", "event", "data"}` per line with `--json`).

use std::process::ExitCode;
use std::time::Duration;

use futures::{Stream, StreamExt};
use nexus_knowql::Client;
use nexus_knowql::query::DEFAULT_MAX_FRAME_BYTES;

use super::{Call, Credentials};
use crate::common::error_line;

/// How long a streamed answer may stay silent before the call gives up.
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// The largest error body read from a refused stream.
const MAX_ERROR_BYTES: usize = 64 * 1024;

/// The largest JSON answer read when the server answers a streaming
/// request with one JSON document.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// One Server-Sent Event.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Event {
    id: Option<String>,
    event: Option<String>,
    data: Option<String>,
}

impl Event {
    /// The line `nexus api` prints for this event.
    fn line(&self, json: bool) -> String {
        let data = self.data.as_deref().unwrap_or_default();
        let name = self.event.as_deref().unwrap_or("message");
        if json {
            let data = serde_json::from_str::<serde_json::Value>(data)
                .unwrap_or_else(|_| serde_json::Value::String(data.to_owned()));
            serde_json::json!({"id": self.id, "event": name, "data": data}).to_string()
        } else {
            let data = data.split_whitespace().collect::<Vec<_>>().join(" ");
            match &self.id {
                Some(id) => format!("[{id}] {name}: {data}"),
                None => format!("{name}: {data}"),
            }
        }
    }
}

/// Splits a byte stream into events, bounded by [`DEFAULT_MAX_FRAME_BYTES`]
/// per event.
#[derive(Debug, Default)]
struct Parser {
    line: Vec<u8>,
    event: Event,
    size: usize,
}

impl Parser {
    /// Feeds bytes; returns the events they complete.
    fn push(&mut self, bytes: &[u8]) -> Result<Vec<Event>, String> {
        let mut done = Vec::new();
        for &b in bytes {
            if b != b'\n' {
                self.line.push(b);
                self.size = self.size.saturating_add(1);
                if self.size > DEFAULT_MAX_FRAME_BYTES {
                    return Err(format!("an event is over {DEFAULT_MAX_FRAME_BYTES} bytes"));
                }
                continue;
            }
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            let line = String::from_utf8_lossy(&self.line).into_owned();
            self.line.clear();
            if line.is_empty() {
                let event = std::mem::take(&mut self.event);
                self.size = 0;
                if event.data.is_some() || event.event.is_some() {
                    done.push(event);
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line.as_str(), ""));
            let value = value.strip_prefix(' ').unwrap_or(value).to_owned();
            match field {
                "id" => self.event.id = Some(value),
                "event" => self.event.event = Some(value),
                "data" => match &mut self.event.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(&value);
                    }
                    None => self.event.data = Some(value),
                },
                _ => {}
            }
        }
        Ok(done)
    }
}

/// Prints the events of a stream as they arrive.
pub(crate) async fn print_events<S, E>(call: &Call, mut body: S) -> Result<ExitCode, String>
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::error::Error + 'static,
{
    let mut parser = Parser::default();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("{}: {}", call.op.id, error_line(&e)))?;
        for event in parser
            .push(&chunk)
            .map_err(|e| format!("{}: {e}", call.op.id))?
        {
            println!("{}", event.line(call.json));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `query` with `"stream": true`: the body as given, its events printed.
/// The generated call decodes one JSON answer, so this one is sent directly
/// (with the client's base URL, API version and key).
pub(crate) async fn query_stream(
    client: &Client,
    credentials: &Credentials,
    call: &Call,
    body: &serde_json::Value,
) -> Result<ExitCode, String> {
    use nexus_knowql::reqwest;
    let op = call.op.id;
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(READ_TIMEOUT)
        .build()
        .map_err(|e| format!("{op}: {}", error_line(&e)))?;
    let url = format!("{}/query", client.base_url().trim_end_matches('/'));
    let mut request = http
        .post(url)
        .header("Accept", "text/event-stream")
        .header("X-Pinecone-Api-Version", client.api_version().as_str())
        .json(body);
    match (&credentials.api_key, credentials.login) {
        (Some(key), true) => {
            let login = nexus_knowql::types::LoginBody::try_from(
                nexus_knowql::types::LoginBody::builder().api_key(key.clone()),
            )
            .map_err(|e| format!("login: {e}"))?;
            let token = client
                .api()
                .login(&login)
                .await
                .map_err(|e| super::failure("login", e))?
                .into_inner()
                .token;
            request = request.bearer_auth(token);
        }
        (Some(key), false) => request = request.header("X-Pinecone-Api-Key", key),
        (None, _) => {}
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("{op}: {}", error_line(&e)))?;
    let status = response.status();
    let is_events = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !status.is_success() || !is_events {
        let limit = if status.is_success() {
            MAX_BODY_BYTES
        } else {
            MAX_ERROR_BYTES
        };
        let text = bounded_text(response, limit).await;
        if !status.is_success() {
            let message = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
                .unwrap_or_else(|| format!("the server answered {}", status.as_u16()));
            return Err(format!("{op}: {message} (HTTP {})", status.as_u16()));
        }
        println!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    print_events(call, response.bytes_stream().boxed()).await
}

/// The start of a response's body as text, at most `limit` bytes.
async fn bounded_text(response: nexus_knowql::reqwest::Response, limit: usize) -> String {
    let mut body = response.bytes_stream();
    let mut bytes = Vec::new();
    while let Some(Ok(chunk)) = body.next().await {
        let room = limit.saturating_sub(bytes.len());
        bytes.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if bytes.len() >= limit {
            break;
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}
