//! Helpers for tests against the embedded local Nexus.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use nexus_knowql::local::{LocalNexus, LocalNexusBuilder};
use nexus_knowql::resources::TaskWait;
use nexus_knowql::{Client, types};

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "nexus-local-test-{label}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, rel: &str, text: &str) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A small corpus with distinctive facts in distinct sections.
pub fn corpus() -> TempDir {
    let dir = TempDir::new("corpus");
    dir.write(
        "guide/streaming.md",
        "# Streaming\n\nTurns stream events over SSE.\n\n## Resume\n\nTo resume a broken stream, reconnect with the Last-Event-ID header. The server replays events from that id.\n\n## Cancel\n\nA running turn stops when you cancel it.\n",
    );
    dir.write(
        "guide/tea.md",
        "# Tea\n\nGreen tea steeps for two minutes at 80 degrees.\n\n## Black tea\n\nBlack tea steeps for four minutes in boiling water.\n",
    );
    dir.write(
        "notes.txt",
        "The lighthouse keeper counts 42 ships every night.\n",
    );
    dir.write(".hidden/secret.md", "# Secret\n\nnever indexed\n");
    dir
}

/// A server seeded with the corpus as context `docs`, and its client.
pub async fn seeded(builder: LocalNexusBuilder) -> (LocalNexus, Client, TempDir) {
    let dir = corpus();
    let server = builder.context("docs", dir.path()).start().await.unwrap();
    let client = server.client().unwrap();
    (server, client, dir)
}

/// Creates a context, imports a directory through the SDK and curates it.
pub async fn create_and_curate(client: &Client, slug: &str, dir: &Path) -> types::TaskResponse {
    let req: types::CreateContextRequest =
        serde_json::from_value(serde_json::json!({"slug": slug, "name": slug})).unwrap();
    client.contexts().create(&req).await.unwrap();
    client.sources(slug).import_dir(dir, |_| {}).await.unwrap();
    let trigger = client
        .contexts()
        .curate(slug, &Default::default())
        .await
        .unwrap();
    client
        .tasks()
        .wait_completed(
            &trigger.task_id,
            TaskWait::default().interval(Duration::from_millis(10), Duration::from_millis(100)),
        )
        .await
        .unwrap()
}

/// A `QueryRequest` from JSON.
pub fn request(v: serde_json::Value) -> types::QueryRequest {
    serde_json::from_value(v).unwrap()
}

/// One SSE frame as received.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub id: Option<u64>,
    pub event: String,
    pub data: serde_json::Value,
}

/// Reads SSE frames until the body ends. `Ok` when it ended cleanly,
/// `Err(frames)` when the connection broke.
pub async fn read_frames(resp: reqwest::Response) -> Result<Vec<Frame>, Vec<Frame>> {
    assert!(
        resp.headers()[reqwest::header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let mut frames = Vec::new();
    loop {
        match body.next().await {
            Some(Ok(bytes)) => {
                buf.push_str(std::str::from_utf8(&bytes).unwrap());
                while let Some(end) = buf.find("\n\n") {
                    let raw: String = buf.drain(..end + 2).collect();
                    if let Some(f) = parse_frame(&raw) {
                        frames.push(f);
                    }
                }
            }
            Some(Err(_)) => return Err(frames),
            None => return Ok(frames),
        }
    }
}

fn parse_frame(raw: &str) -> Option<Frame> {
    let mut id = None;
    let mut event = String::new();
    let mut data = String::new();
    for line in raw.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim().parse().unwrap());
        } else if let Some(v) = line.strip_prefix("event:") {
            event = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    if event.is_empty() && data.is_empty() {
        return None; // a keep-alive comment
    }
    Some(Frame {
        id,
        event,
        data: serde_json::from_str(&data).unwrap(),
    })
}

/// `POST /query` with `stream: true`, raw.
pub async fn post_stream(base: &str, body: serde_json::Value) -> reqwest::Response {
    let resp = reqwest::Client::new()
        .post(format!("{base}/query"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

/// `GET /queries/{id}/events` with an optional `Last-Event-ID`, raw.
pub async fn get_events(base: &str, id: &str, last: Option<u64>) -> reqwest::Response {
    let mut req = reqwest::Client::new().get(format!("{base}/queries/{id}/events"));
    if let Some(n) = last {
        req = req.header("Last-Event-ID", n.to_string());
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp
}

/// The text of all delta frames, in order.
pub fn text_of(frames: &[Frame]) -> String {
    frames
        .iter()
        .filter(|f| f.event == "response.output_text.delta")
        .map(|f| f.data["delta"].as_str().unwrap())
        .collect()
}

/// A `nexus-local` process: its base URL once ready; killed on drop.
pub struct LocalBinary {
    pub child: std::process::Child,
    pub url: String,
}

impl LocalBinary {
    /// Starts `nexus-local --bind 127.0.0.1:0` with `args` and `envs`, and
    /// waits for the base URL on stdout (at most 60 s).
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> LocalBinary {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nexus-local"))
            .args(["--bind", "127.0.0.1:0"])
            .args(args)
            .envs(envs.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                panic!("nexus-local printed no URL within 60 s");
            }
        };
        let url = line.trim().to_owned();
        if url.is_empty() {
            let status = child.wait().unwrap();
            panic!("nexus-local did not start: {status}");
        }
        LocalBinary { child, url }
    }

    /// Kills the process at once (SIGKILL on Unix) and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LocalBinary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A shared HTTP client with a generous timeout, for raw requests.
pub fn http() -> reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap()
        })
        .clone()
}

/// `GET url`: the status and the JSON body (`null` when not JSON).
pub async fn get_json(url: &str) -> (u16, serde_json::Value) {
    let resp = http().get(url).send().await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(serde_json::Value::Null);
    (status, body)
}

/// `POST url` with a JSON body: the status and the JSON body.
pub async fn post_json(url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let resp = http().post(url).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(serde_json::Value::Null);
    (status, body)
}
