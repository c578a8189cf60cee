//! Ask one question and watch the answer stream into the terminal.
//!
//! ```text
//! cargo run --example ask --features local -- "How do I resume a stream?"
//! cargo run --example ask --features local -- [--base-url URL] [--api-key KEY] \
//!     [--context SLUG]... [--background] [--no-stream] [--json] QUESTION
//! ```
//!
//! Without `--base-url` and `NEXUS_BASE_URL` it starts a `LocalNexus`
//! in-process over the project's own docs (`examples/corpus`), so it works
//! offline with no account. stdout carries only the answer (or, with
//! `--json`, the final Query); steps, citations and diagnostics go to stderr.
//! The exit code is 0 when the turn completed.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use futures::StreamExt;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::{Client, types};

/// Ask a Nexus context a question.
#[derive(Debug, Parser)]
#[command(name = "ask")]
struct Args {
    /// The API base URL (default: NEXUS_BASE_URL, else a local server over examples/corpus).
    #[arg(long)]
    base_url: Option<String>,
    /// The API key (default: PINECONE_API_KEY).
    #[arg(long, hide_env_values = true)]
    api_key: Option<String>,
    /// Context to ask (repeatable); default: the only queryable one.
    #[arg(long = "context", value_name = "SLUG")]
    contexts: Vec<String>,
    /// Run a background turn and wait for it.
    #[arg(long, conflicts_with = "no_stream")]
    background: bool,
    /// Run a synchronous turn instead of streaming.
    #[arg(long)]
    no_stream: bool,
    /// Print the final Query as JSON on stdout instead of the answer text.
    #[arg(long)]
    json: bool,
    /// The question.
    question: String,
}

