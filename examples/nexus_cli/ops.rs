//! The `nexus` commands for forks, manifests, statistics and connectors.

use std::process::ExitCode;

use comfy_table::Cell;
use nexus_knowql::{Client, types};

use crate::common::{context, error_line};
use crate::{new_table, print_json, when};

/// One line for a failed API call, worded as every other error of the CLIs
/// (through the SDK's error: status, the server's code and message, the
/// request id).
fn api_error<E>(what: &str, e: nexus_knowql::api::Error<E>) -> String
where
    nexus_knowql::Error: From<nexus_knowql::api::Error<E>>,
{
    format!("{what}: {}", error_line(&nexus_knowql::Error::from(e)))
}

/// [`api_error`] for a call about context `slug`: a missing one is named
/// as everywhere else.
fn context_api_error(slug: &str, what: &str, e: nexus_knowql::api::Error<types::Error>) -> String {
    let e = nexus_knowql::Error::from(e);
    context::missing(slug, &e).unwrap_or_else(|| format!("{what}: {}", error_line(&e)))
}

fn body<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| format!("invalid request: {e}"))
}

/// `nexus fork SLUG TARGET`.
pub(crate) async fn fork(
    client: &Client,
    json: bool,
    slug: &str,
    target: &str,
) -> Result<ExitCode, String> {
    let api = client.api();
    let request = body(serde_json::json!({"target_slug": target}))?;
    let done = api
        .fork_context(slug, &request)
        .await
        .map_err(|e| context_api_error(slug, &format!("cannot fork `{slug}`"), e))?
        .into_inner();
    let copy = api
        .get_context(target)
        .await
        .map_err(|e| api_error(&format!("cannot read `{target}`"), e))?
        .into_inner();
    if json {
        return print_json(&copy);
    }
    let files = api
        .get_source_stats(target)
        .await
        .map(|s| s.into_inner().file_count)
        .unwrap_or_default();
    if done.success {
        println!(
            "forked `{slug}` into `{target}` ({files} source files); curate it with `nexus curate {target} --wait`"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `nexus manifest SLUG`: the manifest curation runs with, as JSON.
pub(crate) async fn manifest(client: &Client, slug: &str) -> Result<ExitCode, String> {
    let manifest = client
        .api()
        .get_context_manifest(slug)
        .await
        .map_err(|e| context_api_error(slug, &format!("cannot read the manifest of `{slug}`"), e))?
        .into_inner();
    print_json(&manifest)
}

/// `nexus stats [SLUG]`: task counts of the project, or the files and
/// tasks of one context.
pub(crate) async fn stats(
    client: &Client,
    json: bool,
    slug: Option<&str>,
) -> Result<ExitCode, String> {
    let api = client.api();
    let Some(slug) = slug else {
        let s = api
            .get_project_task_stats()
            .await
            .map_err(|e| api_error("cannot read the task statistics", e))?
            .into_inner();
        if json {
            return print_json(&s);
        }
        println!(
            "tasks: {} ({} active, {} completed, {} cancelled)",
            s.tasks_total, s.tasks_active, s.tasks_completed, s.tasks_cancelled
        );
        let mut table = new_table(&["WORKFLOW", "TASKS"]);
        let mut rows: Vec<_> = s.tasks_by_workflow.iter().collect();
        rows.sort();
        for (workflow, n) in rows {
            table.add_row(vec![Cell::new(workflow), Cell::new(n)]);
        }
        crate::common::print_table(table);
        return Ok(ExitCode::SUCCESS);
    };
    let context = |what: &str| format!("cannot read the {what} of `{slug}`");
    let sources = api
        .get_source_stats(slug)
        .await
        .map_err(|e| context_api_error(slug, &context("source statistics"), e))?
        .into_inner();
    let knowledge = api
        .get_knowledge_stats(slug)
        .await
        .map_err(|e| context_api_error(slug, &context("knowledge statistics"), e))?
        .into_inner();
    let tasks = api
        .get_context_task_stats(slug)
        .await
        .map_err(|e| context_api_error(slug, &context("task statistics"), e))?
        .into_inner();
    if json {
        return print_json(&serde_json::json!({
            "sources": sources,
            "knowledge": knowledge,
            "tasks": tasks,
        }));
    }
    let mut table = new_table(&["", "FILES", "DIRECTORIES", "BYTES"]);
    table.add_row(vec![
        Cell::new("sources"),
        Cell::new(sources.file_count),
        Cell::new(sources.dir_count),
        Cell::new(sources.total_size),
    ]);
    table.add_row(vec![
        Cell::new("knowledge"),
        Cell::new(knowledge.file_count),
        Cell::new(knowledge.dir_count),
        Cell::new(knowledge.total_size),
    ]);
    crate::common::print_table(table);
    println!(
        "tasks: {} ({} active, {} completed, {} failed, {} cancelled)",
        tasks.tasks_total,
        tasks.tasks_active,
        tasks.tasks_completed,
        tasks.tasks_failed,
        tasks.tasks_cancelled
    );
    Ok(ExitCode::SUCCESS)
}

/// `nexus connectors [--context SLUG]`.
pub(crate) async fn connectors(
    client: &Client,
    json: bool,
    context: Option<&str>,
) -> Result<ExitCode, String> {
    let api = client.api();
    let rows: Vec<(types::ConnectorView, Option<bool>)> = match context {
        Some(slug) => api
            .list_context_connectors(slug)
            .await
            .map_err(|e| {
                context_api_error(slug, &format!("cannot list the connectors of `{slug}`"), e)
            })?
            .into_inner()
            .into_iter()
            .map(|c| {
                let enabled = c.enabled;
                let view = types::ConnectorView::builder()
                    .account_label(c.account_label)
                    .created_at(c.created_at)
                    .id(c.id)
                    .provider(c.provider)
                    .updated_at(c.updated_at);
                types::ConnectorView::try_from(view)
                    .map(|view| (view, Some(enabled)))
                    .map_err(|e| format!("cannot list the connectors of `{slug}`: {e}"))
            })
            .collect::<Result<_, _>>()?,
        None => api
            .list_connectors(None)
            .await
            .map_err(|e| api_error("cannot list connectors", e))?
            .into_inner()
            .into_iter()
            .map(|c| (c, None))
            .collect(),
    };
    if json {
        let all: Vec<_> = rows.iter().map(|(c, _)| c).collect();
        return print_json(&all);
    }
    if rows.is_empty() {
        println!("no connectors: add one with `nexus connect DIR`");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = new_table(&["ID", "PROVIDER", "LABEL", "ENABLED", "CREATED"]);
    for (c, enabled) in &rows {
        let enabled = match enabled {
            Some(true) => "✓",
            Some(false) => "",
            None => "-",
        };
        table.add_row(vec![
            Cell::new(&c.id),
            Cell::new(&c.provider),
            Cell::new(c.account_label.as_deref().unwrap_or("")),
            Cell::new(enabled),
            Cell::new(when(&c.created_at)),
        ]);
    }
    crate::common::print_table(table);
    Ok(ExitCode::SUCCESS)
}

/// `nexus connect DIR [--label L] [--enable SLUG]`: a `local` connector
/// over a directory the server may read.
pub(crate) async fn connect(
    client: &Client,
    json: bool,
    dir: &str,
    label: Option<&str>,
    enable: Option<&str>,
) -> Result<ExitCode, String> {
    let api = client.api();
    let mut request = serde_json::json!({"api_key": dir});
    if let Some(l) = label {
        request["account_label"] = l.into();
    }
    let created = api
        .create_connector("local", &body(request)?)
        .await
        .map_err(|e| api_error(&format!("cannot connect {dir}"), e))?
        .into_inner();
    if let Some(slug) = enable {
        api.update_context_connector(
            slug,
            &created.id,
            &body(serde_json::json!({"enabled": true}))?,
        )
        .await
        .map_err(|e| api_error(&format!("cannot enable it on `{slug}`"), e))?;
    }
    if json {
        return print_json(&created);
    }
    println!("connected {} as {}", dir, created.id);
    Ok(ExitCode::SUCCESS)
}
