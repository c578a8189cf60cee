//! What the `chat` and `nexus` examples share: the connection flags, one-line
//! errors, colour that respects `NO_COLOR`, progress on stderr, and how a
//! turn's answer and citations are printed.

// Each example uses a different part of this module.
#![allow(dead_code, unused_macros)]

/// `println!` that ends the program quietly (exit 0) when stdout is closed
/// (`nexus tasks | head -1`), where std's would panic. Declared before the
/// rest of the module, and the module `#[macro_use]`, so that it replaces
/// std's in the examples that share this module.
macro_rules! println {
    () => { $crate::common::out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::common::out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` with the same rule as [`println!`].
macro_rules! print {
    ($($arg:tt)*) => { $crate::common::out(format_args!($($arg)*)) };
}

/// Writes to stdout and flushes; a closed stdout ends the program quietly.
pub(crate) fn out(args: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

pub(crate) mod context;

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use console::style;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nexus_knowql::local::LocalNexus;
use nexus_knowql::{Client, Error, QueryEvent, QueryHandle, QueryTurn, WaitPolicy, types};

/// Where the examples find a Nexus, from flags or the environment.
#[derive(Debug, clap::Args)]
pub(crate) struct ServerArgs {
    /// Base URL of the Nexus API, for example `https://HOST/api`. Without it,
    /// an embedded local Nexus is started over the shipped corpus.
    #[arg(long, env = "NEXUS_BASE_URL", global = true)]
    pub(crate) base_url: Option<String>,
    /// API key (sent as `X-Pinecone-Api-Key`).
    #[arg(long, env = "PINECONE_API_KEY", hide_env_values = true, global = true)]
    pub(crate) api_key: Option<String>,
    /// API version to request (default `2026-07`).
    #[arg(long, env = "NEXUS_API_VERSION", global = true)]
    pub(crate) api_version: Option<String>,
    /// Exchange the API key for a bearer token (`POST /auth/login`) and
    /// send `Authorization: Bearer` instead of the key (needs `--api-key`
    /// or `PINECONE_API_KEY`).
    // Checked in `connect`, not with clap's `requires`: that one fails a
    // global flag given on the other side of the subcommand.
    #[arg(long, global = true)]
    pub(crate) login: bool,
}

/// A connected client, and the embedded server it talks to when there is one
/// (kept alive as long as this value).
#[derive(Debug)]
pub(crate) struct Connection {
    /// The client.
    pub(crate) client: Client,
    /// Whether the client talks to the embedded local Nexus.
    pub(crate) local: bool,
    _server: Option<LocalNexus>,
}

impl ServerArgs {
    /// Connects to the configured server, or starts the embedded one.
    pub(crate) async fn connect(&self) -> Result<Connection, String> {
        let key = self.api_key.as_deref().filter(|k| !k.trim().is_empty());
        if self.login && key.is_none() {
            return Err("--login needs an API key: give --api-key or set PINECONE_API_KEY".into());
        }
        let base_url = self
            .base_url
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty());
        let (url, server) = match base_url {
            Some(url) => (url.to_owned(), None),
            None => {
                let server = start_local().await?;
                (server.base_url().to_owned(), Some(server))
            }
        };
        let mut builder = Client::builder().base_url(url);
        if let Some(key) = key {
            builder = builder.api_key(key.trim()).login(self.login);
        }
        if let Some(version) = self.api_version.as_deref().filter(|v| !v.trim().is_empty()) {
            builder = builder.api_version(version.trim());
        }
        let client = builder.build().map_err(|e| error_line(&e))?;
        Ok(Connection {
            client,
            local: server.is_some(),
            _server: server,
        })
    }
}

/// The corpus the embedded server serves when no base URL is given.
pub(crate) const CORPUS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");

/// The slug of the corpus context on the embedded server.
pub(crate) const CORPUS_CONTEXT: &str = "docs";

