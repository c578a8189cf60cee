//! `nexus`: everyday Nexus management from the terminal, over the SDK's
//! resource calls and query engine.
//!
//! ```text
//! cargo run --example nexus --features local -- contexts
//! cargo run --example nexus --features local -- create handbook --description "Team handbook"
//! cargo run --example nexus --features local -- upload handbook ./docs README.md
//! cargo run --example nexus --features local -- curate handbook --wait
//! cargo run --example nexus --features local -- ask handbook "Who approves travel?"
//! cargo run --example nexus --features local -- tasks --context handbook
//! cargo run --example nexus --features local -- sessions
//! cargo run --example nexus --features local -- query QUERY_ID
//! cargo run --example nexus --features local -- models
//! cargo run --example nexus --features local -- fork handbook handbook-draft
//! cargo run --example nexus --features local -- manifest handbook
//! cargo run --example nexus --features local -- stats handbook
//! cargo run --example nexus --features local -- connect ./shared --enable handbook
//! cargo run --example nexus --features local -- connectors --context handbook
//! cargo run --example nexus --features local -- api --list
//! cargo run --example nexus --features local -- api get_context -p slug=handbook
//! echo '{"rating":"up"}' | cargo run --example nexus --features local -- api create_query_feedback -p id=QUERY_ID --body -
//! ```
//!
//! `nexus api OPERATION_ID` reaches every operation of the API (the
//! generated client's calls): path, query and header parameters as
//! `--param NAME=VALUE`, a JSON body from `--body FILE` or `--body -`.
//!
//! Every command takes `--json` to print the API's JSON instead of tables
//! and text. The server comes from `--base-url` or `NEXUS_BASE_URL` (with
//! `PINECONE_API_KEY` and `NEXUS_API_VERSION`); without one, an embedded
//! local Nexus is started over the shipped corpus, and whatever a command
//! changes there is gone when it exits. Errors are one line on stderr with
//! exit code 1.

#[path = "common/mod.rs"]
#[macro_use]
mod common;
#[path = "nexus_cli/api.rs"]
mod api;
#[path = "nexus_cli/ops.rs"]
mod ops;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use comfy_table::{Cell, ContentArrangement, Table, presets};
use console::style;
use nexus_knowql::resources::{CurateOptions, TaskWait};
use nexus_knowql::{Client, Error, TaskStatus, types};

use common::{Outcome, ServerArgs, context_error, error_line, fail};