/// The largest SSE frame accepted from the server.
const MAX_FRAME: usize = 4 * 1024 * 1024;
/// Reconnections allowed when a stream breaks.
const MAX_RESUMES: usize = 20;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(reason) => {
            eprintln!("ask: {reason}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let base_url = args.base_url.clone().or_else(|| env("NEXUS_BASE_URL"));
    let api_key = args.api_key.clone().or_else(|| env("PINECONE_API_KEY"));

    // Keep the local server alive until the turn is done.
    let (_local, base_url, api_key) = match base_url {
        Some(url) => (None, url, api_key),
        None => {
            let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
            let server = LocalNexus::builder()
                .faults_from_env()
                .context("nexus-knowql-docs", corpus)
                .start()
                .await
                .map_err(|e| format!("could not start the local server: {e}"))?;
            eprintln!(
                "ask: no --base-url or NEXUS_BASE_URL; started a local Nexus at {} over examples/corpus",
                server.base_url()
            );
            let url = server.base_url().to_owned();
            (Some(server), url, None)
        }
    };
    let mut builder = Client::builder().base_url(&base_url);
    if let Some(key) = &api_key {
        builder = builder.api_key(key.clone());
    }
    let client = builder.build().map_err(|e| e.to_string())?;

    let scope = if args.contexts.is_empty() {
        vec![only_queryable_context(&client).await?]
    } else {
        args.contexts.clone()
    };
    let request: types::QueryRequest = serde_json::from_value(serde_json::json!({
        "ask": args.question,
        "scope": scope,
        "stream": !(args.background || args.no_stream),
        "background": args.background,
    }))
    .map_err(|e| e.to_string())?;

    let query = if args.background {
        background(&client, &request).await?
    } else if args.no_stream {
        client
            .api()
            .query(None, &request)
            .await
            .map_err(|e| describe(&e.to_string(), &scope))?
            .into_inner()
    } else {
        stream(&base_url, api_key.as_deref(), &request, !args.json).await?
    };

    if args.json {
        let text = serde_json::to_string_pretty(&query).map_err(|e| e.to_string())?;
        println!("{text}");
    } else if args.background || args.no_stream {
        println!("{}", query.answer_text());
    }
    for (i, c) in query.citations.iter().enumerate() {
        let sections: Vec<String> = c.section_paths.iter().map(|p| p.join(" > ")).collect();
        if sections.is_empty() {
            eprintln!("[{}] {}", i + 1, c.source);
        } else {
            eprintln!("[{}] {} ({})", i + 1, c.source, sections.join("; "));
        }
    }
    match query.status.as_str() {
        "completed" => Ok(()),
        status => Err(format!(
            "the turn {status}: {}",
            query.error.as_deref().unwrap_or("no reason given")
        )),
    }
}

/// The slug of the only queryable context, or an error listing the choices.
async fn only_queryable_context(client: &Client) -> Result<String, String> {
    let contexts = client
        .contexts()
        .list()
        .await
        .map_err(|e| format!("cannot list contexts: {e}"))?;
    let queryable: Vec<&str> = contexts
        .iter()
        .filter(|c| c.is_queryable())
        .map(|c| c.slug.as_str())
        .collect();
    match queryable.as_slice() {
        [one] => Ok((*one).to_owned()),
        [] => Err("no queryable context on this server; curate one first".to_owned()),
        many => Err(format!(
            "several queryable contexts ({}); pick one with --context",
            many.join(", ")
        )),
    }
}

fn describe(error: &str, scope: &[String]) -> String {
    if error.contains("404") {
        format!("unknown context in {scope:?}: {error}")
    } else {
        error.to_owned()
    }
}

/// Starts a background turn and polls it to the end.
async fn background(
    client: &Client,
    request: &types::QueryRequest,
) -> Result<types::Query, String> {
    let started = client
        .api()
        .query(None, request)
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    eprintln!("ask: background turn {}", started.id);
    let mut delay = Duration::from_millis(100);
    loop {
        let q = client
            .queries()
            .get(&started.id)
            .await
            .map_err(|e| e.to_string())?;
        if q.is_terminal() {
            return Ok(q);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// One parsed SSE frame.
struct Frame {
    id: Option<u64>,
    event: String,
    data: String,
}

/// Streams a turn, printing text deltas to stdout (when `print`) and steps to
/// stderr; resumes a broken connection from the last event id.
async fn stream(
    base_url: &str,
    api_key: Option<&str>,
    request: &types::QueryRequest,
    print: bool,
) -> Result<types::Query, String> {
    let http = reqwest::Client::new();
    let with_headers = |rb: reqwest::RequestBuilder| {
        let rb = rb
            .header("X-Pinecone-Api-Version", "2026-07")
            .header("Accept", "text/event-stream");
        match api_key {
            Some(k) => rb.header("X-Pinecone-Api-Key", k),
            None => rb,
        }
    };
    let mut resp = with_headers(http.post(format!("{base_url}/query")).json(request))
        .send()
        .await
        .map_err(|e| format!("cannot reach {base_url}: {e}"))?;
    let mut query_id: Option<String> = None;
    let mut last_id: Option<u64> = None;
    let mut stdout = std::io::stdout();
    for _ in 0..=MAX_RESUMES {
        if !resp.status().is_success() {
            let status = resp.status();
            let body: Option<types::Error> = resp.json().await.ok();
            let msg = body.map(|b| b.message).unwrap_or_default();
            return Err(format!("{status}: {msg}"));
        }
        let mut body = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        // Read until the closing `query` frame returns; a connection error or
        // an end without that frame falls through to a resume.
        while let Some(Ok(bytes)) = body.next().await {
            buf.extend_from_slice(&bytes);
            if buf.len() > MAX_FRAME {
                return Err("the server sent an oversized event".to_owned());
            }
            while let Some(frame) = next_frame(&mut buf) {
                if frame.id.is_some() && frame.id <= last_id {
                    continue; // replayed on resume: already delivered
                }
                if frame.id.is_some() {
                    last_id = frame.id;
                }
                let data: serde_json::Value = serde_json::from_str(&frame.data).unwrap_or_default();
                match frame.event.as_str() {
                    "query" => {
                        let q: types::Query = serde_json::from_value(data)
                            .map_err(|e| format!("undecodable final query: {e}"))?;
                        if print {
                            println!();
                        }
                        return Ok(q);
                    }
                    "response.created" => {
                        query_id = data["query_id"].as_str().map(str::to_owned);
                    }
                    "response.step" => {
                        if let Some(c) = data["commentary"].as_str() {
                            eprintln!("· {c}");
                        }
                    }
                    "response.output_text.delta" => {
                        if print && let Some(d) = data["delta"].as_str() {
                            print!("{d}");
                            let _ = stdout.flush();
                        }
                    }
                    _ => {}
                }
            }
        }
        let id = query_id
            .clone()
            .ok_or("the stream broke before the turn started")?;
        eprintln!(
            "ask: stream interrupted; resuming after event {}",
            last_id.unwrap_or(0)
        );
        let mut rb = http.get(format!("{base_url}/queries/{id}/events"));
        if let Some(n) = last_id {
            rb = rb.header("Last-Event-ID", n.to_string());
        }
        resp = with_headers(rb)
            .send()
            .await
            .map_err(|e| format!("cannot reach {base_url}: {e}"))?;
    }
    Err("the stream kept breaking; giving up".to_owned())
}

/// Takes one complete frame (ended by a blank line) off the buffer.
fn next_frame(buf: &mut Vec<u8>) -> Option<Frame> {
    loop {
        let text = std::str::from_utf8(buf).ok()?;
        let (end, sep) = [("\r\n\r\n", 4), ("\n\n", 2)]
            .iter()
            .filter_map(|(s, n)| text.find(s).map(|i| (i, *n)))
            .min()?;
        let raw = text[..end].to_owned();
        buf.drain(..end + sep);
        let mut frame = Frame {
            id: None,
            event: String::new(),
            data: String::new(),
        };
        for line in raw.lines() {
            if let Some(v) = line.strip_prefix("id:") {
                frame.id = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("event:") {
                frame.event = v.trim().to_owned();
            } else if let Some(v) = line.strip_prefix("data:") {
                frame.data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if !frame.event.is_empty() {
            return Some(frame);
        }
    }
}
