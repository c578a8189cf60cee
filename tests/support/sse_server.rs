//! A scripted HTTP/1.1 server for event-stream tests.
//!
//! It writes raw bytes, so a test controls every byte: line endings, a BOM,
//! how writes are split, where the connection is cut (a clean close or a
//! reset). Each request is recorded; a script decides each reply from the
//! request and its index. Each recorded request and each close a client
//! makes is signalled, so a test waits for them with
//! [`SseServer::wait_for`]. The server stops when dropped.
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A request as the server received it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    pub fn is(&self, method: &str, path: &str) -> bool {
        self.method == method && self.path == path
    }
}

/// One thing the server does on a connection, in order.
#[derive(Debug, Clone)]
pub enum Step {
    /// Write these bytes in one call.
    Write(Vec<u8>),
    /// Write these bytes in pieces of the given sizes (cycled), flushing each.
    /// The client may still read several pieces at once.
    WriteSplit(Vec<u8>, Vec<usize>),
    /// Write these bytes as HTTP/1.1 chunks of the given sizes (cycled), for
    /// a [`Reply::sse_chunked`] reply: the client's HTTP stack hands each
    /// chunk to the event parser on its own, so the parser really sees the
    /// split (a chunk is never merged with the next one).
    WriteChunks(Vec<u8>, Vec<usize>),
    /// Wait.
    Sleep(Duration),
    /// Reset the connection (RST): the client sees a transport error.
    Reset,
    /// Keep the connection open until the client closes it, then note it.
    AwaitClose,
}

/// A reply: the status line and headers, then the steps. After the last
/// step the connection is closed cleanly.
#[derive(Debug, Clone)]
pub struct Reply {
    pub head: String,
    pub steps: Vec<Step>,
}

impl Reply {
    /// `200 text/event-stream`, the body written by `steps` (close-delimited).
    pub fn sse(steps: Vec<Step>) -> Reply {
        Reply {
            head: "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n".into(),
            steps,
        }
    }

    /// `200 text/event-stream` with a chunked body: `steps` write its chunks
    /// ([`Step::WriteChunks`]), then the last chunk ends it.
    pub fn sse_chunked(mut steps: Vec<Step>) -> Reply {
        steps.push(Step::Write(b"0\r\n\r\n".to_vec()));
        Reply {
            head: "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".into(),
            steps,
        }
    }

    /// A JSON answer with a status and extra header lines (`"Name: value"`).
    pub fn json(status: u16, extra_headers: &[&str], body: &serde_json::Value) -> Reply {
        let body = body.to_string();
        let mut head = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
            body.len()
        );
        for h in extra_headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        Reply {
            head,
            steps: vec![Step::Write(body.into_bytes())],
        }
    }
}

type Script = dyn Fn(&Request, usize) -> Reply + Send + Sync;

/// The running server.
pub struct SseServer {
    pub url: String,
    log: Arc<Mutex<Vec<Request>>>,
    closed: Arc<AtomicUsize>,
    seen: Seen,
    task: JoinHandle<()>,
}

/// Fires each time the server records a request or a client's close.
type Seen = Arc<watch::Sender<u64>>;

