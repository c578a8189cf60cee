//! The local Nexus's project, stats, manifest, fork, curation-ledger,
//! source-removal, workflow and task-file operations, through the SDK's
//! `Client` against `LocalNexus`.

use crate::support::local as local_support;
use futures::StreamExt;
use local_support::*;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::{Client, types};
use serde_json::{Value, json};

fn body<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// The bytes of a task file.
async fn task_file(client: &Client, task: &str, path: &str) -> Vec<u8> {
    let mut stream = client
        .api()
        .read_task_file(task, path)
        .await
        .unwrap()
        .into_inner()
        .into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    out
}

/// The report a workflow task left.
async fn report(client: &Client, task: &str) -> Value {
    client
        .tasks()
        .wait_completed(task, Default::default())
        .await
        .unwrap();
    serde_json::from_slice(&task_file(client, task, "report.json").await).unwrap()
}

fn status<T>(r: Result<T, nexus_knowql::api::Error<types::Error>>) -> u16 {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.status().map(|s| s.as_u16()).unwrap(),
    }
}

async fn source_paths(client: &Client, slug: &str) -> Vec<String> {
    let m = client.api().get_source_manifest(slug).await.unwrap();
    m.into_inner().files.into_iter().map(|f| f.path).collect()
}

#[tokio::test]
async fn stats_count_what_the_server_holds() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let api = client.api();
    let stats = api.get_source_stats("docs").await.unwrap().into_inner();
    // guide/streaming.md, guide/tea.md, notes.txt (the hidden file is skipped).
    assert_eq!((stats.file_count, stats.dir_count), (3, 1));
    let manifest = source_paths(&client, "docs").await;
    assert_eq!(
        manifest,
        ["guide/streaming.md", "guide/tea.md", "notes.txt"]
    );
    assert_eq!(stats.used_bytes, Some(stats.total_size));
    let knowledge = api.get_knowledge_stats("docs").await.unwrap().into_inner();
    assert_eq!(knowledge.file_count, 3);

    let project = api.get_project_task_stats().await.unwrap().into_inner();
    assert_eq!((project.tasks_total, project.tasks_completed), (1, 1));
    assert_eq!(project.tasks_by_workflow.get("curate"), Some(&1));
    let ctx = api
        .get_context_task_stats("docs")
        .await
        .unwrap()
        .into_inner();
    assert_eq!((ctx.tasks_total, ctx.tasks_active), (1, 0));
    let trigger = api
        .explore_context("docs", &body(json!({})))
        .await
        .unwrap()
        .into_inner();
    report(&client, &trigger.task_id).await;
    let project = api.get_project_task_stats().await.unwrap().into_inner();
    assert_eq!(project.tasks_by_workflow.get("explore"), Some(&1));
    assert_eq!(project.tasks_total, 2);
    let task = api
        .get_task_stats(&trigger.task_id)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(task.task_id, trigger.task_id);
    assert_eq!(status(api.get_task_stats("tsk_nope").await), 404);
    assert_eq!(status(api.get_source_stats("nope").await), 404);
    assert_eq!(
        api.get_project().await.unwrap().into_inner().name,
        "nexus-local"
    );
}

