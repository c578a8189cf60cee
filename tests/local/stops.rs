//! A clean stop (SIGTERM) keeps the same promises as a crash: an import
//! stopped while it moves its files is whole after the next start, or its
//! task is not reported `completed`.

use std::path::Path;
use std::time::Duration;

use crate::support::local::*;
use crate::support::wait::until_blocking;
use serde_json::{Value, json};

/// Files in the archive of the stopped import.
const FILES: usize = 200;

fn text_of(i: usize) -> String {
    format!("# File {i}\n\nThe number of this file is {i}.\n")
}

fn archive() -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for i in 0..FILES {
        let text = text_of(i);
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, format!("bulk/f{i:03}.md"), text.as_bytes())
            .unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

/// Files below `dir` (recursively).
fn count_files(dir: &Path) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                n += 1;
            }
        }
    }
    n
}

/// Sends SIGTERM and waits for the process to end.
pub(crate) fn terminate(server: &mut LocalBinary, limit: Duration) {
    let pid = server.child.id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let stopped = || server.child.try_wait().unwrap().is_some();
    until_blocking(limit, "the server stopping on SIGTERM", stopped);
}

/// `nexus-local verify --data dir`: whether it found the directory
/// consistent, and its report.
pub(crate) fn verify(dir: &str) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nexus-local"))
        .args(["verify", "--data", dir])
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Used to end with 123 of 200 files and the task `completed`: the stop
/// removed the staging directory under the running move, and the next
/// start skipped what was missing.
#[test]
fn sigterm_mid_import_keeps_every_file_or_does_not_report_completed() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let data = TempDir::new("sigterm-import");
    let dir = data.path().to_str().unwrap().to_owned();
    let mut server = LocalBinary::start(
        &["--data", &dir],
        &[(nexus_knowql::local::ENV_FAILPOINTS, "file.move=delay(70)")],
    );
    let base = server.url.clone();
    let (status, ctx) = rt.block_on(post_json(
        &format!("{base}/contexts"),
        json!({"slug": "bulk", "name": "Bulk"}),
    ));
    assert_eq!(status, 200, "{ctx}");
    let id = ctx["id"].as_str().unwrap().to_owned();
    let upload_base = base.clone();
    let upload = rt.spawn(async move {
        let form = reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(archive()).file_name("bulk.tar.gz"),
        );
        http()
            .post(format!("{upload_base}/contexts/bulk/import/upload"))
            .multipart(form)
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    // Stop once the move is under way (some files are in place).
    let sources = data.path().join("contexts").join(&id).join("sources");
    let moving = || count_files(&sources) >= 10;
    until_blocking(Duration::from_secs(60), "the import moving files", moving);
    terminate(&mut server, Duration::from_secs(60));
    let _ = rt.block_on(upload);
    drop(server);
    let server = LocalBinary::start(&["--data", &dir], &[]);
    let base = server.url.clone();
    let (_, tasks) = rt.block_on(get_json(&format!("{base}/tasks")));
    let list = tasks["items"].as_array().cloned().unwrap_or_default();
    let import: Vec<&Value> = list.iter().filter(|t| t["workflow"] == "import").collect();
    assert_eq!(import.len(), 1, "{tasks}");
    let state = import[0]["state"].as_str().unwrap().to_owned();
    let (_, manifest) = rt.block_on(get_json(&format!("{base}/contexts/bulk/source/manifest")));
    let files = manifest["files"].as_array().cloned().unwrap_or_default();
    if state == "completed" {
        assert_eq!(
            files.len(),
            FILES,
            "task completed with {} files",
            files.len()
        );
        for i in (0..FILES).step_by(17) {
            let name = format!("f{i:03}.md");
            let path = files
                .iter()
                .filter_map(|f| f["path"].as_str())
                .find(|p| p.ends_with(&name))
                .unwrap_or_else(|| panic!("{name} is not listed"));
            let url = format!("{base}/contexts/bulk/source/read/{path}");
            let (status, text) = rt.block_on(async {
                let resp = http().get(url).send().await.unwrap();
                (resp.status().as_u16(), resp.text().await.unwrap())
            });
            assert_eq!(status, 200);
            assert_eq!(text, text_of(i));
        }
    }
    terminate(&mut { server }, Duration::from_secs(60));
    let (ok, report) = verify(&dir);
    assert!(ok, "verify found problems:\n{report}");
}
