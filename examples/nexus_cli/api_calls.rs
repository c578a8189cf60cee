//! The dispatch of `nexus api`: one generated call per operation, its
//! answer printed as JSON (bytes as sent for file reads, events one per line
//! for event streams).

use std::process::ExitCode;

use futures::StreamExt;
use nexus_knowql::api::{ByteStream, ResponseValue};
use nexus_knowql::{Client, types};

use super::{Body, Call, Credentials, body, failure, stream};
use crate::common::{error_line, to_json};

type Answer<T, E> = Result<ResponseValue<T>, nexus_knowql::api::Error<E>>;

/// The most pages `--paginate` follows.
const MAX_PAGES: usize = 100_000;

/// With `-i`: the answer's status line and headers, then an empty line.
pub(super) fn head<T>(call: &Call, answer: &ResponseValue<T>) {
    if !call.include {
        return;
    }
    let mut text = format!("HTTP {}\n", answer.status());
    for (name, value) in answer.headers() {
        let value = String::from_utf8_lossy(value.as_bytes());
        text.push_str(&format!("{name}: {value}\n"));
    }
    println!("{text}");
}

/// Prints a JSON answer (or keeps it, while following pages).
fn show<T: serde::Serialize, E>(call: &Call, answer: Answer<T, E>) -> Result<ExitCode, String>
where
    nexus_knowql::Error: From<nexus_knowql::api::Error<E>>,
{
    let answer = answer.map_err(|e| failure(call.op.id, e))?;
    head(call, &answer);
    let value = answer.into_inner();
    if call.paginate {
        let value = serde_json::to_value(&value).map_err(|e| format!("{}: {e}", call.op.id))?;
        *call.page.borrow_mut() = Some(value);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}", to_json(&value));
    Ok(ExitCode::SUCCESS)
}

/// `--paginate`: every page of a listing from `offset` on, its entries
/// printed as one JSON array.
pub(crate) async fn paginate(
    client: &Client,
    credentials: &Credentials,
    call: &mut Call,
) -> Result<ExitCode, String> {
    let mut all = Vec::new();
    let mut offset = call.int("offset")?.unwrap_or(0);
    for _ in 0..MAX_PAGES {
        call.params.insert("offset".to_owned(), offset.to_string());
        dispatch(client, credentials, call).await?;
        let Some(page) = call.page.borrow_mut().take() else {
            return Err(format!("{}: no page came back", call.op.id));
        };
        let items = ["entries", "items"]
            .iter()
            .find_map(|key| page.get(*key).and_then(|v| v.as_array()))
            .cloned()
            .unwrap_or_default();
        let count = i64::try_from(items.len()).unwrap_or(i64::MAX);
        all.extend(items);
        let total = page.get("total").and_then(serde_json::Value::as_i64);
        let next = page
            .get("next_offset")
            .and_then(serde_json::Value::as_i64)
            .or_else(|| {
                let next = offset.checked_add(count)?;
                total.filter(|total| next < *total).map(|_| next)
            });
        match next {
            Some(next) if count > 0 && next > offset => offset = next,
            _ => {
                println!("{}", to_json(&all));
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
    Err(format!("{}: more than {MAX_PAGES} pages", call.op.id))
}

/// Reports an answer without a body (its status, on stderr).
pub(super) fn done<E>(call: &Call, answer: Answer<(), E>) -> Result<ExitCode, String>
where
    nexus_knowql::Error: From<nexus_knowql::api::Error<E>>,
{
    let answer = answer.map_err(|e| failure(call.op.id, e))?;
    head(call, &answer);
    if call.json {
        println!(
            "{}",
            serde_json::json!({"status": answer.status().as_u16()})
        );
    } else {
        eprintln!("{}: done ({})", call.op.id, answer.status());
    }
    Ok(ExitCode::SUCCESS)
}

/// Copies a file's bytes to stdout as they arrive.
async fn copy_out(
    call: &Call,
    answer: Answer<ByteStream, types::Error>,
) -> Result<ExitCode, String> {
    use std::io::Write as _;
    let answer = answer.map_err(|e| failure(call.op.id, e))?;
    head(call, &answer);
    let mut body = answer.into_inner().into_inner();
    let mut stdout = std::io::stdout().lock();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("{}: {}", call.op.id, error_line(&e)))?;
        if let Err(e) = stdout.write_all(&chunk) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(ExitCode::SUCCESS);
            }
            return Err(format!("cannot write to stdout: {e}"));
        }
    }
    let _ = stdout.flush();
    Ok(ExitCode::SUCCESS)
}

/// Runs the call's operation.
pub(crate) async fn dispatch(
    client: &Client,
    credentials: &Credentials,
    call: &Call,
) -> Result<ExitCode, String> {
    let c = call;
    if c.op.body == Body::Json {
        let body = c.raw_body();
        if c.op.id == "query"
            && body.get("stream").and_then(serde_json::Value::as_bool) == Some(true)
        {
            return stream::query_stream(client, credentials, c, &body).await;
        }
        return body::send(client, c).await;
    }
    let api = client.api();
    match c.op.id {
        "get_identity" => show(c, api.get_identity().await),
        "get_project" => show(c, api.get_project().await),
        "list_connectors" => show(c, api.list_connectors(c.typed("kind")?.as_ref()).await),
        "get_connector" => show(c, api.get_connector(c.req("id")?).await),
        "delete_connector" => show(c, api.delete_connector(c.req("id")?).await),
        "start_connector_oauth" => show(
            c,
            api.start_connector_oauth(c.req("provider")?, c.opt("return_to"))
                .await,
        ),
        "list_connector_items" => show(
            c,
            api.list_connector_items(c.req("id")?, c.opt("folder"))
                .await,
        ),
        "list_context_connectors" => show(c, api.list_context_connectors(c.req("slug")?).await),
        _ => dispatch_contexts(client, c).await,
    }
}

