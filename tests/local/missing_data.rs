//! A start never discards acknowledged data: when the state database, a
//! context's `sources/` folder or a recorded source file is missing, the
//! start is refused with a message saying what is missing and how to
//! recover, nothing is set aside or forgotten, `verify` reports it, and a
//! start once it is back serves everything.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::support::local::*;
use nexus_knowql::local::{LocalNexus, StartError, verify_data_dir};

/// A data directory holding context `docs` with `uploads/a.md`; returns
/// the directory and the context's source folder.
async fn data_with_a_source(label: &str) -> (TempDir, PathBuf, PathBuf) {
    let tmp = TempDir::new(label);
    let data = tmp.path().join("data");
    let server = LocalNexus::builder().data_dir(&data).start().await.unwrap();
    let base = server.base_url().to_owned();
    let (status, ctx) = post_json(
        &format!("{base}/contexts"),
        json!({"slug": "docs", "name": "Docs"}),
    )
    .await;
    assert_eq!(status, 200, "{ctx}");
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(b"# A\n\nkept\n".to_vec()).file_name("a.md"),
    );
    let resp = http()
        .post(format!("{base}/contexts/docs/import/upload"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    server.shutdown().await;
    let sources = data
        .join("contexts")
        .join(ctx["id"].as_str().unwrap())
        .join("sources");
    assert!(sources.join("uploads/a.md").is_file());
    (tmp, data, sources)
}

/// The refusal of a start on `data`, as its message.
async fn refused(data: &Path) -> String {
    match LocalNexus::builder().data_dir(data).start().await {
        Err(e @ StartError::DataDirDamaged { .. }) => e.to_string(),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(server) => {
            server.shutdown().await;
            panic!("started on a data directory missing acknowledged data")
        }
    }
}

/// Starts on `data` and reads `docs/uploads/a.md`.
async fn serves_the_source(data: &Path) {
    let server = LocalNexus::builder().data_dir(data).start().await.unwrap();
    let resp = http()
        .get(format!(
            "{}/contexts/docs/source/read/uploads/a.md",
            server.base_url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "# A\n\nkept\n");
    server.shutdown().await;
}

fn no_quarantine(data: &Path) {
    assert!(
        !data.join("quarantine").exists(),
        "a start set data aside in quarantine/"
    );
}

/// Reproduction: a missing (or emptied) `state.db` with contexts' files
/// present started empty and moved every context into `quarantine/`, and
/// `verify` then found nothing wrong.
#[tokio::test]
async fn a_missing_or_empty_database_refuses_the_start_and_moves_nothing() {
    for empty in [false, true] {
        let (_tmp, data, sources) = data_with_a_source("missing-db").await;
        let db = data.join("state.db");
        let saved = data.join("state.db.saved");
        std::fs::rename(&db, &saved).unwrap();
        if empty {
            std::fs::write(&db, b"").unwrap();
        }
        let message = refused(&data).await;
        assert!(
            message.contains("state.db") && message.contains("backup"),
            "{message}"
        );
        assert!(
            sources.join("uploads/a.md").is_file(),
            "the source was moved"
        );
        no_quarantine(&data);
        let report = verify_data_dir(&data).unwrap();
        assert!(!report.is_clean(), "verify found nothing: {report}");
        // Restored, everything is there.
        std::fs::rename(&saved, &db).unwrap();
        serves_the_source(&data).await;
    }
}

/// Reproduction: a `sources/` folder missing for one start (a late mount)
/// dropped every source row, and a deleted source file's row was dropped
/// silently.
#[tokio::test]
async fn missing_sources_refuse_the_start_and_keep_their_rows() {
    let (_tmp, data, sources) = data_with_a_source("missing-sources").await;
    let aside = data.join("sources.unmounted");
    std::fs::rename(&sources, &aside).unwrap();
    let message = refused(&data).await;
    assert!(message.contains("docs/uploads/a.md"), "{message}");
    let report = verify_data_dir(&data).unwrap();
    assert!(!report.is_clean(), "verify found nothing: {report}");
    // The folder is back: nothing was forgotten, nothing set aside.
    std::fs::rename(&aside, &sources).unwrap();
    serves_the_source(&data).await;
    no_quarantine(&data);

    // One file deleted by hand.
    let kept = std::fs::read(sources.join("uploads/a.md")).unwrap();
    std::fs::remove_file(sources.join("uploads/a.md")).unwrap();
    let message = refused(&data).await;
    assert!(message.contains("docs/uploads/a.md"), "{message}");
    std::fs::write(sources.join("uploads/a.md"), kept).unwrap();
    serves_the_source(&data).await;
}

/// Reproduction: with the marker in place, a start deleted a file of
/// someone else's in `staging/` and changed the directory's mode.
#[cfg(unix)]
#[tokio::test]
async fn a_start_touches_only_what_the_server_made() {
    use std::os::unix::fs::PermissionsExt;
    let (_tmp, data, _) = data_with_a_source("foreign-staging").await;
    std::fs::create_dir_all(data.join("staging")).unwrap();
    std::fs::write(data.join("staging/notes.txt"), b"mine").unwrap();
    std::fs::create_dir_all(data.join("staging/0123456789abcdef/files")).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o750)).unwrap();
    serves_the_source(&data).await;
    assert_eq!(
        std::fs::read(data.join("staging/notes.txt")).unwrap(),
        b"mine"
    );
    assert!(
        !data.join("staging/0123456789abcdef").exists(),
        "a stale staged upload stayed"
    );
    let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o750);
}
