//! `chat`: a multi-turn conversation with Nexus in the terminal, over one
//! session.
//!
//! ```text
//! cargo run --example chat --features local
//! cargo run --example chat --features local -- --base-url URL --context handbook
//! ```
//!
//! Each answer streams as it arrives, with the latest step commentary on a
//! spinner line (stderr, on a terminal) while the turn retrieves, and its
//! citations as numbered footnotes. Ctrl-C during a turn cancels it on the
//! server and returns to the prompt; Ctrl-C or Ctrl-D at an empty prompt
//! exits. Commands: `/new`, `/contexts`, `/scope SLUG...`, `/background`,
//! `/json`, `/trace`, `/help`, `/quit`.
//!
//! The server comes from `--base-url` or `NEXUS_BASE_URL` (with
//! `PINECONE_API_KEY` and `NEXUS_API_VERSION`); without one, an embedded
//! local Nexus is started over the shipped corpus. Without `--context`, the
//! only queryable context is used.

#[path = "common/mod.rs"]
#[macro_use]
mod common;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use comfy_table::{Cell, ContentArrangement, Table, presets};
use console::style;
use nexus_knowql::{Client, Error, Session, types};
use rustyline::history::DefaultHistory;
use rustyline::{
    Cmd, ConditionalEventHandler, Editor, Event, EventContext, EventHandler, KeyEvent, Movement,
    RepeatCount,
};

use common::{Interrupts, Outcome, ServerArgs, context_error, error_line, fail};

/// Chat with Nexus: a multi-turn session with streamed answers.
#[derive(Debug, Parser)]
#[command(name = "chat", version)]
struct Cli {
    #[command(flatten)]
    server: ServerArgs,
    /// A context to ask (repeat for several; default: the only queryable one).
    #[arg(long = "context", short = 'c', value_name = "SLUG")]
    contexts: Vec<String>,
    /// Keep the line history in this file.
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
}

/// The most contexts a session's scope may name.
const MAX_SCOPE: usize = 10;

const PROMPT: &str = "› ";

const HELP: &str = "\
/new              start a new session (same scope)
/contexts         list contexts (✓ queryable, • in scope)
/scope SLUG...    ask these contexts from now on (a new session)
/background       run the next question in the background
/json             show the last turn as JSON
/trace            show the last turn's trace
/help             this list
/quit             leave (or Ctrl-D)
Ctrl-C cancels a running turn; at an empty prompt it leaves.";

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(line) => fail(line),
    };
    // The line editor may still block on stdin after a Ctrl-C: do not wait for it.
    runtime.shutdown_background();
    code
}

async fn run(cli: Cli) -> Result<(), String> {
    let conn = cli.server.connect().await?;
    if conn.local {
        eprintln!(
            "{}",
            style("using an embedded local Nexus over the shipped corpus")
                .for_stderr()
                .dim()
        );
    }
    let scope = resolve_scope(&conn.client, &cli.contexts).await?;
    let mut chat = Chat::new(conn.client.clone(), scope)?;
    // Before the editor: it restores the SIGINT handler it found.
    let mut interrupts = Interrupts::listen();
    let mut editor = LineEditor::new(cli.history)?;
    eprintln!(
        "{}",
        style(format!(
            "chat · scope {} · /help for commands · Ctrl-D to quit",
            chat.scope.join(", ")
        ))
        .for_stderr()
        .dim()
    );
    while let Input::Line(line) = editor.read(&mut interrupts).await? {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let keep_going = match line.strip_prefix('/') {
            Some(command) => chat.command(command).await,
            None => {
                chat.ask(line, &mut interrupts).await;
                true
            }
        };
        if !keep_going {
            break;
        }
    }
    editor.save();
    Ok(())
}