/// Starts the embedded local Nexus with the corpus created and curated
/// (and readable by `local` connectors).
async fn start_local() -> Result<LocalNexus, String> {
    LocalNexus::builder()
        .context(CORPUS_CONTEXT, CORPUS_DIR)
        .connector_root(CORPUS_DIR)
        .start()
        .await
        .map_err(|e| format!("cannot start the local Nexus: {}", error_line(&e)))
}

/// An error as one line: its text and its sources' texts, joined by `: `,
/// with line breaks folded (a server message may hold some).
pub(crate) fn error_line(error: &(dyn std::error::Error + 'static)) -> String {
    // A refused connection reads better by its root cause than by the
    // transport's layers of wrapping.
    if let Some(Error::Transport {
        operation,
        connect: true,
        ..
    }) = error.downcast_ref::<Error>()
    {
        let mut root = error.source();
        while let Some(next) = root.and_then(|e| e.source()) {
            root = Some(next);
        }
        let cause = root.map(|e| e.to_string()).unwrap_or_default();
        return format!("{operation}: cannot connect to the server: {cause}");
    }
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        // Some errors repeat their source's text in their own.
        if !text.is_empty() && !line.contains(&text) {
            let _ = write!(line, ": {text}");
        }
        source = e.source();
    }
    let mut line = line.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some(error) = error.downcast_ref::<Error>() {
        line.push_str(&answer_details(error));
    }
    line
}

/// What an error answer said besides its message, for a support ticket or
/// a retry: ` (request ID, retry after N s)`, or nothing.
fn answer_details(error: &Error) -> String {
    let mut details = Vec::new();
    if let Some(id) = error.request_id() {
        details.push(format!("request {id}"));
    }
    if let Some(after) = error.retry_after() {
        details.push(format!("retry after {} s", after.as_secs_f64().ceil()));
    }
    if details.is_empty() {
        String::new()
    } else {
        format!(" ({})", details.join(", "))
    }
}

/// Prints `error: LINE` on stderr and returns exit code 1.
pub(crate) fn fail(line: impl std::fmt::Display) -> ExitCode {
    eprintln!("{} {line}", style("error:").for_stderr().red().bold());
    ExitCode::FAILURE
}

/// The error of a call about one context, naming the context when it does
/// not exist (in [`context::missing`]'s words) instead of quoting the HTTP
/// answer.
pub(crate) fn context_error(slug: &str, error: &Error) -> String {
    context::missing(slug, error).unwrap_or_else(|| error_line(error))
}

/// Prints a table. When stdout is not a terminal (a pipe, a file), the
/// rows are plain tab-separated lines, header first, without rules, for
/// `cut`, `awk` and `sort`; a tab or line break inside a cell becomes a
/// space. On a terminal that reports no width (0 columns, as under
/// `script` or some `docker exec`), the table is 100 columns wide.
pub(crate) fn print_table(mut table: comfy_table::Table) {
    if !std::io::stdout().is_terminal() {
        let line = |row: &comfy_table::Row| {
            let cells: Vec<String> = row
                .cell_iter()
                .map(|cell| cell.content().replace(['\t', '\n', '\r'], " "))
                .collect();
            cells.join("\t") + "\n"
        };
        let mut text: String = table.header().map(line).unwrap_or_default();
        text.extend(table.row_iter().map(line));
        out(format_args!("{text}"));
        return;
    }
    if table.width().is_none_or(|width| width == 0) {
        table.set_width(100);
    }
    out(format_args!("{table}\n"));
}

/// Whether stderr is a terminal (spinners and bars only make sense there).
pub(crate) fn stderr_is_tty() -> bool {
    std::io::stderr().is_terminal()
}

/// A one-line spinner on stderr with the latest message, on a terminal; plain
/// lines (each message once) otherwise.
#[derive(Debug)]
pub(crate) struct Activity {
    bar: Option<ProgressBar>,
    last: String,
}

