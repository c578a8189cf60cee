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
//! The exit code is 0 when the turn completed. Ctrl-C cancels the running
//! turn on the server (whichever way it runs) and exits with code 130; a
//! closed stdout (`ask … | head -c 5`) cancels it too and ends quietly
//! (exit code 0). `NEXUS_API_VERSION` picks the API version, as for the
//! other examples.

#[path = "common/answer_text.rs"]
mod answer_text;
#[path = "common/citation.rs"]
mod citation;
#[path = "common/context.rs"]
mod context;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use answer_text::AnswerText;
use clap::Parser;
use futures::StreamExt;
use nexus_knowql::client::DEFAULT_HEADER_TIMEOUT;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::{Client, ClientBuilder, Error, QueryEvent, StreamConfig, WaitPolicy, types};

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
    /// The longest the turn is awaited, in seconds, from the question to
    /// the answer (default 960: the service's 900 s cap plus a margin).
    #[arg(long, value_name = "SECS", default_value_t = 960,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// The question.
    question: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Interrupted) => ExitCode::from(130),
        Err(Failure::StdoutClosed) => ExitCode::SUCCESS,
        Err(Failure::Reason(reason)) => {
            eprintln!("error: {reason}");
            ExitCode::FAILURE
        }
    }
}

/// Why `ask` did not print a completed answer.
#[derive(Debug)]
enum Failure {
    /// Ctrl-C: the turn was cancelled on the server (exit code 130).
    Interrupted,
    /// stdout was closed (the reader went away); the turn was cancelled.
    StdoutClosed,
    /// A one-line reason.
    Reason(String),
}

impl From<String> for Failure {
    fn from(reason: String) -> Self {
        Failure::Reason(reason)
    }
}

impl From<&str> for Failure {
    fn from(reason: &str) -> Self {
        Failure::Reason(reason.to_owned())
    }
}

/// Resolves at the first Ctrl-C (never, if the handler cannot be installed).
async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// `work`'s output, or `None` when Ctrl-C comes first (`work` is dropped).
async fn unless_ctrl_c<T>(work: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::select! {
        done = work => Some(done),
        () = ctrl_c() => None,
    }
}

/// Cancels the turn `id` on the server; the answer must name that turn.
async fn cancel_turn(client: &Client, id: &str) -> nexus_knowql::Result<types::Query> {
    client.queries().attach(id).await?.cancel().await
}

/// Cancels a turn on the server after Ctrl-C and says so.
async fn cancel(client: &Client, query_id: Option<&str>) -> Failure {
    match query_id {
        Some(id) => match cancel_turn(client, id).await {
            Ok(_) => eprintln!("ask: interrupted; cancelled {id} on the server"),
            Err(e) => eprintln!("ask: interrupted; could not cancel {id}: {}", one_line(&e)),
        },
        None => eprintln!("ask: interrupted before the server named the turn"),
    }
    Failure::Interrupted
}