/// Everyday Nexus management: contexts, uploads, curation, tasks, questions.
#[derive(Debug, Parser)]
#[command(name = "nexus", version)]
struct Cli {
    #[command(flatten)]
    server: ServerArgs,
    /// Print the API's JSON instead of tables and text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List contexts; `✓` marks the ones that can be queried now.
    Contexts,
    /// Create a context.
    Create {
        /// The new context's slug.
        slug: String,
        /// What the context holds.
        #[arg(long)]
        description: Option<String>,
        /// Display name (default: the slug).
        #[arg(long)]
        name: Option<String>,
        /// `search` (curated, then queried) or `work`.
        #[arg(long, default_value = "search")]
        kind: String,
    },
    /// Upload files or directories (directories keep their layout).
    Upload {
        /// The context to upload to.
        slug: String,
        /// Files and directories to upload.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Curate a context: chunk and index its sources so it can be queried.
    Curate {
        /// The context to curate.
        slug: String,
        /// Follow the task with a progress bar until it ends.
        #[arg(long)]
        wait: bool,
        /// Re-curate sources that are already curated.
        #[arg(long)]
        force: bool,
    },
    /// List tasks (imports, curations, ...).
    Tasks {
        /// Only the tasks of this context.
        #[arg(long)]
        context: Option<String>,
    },
    /// Ask one question; the answer streams to stdout.
    Ask {
        /// The context to ask.
        slug: String,
        /// The question.
        question: String,
        /// Run a synchronous turn instead of streaming.
        #[arg(long, conflicts_with = "background")]
        no_stream: bool,
        /// Run a background turn and wait for it.
        #[arg(long)]
        background: bool,
    },
    /// List sessions.
    Sessions,
    /// Show a stored turn.
    Query {
        /// The turn's id.
        id: String,
    },
    /// List the models a query may name.
    Models,
    /// Fork a context: a new context with its sources and manifest.
    Fork {
        /// The context to fork.
        slug: String,
        /// The new context's slug.
        target: String,
    },
    /// Print the manifest a context is curated with (JSON).
    Manifest {
        /// The context.
        slug: String,
    },
    /// Task counts of the project, or the files and tasks of one context.
    Stats {
        /// The context (default: the whole project).
        slug: Option<String>,
    },
    /// List connectors (with `--context`, whether each is enabled there).
    Connectors {
        /// Show whether each connector is enabled on this context.
        #[arg(long)]
        context: Option<String>,
    },
    /// Connect a directory the server may read (a `local` connector).
    Connect {
        /// The directory, absolute or relative to the server's first
        /// connector root.
        dir: String,
        /// A label for the connector.
        #[arg(long)]
        label: Option<String>,
        /// Enable it on this context at once.
        #[arg(long)]
        enable: Option<String>,
    },
    /// Call any API operation by its operationId (`nexus api --list`).
    Api(api::ApiArgs),
}

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
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(line) => fail(line),
    }
}

/// Runs one command; `Err` is the one-line reason it failed.
async fn run(cli: Cli) -> Result<ExitCode, String> {
    if let Command::Api(args) = cli.command {
        return api::run(&cli.server, cli.json, args).await;
    }
    let conn = cli.server.connect().await?;
    if conn.local {
        local_note();
    }
    let client = &conn.client;
    let json = cli.json;
    match cli.command {
        Command::Contexts => contexts(client, json).await,
        Command::Create {
            slug,
            description,
            name,
            kind,
        } => create(client, json, slug, description, name, kind).await,
        Command::Upload { slug, paths } => upload(client, json, &slug, &paths).await,
        Command::Curate { slug, wait, force } => curate(client, json, &slug, wait, force).await,
        Command::Tasks { context } => tasks(client, json, context.as_deref()).await,
        Command::Ask {
            slug,
            question,
            no_stream,
            background,
        } => ask(client, json, &slug, &question, no_stream, background).await,
        Command::Sessions => sessions(client, json).await,
        Command::Query { id } => query(client, json, &id).await,
        Command::Models => models(client, json).await,
        Command::Fork { slug, target } => ops::fork(client, json, &slug, &target).await,
        Command::Manifest { slug } => ops::manifest(client, &slug).await,
        Command::Stats { slug } => ops::stats(client, json, slug.as_deref()).await,
        Command::Connectors { context } => ops::connectors(client, json, context.as_deref()).await,
        Command::Connect { dir, label, enable } => {
            ops::connect(client, json, &dir, label.as_deref(), enable.as_deref()).await
        }
        Command::Api(_) => Err("unreachable: `api` runs before connecting".to_owned()),
    }
}

/// Says on stderr that the embedded server answers.
fn local_note() {
    eprintln!(
        "{}",
        style("using an embedded local Nexus over the shipped corpus (changes are not kept)")
            .for_stderr()
            .dim()
    );
}

fn print_json<T: serde::Serialize>(value: &T) -> Result<ExitCode, String> {
    println!("{}", common::to_json(value));
    Ok(ExitCode::SUCCESS)
}

fn new_table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_style(presets::UTF8_HORIZONTAL_ONLY)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.iter().map(Cell::new));
    table
}

fn when(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M").to_string()
}

