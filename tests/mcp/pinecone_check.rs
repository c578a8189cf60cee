//! Probing the configured Pinecone indexes before serving: the server's
//! `check_indexes` and `nexus-mcp --check-indexes`, against the Pinecone fake.

use std::time::Duration;

use crate::support::pinecone_fake::{self, KEY_A, PineconeFake};
use nexus_knowql::mcp::pinecone::PineconeServer;

#[tokio::test]
async fn check_indexes_probes_dense_and_sparse_indexes() {
    let fake = PineconeFake::start().await;
    let server = PineconeServer::new(fake.config()).unwrap();
    assert_eq!(
        server.check_indexes().await.unwrap(),
        "dense index \"kb\" and sparse index \"kb-sparse\" reachable."
    );
    fake.fail("stats:kb-sparse", 404, 1);
    let errors = server.check_indexes().await.unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0]
            .starts_with("Sparse index \"kb-sparse\": describeIndexStats failed with HTTP 404"),
        "{errors:?}"
    );
    assert!(!errors[0].contains(KEY_A));
    let multi = PineconeServer::new(fake.multi_config()).unwrap();
    assert_eq!(
        multi.check_indexes().await.unwrap(),
        "all 2 source(s) reachable."
    );
}

/// Runs `nexus-mcp --check-indexes` with only `env` set; returns (exit
/// code, stderr lines, stdout).
async fn check_indexes(env: &[(&str, &str)]) -> (i32, Vec<String>, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_nexus-mcp"));
    cmd.env_clear()
        .arg("--check-indexes")
        .env("RUST_LOG", "off")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("--check-indexes exits by itself")
        .expect("nexus-mcp runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    (
        out.status.code().unwrap_or(-1),
        stderr.lines().map(str::to_owned).collect(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
async fn check_indexes_exits_0_when_every_index_answers() {
    let fake = PineconeFake::start().await;
    let (code, lines, stdout) = check_indexes(&[
        ("PINECONE_API_KEY", KEY_A),
        ("PINECONE_INDEX_NAME", "kb"),
        ("PINECONE_CONTROLLER_HOST", &fake.url),
    ])
    .await;
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(
        lines,
        [
            "--check-indexes: Dense index \"kb\": reachable (3 namespaces)",
            "--check-indexes: Sparse index \"kb-sparse\": reachable (3 namespaces)",
        ]
    );
    assert!(stdout.is_empty(), "nothing is served: {stdout}");
    assert_eq!(fake.count("stats:kb"), 1);
    assert_eq!(fake.count("stats:kb-sparse"), 1);
    assert_eq!(fake.count("search:kb"), 0);

    // Every source of a multi-source configuration, each line tagged.
    let sources = format!("src_a:{KEY_A}:kb;src_b:{}:kb2", pinecone_fake::KEY_B);
    let (code, lines, _) = check_indexes(&[
        ("PINECONE_SOURCES", &sources),
        ("PINECONE_CONTROLLER_HOST", &fake.url),
    ])
    .await;
    assert_eq!(code, 0, "{lines:?}");
    assert_eq!(lines.len(), 4, "{lines:?}");
    for (line, prefix) in lines.iter().zip([
        "--check-indexes: [src_a] Dense index \"kb\": reachable",
        "--check-indexes: [src_a] Sparse index \"kb-sparse\": reachable",
        "--check-indexes: [src_b] Dense index \"kb2\": reachable",
        "--check-indexes: [src_b] Sparse index \"kb2-sparse\": reachable",
    ]) {
        assert!(line.starts_with(prefix), "{line}");
    }
}

#[tokio::test]
async fn check_indexes_exits_1_when_an_index_does_not_answer_without_retrying() {
    let fake = PineconeFake::start().await;
    // 503 is retryable for tool calls; the probe still tries once only.
    fake.fail("stats:kb-sparse", 503, 5);
    let (code, lines, stdout) = check_indexes(&[
        ("PINECONE_API_KEY", KEY_A),
        ("PINECONE_INDEX_NAME", "kb"),
        ("PINECONE_CONTROLLER_HOST", &fake.url),
    ])
    .await;
    assert_eq!(code, 1, "{lines:?}");
    assert!(stdout.is_empty());
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].ends_with("\"kb\": reachable (3 namespaces)"),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with(
            "--check-indexes: Sparse index \"kb-sparse\": describeIndexStats failed with HTTP 503"
        ),
        "{lines:?}"
    );
    assert!(
        !lines.join("\n").contains(KEY_A),
        "the key is redacted: {lines:?}"
    );
    assert_eq!(fake.count("stats:kb-sparse"), 1, "no retries");

    // A refused key.
    let (code, lines, _) = check_indexes(&[
        ("PINECONE_API_KEY", "pcsk_wrong_key_0123456789"),
        ("PINECONE_INDEX_NAME", "kb"),
        ("PINECONE_CONTROLLER_HOST", &fake.url),
    ])
    .await;
    assert_eq!(code, 1, "{lines:?}");
    assert_eq!(lines.len(), 2, "{lines:?}");

    // Nothing to probe is an error too.
    let (code, lines, _) = check_indexes(&[("NEXUS_BASE_URL", "http://127.0.0.1:9/api")]).await;
    assert_eq!(code, 1, "{lines:?}");
}
