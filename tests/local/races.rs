//! Operations that race keep what they acknowledged, reproduced with a
//! failpoint that holds the race's window open: an upload of a path whose
//! deletion is still removing its file, and a SIGKILL right after an
//! import is answered.

use serde_json::{Value, json};

use crate::support::local::*;

/// Uploads `text` as `name` into `slug`: the status and the answer.
async fn upload(base: &str, slug: &str, name: &str, text: &str) -> (u16, Value) {
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(text.as_bytes().to_vec()).file_name(name.to_owned()),
    );
    let resp = http()
        .post(format!("{base}/contexts/{slug}/import/upload"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The status and text of a source.
async fn read(base: &str, slug: &str, path: &str) -> (u16, String) {
    let resp = http()
        .get(format!("{base}/contexts/{slug}/source/read/{path}"))
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn create_context(base: &str, slug: &str) {
    let (status, body) = post_json(
        &format!("{base}/contexts"),
        json!({"slug": slug, "name": slug}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// Catches a deletion removing the file of an upload it raced: the
/// deletion saved the row's removal, then (held 3 s here by a failpoint)
/// deleted the file; an upload of the same path in between was answered
/// 200 and its file was deleted under it. An acknowledged upload is read
/// back with its own text, before and after a restart; one refused (409
/// while the deletion runs) leaves the path deleted.
#[test]
fn an_upload_racing_the_deletion_of_its_path_keeps_its_file() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let data = TempDir::new("delete-upload-race");
    let dir = data.path().to_str().unwrap().to_owned();
    let server = LocalBinary::start(
        &["--data", &dir],
        &[(
            nexus_knowql::local::ENV_FAILPOINTS,
            "source.remove=delay(3000)",
        )],
    );
    let base = server.url.clone();
    let (deleted, uploaded) = rt.block_on(async {
        create_context(&base, "race").await;
        let (status, body) = upload(&base, "race", "a.md", "# First\n").await;
        assert_eq!(status, 200, "{body}");
        let delete_base = base.clone();
        let delete = tokio::spawn(async move {
            http()
                .delete(format!(
                    "{delete_base}/contexts/race/source/delete/uploads/a.md"
                ))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        });
        // The signal: the row is gone (its removal is saved at once; the
        // file waits 3 s).
        let began = async || read(&base, "race", "uploads/a.md").await.0 == 404;
        let limit = std::time::Duration::from_secs(30);
        crate::support::wait::until(limit, "the deletion beginning", began).await;
        let uploaded = upload(&base, "race", "a.md", "# Second\n").await;
        (delete.await.unwrap(), uploaded)
    });
    assert_eq!(deleted, 200);
    let expect_read = |(status, text): (u16, String), when: &str| {
        if uploaded.0 == 200 {
            assert_eq!(
                (status, text.as_str()),
                (200, "# Second\n"),
                "acknowledged upload lost {when}"
            );
        } else {
            assert_eq!(uploaded.0, 409, "{:?}", uploaded.1);
            assert_eq!(status, 404, "deleted path served {when}: {text}");
        }
    };
    expect_read(rt.block_on(read(&base, "race", "uploads/a.md")), "at once");
    server.kill();
    let server = LocalBinary::start(&["--data", &dir], &[]);
    expect_read(
        rt.block_on(read(&server.url, "race", "uploads/a.md")),
        "after a restart",
    );
    server.kill();
}

/// Catches an import answered before its end is saved: killed right after
/// the 200 (every commit held 300 ms by a failpoint, so the end is still
/// on its way), the restarted server reported the task `failed`. An
/// import answered 200 is `completed` after the kill.
#[test]
fn an_import_answered_200_is_completed_after_a_kill() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let data = TempDir::new("import-answer-kill");
    let dir = data.path().to_str().unwrap().to_owned();
    let server = LocalBinary::start(
        &["--data", &dir],
        &[(nexus_knowql::local::ENV_FAILPOINTS, "db.commit=delay(300)")],
    );
    let base = server.url.clone();
    let (status, body) = rt.block_on(async {
        create_context(&base, "answer").await;
        upload(&base, "answer", "a.md", "# Answered\n").await
    });
    server.kill();
    assert_eq!(status, 200, "{body}");
    let task = body["task_id"].as_str().unwrap().to_owned();
    let server = LocalBinary::start(&["--data", &dir], &[]);
    let (status, got) = rt.block_on(get_json(&format!("{}/tasks/{task}", server.url)));
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["state"], "completed", "{got}");
    let (status, text) = rt.block_on(read(&server.url, "answer", "uploads/a.md"));
    assert_eq!((status, text.as_str()), (200, "# Answered\n"));
    server.kill();
}
