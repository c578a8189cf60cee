//! A turn that outlives its process: a worker streams the answer while a
//! `CheckpointStore` keeps its place, "crashes", and a restarted worker
//! continues from the store, reading exactly the events after it.
//!
//! ```text
//! cargo run --example worker --features local
//! cargo run --example worker --features local -- --crash-after 10 "How do I resume a stream?"
//! cargo run --example worker --features local -- --output answer.txt
//! RUST_LOG=nexus_knowql=debug cargo run --example worker --features local
//! ```
//!
//! Without `--base-url` and `NEXUS_BASE_URL` it starts a `LocalNexus`
//! in-process over the project's own docs (`examples/corpus`), with a small
//! pause between events so the turn is still running at the crash. It then
//! runs the same worker twice as child processes (`worker --once`), sharing
//! one `FileCheckpointStore` directory:
//!
//! 1. The first finds nothing stored and starts the job's turn with
//!    `CheckpointedTurn::start_or_resume`, which records its intent before
//!    `POST /query`. It writes the answer as it streams; each event's
//!    checkpoint (with the digest of the text up to it) is saved (temp
//!    file, fsync, rename) before the next one is read. After handling
//!    `--crash-after` events it exits at once with code 3.
//! 2. The second finds the checkpoint (or, had the first died before its
//!    first checkpoint, the turn the first started: never a second turn;
//!    had it died before its `POST /query` arrived, the turn again, once
//!    the admission horizon has passed: this worker is at least once)
//!    and writes the rest: the events after the last one handled, checked
//!    against the stored answer, whose beginning must be the text the
//!    checkpoint proves. Once the turn has ended the store forgets it.
//!
//! With `--output FILE` the answer is written to FILE exactly once, whenever
//! a worker is killed (even with `kill -9`): a restarted worker first checks
//! that FILE begins with the text its checkpoint proves and cuts it back to
//! that length, and each part is synced to FILE before the checkpoint after
//! it is saved. Without it the answer goes to stdout at least once: a
//! terminal cannot be cut back, so the event in hand at a crash may be
//! printed again (one event at most). Progress goes to stderr.
//!
//! A worker that finished leaves the job's final checkpoint in the store:
//! started again, it writes nothing more and exits 0 (never a second turn).
//! The supervisor forgets the job once it has its answer.
//!
//! A closed stdout (`worker | head -c 5`) cancels the turn and ends quietly.
//! A turn that failed verification is recorded as failed under the job's
//! key, never resumed: the worker says so, exits 1, and the way out is to
//! remove the record and the output. Logs use the `tracing-subscriber` fmt
//! layer on stderr; each turn is a `query_turn` span. The exit code is 0
//! when the turn completed.

#[path = "common/context.rs"]
mod context;

use std::fs::File;
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use futures::StreamExt;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::query::{CheckpointStore, FileCheckpointStore, IfNotFound, StartProtocol};
use nexus_knowql::{Checkpoint, CheckpointedTurn, Client, QueryEvent};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

/// Start a turn, crash, and finish it from a restarted worker.
#[derive(Debug, Parser)]
#[command(name = "worker")]
struct Args {
    /// The API base URL (default: NEXUS_BASE_URL, else a local server over examples/corpus).
    #[arg(long, env = "NEXUS_BASE_URL")]
    base_url: Option<String>,
    /// The API key (default: PINECONE_API_KEY).
    #[arg(long, env = "PINECONE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The checkpoint store's directory (default: a new one in the temp directory).
    #[arg(long)]
    store: Option<PathBuf>,
    /// Be one worker process: continue the stored turn, or start one.
    #[arg(long)]
    once: bool,
    /// Write the answer to this file, exactly once across crashes (default: stdout, at least once).
    #[arg(long)]
    output: Option<PathBuf>,
    /// The job's key in the store.
    #[arg(long, default_value = "worker-job")]
    key: String,
    /// Pause after writing each part, as a slow sink would (a wider window
    /// between a write and its checkpoint, for crash tests).
    #[arg(long, hide = true, default_value_t = 0)]
    slow_sink_ms: u64,
    /// Events handled before the (first) worker crashes.
    #[arg(long)]
    crash_after: Option<usize>,
    /// When a restart cannot find the turn a dead worker was starting (the
    /// admission horizon passed), fail with `CheckpointError::NotStarted`
    /// and post nothing, instead of posting the turn again.
    #[arg(long)]
    at_most_once: bool,
    /// Context to ask (default: the only queryable one).
    #[arg(long = "context", value_name = "SLUG")]
    context: Option<String>,
    /// The question.
    #[arg(default_value = "How do I resume a broken stream?")]
    question: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("nexus_knowql=warn")),
        )
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = Args::parse();
    let result = if args.once {
        work(&args).await
    } else {
        orchestrate(&args).await
    };
    result.unwrap_or_else(|reason| {
        eprintln!("error: {reason}");
        ExitCode::FAILURE
    })
}

