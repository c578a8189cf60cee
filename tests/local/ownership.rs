//! The data directory is the server's own: a folder it did not make is
//! refused untouched, start-up repairs set user-visible files aside instead
//! of deleting them; and acknowledgements that must be true: a cancel
//! answers only an end on disk, an evicted turn is gone everywhere.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::support::local::*;
use crate::support::wait::until_some;
use nexus_knowql::local::{LocalNexus, StartError};
use serde_json::json;

/// Every entry below `dir` (relative path) with its bytes (`None` for a
/// directory) and, on Unix, its mode.
fn snapshot(dir: &Path) -> BTreeMap<String, (Option<Vec<u8>>, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let meta = std::fs::metadata(&p).unwrap();
            let mode = mode_of(&meta);
            if meta.is_dir() {
                out.insert(rel, (None, mode));
                stack.push(p);
            } else {
                out.insert(rel, (Some(std::fs::read(&p).unwrap()), mode));
            }
        }
    }
    out.insert(
        ".".to_owned(),
        (None, mode_of(&std::fs::metadata(dir).unwrap())),
    );
    out
}

#[cfg(unix)]
fn mode_of(meta: &std::fs::Metadata) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&meta.permissions())
}

#[cfg(not(unix))]
fn mode_of(_: &std::fs::Metadata) -> u32 {
    0
}

