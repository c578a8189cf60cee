//! Deleting a context while its curation runs removes all of its files:
//! the deletion waits for the context's jobs to stop before it removes
//! them, so no job writes after them.

use std::time::Duration;

use nexus_knowql::local::LocalNexus;
use nexus_knowql::types;

use crate::support::local::*;

/// Tries of create, import, curate, delete.
const TRIES: usize = 20;

/// Files enough that a curation takes a while in a debug build.
fn big_corpus() -> TempDir {
    let dir = TempDir::new("delete-corpus");
    for i in 0..40 {
        let mut text = format!("# Note {i}\n\n");
        for j in 0..60 {
            text.push_str(&format!(
                "Paragraph {j} of note {i} tells of lighthouse {i} and ship {j}.\n\n"
            ));
        }
        dir.write(&format!("notes/n{i}.md"), &text);
    }
    dir
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Catches a deletion that removes a context's files while its curation
/// still writes (the wait on the context's jobs removed): the index the
/// curation was building lands in a directory of a context that no longer
/// exists. Every try leaves nothing, at once and after the jobs end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_context_during_its_curation_leaves_no_files() {
    let corpus = big_corpus();
    let data = TempDir::new("delete-data");
    let server = LocalNexus::builder()
        .data_dir(data.path())
        .chunk_chars(200)
        .start()
        .await
        .unwrap();
    let client = server.client().unwrap();
    let contexts = data.path().join("contexts");
    let mut left = Vec::new();
    for i in 0..TRIES {
        let slug = format!("d{i}");
        let req: types::CreateContextRequest =
            serde_json::from_value(serde_json::json!({"slug": slug, "name": slug})).unwrap();
        let id = client.contexts().create(&req).await.unwrap().id;
        client
            .sources(&slug)
            .import_dir(corpus.path(), |_| {})
            .await
            .unwrap();
        let task_id = client
            .contexts()
            .curate(&slug, &Default::default())
            .await
            .unwrap()
            .task_id;
        // Into the curation by a varying amount: once it reached phase 0, 1
        // or 2 (reading, chunking, indexing), or ended.
        let phase = (i % 3) as i64;
        let reached = async || {
            let task = client.tasks().get(&task_id).await.unwrap();
            task.is_terminal() || task.progress.is_some_and(|p| p.phase >= phase)
        };
        let what = format!("the curation reaching phase {phase}");
        crate::support::wait::until(Duration::from_secs(60), &what, reached).await;
        client.contexts().delete(&slug).await.unwrap();
        if contexts.join(&id).exists() {
            left.push(format!("try {i}: {:?}", entries(&contexts.join(&id))));
        }
    }
    // Nothing appears later either: once the server has stopped, every
    // job it ran has ended (no sleep standing in for that).
    server.shutdown().await;
    let later = entries(&contexts);
    assert!(
        left.is_empty() && later.is_empty(),
        "files left: {left:?}; later: {later:?}"
    );
}
