//! The stdio transport with its input checked first: each line is at most
//! [`MAX_LINE_BYTES`], and a line that is not one JSON-RPC message is
//! answered with a JSON-RPC error (-32700 or -32600) instead of being
//! dropped. Valid lines go on to the MCP service.
//!
//! Each line is read into one reused buffer and decoded once: the checks
//! keep the message they decoded. Each answer is written to `output` as one
//! line, serialized once into a buffer sized by the answers before it; a
//! tool result's `structuredContent` is written from its text (see
//! `structured`).
//!
//! Every request goes through the call ledger as the HTTP transport's do,
//! with the process as its one caller: it is admitted with a ticket (at
//! most [`MAX_IN_FLIGHT`] at once; past it, a JSON-RPC error), and when
//! the input ends the calls still running are cancelled (a Nexus turn
//! they started with them) and the server ends once they have, within
//! [`END_GRACE`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, ConstString, GetExtensions, GetMeta, JsonRpcMessage,
    PingRequestMethod, ServerJsonRpcMessage,
};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::caller::{CallTicket, CallerGone};
use super::http::budget::{Budgets, CallerId};
use super::jsonrpc::{INVALID_REQUEST, Invalid, METHOD_NOT_FOUND, classify_keeping, error_json};
use super::server::NexusMcp;
use super::structured::{WritesStructuredFromText, splice_structured};

/// The longest input line (one message) accepted.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// The most requests in flight at once: past it, a request is answered
/// with a JSON-RPC error.
pub const MAX_IN_FLIGHT: usize = 64;

/// How long the server waits, once its input has ended, for the calls it
/// cancelled to end (their turns' cancels answered).
pub const END_GRACE: Duration = Duration::from_secs(10);

/// The JSON-RPC error code of a request over [`MAX_IN_FLIGHT`].
const BUSY: i32 = -32000;

/// The largest answer buffer size remembered as the next one's first guess.
const MAX_SIZE_HINT: usize = 64 * 1024;

/// Why serving stopped.
pub type StdioError = Box<dyn std::error::Error + Send + Sync>;

/// Serves `server` over line-delimited JSON-RPC on `input` and `output`
/// until `input` ends.
///
/// # Errors
/// The MCP handshake failed, or reading or writing failed.
pub async fn serve<R, W>(server: NexusMcp, input: R, output: W) -> Result<(), StdioError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let budgets = Arc::new(Budgets::new(MAX_IN_FLIGHT, MAX_IN_FLIGHT));
    let transport = LineTransport::new(input, output, Arc::clone(&budgets));
    let running = server.serve(transport).await?;
    running.waiting().await?;
    // The input is gone: the calls still running were cancelled; their
    // turns' cancels are answered before the process may end.
    if tokio::time::timeout(END_GRACE, budgets.until_idle())
        .await
        .is_err()
    {
        tracing::warn!("stdio: calls still running {END_GRACE:?} after the input ended");
    }
    Ok(())
}

/// What one read of the input found.
enum Read {
    /// A whole line is in the buffer.
    Line,
    /// A line longer than [`MAX_LINE_BYTES`] was skipped.
    TooLong,
    /// The input ended.
    End,
}

/// Line-delimited JSON-RPC over a reader and a writer.
struct LineTransport<R, W> {
    input: BufReader<R>,
    /// The line being read; kept across cancelled reads.
    line: Vec<u8>,
    /// Skipping the rest of a line longer than the limit.
    skipping: bool,
    /// One writer, so that lines never interleave; `None` once closed.
    output: Arc<Mutex<Option<W>>>,
    /// The size of the last answer, the next buffer's first capacity.
    size_hint: Arc<AtomicUsize>,
    /// The call ledger: the process's requests in flight.
    budgets: Arc<Budgets>,
    /// Fired when the input ends: the calls still running are cancelled.
    gone: CancellationToken,
}

impl<R, W> LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    fn new(input: R, output: W, budgets: Arc<Budgets>) -> Self {
        LineTransport {
            input: BufReader::new(input),
            line: Vec::new(),
            skipping: false,
            output: Arc::new(Mutex::new(Some(output))),
            size_hint: Arc::new(AtomicUsize::new(256)),
            budgets,
            gone: CancellationToken::new(),
        }
    }

    /// Admits `message` into the ledger: a request gets its ticket and
    /// the input's end as its caller's; `false` (answered) when too many
    /// are in flight.
    fn admit(&self, message: &mut ClientJsonRpcMessage) -> bool {
        let JsonRpcMessage::Request(request) = message else {
            return true;
        };
        let Ok(slot) = self.budgets.admit(CallerId::Process, true) else {
            let id = serde_json::to_value(&request.id).unwrap_or(serde_json::Value::Null);
            self.answer(error_json(&Invalid {
                code: BUSY,
                message: format!(
                    "too many requests in flight (limit {MAX_IN_FLIGHT}); retry when one has finished"
                ),
                id,
            }));
            return false;
        };
        let extensions = request.request.extensions_mut();
        extensions.insert(CallTicket(Arc::new(slot)));
        extensions.insert(CallerGone(self.gone.clone()));
        true
    }

    /// Reads up to the end of the next line, in bounded pieces.
    ///
    /// Cancel safe: what was read stays in `self.line` for the next call.
    async fn read_line(&mut self) -> std::io::Result<Read> {
        loop {
            let available = self.input.fill_buf().await?;
            if available.is_empty() {
                return Ok(Read::End);
            }
            let newline = memchr::memchr(b'\n', available);
            let take = newline.map_or(available.len(), |i| i + 1);
            let mut outcome = None;
            if self.skipping {
                if newline.is_some() {
                    self.skipping = false;
                    outcome = Some(Read::TooLong);
                }
            } else if self.line.len().saturating_add(take) > MAX_LINE_BYTES.saturating_add(1) {
                self.line.clear();
                if newline.is_some() {
                    outcome = Some(Read::TooLong);
                } else {
                    self.skipping = true;
                }
            } else {
                self.line.extend_from_slice(&available[..take]);
                if newline.is_some() {
                    outcome = Some(Read::Line);
                }
            }
            self.input.consume(take);
            if let Some(outcome) = outcome {
                return Ok(outcome);
            }
        }
    }

    /// Writes the JSON-RPC error for `invalid` in the background.
    fn answer_invalid(&self, invalid: &Invalid) {
        self.answer(error_json(invalid));
    }

    /// Writes `answer` in the background: a cancelled `receive` never
    /// leaves half a line behind.
    fn answer(&self, answer: serde_json::Value) {
        let mut line = answer.to_string().into_bytes();
        line.push(b'\n');
        let output = Arc::clone(&self.output);
        tokio::spawn(async move {
            if let Some(out) = output.lock().await.as_mut() {
                let _ = write_line(out, &line).await;
            }
        });
    }
}

