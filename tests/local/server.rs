//! The local Nexus through the SDK: contexts, uploads, curation, tasks,
//! knowledge, version and auth, injected faults, persistence and the
//! `nexus-local` binary.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use crate::support::local as local_support;
use crate::support::wait::until_some;
use local_support::*;
use nexus_knowql::local::LocalNexus;
use nexus_knowql::{Client, Error, RetryPolicy, types};
use serde_json::json;

fn create_req(slug: &str) -> types::CreateContextRequest {
    serde_json::from_value(json!({"slug": slug, "name": format!("{slug} name")})).unwrap()
}

#[tokio::test]
async fn uploaded_directory_is_curated_into_a_queryable_context() {
    let server = LocalNexus::start().await.unwrap();
    let client = server.client().unwrap();
    let dir = corpus();
    let ctx = client.contexts().create(&create_req("kb")).await.unwrap();
    assert!(!ctx.is_queryable() && !ctx.has_sources);

    // import_dir sends one .tar.gz; the server expands it under uploads/.
    let imports = client
        .sources("kb")
        .import_dir(dir.path(), |_| {})
        .await
        .unwrap();
    assert_eq!(imports.len(), 1);
    let root = client.sources("kb").list().await.unwrap();
    assert_eq!(root[0].name, "uploads");
    assert_eq!(root[0].kind, "dir");
    let guide = client
        .sources("kb")
        .list()
        .path("uploads/guide")
        .await
        .unwrap();
    let names: Vec<_> = guide.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["streaming.md", "tea.md"]);
    let hidden = client.sources("kb").list().path("uploads/.hidden").await;
    assert!(
        hidden.unwrap_err().is_not_found(),
        "hidden files are skipped"
    );
    let bytes = client
        .sources("kb")
        .read("uploads/notes.txt")
        .await
        .unwrap();
    assert!(std::str::from_utf8(&bytes).unwrap().contains("42 ships"));

    let mut seen_progress = false;
    let trigger = client
        .contexts()
        .curate("kb", &Default::default())
        .await
        .unwrap();
    let task = client
        .tasks()
        .wait_completed(
            &trigger.task_id,
            nexus_knowql::resources::TaskWait::default()
                .interval(Duration::from_millis(5), Duration::from_millis(50))
                .on_progress(|t| seen_progress |= t.progress.is_some()),
        )
        .await
        .unwrap();
    assert!(seen_progress);
    assert_eq!(task.workflow.as_str(), "curate");
    assert_eq!(task.progress.as_ref().unwrap().pct, 100.0);
    assert!(task.output.is_some());
    let out = task
        .output_as::<types::CurateRunOutput>()
        .unwrap()
        .expect("a completed curation has an output");
    assert_eq!(out.delta.processed, 3);
    assert!(out.delta.chunks_created >= 5);
    let ctx = client.contexts().get("kb").await.unwrap();
    assert!(ctx.is_queryable() && ctx.has_sources && !ctx.is_curating);
    assert!(!ctx.sample_queries.is_empty());

    let knowledge = client
        .knowledge("kb")
        .list()
        .path("chunks/uploads/guide")
        .await
        .unwrap();
    assert_eq!(knowledge.len(), 2);
    let tea = client
        .knowledge("kb")
        .read("chunks/uploads/guide/tea.md")
        .await
        .unwrap();
    assert!(
        std::str::from_utf8(&tea)
            .unwrap()
            .contains("## Tea > Black tea")
    );

    let tasks = client.tasks().list().context("kb").await.unwrap();
    let workflows: Vec<_> = tasks.iter().map(|t| t.workflow.as_str()).collect();
    assert_eq!(workflows, ["curate", "import"], "newest first");
}