impl Drop for SseServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SseServer {
    /// Starts a server on `127.0.0.1:0` answering with `script(request, index)`.
    pub async fn start(script: impl Fn(&Request, usize) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let closed = Arc::new(AtomicUsize::new(0));
        let script: Arc<Script> = Arc::new(script);
        let seen: Seen = Arc::new(watch::channel(0).0);
        let (log2, closed2, seen2) = (log.clone(), closed.clone(), seen.clone());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let (log, closed, script) = (log2.clone(), closed2.clone(), script.clone());
                let seen = seen2.clone();
                conns.spawn(async move {
                    let _ = serve(sock, log, closed, seen, script).await;
                });
            }
        });
        SseServer {
            url,
            log,
            closed,
            seen,
            task,
        }
    }

    /// Waits until `check` holds over what the server recorded, looking
    /// again at each request and each close it sees (bounded, see
    /// [`wait::PATIENCE`](super::wait::PATIENCE)).
    pub async fn wait_for(&self, what: &str, check: impl Fn(&SseServer) -> bool) {
        let mut signal = self.seen.subscribe();
        super::wait::signalled(&mut signal, what, || check(self)).await;
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Request> {
        self.log.lock().unwrap().clone()
    }

    /// How many requests had this method and path.
    pub fn count(&self, method: &str, path: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.is(method, path))
            .count()
    }

    /// The `Last-Event-ID` of every events request, in order (`None` when absent).
    pub fn last_event_ids(&self) -> Vec<Option<String>> {
        self.requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path.ends_with("/events"))
            .map(|r| r.header("last-event-id").map(str::to_owned))
            .collect()
    }

    /// How many `AwaitClose` steps saw the client close.
    pub fn closed_by_client(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }

    /// A client for this server that never retries on its own.
    pub fn client(&self) -> nexus_knowql::Client {
        nexus_knowql::Client::builder()
            .base_url(&self.url)
            .api_key("pcsk_test")
            .retry(
                nexus_knowql::RetryPolicy::default()
                    .jitter(0.0)
                    .initial_delay(Duration::from_millis(10)),
            )
            .build()
            .unwrap()
    }
}

async fn read_request(sock: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let path = first.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&tmp[..n]);
    }
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