/// The operations on contexts, their sources and their knowledge.
async fn dispatch_contexts(client: &Client, c: &Call) -> Result<ExitCode, String> {
    let api = client.api();
    match c.op.id {
        "list_contexts" => show(c, api.list_contexts().await),
        "get_context" => show(c, api.get_context(c.req("slug")?).await),
        "delete_context" => done(c, api.delete_context(c.req("slug")?).await),
        "get_context_manifest" => show(c, api.get_context_manifest(c.req("slug")?).await),
        "get_context_task_stats" => show(c, api.get_context_task_stats(c.req("slug")?).await),
        "get_curation_ledger" => show(c, api.get_curation_ledger(c.req("slug")?).await),
        "upload_context_source" => {
            let slug = c.req("slug")?;
            let file = c.req("file")?;
            let trigger = client
                .sources(slug)
                .upload_file(file, c.opt("path"))
                .await
                .map_err(|e| format!("{}: {}", c.op.id, error_line(&e)))?;
            println!("{}", to_json(&trigger));
            Ok(ExitCode::SUCCESS)
        }
        "list_source_files" => show(
            c,
            api.list_source_files(c.req("slug")?, c.int("limit")?, c.int("offset")?)
                .await,
        ),
        "get_source_stats" => show(c, api.get_source_stats(c.req("slug")?).await),
        "get_source_manifest" => show(c, api.get_source_manifest(c.req("slug")?).await),
        "list_source_files_by_path" => show(
            c,
            api.list_source_files_by_path(
                c.req("slug")?,
                c.req("path")?,
                c.int("limit")?,
                c.int("offset")?,
            )
            .await,
        ),
        "read_source_file" => {
            copy_out(
                c,
                api.read_source_file(c.req("slug")?, c.req("path")?).await,
            )
            .await
        }
        "delete_source_file" => show(
            c,
            api.delete_source_file(c.req("slug")?, c.req("path")?).await,
        ),
        "list_knowledge" => show(
            c,
            api.list_knowledge(c.req("slug")?, c.int("limit")?, c.int("offset")?)
                .await,
        ),
        "get_knowledge_stats" => show(c, api.get_knowledge_stats(c.req("slug")?).await),
        "list_knowledge_by_path" => show(
            c,
            api.list_knowledge_by_path(
                c.req("slug")?,
                c.req("path")?,
                c.int("limit")?,
                c.int("offset")?,
            )
            .await,
        ),
        "read_knowledge_file" => {
            copy_out(
                c,
                api.read_knowledge_file(c.req("slug")?, c.req("path")?)
                    .await,
            )
            .await
        }
        _ => dispatch_queries(client, c).await,
    }
}

/// The operations on queries, sessions, models and templates.
async fn dispatch_queries(client: &Client, c: &Call) -> Result<ExitCode, String> {
    let api = client.api();
    match c.op.id {
        "get_query" => show(c, api.get_query(c.req("id")?).await),
        "cancel_query" => show(c, api.cancel_query(c.req("id")?).await),
        "get_query_trace" => show(c, api.get_query_trace(c.req("id")?).await),
        "stream_query_events" => {
            let events = api
                .stream_query_events(c.req("id")?, c.opt("last_event_id"))
                .await
                .map_err(|e| failure(c.op.id, e))?;
            stream::print_events(c, events.into_inner().into_inner()).await
        }
        "list_models" => show(c, api.list_models().await),
        "list_sessions" => show(c, api.list_sessions(c.positive("limit")?).await),
        "get_session" => show(c, api.get_session(c.req("id")?).await),
        "delete_session" => show(c, api.delete_session(c.req("id")?).await),
        "get_project_task_stats" => show(c, api.get_project_task_stats().await),
        "list_manifest_templates" => show(c, api.list_manifest_templates().await),
        _ => dispatch_tasks(client, c).await,
    }
}

/// The operations on tasks and their files.
async fn dispatch_tasks(client: &Client, c: &Call) -> Result<ExitCode, String> {
    let api = client.api();
    match c.op.id {
        "list_tasks" => show(
            c,
            api.list_tasks(
                c.opt("context"),
                c.positive("limit")?,
                c.int("offset")?,
                c.int("page")?,
                c.opt("q"),
                c.typed("state")?.as_ref(),
                c.typed("workflow")?.as_ref(),
            )
            .await,
        ),
        "get_task" => show(c, api.get_task(c.req("id")?).await),
        "get_task_stats" => show(c, api.get_task_stats(c.req("id")?).await),
        "read_task_file" => {
            copy_out(c, api.read_task_file(c.req("id")?, c.req("path")?).await).await
        }
        "get_task_file_metadata" => show(
            c,
            api.get_task_file_metadata(c.req("id")?, c.req("path")?)
                .await,
        ),
        "list_task_files_by_path" => show(
            c,
            api.list_task_files_by_path(
                c.req("id")?,
                c.req("path")?,
                c.int("limit")?,
                c.int("offset")?,
            )
            .await,
        ),
        "list_task_files" => show(
            c,
            api.list_task_files(c.req("id")?, c.int("limit")?, c.int("offset")?)
                .await,
        ),
        "delete_task_file" => show(c, api.delete_task_file(c.req("id")?, c.req("path")?).await),
        other => Err(format!("operation `{other}` has no call")),
    }
}
