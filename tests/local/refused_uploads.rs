//! A staged upload belongs to its request until its import commits: every
//! refusal and every request that goes away removes what it staged, so a
//! client retrying refused uploads never fills the disk.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::local::*;
use nexus_knowql::local::LocalNexus;

async fn upload(base: &str, slug: &str, name: &str, dir: Option<&str>, text: &str) -> (u16, Value) {
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(text.as_bytes().to_vec()).file_name(name.to_owned()),
    );
    let mut url = format!("{base}/contexts/{slug}/import/upload");
    if let Some(dir) = dir {
        url.push_str(&format!("?path={dir}"));
    }
    let resp = http().post(url).multipart(form).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Creates the context `docs`.
async fn create_docs(base: &str) {
    let (status, body) = post_json(
        &format!("{base}/contexts"),
        json!({"slug": "docs", "name": "Docs"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// The entries of `dir` (none when it does not exist).
fn entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (at most 10 s) for `staging/` to be empty; what it still holds.
async fn staging_left(data: &std::path::Path) -> Vec<String> {
    let staging = data.join("staging");
    let empty = async || entries(&staging).is_empty().then_some(());
    crate::support::wait::found_within(Duration::from_secs(10), empty).await;
    entries(&staging)
}

/// Reproduction: an upload refused after staging (the context's byte limit,
/// 413; a path clash, 409) kept its staged copy in `staging/` until the
/// next restart.
#[tokio::test]
async fn refused_uploads_leave_staging_empty() {
    let tmp = TempDir::new("refused-uploads");
    let data = tmp.path().join("data");
    let server = LocalNexus::builder()
        .data_dir(&data)
        .context_bytes_limit(100)
        .start()
        .await
        .unwrap();
    let base = server.base_url().to_owned();
    create_docs(&base).await;
    let (status, body) = upload(&base, "docs", "a.md", None, &"a".repeat(60)).await;
    assert_eq!(status, 200, "{body}");
    for round in 0..5 {
        // Fits alone, not beside a.md: the context's limit.
        let (status, body) = upload(&base, "docs", "b.md", None, &"b".repeat(60)).await;
        assert_eq!(status, 413, "round {round}: {body}");
        // Below the file uploads/a.md: a clash.
        let (status, body) = upload(&base, "docs", "c.md", Some("uploads/a.md"), "c").await;
        assert_eq!(status, 409, "round {round}: {body}");
    }
    assert_eq!(staging_left(&data).await, Vec::<String>::new());
    server.shutdown().await;
}

/// Reproduction: uploads to one context while an import ran there got 409,
/// which the SDK does not retry. They queue behind it now (and an upload
/// shed as busy is sent again by the SDK): every one of eight concurrent
/// clients' uploads lands.
#[tokio::test]
async fn concurrent_uploads_to_one_context_all_land() {
    let tmp = TempDir::new("concurrent-uploads");
    // Each import's task stays open a moment after it answers, so the
    // uploads overlap the import before them.
    let server = LocalNexus::builder()
        .data_dir(tmp.path().join("data"))
        .frame_delay(Duration::from_millis(150))
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let base = server.base_url().to_owned();
    create_docs(&base).await;
    let uploads = (0..8).map(|c| {
        let client = client.clone();
        async move {
            for n in 0..3 {
                let name = format!("c{c}-{n}.md");
                client
                    .sources("docs")
                    .upload_bytes(&name, format!("# {name}\n"), None)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    });
    futures::future::join_all(uploads).await;
    let (status, listing) = get_json(&format!("{base}/contexts/docs/source/list/uploads")).await;
    assert_eq!(status, 200, "{listing}");
    assert_eq!(listing["total"], 24, "{listing}");
    server.shutdown().await;
}

/// The files under `dir`, at any depth, named `name`.
fn found_file(dir: &std::path::Path, name: &str) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let path = e.path();
            e.file_name() == name || (path.is_dir() && found_file(&path, name))
        })
}

/// Reproduction: an import whose context was deleted after its files moved
/// answered 409 and kept its staging directory, marked for the next start
/// before the move, until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_whose_context_is_deleted_leaves_staging_empty() {
    let tmp = TempDir::new("import-context-deleted");
    let data = tmp.path().join("data");
    // The import waits 1.5 s between its files moving and their record.
    let server = LocalNexus::builder()
        .data_dir(&data)
        .frame_delay(Duration::from_millis(1500))
        .start()
        .await
        .unwrap();
    let base = server.base_url().to_owned();
    create_docs(&base).await;
    let uploaded = tokio::spawn({
        let base = base.clone();
        async move { upload(&base, "docs", "moved.md", None, "# moved\n").await }
    });
    let contexts = data.join("contexts");
    crate::support::wait::until(Duration::from_secs(30), "the file moves", async || {
        found_file(&contexts, "moved.md")
    })
    .await;
    let deleted = http()
        .delete(format!("{base}/contexts/docs"))
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    let (status, body) = uploaded.await.unwrap();
    assert_eq!(status, 409, "{body}");
    assert_eq!(staging_left(&data).await, Vec::<String>::new());
    server.shutdown().await;
}

/// Reproduction: an upload whose client went away while its staging
/// directory was being made left that directory behind (the request's
/// owner removed it before the blocking task made it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_abandoned_at_any_instant_leave_staging_empty() {
    let tmp = TempDir::new("abandoned-uploads");
    let data = tmp.path().join("data");
    let server = LocalNexus::builder().data_dir(&data).start().await.unwrap();
    let base = server.base_url().to_owned();
    create_docs(&base).await;
    let mut served = 0;
    for n in 0..300u64 {
        // Given up after 0-2.9 ms: some before staging, some during it,
        // some after the answer.
        let wait = Duration::from_micros(n % 30 * 100);
        let name = format!("f{n}.md");
        let sent = upload(&base, "docs", &name, None, "# abandoned\n");
        if tokio::time::timeout(wait, sent).await.is_ok() {
            served += 1;
        }
    }
    assert_eq!(
        staging_left(&data).await,
        Vec::<String>::new(),
        "{served} answered"
    );
    server.shutdown().await;
}

/// Reproduction: a fork whose client went away after its sources were
/// copied aside, before they moved into place, left the copy in
/// `staging/` until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_abandoned_at_any_instant_leave_staging_empty() {
    let tmp = TempDir::new("abandoned-forks");
    let data = tmp.path().join("data");
    let server = LocalNexus::builder().data_dir(&data).start().await.unwrap();
    let base = server.base_url().to_owned();
    create_docs(&base).await;
    for n in 0..8 {
        let (status, body) = upload(&base, "docs", &format!("f{n}.md"), None, "# f\n").await;
        assert_eq!(status, 200, "{body}");
    }
    let mut served = 0;
    for n in 0..200u64 {
        // Given up after 0-9.5 ms: during the copy, the mark, the move or
        // after the answer.
        let wait = Duration::from_micros(n % 20 * 500);
        let url = format!("{base}/contexts/docs/fork");
        let sent = post_json(&url, json!({"target_slug": format!("fork-{n}")}));
        if tokio::time::timeout(wait, sent).await.is_ok() {
            served += 1;
        }
    }
    assert_eq!(
        staging_left(&data).await,
        Vec::<String>::new(),
        "{served} answered"
    );
    server.shutdown().await;
}