/// The contexts to ask: the given ones (each must exist and be queryable),
/// or the only queryable one.
async fn resolve_scope(client: &Client, wanted: &[String]) -> Result<Vec<String>, String> {
    if wanted.is_empty() {
        let contexts = client.contexts().list().await.map_err(|e| error_line(&e))?;
        let queryable: Vec<String> = contexts
            .iter()
            .filter(|c| c.is_queryable())
            .map(|c| c.slug.clone())
            .collect();
        return match queryable.len() {
            0 => Err("no context can be queried yet: create, upload and curate one first".into()),
            1 => Ok(queryable),
            _ => Err(format!(
                "several contexts can be queried ({}): choose with --context SLUG",
                queryable.join(", ")
            )),
        };
    }
    let mut scope: Vec<String> = Vec::with_capacity(wanted.len());
    for slug in wanted {
        let slug = slug.trim();
        if scope.iter().any(|s| s == slug) {
            continue;
        }
        check_queryable(client, slug).await?;
        scope.push(slug.to_owned());
    }
    if scope.len() > MAX_SCOPE {
        return Err(format!("a session asks at most {MAX_SCOPE} contexts"));
    }
    Ok(scope)
}

async fn check_queryable(client: &Client, slug: &str) -> Result<(), String> {
    if slug.is_empty() {
        return Err("a context slug is empty".into());
    }
    let context = client
        .contexts()
        .get(slug)
        .await
        .map_err(|e| context_error(slug, &e))?;
    if !context.is_queryable() {
        return Err(format!(
            "context `{slug}` cannot be queried yet: curate it first"
        ));
    }
    Ok(())
}

/// One line of input, or the wish to leave.
enum Input {
    Line(String),
    Exit,
}

/// Ctrl-C clears a line being typed, and ends the chat at an empty prompt.
struct CtrlC;

impl ConditionalEventHandler for CtrlC {
    fn handle(&self, _: &Event, _: RepeatCount, _: bool, ctx: &EventContext) -> Option<Cmd> {
        Some(if ctx.line().is_empty() {
            Cmd::Interrupt
        } else {
            Cmd::Kill(Movement::WholeLine)
        })
    }
}

/// The line editor, run on a blocking thread so that the runtime keeps
/// serving while the prompt waits.
struct LineEditor {
    editor: Option<Editor<(), DefaultHistory>>,
    history: Option<PathBuf>,
}

impl LineEditor {
    fn new(history: Option<PathBuf>) -> Result<LineEditor, String> {
        let mut editor = Editor::<(), DefaultHistory>::new()
            .map_err(|e| format!("cannot set up line editing: {e}"))?;
        editor.bind_sequence(
            KeyEvent::ctrl('C'),
            EventHandler::Conditional(Box::new(CtrlC)),
        );
        if let Some(path) = &history {
            // A missing history file is the normal first run.
            let _ = editor.load_history(path);
        }
        Ok(LineEditor {
            editor: Some(editor),
            history,
        })
    }

    async fn read(&mut self, interrupts: &mut Interrupts) -> Result<Input, String> {
        let Some(mut editor) = self.editor.take() else {
            return Ok(Input::Exit);
        };
        interrupts.discard_pending();
        let reading = tokio::task::spawn_blocking(move || {
            let line = editor.readline(PROMPT);
            if let Ok(line) = &line
                && !line.trim().is_empty()
            {
                let _ = editor.add_history_entry(line.trim());
            }
            (editor, line)
        });
        tokio::select! {
            joined = reading => {
                let (editor, line) = joined.map_err(|e| format!("the line editor stopped: {e}"))?;
                self.editor = Some(editor);
                match line {
                    Ok(line) => Ok(Input::Line(line)),
                    Err(rustyline::error::ReadlineError::Interrupted | rustyline::error::ReadlineError::Eof) => {
                        Ok(Input::Exit)
                    }
                    Err(e) => Err(format!("cannot read input: {e}")),
                }
            }
            // Ctrl-C as a signal: input is not a terminal the editor controls.
            () = interrupts.next() => Ok(Input::Exit),
        }
    }

    fn save(&mut self) {
        if let (Some(editor), Some(path)) = (self.editor.as_mut(), &self.history)
            && let Err(e) = editor.save_history(path)
        {
            eprintln!("cannot save the history to {}: {e}", path.display());
        }
    }
}