async fn contexts(client: &Client, json: bool) -> Result<ExitCode, String> {
    let contexts = client.contexts().list().await.map_err(|e| error_line(&e))?;
    if json {
        return print_json(&contexts);
    }
    if contexts.is_empty() {
        println!("no contexts yet: create one with `nexus create SLUG`");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = new_table(&["", "SLUG", "KIND", "STATE", "CURATED", "DESCRIPTION"]);
    for c in &contexts {
        table.add_row(vec![
            Cell::new(if c.is_queryable() { "✓" } else { " " }),
            Cell::new(&c.slug),
            Cell::new(c.kind.as_str()),
            Cell::new(context_state(c)),
            Cell::new(c.last_curated_at.as_ref().map(when).unwrap_or_default()),
            Cell::new(c.description.as_deref().unwrap_or_default()),
        ]);
    }
    common::print_table(table);
    Ok(ExitCode::SUCCESS)
}

/// What a context is busy with, or whether it is ready.
fn context_state(c: &types::ContextResponse) -> &'static str {
    if c.is_importing {
        "importing"
    } else if c.is_curating {
        "curating"
    } else if c.is_queryable() {
        "ready"
    } else if c.has_sources {
        "not curated"
    } else {
        "empty"
    }
}

async fn create(
    client: &Client,
    json: bool,
    slug: String,
    description: Option<String>,
    name: Option<String>,
    kind: String,
) -> Result<ExitCode, String> {
    let request = types::CreateContextRequest::builder()
        .description(description)
        .kind(types::ContextKind(kind))
        .name(name.unwrap_or_else(|| slug.clone()))
        .slug(slug);
    let request = types::CreateContextRequest::try_from(request).map_err(|e| e.to_string())?;
    let context = client
        .contexts()
        .create(&request)
        .await
        .map_err(|e| match e.is_conflict() {
            true => format!("a context `{}` already exists", request.slug),
            false => error_line(&e),
        })?;
    if json {
        return print_json(&context);
    }
    println!(
        "created {} context `{}`; add sources with `nexus upload {} PATH...`",
        context.kind.as_str(),
        context.slug,
        context.slug
    );
    Ok(ExitCode::SUCCESS)
}

/// One file to upload: where it is, the source folder it goes to, its size.
#[derive(Debug)]
struct UploadFile {
    path: PathBuf,
    label: String,
    dir: Option<String>,
    len: u64,
}

/// Every file named by `paths`, directories walked (hidden entries skipped).
fn collect_uploads(paths: &[PathBuf]) -> Result<Vec<UploadFile>, String> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if meta.is_file() {
            files.push(UploadFile {
                path: path.clone(),
                label: path.display().to_string(),
                dir: None,
                len: meta.len(),
            });
        } else if meta.is_dir() {
            let before = files.len();
            walk_dir(path, path, &mut files)?;
            if files.len() == before {
                return Err(format!("{} holds no files to upload", path.display()));
            }
        } else {
            return Err(format!(
                "{} is neither a file nor a directory",
                path.display()
            ));
        }
    }
    Ok(files)
}

fn walk_dir(root: &Path, dir: &Path, out: &mut Vec<UploadFile>) -> Result<(), String> {
    let read = |e: std::io::Error| format!("{}: {e}", dir.display());
    let mut entries = std::fs::read_dir(dir)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let meta = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if meta.is_dir() {
            walk_dir(root, &path, out)?;
        } else if meta.is_file() {
            let rel: Vec<String> = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let dir = match rel.split_last() {
                Some((_, parents)) if !parents.is_empty() => {
                    Some(format!("uploads/{}", parents.join("/")))
                }
                _ => None,
            };
            out.push(UploadFile {
                label: rel.join("/"),
                path,
                dir,
                len: meta.len(),
            });
        }
    }
    Ok(())
}

/// How long an upload waits for another import of the context to finish.
const BUSY_WAIT: Duration = Duration::from_secs(300);