fn client(base_url: &str, api_key: Option<&str>) -> Result<Client, String> {
    let mut builder = Client::builder().base_url(base_url);
    if let Some(key) = api_key.map(str::trim).filter(|k| !k.is_empty()) {
        builder = builder.api_key(key);
    }
    builder.build().map_err(|e| e.to_string())
}

/// Runs two workers one after the other against one server and store.
async fn orchestrate(args: &Args) -> Result<ExitCode, String> {
    let mut _local: Option<LocalNexus> = None;
    let base_url = match args.base_url.clone().filter(|u| !u.trim().is_empty()) {
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
    if let Some(slug) = &args.context {
        // Checked once here: a worker that fails on it would be restarted.
        context::require(&client(&base_url, args.api_key.as_deref())?, slug).await?;
    }
    let (store, own_store) = match &args.store {
        Some(dir) => (dir.clone(), false),
        None => {
            let dir = std::env::temp_dir().join(format!("nexus-worker-{}", std::process::id()));
            (dir, true)
        }
    };
    let exe = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
    let worker = |crash_after: Option<usize>| {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.args([
            "--once",
            "--base-url",
            &base_url,
            "--key",
            &args.key,
            "--store",
        ])
        .arg(&store)
        .arg(&args.question);
        if let Some(output) = &args.output {
            cmd.arg("--output").arg(output);
        }
        if let Some(context) = &args.context {
            cmd.args(["--context", context]);
        }
        if let Some(key) = &args.api_key {
            cmd.env("PINECONE_API_KEY", key);
        }
        if let Some(n) = crash_after {
            cmd.args(["--crash-after", &n.to_string()]);
        }
        cmd
    };
    let crash_after = args.crash_after.unwrap_or(8);
    eprintln!("worker: worker 1 starts the turn and crashes after {crash_after} events");
    let cannot_run = |e: std::io::Error| format!("cannot run a worker: {e}");
    let first = worker(Some(crash_after)).status().await.map_err(cannot_run);
    // A supervisor's rule: restart a worker that crashed, not one that
    // finished (or stopped because nobody reads its answer).
    let last = match first {
        Ok(first) if !first.success() => {
            eprintln!("worker: worker 1 ended with {first}");
            eprintln!("worker: worker 2 continues from the store");
            worker(None).status().await.map_err(cannot_run)
        }
        done => done,
    };
    let last = last?;
    if last.success() {
        // The job is done and its answer handed on: forget it. (A worker
        // does not: killed after that, its restart would start the job's
        // turn again.)
        let forget = FileCheckpointStore::new(&store).and_then(|s| s.clear(&args.key));
        forget.map_err(|e| format!("cannot forget the finished job: {e}"))?;
    }
    if own_store {
        let _ = std::fs::remove_dir_all(&store);
    }
    if last.success() {
        Ok(ExitCode::SUCCESS)
    } else {
        Err(format!("the last worker ended with {last}"))
    }
}

/// One worker process: continues the stored turn, or starts one, and
/// writes the answer text it handles.
async fn work(args: &Args) -> Result<ExitCode, String> {
    let url = args
        .base_url
        .as_deref()
        .ok_or("no --base-url or NEXUS_BASE_URL")?;
    let client = client(url, args.api_key.as_deref())?;
    let dir = args.store.clone().ok_or("no --store")?;
    let store = FileCheckpointStore::new(dir).map_err(|e| e.to_string())?;
    let context = match &args.context {
        Some(c) => c.clone(),
        None => only_queryable_context(&client).await?,
    };
    let context_slug = context.clone();
    let session = client.session([context]).build();
    let ask = session.map_err(|e| e.to_string())?.ask(&args.question);
    // This worker's choice: at least once. A job's answer matters more here
    // than its cost, so a turn a dead worker was starting that no session
    // shows once the admission horizon has passed is posted again (a
    // second turn only if the server admitted the first after the
    // horizon). `--at-most-once` fails instead and posts nothing.
    let policy = if args.at_most_once {
        IfNotFound::AtMostOnce
    } else {
        IfNotFound::AtLeastOnce
    };
    let protocol = StartProtocol::default().if_not_found(policy);
    let started =
        CheckpointedTurn::start_or_resume_with(&client, store, &args.key, ask, &protocol).await;
    let mut turn = match started {
        Ok(turn) => turn,
        // A turn's start answered 404 names no context: ask which.
        Err(e) if e.is_not_found() => {
            let scope = [context_slug];
            return Err(context::first_missing(&client, &scope)
                .await
                .unwrap_or_else(|| e.to_string()));
        }
        Err(e) => return Err(e.to_string()),
    };
    if let Some(cp) = turn.resumed_from() {
        eprintln!(
            "worker: resuming {} after event {} ({} bytes of text)",
            cp.query_id, cp.event_id, cp.text_len
        );
    }
    let mut sink = match &args.output {
        Some(path) => Sink::File(positioned(path, turn.resumed_from())?),
        None => Sink::Stdout,
    };
    let mut handled = 0;
    while let Some(event) = turn.next().await {
        if Some(handled) == args.crash_after {
            // The checkpoint of the last handled event is saved; die
            // abruptly, with no destructor run and nothing cancelled.
            eprintln!("worker: crashing after {handled} events");
            std::process::exit(3);
        }
        match event.map_err(|e| e.to_string())? {
            QueryEvent::Created { query_id, .. } => eprintln!("worker: turn {query_id}"),
            QueryEvent::Step(step) => eprintln!("· {}", step.commentary),
            QueryEvent::TextDelta { delta } => {
                if !sink.write(&delta)? {
                    // Nobody reads the answer any more: stop the turn too.
                    let _ = turn.cancel().await;
                    return Ok(ExitCode::SUCCESS);
                }
                if args.slow_sink_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(args.slow_sink_ms)).await;
                }
            }
            _ => {}
        }
        handled += 1;
    }
    let query = turn.finish().await.map_err(|e| e.to_string())?;
    if let Sink::Stdout = sink {
        print("\n");
    }
    eprintln!(
        "worker: {} completed, {} citations",
        query.id,
        query.citations.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// Where the answer goes.
enum Sink {
    /// A terminal or pipe: at least once.
    Stdout,
    /// A file, cut back to the checkpoint: exactly once.
    File(File),
}

impl Sink {
    /// Writes `text`; false once stdout is closed. A file's part is synced
    /// before this returns, so before the checkpoint after it is saved.
    fn write(&mut self, text: &str) -> Result<bool, String> {
        match self {
            Sink::Stdout => Ok(print(text)),
            Sink::File(file) => {
                file.write_all(text.as_bytes())
                    .and_then(|()| file.sync_data())
                    .map_err(|e| format!("cannot write the output: {e}"))?;
                Ok(true)
            }
        }
    }
}

/// Opens the output file at the checkpoint: it must begin with the text the
/// checkpoint proves (else it is not this job's output), and is cut back to
/// it; with no checkpoint, it is emptied.
fn positioned(path: &Path, from: Option<&Checkpoint>) -> Result<File, String> {
    let mut file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let keep = from.map_or(0, |cp| cp.text_len);
    if let Some(cp) = from {
        let mut head = Vec::new();
        (&mut file)
            .take(keep)
            .read_to_end(&mut head)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if !cp.proves_prefix_of(&head) {
            return Err(format!(
                "{} does not begin with the {keep} bytes the checkpoint of {} proves; \
                 remove it and the job's record to start afresh",
                path.display(),
                cp.query_id
            ));
        }
    }
    file.set_len(keep)
        .and_then(|()| file.seek(SeekFrom::Start(keep)).map(drop))
        .and_then(|()| file.sync_data())
        .map_err(|e| format!("cannot cut {} back: {e}", path.display()))?;
    Ok(file)
}

/// Writes to stdout; false once stdout is closed.
fn print(text: &str) -> bool {
    let mut stdout = std::io::stdout();
    !matches!(write!(stdout, "{text}").and_then(|()| stdout.flush()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
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
