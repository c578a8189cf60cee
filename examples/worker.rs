//! A turn that outlives its process: start it, persist a checkpoint after
//! every event, "crash", and finish it from a second process that attaches
//! by id and reads exactly the events after the checkpoint.
//!
//! ```text
//! cargo run --example worker --features local
//! cargo run --example worker --features local -- --crash-after 10 "How do I resume a stream?"
//! RUST_LOG=nexus_knowql=debug cargo run --example worker --features local
//! ```
//!
//! Without `--base-url` and `NEXUS_BASE_URL` it starts a `LocalNexus`
//! in-process over the project's own docs (`examples/corpus`), with a small
//! pause between events so the turn is still running at the crash. It then
//! runs itself twice as child processes:
//!
//! 1. `worker start`: streams a new turn and, after every event, writes the
//!    checkpoint (`QueryTurn::checkpoint()`: the turn, the last event and
//!    the bytes of text up to it, plus the text so far) to a file, temp +
//!    fsync + rename, so a crash never leaves half a checkpoint. After
//!    `--crash-after` events it exits at once with code 3.
//! 2. `worker resume`: reads the checkpoint, `client.queries().attach(id)`,
//!    then `events_from(&checkpoint)` and prints the whole answer. The rest
//!    is checked against the stored answer; if the event log is gone by
//!    then, the rest comes from the stored turn.
//!
//! stdout carries only the answer; progress goes to stderr. A closed stdout
//! (`worker | head -c 5`) cancels the turn and ends quietly. Logs use the
//! `tracing-subscriber` fmt layer on stderr: each turn is a `query_turn`
//! span with `mode`, `query_id`, `session_id` and `resumes`, and retries,
//! resumes and replay checks are events inside it (the span's close line
//! shows its fields). The exit code is 0 when the resumed turn completed.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use futures::StreamExt;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::{Client, QueryEvent};
use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

/// Start a turn, crash, and finish it from another process.
#[derive(Debug, Parser)]
#[command(name = "worker")]
struct Args {
    /// The API base URL (default: NEXUS_BASE_URL, else a local server over examples/corpus).
    #[arg(long, global = true)]
    base_url: Option<String>,
    /// The API key (default: PINECONE_API_KEY).
    #[arg(long, hide_env_values = true, global = true)]
    api_key: Option<String>,
    /// Where the checkpoint lives (default: a file in the temp directory).
    #[arg(long, global = true)]
    checkpoint: Option<PathBuf>,
    #[command(subcommand)]
    role: Option<Role>,
    /// Events the first process reads before it crashes.
    #[arg(long, default_value_t = 8)]
    crash_after: usize,
    /// Context to ask (default: the only queryable one).
    #[arg(long = "context", value_name = "SLUG")]
    context: Option<String>,
    /// The question.
    #[arg(default_value = "How do I resume a broken stream?")]
    question: String,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Start the turn, checkpoint every event, crash after N events.
    Start {
        /// Events to read before crashing.
        #[arg(long)]
        crash_after: usize,
        /// The context to ask.
        #[arg(long)]
        context: String,
        /// The question.
        question: String,
    },
    /// Continue the turn of the checkpoint and print the answer.
    Resume,
}

/// What a worker persists: enough to continue the same answer elsewhere.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    /// `QueryTurn::checkpoint()`: every event up to it was handled.
    checkpoint: nexus_knowql::query::Checkpoint,
    /// The answer text up to the checkpoint.
    text: String,
}

/// The answer could not be written: stdout was closed.
const STDOUT_CLOSED: &str = "stdout closed";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("nexus_knowql=info")),
        )
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        // The reader went away (`worker | head`): nothing more to say.
        Err(reason) if reason == STDOUT_CLOSED => ExitCode::SUCCESS,
        Err(reason) => {
            eprintln!("worker: {reason}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<ExitCode, String> {
    let checkpoint = args.checkpoint.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("nexus-worker-{}.json", std::process::id()))
    });
    match &args.role {
        Some(Role::Start {
            crash_after,
            context,
            question,
        }) => {
            let client = connect(&args)?;
            start(&client, context, question, *crash_after, &checkpoint).await
        }
        Some(Role::Resume) => {
            let client = connect(&args)?;
            resume(&client, &checkpoint)
                .await
                .map(|()| ExitCode::SUCCESS)
        }
        None => orchestrate(&args, &checkpoint).await,
    }
}

fn connect(args: &Args) -> Result<Client, String> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let url = args
        .base_url
        .clone()
        .or_else(|| env("NEXUS_BASE_URL"))
        .ok_or("no --base-url or NEXUS_BASE_URL")?;
    let mut builder = Client::builder().base_url(url);
    if let Some(key) = args.api_key.clone().or_else(|| env("PINECONE_API_KEY")) {
        builder = builder.api_key(key);
    }
    builder.build().map_err(|e| e.to_string())
}