async fn upload(
    client: &Client,
    json: bool,
    slug: &str,
    paths: &[PathBuf],
) -> Result<ExitCode, String> {
    client
        .contexts()
        .get(slug)
        .await
        .map_err(|e| context_error(slug, &e))?;
    let files = collect_uploads(paths)?;
    let total: u64 = files.iter().map(|f| f.len).sum();
    let bar = common::progress_bar(
        total,
        "{spinner:.cyan} [{bar:30.cyan/blue}] {bytes}/{total_bytes} {msg}",
    );
    let mut tasks = Vec::with_capacity(files.len());
    for (i, file) in files.iter().enumerate() {
        bar.set_message(format!("{}/{} files · {}", i, files.len(), file.label));
        let trigger = upload_one(client, slug, file).await.map_err(|e| {
            bar.abandon();
            format!("upload of {} failed: {}", file.label, error_line(&e))
        })?;
        // The server takes one import at a time: wait for this one to land.
        let task = client
            .tasks()
            .wait_completed(
                &trigger.task_id,
                TaskWait::default().interval(Duration::from_millis(50), Duration::from_secs(1)),
            )
            .await
            .map_err(|e| {
                bar.abandon();
                format!("import of {} failed: {}", file.label, error_line(&e))
            })?;
        tasks.push(task);
        bar.inc(file.len);
    }
    bar.finish_and_clear();
    if json {
        return print_json(&serde_json::json!({
            "context": slug,
            "files": files.len(),
            "bytes": total,
            "tasks": tasks,
        }));
    }
    println!(
        "uploaded {} file{} ({}) to `{slug}`; next: `nexus curate {slug} --wait`",
        files.len(),
        if files.len() == 1 { "" } else { "s" },
        common::human_bytes(total),
    );
    Ok(ExitCode::SUCCESS)
}

/// Uploads one file, waiting out another import in flight (409).
async fn upload_one(
    client: &Client,
    slug: &str,
    file: &UploadFile,
) -> Result<types::WorkflowTriggerResponse, Error> {
    let started = tokio::time::Instant::now();
    let mut delay = Duration::from_millis(100);
    loop {
        match client
            .sources(slug)
            .upload_file(&file.path, file.dir.as_deref())
            .await
        {
            Err(e) if e.is_conflict() && started.elapsed() < BUSY_WAIT => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(3));
            }
            other => return other,
        }
    }
}