async fn write_line<W: AsyncWrite + Unpin>(out: &mut W, line: &[u8]) -> std::io::Result<()> {
    out.write_all(line).await?;
    out.flush().await
}

impl<R, W> Transport<rmcp::RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // Serialized here, once, into a buffer the size of the last answer.
        let hint = self.size_hint.load(Ordering::Relaxed);
        let mut line = Vec::with_capacity(hint);
        let written = splice_structured(item, &mut line);
        line.push(b'\n');
        self.size_hint
            .store(line.len().min(MAX_SIZE_HINT), Ordering::Relaxed);
        let output = Arc::clone(&self.output);
        async move {
            written.map_err(std::io::Error::other)?;
            match output.lock().await.as_mut() {
                Some(out) => write_line(out, &line).await,
                None => Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the output is closed",
                )),
            }
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            match self.read_line().await {
                Ok(Read::Line) => {}
                Ok(Read::TooLong) => {
                    tracing::warn!("stdio: refused a message longer than {MAX_LINE_BYTES} bytes");
                    self.answer_invalid(&Invalid {
                        code: INVALID_REQUEST,
                        message: format!(
                            "invalid request: message longer than {MAX_LINE_BYTES} bytes"
                        ),
                        id: serde_json::Value::Null,
                    });
                    continue;
                }
                Ok(Read::End) => {
                    self.gone.cancel();
                    return None;
                }
                Err(e) => {
                    tracing::error!("stdio: reading failed: {e}");
                    self.gone.cancel();
                    return None;
                }
            }
            let decoded = {
                let text = self.line.trim_ascii();
                (!text.is_empty()).then(|| decode(text))
            };
            self.line.clear();
            match decoded {
                None | Some(Ok(None)) => {}
                Some(Ok(Some(mut message))) => {
                    if let Some(answer) = ping_answer(&message) {
                        self.answer(answer);
                        continue;
                    }
                    // This transport writes tool results itself: their
                    // structured content is written from their text.
                    if let JsonRpcMessage::Request(request) = &mut message
                        && let ClientRequest::CallToolRequest(call) = &mut request.request
                    {
                        call.extensions.insert(WritesStructuredFromText);
                    }
                    if !self.admit(&mut message) {
                        continue;
                    }
                    return Some(message);
                }
                Some(Err(invalid)) => {
                    tracing::warn!(code = invalid.code, "stdio: answered an invalid message");
                    self.answer_invalid(&invalid);
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        if let Some(mut out) = self.output.lock().await.take() {
            out.flush().await?;
        }
        Ok(())
    }
}

/// The answer to a `ping`, the same whatever came before it: `-32601` when
/// its own `_meta` names a revision without the method (2026-07-28 on),
/// else `{}`. The service would answer by the revision it has chosen
/// (after `server/discover`, a `ping` without `_meta` was refused), so the
/// transport answers every `ping` itself.
fn ping_answer(message: &ClientJsonRpcMessage) -> Option<serde_json::Value> {
    let JsonRpcMessage::Request(request) = message else {
        return None;
    };
    if !matches!(request.request, ClientRequest::PingRequest(_)) {
        return None;
    }
    let id = serde_json::to_value(&request.id).unwrap_or(serde_json::Value::Null);
    let version = request.request.get_meta().protocol_version();
    if version.is_some_and(|v| !v.has_initialize()) {
        return Some(error_json(&Invalid {
            code: METHOD_NOT_FOUND,
            message: PingRequestMethod::VALUE.to_owned(),
            id,
        }));
    }
    Some(serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {}}))
}

/// Checks one line and decodes it as a client message: `Ok(None)` for a
/// message the service does not take (a notification of another protocol).
fn decode(text: &[u8]) -> Result<Option<ClientJsonRpcMessage>, Invalid> {
    let (_, _, kept) = classify_keeping(text)?;
    if let Some(message) = kept {
        return Ok(Some(message));
    }
    match serde_json::from_slice::<ClientJsonRpcMessage>(text) {
        Ok(message) => Ok(Some(message)),
        Err(e) => {
            // A well-formed notification the service has no type for (of
            // another protocol, or a non-standard one) is ignored; any other
            // message that does not decode is an invalid request.
            let notification = serde_json::from_slice::<serde_json::Value>(text)
                .ok()
                .is_some_and(|v| v.get("id").is_none() && v.get("method").is_some());
            if notification {
                tracing::debug!("stdio: ignored a notification that does not decode: {e}");
                return Ok(None);
            }
            Err(Invalid {
                code: INVALID_REQUEST,
                message: "Invalid request".to_owned(),
                id: serde_json::Value::Null,
            })
        }
    }
}