/// A project folder given as `--data` used to be chmodded and have its
/// `contexts/` and `staging/` folders swept.
#[tokio::test]
async fn a_foreign_folder_is_refused_and_left_byte_for_byte_intact() {
    let dir = TempDir::new("foreign");
    dir.write("README.md", "# My project\n");
    dir.write("contexts/notes/a.md", "my notes\n");
    dir.write("staging/draft.txt", "a draft\n");
    #[cfg(unix)]
    std::fs::set_permissions(
        dir.path(),
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .unwrap();
    let before = snapshot(dir.path());
    let err = LocalNexus::builder()
        .data_dir(dir.path())
        .start()
        .await
        .expect_err("a folder with foreign files was taken as a data directory");
    assert!(matches!(err, StartError::DataDirForeign { .. }), "{err:?}");
    assert!(err.to_string().contains("README.md"), "{err}");
    assert_eq!(snapshot(dir.path()), before, "the folder changed");
}

/// A new directory and an empty one are taken (and marked); the marked
/// directory is taken again after a restart.
#[tokio::test]
async fn new_and_empty_directories_are_taken_and_kept() {
    let parent = TempDir::new("new-data");
    let new = parent.path().join("data");
    for dir in [new.as_path(), parent.path()] {
        let server = LocalNexus::builder().data_dir(dir).start().await.unwrap();
        server.shutdown().await;
        let again = LocalNexus::builder().data_dir(dir).start().await.unwrap();
        again.shutdown().await;
        assert!(dir.join(".nexus-local").is_file());
        // The parent is not empty any more (it holds `data`): foreign.
        if dir == new.as_path() {
            assert!(
                LocalNexus::builder()
                    .data_dir(parent.path())
                    .start()
                    .await
                    .is_err()
            );
            std::fs::remove_dir_all(&new).unwrap();
        }
    }
}

/// Every file below `dir` whose name is `name`, with its text.
fn find_named(dir: &Path, name: &str) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == name) {
                out.push((p.clone(), std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    out
}

/// Start-up used to delete a source file no row records and the folder
/// of a context that does not exist.
#[tokio::test]
async fn unrecorded_files_are_set_aside_in_quarantine_not_deleted() {
    let data = TempDir::new("quarantine");
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let req: nexus_knowql::types::CreateContextRequest =
        serde_json::from_value(json!({"slug": "keep", "name": "Keep"})).unwrap();
    let id = client.contexts().create(&req).await.unwrap().id;
    client
        .sources("keep")
        .upload_bytes("a.md", b"# A\n".to_vec(), None)
        .await
        .unwrap();
    server.shutdown().await;
    data.write(&format!("contexts/{id}/sources/stray.md"), "stray\n");
    data.write("contexts/ctx_unknown/sources/old.md", "old\n");
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .start()
        .await
        .unwrap();
    let (status, manifest) = get_json(&format!(
        "{}/contexts/keep/source/manifest",
        server.base_url()
    ))
    .await;
    assert_eq!(status, 200);
    let paths: Vec<&str> = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["uploads/a.md"]);
    server.shutdown().await;
    let quarantine = data.path().join("quarantine");
    assert_eq!(
        find_named(&quarantine, "stray.md")
            .into_iter()
            .map(|(_, t)| t)
            .collect::<Vec<_>>(),
        ["stray\n"]
    );
    assert_eq!(
        find_named(&quarantine, "old.md")
            .into_iter()
            .map(|(_, t)| t)
            .collect::<Vec<_>>(),
        ["old\n"]
    );
    assert!(!data.path().join("contexts/ctx_unknown").exists());
    assert!(
        !data
            .path()
            .join(format!("contexts/{id}/sources/stray.md"))
            .exists()
    );
}

/// Feedback on a turn forgotten past `--max-queries` used to put it back
/// (without its events), and forgotten turns were served from memory
/// until a restart.
#[tokio::test]
async fn an_evicted_turn_is_gone_at_once_and_feedback_does_not_bring_it_back() {
    let data = TempDir::new("evict");
    let (server, _client, _corpus) =
        seeded(LocalNexus::builder().data_dir(data.path()).query_limit(2)).await;
    let base = server.base_url().to_owned();
    let mut ids = Vec::new();
    for ask in ["tea?", "ships?", "resume?", "black tea?"] {
        let (status, q) = post_json(
            &format!("{base}/query"),
            json!({"ask": ask, "scope": ["docs"]}),
        )
        .await;
        assert_eq!(status, 200, "{q}");
        ids.push(q["id"].as_str().unwrap().to_owned());
    }
    for id in &ids[..2] {
        let (status, _) = get_json(&format!("{base}/queries/{id}")).await;
        assert_eq!(status, 404, "an evicted turn was served: {id}");
        let (status, _) = post_json(
            &format!("{base}/queries/{id}/feedback"),
            json!({"rating": "up"}),
        )
        .await;
        assert_eq!(status, 404, "feedback on an evicted turn was accepted");
    }
    for id in &ids[2..] {
        assert_eq!(get_json(&format!("{base}/queries/{id}")).await.0, 200);
    }
    server.shutdown().await;
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .query_limit(2)
        .start()
        .await
        .unwrap();
    let base = server.base_url().to_owned();
    for (i, id) in ids.iter().enumerate() {
        let want = if i < 2 { 404 } else { 200 };
        assert_eq!(
            get_json(&format!("{base}/queries/{id}")).await.0,
            want,
            "turn {i}"
        );
    }
    server.shutdown().await;
}

/// A cancel used to answer `cancelled` after its wait although the turn's
/// end was not on disk (the state database's write lock held by another
/// program here).
#[tokio::test]
async fn a_cancel_never_answers_an_end_that_is_not_saved() {
    let data = TempDir::new("cancel");
    let (server, _client, _corpus) = seeded(
        LocalNexus::builder()
            .data_dir(data.path())
            .frame_delay(Duration::from_millis(200)),
    )
    .await;
    let base = server.base_url().to_owned();
    let (status, q) = post_json(
        &format!("{base}/query"),
        json!({"ask": "How long does tea steep?", "scope": ["docs"], "background": true}),
    )
    .await;
    assert_eq!(status, 202, "{q}");
    let id = q["id"].as_str().unwrap().to_owned();
    let db = rusqlite::Connection::open(data.path().join("state.db")).unwrap();
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (status, body) = post_json(&format!("{base}/queries/{id}/cancel"), json!({})).await;
    assert_eq!(
        status, 503,
        "answered {body} while the end could not be saved"
    );
    assert_eq!(body["code"], "cancel_pending", "{body}");
    db.execute_batch("ROLLBACK").unwrap();
    drop(db);
    // Once written, the cancel answers the saved end.
    let body = until_some(Duration::from_secs(60), "the cancel ending", async || {
        let (status, body) = post_json(&format!("{base}/queries/{id}/cancel"), json!({})).await;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(body["status"], "cancelled", "{body}");
    server.shutdown().await;
}