async fn run(args: Args) -> Result<(), Failure> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let base_url = args.base_url.clone().or_else(|| env("NEXUS_BASE_URL"));
    let limit = Duration::from_secs(args.timeout);

    // Keep the local server alive until the turn is done.
    let (_local, client) = match base_url {
        Some(url) => {
            // The key (PINECONE_API_KEY) and NEXUS_API_VERSION from the
            // environment, as for the other examples; --api-key wins.
            let mut builder = ClientBuilder::from_env()
                .base_url(&url)
                .header_timeout(Some(limit.min(DEFAULT_HEADER_TIMEOUT)));
            if let Some(key) = args.api_key.clone() {
                builder = builder.api_key(key);
            }
            (None, builder.build().map_err(|e| e.to_string())?)
        }
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
            let client = server.client().map_err(|e| e.to_string())?;
            (Some(server), client)
        }
    };

    let scope = if args.contexts.is_empty() {
        vec![only_queryable_context(&client).await?]
    } else {
        args.contexts.clone()
    };
    let session = client
        .session(scope.iter().map(String::as_str))
        .build()
        .map_err(|e| e.to_string())?;
    // The deltas are printed, not kept: the turn only checks them. One
    // bound covers the turn however it runs.
    let config = StreamConfig::default().keep_text(false);
    let turn = session
        .ask(args.question.as_str())
        .turn_timeout(limit)
        .stream_config(config);

    // A Ctrl-C while a turn is being started drops the request; the session
    // remembers the turn it started, once the server has named it.
    let outcome = if args.background {
        let Some(started) = unless_ctrl_c(turn.background()).await else {
            return Err(cancel(&client, session.unfinished_query_id().as_deref()).await);
        };
        match started {
            Ok(mut handle) => {
                eprintln!("ask: background turn {}", handle.id());
                match unless_ctrl_c(handle.wait(WaitPolicy::default())).await {
                    Some(waited) => waited.and_then(types::Query::into_result),
                    None => return Err(cancel(&client, Some(handle.id())).await),
                }
            }
            Err(e) => Err(e),
        }
    } else if args.no_stream {
        match unless_ctrl_c(turn.send()).await {
            Some(sent) => sent,
            // The session remembers the turn the dropped send() started.
            None => return Err(cancel(&client, session.unfinished_query_id().as_deref()).await),
        }
    } else {
        let Some(started) = unless_ctrl_c(turn.stream()).await else {
            return Err(cancel(&client, session.unfinished_query_id().as_deref()).await);
        };
        match started {
            Ok(turn) => match stream(turn, !args.json).await {
                Ok(Streamed::Done(outcome)) => *outcome,
                Ok(Streamed::Interrupted(id)) => {
                    return Err(cancel(&client, id.as_deref()).await);
                }
                Ok(Streamed::Closed(id)) => {
                    // Nobody reads the answer: stop the turn, quietly.
                    if let Some(id) = id {
                        let _ = cancel_turn(&client, &id).await;
                    }
                    return Err(Failure::StdoutClosed);
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    };

    let query = match outcome {
        Ok(q) => q,
        Err(e) => {
            // A turn that ran and failed still has a document worth printing.
            if args.json
                && let Error::TurnFailed { query_id, .. } | Error::TurnCancelled { query_id, .. } =
                    &e
                && let Ok(handle) = client.queries().attach(query_id).await
            {
                let q = handle.last_seen();
                let text = serde_json::to_string_pretty(&q).map_err(|e| e.to_string())?;
                out(&format!("{text}\n"))?;
            }
            // A turn's start answered 404 names no context: ask which.
            if e.is_not_found()
                && e.as_api().is_some_and(|a| a.operation == "create_query")
                && let Some(line) = context::first_missing(&client, &scope).await
            {
                return Err(line.into());
            }
            let pending = session.unfinished_query_id();
            return Err(reason(&e, client.base_url(), pending.as_deref()).into());
        }
    };
    if args.json {
        let text = serde_json::to_string_pretty(&query).map_err(|e| e.to_string())?;
        out(&format!("{text}\n"))?;
    } else if args.background || args.no_stream {
        let mut text = AnswerText::new(std::io::stdout(), answer_text::Mode::for_stdout());
        text.push(&query.answer_text())
            .and_then(|()| text.finish())
            .map_err(written)?;
    }
    eprint!("{}", citation::footnotes(&query.citations));
    Ok(())
}

/// How a streamed turn ended.
enum Streamed {
    /// It ran to its end (or failed).
    Done(Box<nexus_knowql::Result<types::Query>>),
    /// Ctrl-C; the turn's id when known.
    Interrupted(Option<String>),
    /// stdout was closed; the turn's id when known.
    Closed(Option<String>),
}

/// Writes `text` to stdout and flushes it; a closed stdout is
/// [`Failure::StdoutClosed`] (never a panic, as `print!` would be).
fn out(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(written)
}

/// A failed write to stdout: a closed stdout ends the program quietly.
fn written(e: std::io::Error) -> Failure {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Failure::StdoutClosed
    } else {
        Failure::Reason(format!("cannot write the answer: {e}"))
    }
}

/// Streams a turn: text deltas to stdout (when `print`), steps to stderr.
async fn stream(mut turn: nexus_knowql::QueryTurn, print: bool) -> nexus_knowql::Result<Streamed> {
    let mut printed = false;
    let mut text = AnswerText::new(std::io::stdout(), answer_text::Mode::for_stdout());
    let closed = |turn: nexus_knowql::QueryTurn| {
        let id = turn.query_id().map(str::to_owned);
        drop(turn);
        Ok(Streamed::Closed(id))
    };
    loop {
        let event = tokio::select! {
            event = turn.next() => event,
            () = ctrl_c() => {
                if printed {
                    let _ = text.finish();
                }
                let id = turn.query_id().map(str::to_owned);
                // Closing the stream first; the caller cancels on the server.
                drop(turn);
                return Ok(Streamed::Interrupted(id));
            }
        };
        let Some(event) = event else { break };
        match event {
            Ok(QueryEvent::TextDelta { delta }) if print => {
                if let Err(Failure::StdoutClosed) = text.push(&delta).map_err(written) {
                    return closed(turn);
                }
                printed = true;
            }
            Ok(QueryEvent::Step(step)) => eprintln!("· {}", step.commentary),
            Ok(_) => {}
            Err(e) => {
                if printed {
                    let _ = text.finish();
                }
                return Ok(Streamed::Done(Box::new(Err(e))));
            }
        }
    }
    if printed && let Err(Failure::StdoutClosed) = text.finish().map_err(written) {
        return closed(turn);
    }
    Ok(Streamed::Done(Box::new(turn.finish().await)))
}

/// One line saying why the turn did not complete. `pending` is the turn the
/// session started and has not seen end, when it knows one.
fn reason(e: &Error, base_url: &str, pending: Option<&str>) -> String {
    let query_id = e.query_id().or(pending);
    let named = query_id
        .map(|q| format!(" (query {q})"))
        .unwrap_or_default();
    match e {
        Error::TurnFailed { message, .. } => format!("the turn failed: {message}"),
        Error::TurnCancelled { message, .. } => format!("the turn was cancelled: {message}"),
        // The request reached the server (or may have): the turn may run.
        Error::Timeout { elapsed_ms, .. } if e.may_have_started() => format!(
            "No answer in {} s; the turn may still be running{named}",
            // A timer fires a little after its deadline: the nearest second.
            elapsed_ms.saturating_add(500) / 1000
        ),
        Error::Transport { .. } | Error::Stream { .. } if e.may_have_started() => {
            format!(
                "the connection broke; the turn may still be running{named}: {}",
                one_line(e)
            )
        }
        Error::Transport { connect: true, .. } | Error::Timeout { .. } => {
            format!("cannot reach {base_url}: {}", one_line(e))
        }
        Error::ReplayGap { .. } => format!("the answer is incomplete: {}", one_line(e)),
        e => one_line(e),
    }
}

/// An error and its sources on one line, each cause once (an error whose
/// text already shows its source is not followed by it again).
fn one_line(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out.replace('\n', " ")
}

/// The slug of the only queryable context, or an error listing the choices.
async fn only_queryable_context(client: &Client) -> Result<String, String> {
    let contexts = client.contexts().list().await.map_err(|e| {
        format!(
            "cannot list contexts at {}: {}",
            client.base_url(),
            one_line(&e)
        )
    })?;
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
