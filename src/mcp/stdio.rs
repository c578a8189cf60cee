//! The stdio transport with its input checked first: each line is at most
//! [`MAX_LINE_BYTES`], and a line that is not one JSON-RPC message is
//! answered with a JSON-RPC error (-32700 or -32600) instead of being
//! dropped. Valid lines go on to the MCP service unchanged.

use rmcp::ServiceExt;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use super::jsonrpc::{INVALID_REQUEST, Invalid, classify, error_json};
use super::server::NexusMcp;

/// The longest input line (one message) accepted.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

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
    let (service_in, mut to_service) = tokio::io::duplex(64 * 1024);
    let (from_service, service_out) = tokio::io::duplex(64 * 1024);
    let (lines, mut queued) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    // One writer owns `output`, so answers and error lines never interleave.
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(line) = queued.recv().await {
            output.write_all(&line).await?;
            output.flush().await?;
        }
        Ok::<(), std::io::Error>(())
    });
    let answers = lines.clone();
    let forward = tokio::spawn(async move {
        let mut from_service = BufReader::new(from_service);
        loop {
            let mut line = Vec::new();
            if from_service.read_until(b'\n', &mut line).await? == 0 {
                return Ok::<(), std::io::Error>(());
            }
            if answers.send(line).await.is_err() {
                return Ok(());
            }
        }
    });
    let reader = tokio::spawn(async move {
        let mut input = BufReader::new(input);
        let mut line = Vec::new();
        loop {
            line.clear();
            let limit = u64::try_from(MAX_LINE_BYTES)
                .unwrap_or(u64::MAX)
                .saturating_add(1);
            let n = (&mut input)
                .take(limit)
                .read_until(b'\n', &mut line)
                .await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            if line.len() > MAX_LINE_BYTES && line.last() != Some(&b'\n') {
                // Skip the rest of the line, in bounded pieces.
                loop {
                    let mut rest = Vec::new();
                    let n = (&mut input)
                        .take(64 * 1024)
                        .read_until(b'\n', &mut rest)
                        .await?;
                    if n == 0 || rest.last() == Some(&b'\n') {
                        break;
                    }
                }
                let invalid = Invalid {
                    code: INVALID_REQUEST,
                    message: format!("invalid request: message longer than {MAX_LINE_BYTES} bytes"),
                    id: serde_json::Value::Null,
                };
                tracing::warn!("stdio: refused a message longer than {MAX_LINE_BYTES} bytes");
                send_error(&lines, &invalid).await;
                continue;
            }
            let text = line.trim_ascii();
            if text.is_empty() {
                continue;
            }
            match classify(text) {
                Ok(_) => {
                    to_service.write_all(text).await?;
                    to_service.write_all(b"\n").await?;
                }
                Err(invalid) => {
                    tracing::warn!(code = invalid.code, "stdio: answered an invalid message");
                    send_error(&lines, &invalid).await;
                }
            }
        }
    });
    let running = server.serve((service_in, service_out)).await?;
    let waited = running.waiting().await;
    reader.abort();
    let _ = forward.await;
    let _ = writer.await;
    waited?;
    Ok(())
}

async fn send_error(lines: &tokio::sync::mpsc::Sender<Vec<u8>>, invalid: &Invalid) {
    let mut line = error_json(invalid).to_string().into_bytes();
    line.push(b'\n');
    let _ = lines.send(line).await;
}