impl Activity {
    /// Starts showing `message`.
    pub(crate) fn start(message: &str) -> Activity {
        let bar = stderr_is_tty().then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let template = if console::colors_enabled_stderr() {
                "{spinner:.cyan} {msg:.dim} {elapsed:.dim}"
            } else {
                "{spinner} {msg} {elapsed}"
            };
            if let Ok(s) = ProgressStyle::with_template(template) {
                bar.set_style(s);
            }
            bar.enable_steady_tick(Duration::from_millis(90));
            bar
        });
        let mut activity = Activity {
            bar,
            last: String::new(),
        };
        activity.set(message);
        activity
    }

    /// Shows `message` instead of the previous one.
    pub(crate) fn set(&mut self, message: &str) {
        let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
        if message.is_empty() || message == self.last {
            return;
        }
        match &self.bar {
            Some(bar) => bar.set_message(message.clone()),
            None => eprintln!("{} {message}", style("·").for_stderr().dim()),
        }
        self.last = message;
    }

    /// Removes the spinner (the terminal line is left empty).
    pub(crate) fn clear(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.clear();
    }
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub(crate) fn progress_bar(len: u64, template: &str) -> ProgressBar {
    let target = if stderr_is_tty() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(len), target);
    let template = if console::colors_enabled_stderr() {
        template.to_owned()
    } else {
        // Strip the `.style` parts of `{key:.style}` placeholders.
        strip_template_styles(template)
    };
    if let Ok(s) = ProgressStyle::with_template(&template) {
        bar.set_style(s.progress_chars("█▉▊▋▌▍▎▏ "));
    }
    bar
}