#[tokio::test]
async fn manifests_and_templates_describe_local_curation() {
    let (_server, client, _dir) = seeded(LocalNexus::builder().chunk_chars(800)).await;
    let api = client.api();
    let manifest = api.get_context_manifest("docs").await.unwrap().into_inner();
    let chunking = manifest.curate.unwrap().chunks.unwrap().chunking.unwrap();
    assert_eq!(
        (chunking.strategy.as_str(), chunking.target_size),
        ("markdown_heading", 200)
    );
    let catalog = api.list_manifest_templates().await.unwrap().into_inner();
    assert!(
        catalog
            .templates
            .iter()
            .any(|t| t.id == catalog.default_id && t.default)
    );
    // A profile with a manifest makes it the context's manifest.
    let notes = catalog.templates.iter().find(|t| t.id == "notes").unwrap();
    let trigger = api
        .profile_context(
            "docs",
            &body(json!({"manifest": serde_json::to_value(&notes.manifest).unwrap()})),
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(trigger.state, "profiling");
    let profile = report(&client, &trigger.task_id).await;
    let types: Vec<&str> = profile["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["markdown", "text"]);
    assert_eq!(profile["files"].as_array().unwrap().len(), 3);
    let now = api.get_context_manifest("docs").await.unwrap().into_inner();
    let strategy = now
        .curate
        .unwrap()
        .chunks
        .unwrap()
        .chunking
        .unwrap()
        .strategy;
    assert_eq!(strategy, "sliding_window");
}

/// The status and message of an error answer (declared in the spec or not).
async fn refusal<T>(r: Result<T, nexus_knowql::api::Error<types::Error>>) -> (u16, String) {
    match r {
        Err(nexus_knowql::api::Error::ErrorResponse(e)) => {
            (e.status().as_u16(), e.into_inner().message)
        }
        Err(nexus_knowql::api::Error::UnexpectedResponse(resp)) => {
            let code = resp.status().as_u16();
            let body: types::Error = resp.json().await.unwrap();
            (code, body.message)
        }
        Ok(_) => panic!("expected an error"),
        Err(e) => panic!("expected an error answer, got {e}"),
    }
}

/// Found by a Schemathesis run: a manifest outside the API's bounds was stored
/// and then answered back, breaking the response schema. It is refused with
/// 400 on every way in, and what was stored stays.
#[tokio::test]
async fn a_manifest_outside_the_apis_bounds_is_refused_and_nothing_changes() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let api = client.api();
    let before = api.get_context_manifest("docs").await.unwrap().into_inner();
    let bad = json!({"optimize": {"eval_pass_rate_threshold": -1.0}});
    let update = api
        .update_context("docs", &body(json!({"manifest": bad.clone()})))
        .await;
    let (code, message) = refusal(update).await;
    assert_eq!(code, 400);
    assert!(message.contains("eval_pass_rate_threshold"), "{message}");
    let profile = api
        .profile_context("docs", &body(json!({"manifest": bad.clone()})))
        .await;
    let (code, message) = refusal(profile).await;
    assert_eq!(code, 400);
    assert!(message.contains("eval_pass_rate_threshold"), "{message}");
    let create = api
        .create_context(&body(
            json!({"slug": "bounds", "name": "b", "manifest": bad}),
        ))
        .await;
    let (code, message) = refusal(create).await;
    assert_eq!(code, 400);
    assert!(message.contains("eval_pass_rate_threshold"), "{message}");
    let after = api.get_context_manifest("docs").await.unwrap().into_inner();
    assert_eq!(after, before);
    assert_eq!(status(api.get_context("bounds").await), 404);
}

#[tokio::test]
async fn a_fork_copies_sources_and_manifest_and_is_independent() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let api = client.api();
    let fork = api
        .fork_context("docs", &body(json!({"target_slug": "copy"})))
        .await
        .unwrap()
        .into_inner();
    assert!(fork.success);
    assert_eq!(
        source_paths(&client, "copy").await,
        source_paths(&client, "docs").await
    );
    let tea = client.sources("copy").read("guide/tea.md").await.unwrap();
    assert!(String::from_utf8_lossy(&tea).contains("Green tea"));
    // Removing a source of the fork leaves the original whole.
    api.delete_source_file("copy", "guide/tea.md")
        .await
        .unwrap();
    assert_eq!(source_paths(&client, "copy").await.len(), 2);
    assert_eq!(source_paths(&client, "docs").await.len(), 3);
    client.sources("docs").read("guide/tea.md").await.unwrap();
    // The fork curates on its own.
    create_and_curate_existing(&client, "copy").await;
    assert_eq!(
        status(
            api.fork_context("docs", &body(json!({"target_slug": "copy"})))
                .await
        ),
        409
    );
    assert_eq!(
        status(
            api.fork_context("nope", &body(json!({"target_slug": "x"})))
                .await
        ),
        404
    );
    assert_eq!(
        status(
            api.fork_context("docs", &body(json!({"target_slug": "Bad Slug"})))
                .await
        ),
        400
    );
}