/// Runs both roles as child processes against one server.
async fn orchestrate(args: &Args, checkpoint: &Path) -> Result<ExitCode, String> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let mut _local = None;
    let base_url = match args.base_url.clone().or_else(|| env("NEXUS_BASE_URL")) {
        Some(url) => url,
        None => {
            let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
            let server = LocalNexus::builder()
                .faults_from_env()
                .frame_delay(Duration::from_millis(40))
                .context("nexus-knowql-docs", corpus)
                .start()
                .await
                .map_err(|e| format!("could not start the local server: {e}"))?;
            eprintln!("worker: started a local Nexus at {}", server.base_url());
            let url = server.base_url().to_owned();
            _local = Some(server);
            url
        }
    };
    let client = {
        let mut b = Client::builder().base_url(&base_url);
        if let Some(key) = args.api_key.clone().or_else(|| env("PINECONE_API_KEY")) {
            b = b.api_key(key);
        }
        b.build().map_err(|e| e.to_string())?
    };
    let context = match &args.context {
        Some(c) => c.clone(),
        None => only_queryable_context(&client).await?,
    };
    let exe = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
    let child = |role: &[&str]| {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("--base-url")
            .arg(&base_url)
            .arg("--checkpoint")
            .arg(checkpoint)
            .args(role);
        if let Some(key) = &args.api_key {
            cmd.env("PINECONE_API_KEY", key);
        }
        cmd
    };
    let crash_after = args.crash_after.to_string();
    eprintln!("worker: process 1 starts the turn and crashes after {crash_after} events");
    let first = child(&[
        "start",
        "--crash-after",
        &crash_after,
        "--context",
        &context,
        &args.question,
    ])
    .status()
    .await
    .map_err(|e| format!("cannot run the first process: {e}"))?;
    eprintln!("worker: process 1 ended with {first}");
    eprintln!("worker: process 2 attaches and finishes the turn");
    let second = child(&["resume"])
        .status()
        .await
        .map_err(|e| format!("cannot run the second process: {e}"))?;
    let _ = std::fs::remove_file(checkpoint);
    if second.success() {
        Ok(ExitCode::SUCCESS)
    } else {
        Err(format!("the second process ended with {second}"))
    }
}

/// Streams a new turn, checkpointing after every event; exits abruptly
/// after `crash_after` events.
async fn start(
    client: &Client,
    context: &str,
    question: &str,
    crash_after: usize,
    path: &Path,
) -> Result<ExitCode, String> {
    let session = client
        .session([context])
        .build()
        .map_err(|e| e.to_string())?;
    let mut turn = session
        .ask(question)
        .stream()
        .await
        .map_err(|e| e.to_string())?;
    let mut seen = 0;
    while let Some(event) = turn.next().await {
        let event = event.map_err(|e| e.to_string())?;
        seen += 1;
        if let QueryEvent::Created { query_id, .. } = &event {
            eprintln!("worker[start]: turn {query_id}");
        }
        if let Some(checkpoint) = turn.checkpoint() {
            save(
                path,
                &Saved {
                    checkpoint,
                    text: turn.text().to_owned(),
                },
            )
            .map_err(|e| format!("cannot write the checkpoint {}: {e}", path.display()))?;
        }
        if seen == crash_after {
            eprintln!(
                "worker[start]: crashing after event {} with {} bytes of the answer",
                turn.last_event_id().unwrap_or_default(),
                turn.text().len()
            );
            // An abrupt end: no destructor runs, nothing is cancelled.
            std::process::exit(3);
        }
    }
    eprintln!("worker[start]: the turn ended before the crash");
    turn.finish().await.map_err(|e| e.to_string())?;
    Ok(ExitCode::SUCCESS)
}

/// Continues the checkpointed turn and prints the whole answer.
async fn resume(client: &Client, path: &Path) -> Result<(), String> {
    let saved = load(path)?;
    let checkpoint = &saved.checkpoint;
    eprintln!(
        "worker[resume]: attaching to {} after event {} ({} bytes of text)",
        checkpoint.query_id, checkpoint.event_id, checkpoint.text_len
    );
    let handle = client
        .queries()
        .attach(&checkpoint.query_id)
        .await
        .map_err(|e| e.to_string())?;
    eprintln!("worker[resume]: the turn is {}", handle.last_seen().status);
    let mut rest = handle
        .events_from(checkpoint)
        .await
        .map_err(|e| e.to_string())?;
    let mut stdout = std::io::stdout();
    let mut print = |text: &str| -> Result<(), String> {
        match write!(stdout, "{text}").and_then(|()| stdout.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(STDOUT_CLOSED.into()),
            _ => Ok(()),
        }
    };
    let mut printed = print(&saved.text);
    while printed.is_ok()
        && let Some(event) = rest.next().await
    {
        match event.map_err(|e| e.to_string())? {
            QueryEvent::TextDelta { delta } => printed = print(&delta),
            QueryEvent::Step(step) => eprintln!("· {}", step.commentary),
            _ => {}
        }
    }
    if let Err(closed) = printed.and_then(|()| print("\n")) {
        // Nobody reads the answer any more: stop the turn too.
        if let Err(e) = client.queries().cancel(&checkpoint.query_id).await {
            eprintln!(
                "worker[resume]: could not cancel {}: {e}",
                checkpoint.query_id
            );
        }
        return Err(closed);
    }
    let whole = format!("{}{}", saved.text, rest.text());
    let query = rest.finish().await.map_err(|e| e.to_string())?;
    if query.answer_text() != whole {
        return Err(
            "the checkpointed and the resumed text do not add up to the stored answer".into(),
        );
    }
    eprintln!(
        "worker[resume]: {} completed, {} citations",
        query.id,
        query.citations.len()
    );
    Ok(())
}

/// Writes the checkpoint durably: temp file, fsync, rename, fsync the directory.
fn save(path: &Path, checkpoint: &Saved) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let tmp = path.with_extension("json.tmp");
    {
        let mut file = std::fs::File::create(&tmp)?;
        let json = serde_json::to_vec(checkpoint).map_err(std::io::Error::other)?;
        file.write_all(&json)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    // The rename itself is durable once the directory is synced (where the
    // platform allows opening one).
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn load(path: &Path) -> Result<Saved, String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("no checkpoint at {}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("bad checkpoint {}: {e}", path.display()))
}

/// The slug of the only queryable context.
async fn only_queryable_context(client: &Client) -> Result<String, String> {
    let contexts = client.contexts().list().await.map_err(|e| e.to_string())?;
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