fn strip_template_styles(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let inner = &rest[open + 1..open + close];
        // `{key:40.cyan/blue}` keeps `key:40`; `{key:.dim}` keeps `key`.
        let kept = match inner.split_once(':') {
            Some((key, spec)) => {
                let width: String = spec.chars().take_while(char::is_ascii_digit).collect();
                if width.is_empty() {
                    key.to_owned()
                } else {
                    format!("{key}:{width}")
                }
            }
            None => inner.to_owned(),
        };
        out.push('{');
        out.push_str(&kept);
        out.push('}');
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

#[path = "answer_text.rs"]
mod answer_text;
#[path = "citation.rs"]
mod citation;
pub(crate) use citation::footnotes;

/// Prints a whole answer as a streamed one is printed: wrapped and rendered
/// on a terminal, exactly as sent elsewhere, and ended by a line break.
pub(crate) fn print_answer(answer: &str) {
    let mut text = answer_text::AnswerText::new(std::io::stdout(), answer_text::Mode::for_stdout());
    if let Err(e) = text.push(answer.trim_end()).and_then(|()| text.finish()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// A duration in milliseconds, short and human.
pub(crate) fn human_ms(ms: i64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// A byte count, short and human.
pub(crate) fn human_bytes(bytes: u64) -> String {
    indicatif::HumanBytes(bytes).to_string()
}

/// Pretty JSON of a value, or the one-line reason it cannot be shown.
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("\"cannot encode: {e}\""))
}

/// How a turn the user watched ended, when it did not fail.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The turn completed; its stored Query.
    Completed(Box<types::Query>),
    /// The user interrupted the turn and it was cancelled on the server.
    Cancelled {
        /// The cancelled turn.
        query_id: String,
    },
}

/// Streams a turn: step commentary on the [`Activity`] line until the answer
/// starts, then the answer text to stdout as it arrives (ended by one
/// newline) unless `print_text` is false. When `interrupt` resolves first,
/// the turn is cancelled on the server.
///
/// # Errors
/// The turn's error: it failed or was cancelled elsewhere, the stream broke
/// beyond resuming, or the cancel call failed.
pub(crate) async fn stream_answer(
    mut turn: QueryTurn,
    print_text: bool,
    interrupt: impl Future<Output = ()>,
) -> Result<Outcome, Error> {
    let mut activity = Activity::start("thinking");
    let mut text = answer_text::AnswerText::new(std::io::stdout(), answer_text::Mode::for_stdout());
    let mut wrote_text = false;
    let mut failure = None;
    tokio::pin!(interrupt);
    let interrupted = loop {
        tokio::select! {
            biased;
            () = &mut interrupt => break true,
            event = turn.next() => match event {
                None => break false,
                Some(Ok(QueryEvent::Step(step))) if !wrote_text => activity.set(&step.commentary),
                Some(Ok(QueryEvent::TextDelta { delta })) if print_text => {
                    if !wrote_text {
                        activity.clear();
                        wrote_text = true;
                    }
                    // A closed stdout (`| head`, a pager quit early): nobody reads
                    // the answer any more, so the turn is cancelled and the
                    // program ends quietly.
                    if let Err(e) = text.push(&delta)
                        && e.kind() == std::io::ErrorKind::BrokenPipe
                    {
                        activity.clear();
                        let _ = turn.cancel().await;
                        std::process::exit(0);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    failure.get_or_insert(e);
                }
            },
        }
    };
    activity.clear();
    if wrote_text {
        let _ = text.finish();
    }
    if interrupted {
        let query_id = turn.query_id().map(str::to_owned);
        let cancelled = turn.cancel().await?;
        return Ok(Outcome::Cancelled {
            query_id: query_id.unwrap_or(cancelled.id),
        });
    }
    if let Some(e) = failure {
        return Err(e);
    }
    turn.finish().await.map(|q| Outcome::Completed(Box::new(q)))
}

/// Waits for a background turn with a live spinner (status and elapsed
/// time). When `interrupt` resolves first, the turn is cancelled on the
/// server. The answer is not printed.
///
/// # Errors
/// The turn's error, or the cancel call's.
pub(crate) async fn wait_background(
    mut handle: QueryHandle,
    interrupt: impl Future<Output = ()>,
) -> Result<Outcome, Error> {
    let mut activity = Activity::start(&format!("running {} in the background", handle.id()));
    let waited = {
        let wait = handle.wait(
            WaitPolicy::default().interval(Duration::from_millis(100), Duration::from_secs(1)),
        );
        tokio::select! {
            biased;
            () = interrupt => None,
            query = wait => Some(query),
        }
    };
    activity.clear();
    match waited {
        Some(query) => query.map(|q| Outcome::Completed(Box::new(q))),
        None => {
            let query_id = handle.id().to_owned();
            handle.cancel().await?;
            Ok(Outcome::Cancelled { query_id })
        }
    }
}

/// Ctrl-C presses, delivered through a channel so that a press is not lost
/// between two waits and old presses can be discarded before a turn.
#[derive(Debug)]
pub(crate) struct Interrupts {
    rx: tokio::sync::mpsc::Receiver<()>,
}

impl Interrupts {
    /// Starts listening for Ctrl-C: from then on it no longer ends the
    /// process by itself.
    ///
    /// The handler is installed before this returns, not when the listening
    /// task first runs: a line editor that saves and later restores the
    /// SIGINT disposition must see ours as the one to restore, or a Ctrl-C
    /// after the first prompt would kill the process.
    pub(crate) fn listen() -> Interrupts {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            // Without a handler the receiver closes and `next` never fires.
            if let Ok(mut presses) = signal(SignalKind::interrupt()) {
                tokio::spawn(async move {
                    while presses.recv().await.is_some() {
                        // A press already waiting to be read is enough.
                        let _ = tx.try_send(());
                    }
                });
            }
        }
        #[cfg(not(unix))]
        tokio::spawn(async move {
            while tokio::signal::ctrl_c().await.is_ok() {
                let _ = tx.try_send(());
            }
        });
        Interrupts { rx }
    }

    /// Forgets presses nobody waited for.
    pub(crate) fn discard_pending(&mut self) {
        while self.rx.try_recv().is_ok() {}
    }

    /// The next press.
    pub(crate) async fn next(&mut self) {
        if self.rx.recv().await.is_none() {
            // No listener (the handler could not be installed): never fires.
            std::future::pending::<()>().await;
        }
    }
}