async fn create_and_curate_existing(client: &Client, slug: &str) {
    let trigger = client
        .contexts()
        .curate(slug, &Default::default())
        .await
        .unwrap();
    client
        .tasks()
        .wait_completed(&trigger.task_id, Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn the_ledger_records_curation_and_deleted_sources_leave_the_index_at_the_next() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let api = client.api();
    let ledger = api.get_curation_ledger("docs").await.unwrap().into_inner();
    assert_eq!(ledger.manifest.len(), 3);
    assert!(ledger.manifest["notes.txt"].hash.starts_with("sha256:"));
    assert_eq!(ledger.chunk_ids["notes.txt"].len(), 1);
    let version = ledger.live_version;
    assert!(ledger.source_removed.is_empty());

    api.delete_curated_sources(
        "docs",
        &body(json!({"sources": ["notes.txt", "no/such.md"]})),
    )
    .await
    .unwrap();
    assert!(
        !source_paths(&client, "docs")
            .await
            .contains(&"notes.txt".to_owned())
    );
    // Still in the index until the next curation.
    let knowledge =
        |l: types::DirListing| -> Vec<String> { l.entries.into_iter().map(|e| e.name).collect() };
    let before = api
        .list_knowledge_by_path("docs", "chunks", None, None)
        .await
        .unwrap()
        .into_inner();
    assert!(knowledge(before).iter().any(|n| n.starts_with("notes")));
    create_and_curate_existing(&client, "docs").await;
    let after = api
        .list_knowledge_by_path("docs", "chunks", None, None)
        .await
        .unwrap()
        .into_inner();
    assert!(!knowledge(after).iter().any(|n| n.starts_with("notes")));
    let ledger = api.get_curation_ledger("docs").await.unwrap().into_inner();
    assert_eq!(ledger.live_version, version + 1);
    assert_eq!(
        ledger.source_removed["notes.txt"].removed_version,
        version + 1
    );
    assert!(!ledger.manifest.contains_key("notes.txt"));
    assert_eq!(status(api.get_curation_ledger("nope").await), 404);
}

#[tokio::test]
async fn explore_and_optimize_work_over_the_curated_index() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let api = client.api();
    let trigger = api
        .explore_context("docs", &body(json!({"guide": "tea and streams"})))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(trigger.state, "exploring");
    let explore = report(&client, &trigger.task_id).await;
    let terms: Vec<&str> = explore["top_terms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["term"].as_str().unwrap())
        .collect();
    assert!(
        terms.contains(&"tea") && terms.contains(&"steep"),
        "{terms:?}"
    );
    let counts: Vec<u64> = explore["top_terms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["count"].as_u64().unwrap())
        .collect();
    assert!(
        counts.windows(2).all(|w| w[0] >= w[1]),
        "most frequent first"
    );
    assert!(explore["top_sections"].as_array().unwrap().len() >= 3);
    assert_eq!(explore["local"], true);

    let trigger = api
        .optimize_context("docs", &body(json!({})))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(trigger.state, "optimizing");
    let optimize = report(&client, &trigger.task_id).await;
    assert_eq!(optimize["segments_after"], 1, "{optimize:#}");
    // Search still works on the compacted index.
    let session = client.session(["docs"]).build().unwrap();
    let q = session
        .ask("How long does green tea steep?")
        .send()
        .await
        .unwrap();
    assert!(
        q.answer_text().contains("two minutes"),
        "{}",
        q.answer_text()
    );

    // Not curated: refused.
    client
        .contexts()
        .create(&body(json!({"slug": "empty", "name": "Empty"})))
        .await
        .unwrap();
    assert_eq!(
        status(api.explore_context("empty", &body(json!({}))).await),
        409
    );
    assert_eq!(
        status(api.optimize_context("empty", &body(json!({}))).await),
        409
    );
}

#[tokio::test]
async fn task_files_hold_what_a_task_produced() {
    let (_server, client, _dir) = seeded(LocalNexus::builder()).await;
    let api = client.api();
    client
        .contexts()
        .create(&body(json!({"slug": "up", "name": "Up"})))
        .await
        .unwrap();
    let up = client
        .sources("up")
        .upload_bytes("a.md", b"# A\n\nalpha\n".to_vec(), Some("docs"))
        .await
        .unwrap();
    client
        .tasks()
        .wait_completed(&up.task_id, Default::default())
        .await
        .unwrap();
    let listing = api
        .list_task_files(&up.task_id, None, None)
        .await
        .unwrap()
        .into_inner();
    let names: Vec<&str> = listing.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["imported.txt", "report.json"]);
    assert_eq!(
        task_file(&client, &up.task_id, "imported.txt").await,
        b"docs/a.md\n"
    );
    let meta = api
        .get_task_file_metadata(&up.task_id, "imported.txt")
        .await
        .unwrap()
        .into_inner();
    match meta {
        types::TaskFileMetadata::Live { kind, size, .. } => {
            assert_eq!((kind.as_str(), size), ("file", 10))
        }
        other => panic!("{other:?}"),
    }
    let one = api
        .list_task_files_by_path(&up.task_id, "report.json", None, None)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(one.total, 1);
    let deleted = api
        .delete_task_file(&up.task_id, "imported.txt")
        .await
        .unwrap()
        .into_inner();
    assert!(deleted.deleted);
    assert_eq!(
        status(api.read_task_file(&up.task_id, "imported.txt").await),
        404
    );
    assert_eq!(
        status(api.delete_task_file(&up.task_id, "imported.txt").await),
        404
    );
    assert_eq!(
        status(api.list_task_files("tsk_nope", None, None).await),
        404
    );
    let left = api
        .list_task_files(&up.task_id, None, None)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(left.total, 1);
}

#[tokio::test]
async fn connectors_and_task_files_survive_a_restart() {
    let data = TempDir::new("ops-data");
    let roots = TempDir::new("ops-roots");
    roots.write("share/a.md", "# A\n\nshared alpha\n");
    let builder = || {
        LocalNexus::builder()
            .data_dir(data.path())
            .connector_root(roots.path())
    };
    let (connector, task) = {
        let server = builder().start().await.unwrap();
        let client = server.client().unwrap();
        let api = client.api();
        let c = api
            .create_connector("local", &body(json!({"api_key": "share"})))
            .await
            .unwrap()
            .into_inner();
        client
            .contexts()
            .create(&body(json!({"slug": "s", "name": "S"})))
            .await
            .unwrap();
        api.update_context_connector("s", &c.id, &body(json!({"enabled": true})))
            .await
            .unwrap();
        let t = api
            .import_context_sources("s", &body(json!({"connector_id": c.id})))
            .await
            .unwrap()
            .into_inner();
        client
            .tasks()
            .wait_completed(&t.task_id, Default::default())
            .await
            .unwrap();
        server.shutdown().await;
        (c.id, t.task_id)
    };
    let server = builder().start().await.unwrap();
    let client = server.client().unwrap();
    let api = client.api();
    assert_eq!(
        api.get_connector(&connector)
            .await
            .unwrap()
            .into_inner()
            .account_label
            .as_deref()
            .map(|l| l.ends_with("share")),
        Some(true)
    );
    let on = api.list_context_connectors("s").await.unwrap().into_inner();
    assert!(on.iter().any(|c| c.id == connector && c.enabled));
    assert_eq!(task_file(&client, &task, "imported.txt").await, b"a.md\n");
    assert_eq!(source_paths(&client, "s").await, ["a.md"]);
}

#[tokio::test]
async fn a_seed_directory_that_cannot_be_read_is_an_io_error_with_its_path() {
    use nexus_knowql::local::StartError;
    let missing = std::env::temp_dir().join("nexus-local-no-such-seed-dir");
    let err = LocalNexus::builder()
        .context("gone", &missing)
        .start()
        .await
        .expect_err("the seed fails");
    match &err {
        StartError::ContextFiles {
            slug, path, source, ..
        } => {
            assert_eq!((slug.as_str(), path), ("gone", &missing));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
    let source = std::error::Error::source(&err).expect("the I/O failure is the source");
    assert!(source.downcast_ref::<std::io::Error>().is_some());

    let dir = corpus();
    let err = LocalNexus::builder()
        .context_bytes_limit(10)
        .context("big", dir.path())
        .start()
        .await
        .expect_err("over the limit");
    match err {
        StartError::ContextFiles { source, .. } => {
            assert_eq!(source.kind(), std::io::ErrorKind::FileTooLarge)
        }
        other => panic!("{other:?}"),
    }
}