async fn curate(
    client: &Client,
    json: bool,
    slug: &str,
    wait: bool,
    force: bool,
) -> Result<ExitCode, String> {
    let trigger = client
        .contexts()
        .curate(slug, &CurateOptions::default().force(force))
        .await
        .map_err(|e| match e.is_conflict() {
            true => format!("`{slug}` is busy (an import or curation is running); try again soon"),
            false => context_error(slug, &e),
        })?;
    if !wait {
        if json {
            return print_json(&trigger);
        }
        println!(
            "curation of `{slug}` started: task {} (follow it with `nexus tasks --context {slug}`)",
            trigger.task_id
        );
        return Ok(ExitCode::SUCCESS);
    }

    // Timed here: the task's `runtime_seconds` has whole-second granularity.
    let started = std::time::Instant::now();
    let bar = common::progress_bar(100, "{spinner:.cyan} [{bar:30.cyan/blue}] {pos:>3}% {msg}");
    bar.set_message(format!("curating {slug}"));
    bar.enable_steady_tick(Duration::from_millis(90));
    let progress = {
        let bar = bar.clone();
        move |task: &types::TaskResponse| {
            if let Some(p) = &task.progress {
                bar.set_position(p.pct.clamp(0.0, 100.0) as u64);
                if !p.label.is_empty() {
                    bar.set_message(p.label.clone());
                }
            }
        }
    };
    let task = client
        .tasks()
        .wait(
            &trigger.task_id,
            TaskWait::default()
                .interval(Duration::from_millis(100), Duration::from_secs(2))
                .on_progress(progress),
        )
        .await;
    bar.finish_and_clear();
    let task = task.map_err(|e| error_line(&e))?;
    if json {
        println!("{}", common::to_json(&task));
    }
    if task.state != TaskStatus::Completed {
        let reason = task.error.as_deref().unwrap_or("no reason given");
        return Err(format!(
            "curation of `{slug}` ended {}: {reason}",
            task.state.as_str()
        ));
    }
    if !json {
        println!(
            "curated `{slug}` in {}; ask it with `nexus ask {slug} QUESTION`",
            common::human_ms(i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX))
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn tasks(client: &Client, json: bool, context: Option<&str>) -> Result<ExitCode, String> {
    let mut listing = client.tasks().list();
    if let Some(slug) = context {
        // An unknown context is an error, not an empty listing.
        client
            .contexts()
            .get(slug)
            .await
            .map_err(|e| context_error(slug, &e))?;
        listing = listing.context(slug);
    }
    let items = listing.await.map_err(|e| match context {
        Some(slug) => context_error(slug, &e),
        None => error_line(&e),
    })?;
    if json {
        return print_json(&items);
    }
    if items.is_empty() {
        println!("no tasks");
        return Ok(ExitCode::SUCCESS);
    }
    // Tasks name their context by id; show slugs.
    let slugs: HashMap<String, String> = client
        .contexts()
        .list()
        .await
        .map(|cs| cs.into_iter().map(|c| (c.id, c.slug)).collect())
        .unwrap_or_default();
    let mut table = new_table(&["ID", "WORKFLOW", "CONTEXT", "STATE", "PROGRESS", "CREATED"]);
    for t in &items {
        let context = t
            .context_id
            .as_ref()
            .map(|id| slugs.get(id).unwrap_or(id).clone())
            .unwrap_or_default();
        let progress = match (&t.progress, &t.state) {
            (_, TaskStatus::Failed) => t.error.clone().unwrap_or_else(|| t.state.to_string()),
            (Some(p), _) => format!("{:>3.0}% {}", p.pct, p.label),
            (None, _) => String::new(),
        };
        table.add_row(vec![
            Cell::new(&t.id),
            Cell::new(t.workflow.as_str()),
            Cell::new(context),
            Cell::new(t.state.as_str()),
            Cell::new(progress),
            Cell::new(when(&t.created_at)),
        ]);
    }
    common::print_table(table);
    Ok(ExitCode::SUCCESS)
}

async fn ask(
    client: &Client,
    json: bool,
    slug: &str,
    question: &str,
    no_stream: bool,
    background: bool,
) -> Result<ExitCode, String> {
    let context = client
        .contexts()
        .get(slug)
        .await
        .map_err(|e| context_error(slug, &e))?;
    if !context.is_queryable() {
        return Err(format!(
            "context `{slug}` cannot be queried yet: run `nexus curate {slug} --wait`"
        ));
    }
    let session = client.session([slug]).build().map_err(|e| error_line(&e))?;
    let builder = session.ask(question);
    let interrupt = async {
        // Without a handler Ctrl-C would end the process and leave the turn running.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let print_answer = |q: &types::Query| {
        if !json {
            common::print_answer(&q.answer_text());
        }
    };
    let outcome = if background {
        let handle = builder.background().await.map_err(|e| error_line(&e))?;
        let outcome = common::wait_background(handle, interrupt).await;
        if let Ok(Outcome::Completed(q)) = &outcome {
            print_answer(q);
        }
        outcome
    } else if no_stream {
        let mut activity = common::Activity::start("waiting for the answer");
        let sent = tokio::select! {
            biased;
            () = interrupt => None,
            query = builder.send() => Some(query),
        };
        activity.clear();
        match sent {
            Some(query) => query.map(|q| {
                print_answer(&q);
                Outcome::Completed(Box::new(q))
            }),
            None => {
                return Err(
                    "interrupted before the answer came; the turn may still run on the server"
                        .into(),
                );
            }
        }
    } else {
        let turn = builder.stream().await.map_err(|e| error_line(&e))?;
        common::stream_answer(turn, !json, interrupt).await
    };
    match outcome.map_err(|e| error_line(&e))? {
        Outcome::Completed(query) => {
            if json {
                return print_json(&query);
            }
            let notes = common::footnotes(&query.citations);
            if !notes.is_empty() {
                eprintln!();
                eprint!("{}", style(notes).for_stderr().dim());
            }
            Ok(ExitCode::SUCCESS)
        }
        Outcome::Cancelled { query_id } => {
            eprintln!(
                "{} cancelled {query_id} on the server",
                style("interrupted:").for_stderr().yellow()
            );
            Ok(ExitCode::from(130))
        }
    }
}

async fn sessions(client: &Client, json: bool) -> Result<ExitCode, String> {
    let sessions = client.sessions().list().await.map_err(|e| error_line(&e))?;
    if json {
        return print_json(&sessions);
    }
    if sessions.is_empty() {
        println!("no sessions yet: `nexus ask SLUG QUESTION` starts one");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = new_table(&["ID", "SCOPE", "TITLE", "LAST QUERY", "UPDATED"]);
    for s in &sessions {
        table.add_row(vec![
            Cell::new(&s.id),
            Cell::new(s.scope.join(", ")),
            Cell::new(s.title.as_deref().unwrap_or_default()),
            Cell::new(s.last_query_id.as_deref().unwrap_or_default()),
            Cell::new(when(&s.updated_at)),
        ]);
    }
    common::print_table(table);
    Ok(ExitCode::SUCCESS)
}

async fn query(client: &Client, json: bool, id: &str) -> Result<ExitCode, String> {
    // Attaching checks that the answer is the turn asked for.
    let handle = client
        .queries()
        .attach(id)
        .await
        .map_err(|e| match e.is_not_found() {
            true => format!("unknown query `{id}`"),
            false => error_line(&e),
        })?;
    let q = handle.last_seen();
    if json {
        return print_json(&q);
    }
    let dim = |s: String| style(s).dim().to_string();
    let question = q
        .input
        .iter()
        .rev()
        .find(|i| i.role == "user")
        .map(|i| i.content.as_str())
        .unwrap_or_default();
    println!("{} {}", style("Q:").bold(), question);
    println!(
        "{}",
        dim(format!(
            "{} · {} · session {} · {} · {} tokens",
            q.id,
            q.status,
            q.session_id,
            common::human_ms(q.runtime_ms),
            q.usage.total_tokens
        ))
    );
    println!();
    let answer = q.answer_text();
    if answer.is_empty() {
        if let Some(e) = &q.error {
            println!("{} {e}", style("error:").red());
        }
    } else {
        common::print_answer(&answer);
    }
    if !q.citations.is_empty() {
        println!();
        print!("{}", dim(common::footnotes(&q.citations)));
    }
    if !q.steps.is_empty() {
        println!();
        for s in &q.steps {
            println!(
                "{}",
                dim(format!("  {} [{}] {}", s.step_id, s.status, s.commentary))
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn models(client: &Client, json: bool) -> Result<ExitCode, String> {
    let catalog = client.models().await.map_err(|e| error_line(&e))?;
    if json {
        return print_json(&catalog);
    }
    let mut table = new_table(&["", "MODEL", "PROVIDER", "LABEL", "AVAILABLE"]);
    for m in &catalog.models {
        table.add_row(vec![
            Cell::new(if m.id == catalog.default { "*" } else { " " }),
            Cell::new(&m.id),
            Cell::new(&m.provider),
            Cell::new(&m.label),
            Cell::new(if m.available { "yes" } else { "no" }),
        ]);
    }
    common::print_table(table);
    println!("* default");
    Ok(ExitCode::SUCCESS)
}