#[tokio::test]
async fn context_crud_and_bad_inputs() {
    let server = LocalNexus::builder()
        .upload_limit(1024)
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    client.contexts().create(&create_req("a")).await.unwrap();
    let dup = client
        .contexts()
        .create(&create_req("a"))
        .await
        .unwrap_err();
    assert!(dup.is_conflict());
    let bad = client
        .contexts()
        .create(&create_req("Not A Slug"))
        .await
        .unwrap_err();
    assert_eq!(bad.status().map(|s| s.as_u16()), Some(400));
    let upd: types::UpdateContextRequest =
        serde_json::from_value(json!({"name": "renamed", "description": "d"})).unwrap();
    let ctx = client.contexts().update("a", &upd).await.unwrap();
    assert_eq!(
        (ctx.name.as_str(), ctx.description.as_deref()),
        ("renamed", Some("d"))
    );
    assert!(
        client
            .contexts()
            .get("missing")
            .await
            .unwrap_err()
            .is_not_found()
    );

    // Oversized upload: 413, and the context is untouched.
    let big = client
        .sources("a")
        .upload_bytes("big.md", vec![b'x'; 4096], None)
        .await
        .unwrap_err();
    assert_eq!(big.status().map(|s| s.as_u16()), Some(413));
    let unsafe_name = reqwest::Client::new()
        .post(format!("{}/contexts/a/import/upload", server.base_url()))
        .multipart(reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(b"x".to_vec()).file_name(".."),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(unsafe_name.status(), 400);
    let to_missing = client
        .sources("missing")
        .upload_bytes("a.md", b"# A".to_vec(), None)
        .await
        .unwrap_err();
    assert!(to_missing.is_not_found());
    // Curating without sources is a conflict.
    assert!(
        client
            .contexts()
            .curate("a", &Default::default())
            .await
            .unwrap_err()
            .is_conflict()
    );

    let t = client
        .sources("a")
        .upload_bytes("ok.md", b"# Ok\n\nfine".to_vec(), None)
        .await
        .unwrap();
    client
        .tasks()
        .wait_completed(&t.task_id, Default::default())
        .await
        .unwrap();
    assert!(client.contexts().get("a").await.unwrap().has_sources);
    client.contexts().delete("a").await.unwrap();
    assert!(client.contexts().get("a").await.unwrap_err().is_not_found());
    assert!(client.contexts().list().await.unwrap().is_empty());
}

/// Imports on one context run one at a time: an upload arriving while one
/// runs waits for its end instead of being refused.
#[tokio::test]
async fn a_second_upload_during_an_import_waits_its_turn() {
    let server = LocalNexus::builder()
        .frame_delay(Duration::from_millis(300))
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    client.contexts().create(&create_req("busy")).await.unwrap();
    let first = client
        .sources("busy")
        .upload_bytes("a.md", b"# A".to_vec(), None)
        .await
        .unwrap();
    // Answered while the first import's task is still open (the frame
    // delay keeps it so): the second waits for it to end.
    let second = client
        .sources("busy")
        .upload_bytes("b.md", b"# B".to_vec(), None)
        .await
        .unwrap();
    let first = client.tasks().get(&first.task_id).await.unwrap();
    assert_eq!(first.state.as_str(), "completed", "{first:?}");
    client
        .tasks()
        .wait_completed(&second.task_id, Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn cancelling_a_curation_task_leaves_the_context_uncurated() {
    let (server, client, dir) =
        seeded(LocalNexus::builder().frame_delay(Duration::from_millis(500))).await;
    client.contexts().create(&create_req("slow")).await.unwrap();
    client
        .sources("slow")
        .import_dir(dir.path(), |_| {})
        .await
        .unwrap();
    let t = client
        .contexts()
        .curate("slow", &Default::default())
        .await
        .unwrap();
    client
        .tasks()
        .cancel(&t.task_id, Some("changed my mind"))
        .await
        .unwrap();
    let task = client
        .tasks()
        .wait(&t.task_id, Default::default())
        .await
        .unwrap();
    assert_eq!(task.state.as_str(), "cancelled");
    // The signal: the curation's job reached its end (it clears
    // `is_curating` last), so nothing it could still swap in is pending.
    let ctx = until_some(Duration::from_secs(30), "the curation ending", async || {
        let ctx = client.contexts().get("slow").await.unwrap();
        (!ctx.is_curating).then_some(ctx)
    })
    .await;
    assert!(!ctx.is_queryable());
    drop(server);
}

#[tokio::test]
async fn api_versions_are_echoed_or_refused() {
    let server = LocalNexus::start().await.unwrap();
    let unstable = Client::builder()
        .base_url(server.base_url())
        .api_version("unstable")
        .build()
        .unwrap();
    unstable.contexts().list().await.unwrap();
    assert_eq!(unstable.server_api_version().as_deref(), Some("unstable"));
    let old = Client::builder()
        .base_url(server.base_url())
        .api_version("1999-01")
        .build()
        .unwrap();
    let err = old.contexts().list().await.unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedApiVersion { .. }),
        "{err:?}"
    );
    let raw = reqwest::get(format!("{}/contexts", server.base_url()))
        .await
        .unwrap();
    assert_eq!(raw.status(), 200, "no version header means 2026-07");
    assert_eq!(raw.headers()["x-pinecone-api-version"], "2026-07");
}

#[tokio::test]
async fn an_api_key_is_required_once_set() {
    let server = LocalNexus::builder()
        .api_key("sekrit")
        .start()
        .await
        .unwrap();
    let anonymous = Client::builder()
        .base_url(server.base_url())
        .build()
        .unwrap();
    assert!(matches!(
        anonymous.contexts().list().await.unwrap_err(),
        Error::Unauthorized { .. }
    ));
    let wrong = Client::builder()
        .base_url(server.base_url())
        .api_key("nope")
        .build()
        .unwrap();
    assert!(matches!(
        wrong.contexts().list().await.unwrap_err(),
        Error::Unauthorized { .. }
    ));
    server.client().unwrap().contexts().list().await.unwrap();
    let bearer = Client::builder()
        .base_url(server.base_url())
        .api_key("sekrit")
        .login(true)
        .build()
        .unwrap();
    bearer.contexts().list().await.unwrap();
    let who = bearer.api().get_identity().await.unwrap().into_inner();
    assert_eq!(who.user, "local");
    assert!(!format!("{server:?}").contains("sekrit"));
}

#[tokio::test]
async fn injected_503s_are_retried_by_idempotent_calls_only() {
    let server = LocalNexus::builder()
        .retry_after_secs(0)
        .start()
        .await
        .unwrap();
    let client = Client::builder()
        .base_url(server.base_url())
        .retry(RetryPolicy::default().initial_delay(Duration::from_millis(1)))
        .build()
        .unwrap();
    server.fail_next_requests(2);
    client.contexts().list().await.unwrap();
    server.fail_next_requests(1);
    let err = client
        .contexts()
        .create(&create_req("x"))
        .await
        .unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    assert!(err.is_retryable());
    client.contexts().create(&create_req("x")).await.unwrap();
}

#[tokio::test]
async fn unknown_paths_answer_404_with_the_error_envelope() {
    let server = LocalNexus::start().await.unwrap();
    let client = server.client().unwrap();
    let project = client.api().get_project().await.unwrap().into_inner();
    assert_eq!(project.id, "local");
    let unknown = reqwest::get(format!("{}/no/such/thing", server.base_url()))
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let _: types::Error = unknown.json().await.unwrap();
}

#[tokio::test]
async fn the_data_directory_keeps_state_across_restarts() {
    let data = TempDir::new("data");
    let dir = corpus();
    let (session_id, query_id) = {
        let server = LocalNexus::builder()
            .data_dir(data.path())
            .context("docs", dir.path())
            .start()
            .await
            .unwrap();
        let client = server.client().unwrap();
        client
            .contexts()
            .create(&create_req("empty"))
            .await
            .unwrap();
        let q = client
            .api()
            .query(&request(json!({"ask": "green tea", "scope": ["docs"]})))
            .await
            .unwrap()
            .into_inner();
        server.shutdown().await;
        (q.session_id, q.id)
    };
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let slugs: Vec<_> = client
        .contexts()
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.slug.clone(), c.is_queryable()))
        .collect();
    assert!(slugs.contains(&("docs".to_string(), true)));
    assert!(slugs.contains(&("empty".to_string(), false)));
    let old = client.queries().get(&query_id).await.unwrap();
    assert!(old.answer_text().contains("two minutes"));
    let next = client
        .api()
        .query(&request(
            json!({"ask": "black tea", "session_id": session_id}),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(next.answer_text().contains("four minutes"));
    assert_eq!(next.previous_query_id.as_deref(), Some(query_id.as_str()));
    assert!(client.sources("docs").read("notes.txt").await.is_ok());
}

#[test]
fn the_binary_prints_its_url_and_serves_the_given_contexts() {
    let dir = corpus();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nexus-local"))
        .args(["--bind", "127.0.0.1:0", "--context"])
        .arg(format!("docs={}", dir.path().display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().to_owned();
    let result = std::panic::catch_unwind(|| {
        assert!(
            url.starts_with("http://127.0.0.1:") && url.ends_with("/api"),
            "{url}"
        );
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let client = Client::builder().base_url(&url).build().unwrap();
            let q = client
                .api()
                .query(&request(json!({"ask": "lighthouse", "scope": ["docs"]})))
                .await
                .unwrap()
                .into_inner();
            assert!(q.answer_text().contains("42 ships"));
        });
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
