//! `nexus-local verify` after a crash: what the next start repairs by
//! design is a note (exit 0), and that start does repair it.

use crate::support::local::*;
use serde_json::json;

/// `nexus-local verify --data dir`: whether it exited 0, and its output.
fn verify(dir: &str) -> (bool, String) {
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

/// Catches `verify` failing on normal crash leftovers: the directory of a
/// context whose delete was saved, an index generation no longer in use
/// and a source file whose delete was saved but not yet carried out (a
/// crash between saving a removal and removing the file leaves each) are
/// notes, and it exits 0; the next start removes them, and `verify` still
/// passes.
#[tokio::test]
async fn verify_passes_on_what_the_next_start_repairs() {
    let data = TempDir::new("verify-leftovers");
    let dir = data.path().to_str().unwrap().to_owned();
    let server = LocalBinary::start(&["--data", &dir], &[]);
    let base = server.url.clone();
    let (status, body) = post_json(
        &format!("{base}/contexts"),
        json!({"slug": "kept", "name": "kept"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(b"# Kept\n".to_vec()).file_name("kept.md"),
    );
    let resp = http()
        .post(format!("{base}/contexts/kept/import/upload"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    server.kill();
    let (ok, report) = verify(&dir);
    assert!(ok, "a clean directory passes: {report}");

    let contexts = data.path().join("contexts");
    let kept = std::fs::read_dir(&contexts)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("sources/uploads/kept.md").is_file())
        .unwrap();
    let gone_context = contexts.join("ctx_00000000000000000000");
    std::fs::create_dir_all(gone_context.join("sources")).unwrap();
    std::fs::write(gone_context.join("sources/old.md"), "# Old\n").unwrap();
    let unused_generation = kept.join("chunks-99.json");
    std::fs::write(&unused_generation, "[]").unwrap();
    let unrecorded = kept.join("sources/uploads/removed.md");
    std::fs::write(&unrecorded, "# Removed\n").unwrap();

    let (ok, report) = verify(&dir);
    assert!(ok, "leftovers the next start repairs exit 0: {report}");
    for named in ["ctx_00000000000000000000", "chunks-99.json", "removed.md"] {
        assert!(
            report
                .lines()
                .any(|l| l.starts_with("note: ") && l.contains(named)),
            "{named} is reported as a note: {report}"
        );
    }

    let server = LocalBinary::start(&["--data", &dir], &[]);
    let (status, _) = get_json(&format!(
        "{}/contexts/kept/source/read/uploads/kept.md",
        server.url
    ))
    .await;
    assert_eq!(status, 200);
    server.kill();
    assert!(
        !gone_context.exists(),
        "the next start removed the old context's files"
    );
    assert!(
        !unused_generation.exists(),
        "and the unused index generation"
    );
    assert!(!unrecorded.exists(), "and the unrecorded source file");
    let (ok, report) = verify(&dir);
    assert!(ok, "{report}");
}