/// The conversation: the session, its scope, and the last turn.
struct Chat {
    client: Client,
    scope: Vec<String>,
    session: Session,
    /// Turns asked in the current session.
    turns: usize,
    /// The last turn's id, whatever became of it.
    last_query_id: Option<String>,
    /// Run the next question in the background.
    background_next: bool,
}

impl Chat {
    fn new(client: Client, scope: Vec<String>) -> Result<Chat, String> {
        let session = new_session(&client, &scope)?;
        Ok(Chat {
            client,
            scope,
            session,
            turns: 0,
            last_query_id: None,
            background_next: false,
        })
    }

    /// Runs one turn and prints its answer, citations and a summary line.
    async fn ask(&mut self, question: &str, interrupts: &mut Interrupts) {
        interrupts.discard_pending();
        let builder = self.session.ask(question);
        let outcome = if std::mem::take(&mut self.background_next) {
            match builder.background().await {
                Ok(handle) => {
                    self.last_query_id = Some(handle.id().to_owned());
                    let outcome = common::wait_background(handle, interrupts.next()).await;
                    if let Ok(Outcome::Completed(q)) = &outcome {
                        common::print_answer(&q.answer_text());
                    }
                    outcome
                }
                Err(e) => Err(e),
            }
        } else {
            match builder.stream().await {
                Ok(turn) => common::stream_answer(turn, true, interrupts.next()).await,
                Err(e) => Err(e),
            }
        };
        match outcome {
            Ok(Outcome::Completed(query)) => {
                self.turns += 1;
                self.last_query_id = Some(query.id.clone());
                let notes = common::footnotes(&query.citations);
                if !notes.is_empty() {
                    println!();
                    print!("{}", style(notes).dim());
                }
                // The answer is complete before the summary line on stderr.
                let _ = std::io::stdout().flush();
                eprintln!(
                    "{}",
                    style(format!(
                        "{} · session {} · turn {} · {} steps · {}",
                        query.id,
                        query.session_id,
                        self.turns,
                        query.steps.len(),
                        common::human_ms(query.runtime_ms)
                    ))
                    .for_stderr()
                    .dim()
                );
            }
            Ok(Outcome::Cancelled { query_id }) => {
                self.turns += 1;
                eprintln!(
                    "{}",
                    style(format!("cancelled {query_id} on the server"))
                        .for_stderr()
                        .yellow()
                );
                self.last_query_id = Some(query_id);
            }
            Err(e) => {
                if let Error::TurnFailed { query_id, .. } | Error::TurnCancelled { query_id, .. } =
                    &e
                {
                    self.turns += 1;
                    self.last_query_id = Some(query_id.clone());
                }
                eprintln!(
                    "{} {}",
                    style("error:").for_stderr().red().bold(),
                    error_line(&e)
                );
            }
        }
    }

    /// Runs a `/command`; `false` means leave.
    async fn command(&mut self, command: &str) -> bool {
        let mut words = command.split_whitespace();
        let name = words.next().unwrap_or_default();
        let args: Vec<&str> = words.collect();
        let result = match name {
            "quit" | "exit" | "q" => return false,
            "help" | "?" => {
                println!("{HELP}");
                Ok(())
            }
            "new" => self
                .restart()
                .map(|()| note(&format!("new session · scope {}", self.scope.join(", ")))),
            "contexts" => self.contexts().await,
            "scope" => self.set_scope(&args).await,
            "background" | "bg" => {
                self.background_next = true;
                note("the next question runs in the background (Ctrl-C cancels it)");
                Ok(())
            }
            "json" => self.show_json().await,
            "trace" => self.show_trace().await,
            other => Err(format!("unknown command /{other}: /help lists them")),
        };
        if let Err(line) = result {
            eprintln!("{} {line}", style("error:").for_stderr().red().bold());
        }
        true
    }

    fn restart(&mut self) -> Result<(), String> {
        self.session = new_session(&self.client, &self.scope)?;
        self.turns = 0;
        Ok(())
    }