async fn serve(
    mut sock: TcpStream,
    log: Arc<Mutex<Vec<Request>>>,
    closed: Arc<AtomicUsize>,
    seen: Seen,
    script: Arc<Script>,
) -> std::io::Result<()> {
    sock.set_nodelay(true)?;
    let Some(req) = read_request(&mut sock).await else {
        return Ok(());
    };
    let index = {
        let mut log = log.lock().unwrap();
        log.push(req.clone());
        log.len() - 1
    };
    seen.send_modify(|n| *n += 1);
    let reply = script(&req, index);
    sock.write_all(reply.head.as_bytes()).await?;
    for step in reply.steps {
        match step {
            Step::Write(bytes) => sock.write_all(&bytes).await?,
            Step::WriteSplit(bytes, sizes) => {
                let mut at = 0;
                let mut sizes = sizes.iter().copied().cycle();
                while at < bytes.len() {
                    let n = sizes.next().unwrap_or(1).max(1).min(bytes.len() - at);
                    sock.write_all(&bytes[at..at + n]).await?;
                    sock.flush().await?;
                    at += n;
                }
            }
            Step::WriteChunks(bytes, sizes) => {
                let mut at = 0;
                let mut sizes = sizes.iter().copied().cycle();
                while at < bytes.len() {
                    let n = sizes.next().unwrap_or(1).max(1).min(bytes.len() - at);
                    let mut chunk = format!("{n:x}\r\n").into_bytes();
                    chunk.extend_from_slice(&bytes[at..at + n]);
                    chunk.extend_from_slice(b"\r\n");
                    sock.write_all(&chunk).await?;
                    at += n;
                }
                sock.flush().await?;
            }
            // A scripted pause in the stream (the server's behaviour under
            // test, not a wait for something to happen).
            Step::Sleep(d) => tokio::time::sleep(d).await,
            Step::Reset => {
                // Linger 0 makes the close an immediate RST (it never blocks).
                #[allow(deprecated)]
                sock.set_linger(Some(Duration::ZERO))?;
                return Ok(());
            }
            Step::AwaitClose => {
                let mut tmp = [0u8; 256];
                loop {
                    match sock.read(&mut tmp).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                closed.fetch_add(1, Ordering::SeqCst);
                seen.send_modify(|n| *n += 1);
                return Ok(());
            }
        }
    }
    sock.shutdown().await
}

/// A scripted turn: its frames (id, wire text) and its final Query.
#[derive(Debug, Clone)]
pub struct Turn {
    pub query_id: String,
    pub session_id: String,
    pub answer: String,
    /// `(id, frame)`; the last one is the id-less `query` frame.
    pub frames: Vec<(Option<u64>, String)>,
}

/// One SSE frame in LF form.
pub fn frame(id: Option<u64>, event: &str, data: &serde_json::Value) -> String {
    let mut s = String::new();
    if let Some(id) = id {
        s.push_str(&format!("id: {id}\n"));
    }
    s.push_str(&format!("event: {event}\ndata: {data}\n\n"));
    s
}

pub fn query_json(
    query_id: &str,
    session_id: &str,
    status: &str,
    answer: &str,
) -> serde_json::Value {
    serde_json::json!({
        "id": query_id, "object": "query", "session_id": session_id, "created": 1_780_000_000,
        "status": status, "error": if status == "failed" { serde_json::json!("the model failed") } else { serde_json::Value::Null },
        "input": [], "output": [{"role": "assistant", "content": [{"type": "output_text", "text": answer}]}],
        "citations": [{"source": "policy.md", "section_paths": [["Travel"]], "pages": [2]}],
        "steps": [{"step_id": "s1", "status": "completed", "commentary": "searched"}],
        "runtime_ms": 42, "usage": {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120},
        "output_json": {"answer": answer}
    })
}

impl Turn {
    /// A completed turn whose answer is the concatenation of `deltas`.
    pub fn completed(query_id: &str, session_id: &str, deltas: &[&str]) -> Turn {
        let q = query_id;
        let mut frames = Vec::new();
        let mut id = 0u64;
        let mut push =
            |frames: &mut Vec<(Option<u64>, String)>, event: &str, data: serde_json::Value| {
                id += 1;
                frames.push((Some(id), frame(Some(id), event, &data)));
            };
        push(
            &mut frames,
            "response.created",
            serde_json::json!({"type": "response.created", "query_id": q, "session_id": session_id}),
        );
        push(
            &mut frames,
            "response.step",
            serde_json::json!({"type": "response.step", "query_id": q, "step_id": "s1", "status": "running", "commentary": "searching", "fns": ["search"]}),
        );
        for d in deltas {
            push(
                &mut frames,
                "response.output_text.delta",
                serde_json::json!({"type": "response.output_text.delta", "query_id": q, "delta": d}),
            );
        }
        push(
            &mut frames,
            "response.step",
            serde_json::json!({"type": "response.step", "query_id": q, "step_id": "s1", "status": "completed", "cum_input_tokens": 100, "cum_output_tokens": 20}),
        );
        push(
            &mut frames,
            "response.turn_rollup",
            serde_json::json!({"type": "response.turn_rollup", "query_id": q, "n_steps": 1, "n_tool_calls": 1, "total_hits": 3, "duration_ms": 40}),
        );
        push(
            &mut frames,
            "response.completed",
            serde_json::json!({"type": "response.completed", "query_id": q}),
        );
        let answer: String = deltas.concat();
        frames.push((
            None,
            frame(
                None,
                "query",
                &query_json(q, session_id, "completed", &answer),
            ),
        ));
        Turn {
            query_id: q.into(),
            session_id: session_id.into(),
            answer,
            frames,
        }
    }

    /// The whole stream as LF text.
    pub fn body(&self) -> String {
        self.frames.iter().map(|(_, f)| f.as_str()).collect()
    }

    /// The first `n` frames.
    pub fn first(&self, n: usize) -> String {
        self.frames
            .iter()
            .take(n)
            .map(|(_, f)| f.as_str())
            .collect()
    }

    /// What `GET /events` with `Last-Event-ID: n` sends: from event `n`
    /// inclusively (everything without the header).
    pub fn replay_from(&self, last_event_id: Option<u64>) -> String {
        let from = last_event_id.unwrap_or(0);
        self.frames
            .iter()
            .filter(|(id, _)| id.is_none_or(|id| id >= from))
            .map(|(_, f)| f.as_str())
            .collect()
    }

    /// The number of id-carrying events.
    pub fn events(&self) -> usize {
        self.frames.iter().filter(|(id, _)| id.is_some()).count()
    }

    /// The path of this turn's events.
    pub fn events_path(&self) -> String {
        format!("/queries/{}/events", self.query_id)
    }
}

/// The `Last-Event-ID` of a request, as a number.
pub fn last_event_id(req: &Request) -> Option<u64> {
    req.header("last-event-id").and_then(|v| v.parse().ok())
}
