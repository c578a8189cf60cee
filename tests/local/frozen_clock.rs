//! Ids never repeat when the clock does: a `nexus-local` whose clock stands
//! still (`NEXUS_LOCAL_FAULT_FROZEN_CLOCK_MS`, as under `faketime` or on a
//! device without a real-time clock) is restarted on its data directory and
//! makes new records, which never take the place of acknowledged ones.

use serde_json::{Value, json};

use crate::support::local::*;

const FROZEN: (&str, &str) = ("NEXUS_LOCAL_FAULT_FROZEN_CLOCK_MS", "1700000000000");

async fn create_context(base: &str, slug: &str) -> String {
    let (status, body) = post_json(
        &format!("{base}/contexts"),
        json!({"slug": slug, "name": slug}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["id"].as_str().unwrap().to_owned()
}

async fn upload(base: &str, slug: &str, name: &str, text: &str) -> Value {
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
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// Reproduction: ids were the clock's milliseconds and a counter from 0 in
/// each process, written with `INSERT OR REPLACE`, so `scratch` made after
/// a restart took `docs`' id and replaced it (and its import task).
#[tokio::test]
async fn a_restart_with_a_frozen_clock_replaces_nothing() {
    let data = TempDir::new("frozen-clock");
    let dir = data.path().join("data");
    let dir = dir.to_str().unwrap();
    let server = LocalBinary::start(&["--data", dir], &[FROZEN]);
    let docs = create_context(&server.url, "docs").await;
    let task = upload(&server.url, "docs", "a.md", "# A\n\nkept\n").await["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    server.kill();

    let server = LocalBinary::start(&["--data", dir], &[FROZEN]);
    let scratch = create_context(&server.url, "scratch").await;
    let second = upload(&server.url, "scratch", "b.md", "# B\n\nnew\n").await["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(scratch, docs);
    assert_ne!(second, task);
    server.kill();

    // What the first process acknowledged is all there after another start.
    let server = LocalBinary::start(&["--data", dir], &[FROZEN]);
    let (status, ctx) = get_json(&format!("{}/contexts/docs", server.url)).await;
    assert_eq!(status, 200, "{ctx}");
    assert_eq!(ctx["id"], docs.as_str());
    let resp = http()
        .get(format!(
            "{}/contexts/docs/source/read/uploads/a.md",
            server.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "# A\n\nkept\n");
    let (status, t) = get_json(&format!("{}/tasks/{task}", server.url)).await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["context_id"], docs.as_str());
    let (status, ctx) = get_json(&format!("{}/contexts/scratch", server.url)).await;
    assert_eq!((status, ctx["id"].as_str()), (200, Some(scratch.as_str())));
    server.kill();
}