    async fn contexts(&self) -> Result<(), String> {
        let contexts = self
            .client
            .contexts()
            .list()
            .await
            .map_err(|e| error_line(&e))?;
        let mut table = Table::new();
        table
            .load_style(presets::UTF8_HORIZONTAL_ONLY)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_header(["", "", "SLUG", "KIND", "DESCRIPTION"].map(Cell::new));
        for c in &contexts {
            table.add_row(vec![
                Cell::new(if c.is_queryable() { "✓" } else { " " }),
                Cell::new(if self.scope.contains(&c.slug) {
                    "•"
                } else {
                    " "
                }),
                Cell::new(&c.slug),
                Cell::new(c.kind.as_str()),
                Cell::new(c.description.as_deref().unwrap_or_default()),
            ]);
        }
        common::print_table(table);
        Ok(())
    }

    async fn set_scope(&mut self, slugs: &[&str]) -> Result<(), String> {
        if slugs.is_empty() {
            note(&format!("scope {}", self.scope.join(", ")));
            return Ok(());
        }
        let wanted: Vec<String> = slugs.iter().map(|s| (*s).to_owned()).collect();
        let scope = resolve_scope(&self.client, &wanted).await?;
        let session = new_session(&self.client, &scope)?;
        self.scope = scope;
        self.session = session;
        self.turns = 0;
        note(&format!("new session · scope {}", self.scope.join(", ")));
        Ok(())
    }

    fn last_id(&self) -> Result<&str, String> {
        self.last_query_id
            .as_deref()
            .ok_or_else(|| "no turn yet: ask a question first".to_owned())
    }

    async fn show_json(&self) -> Result<(), String> {
        let handle = self
            .client
            .queries()
            .attach(self.last_id()?)
            .await
            .map_err(|e| error_line(&e))?;
        println!("{}", common::to_json(handle.last_seen()));
        Ok(())
    }

    async fn show_trace(&self) -> Result<(), String> {
        let id = self.last_id()?;
        let trace = self
            .client
            .queries()
            .trace(id)
            .await
            .map_err(|e| error_line(&e))?;
        print_trace(id, &trace);
        Ok(())
    }
}

fn new_session(client: &Client, scope: &[String]) -> Result<Session, String> {
    client
        .session(scope.iter().cloned())
        .build()
        .map_err(|e| error_line(&e))
}

/// A dim note on stderr.
fn note(text: &str) {
    eprintln!("{}", style(text).for_stderr().dim());
}

fn print_trace(id: &str, trace: &types::Trace) {
    println!("{}", style(format!("trace of {id}")).bold());
    if trace.steps.is_empty() {
        println!("  (no steps)");
    }
    for step in &trace.steps {
        let strategy = match step.strategy.label.as_str() {
            "" => step.strategy.kind.clone(),
            label => format!("{} ({label})", step.strategy.kind),
        };
        println!(
            "{} {} {}",
            style(&step.step_id).bold(),
            strategy,
            step.commentary
        );
        for call in &step.calls {
            let status = match (&call.error, call.ok) {
                (Some(e), _) => format!("failed: {e}"),
                (None, true) => "ok".to_owned(),
                (None, false) => "not ok".to_owned(),
            };
            println!(
                "    {} {} · {} · {}",
                call.fn_,
                style(format!("[{}]", call.category)).dim(),
                common::human_ms(call.duration_ms),
                status
            );
        }
        if let Some(cost) = &step.cost {
            println!(
                "{}",
                style(format!(
                    "    decide {} · execute {} · {} tokens in, {} out",
                    common::human_ms(cost.decide_ms),
                    common::human_ms(cost.execute_ms),
                    cost.tokens_in,
                    cost.tokens_out
                ))
                .dim()
            );
        }
    }
    if let Some(r) = &trace.rollup {
        println!(
            "{}",
            style(format!(
                "{} steps · {} tool calls · {} hits · {}",
                r.n_steps,
                r.n_tool_calls,
                r.total_hits,
                common::human_ms(r.duration_ms)
            ))
            .dim()
        );
    }
}
