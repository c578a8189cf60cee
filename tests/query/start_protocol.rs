//! A restart recognises the turn its job started by the whole fingerprint
//! of the request (ask, scope, system prompt, workflow), not by the
//! question alone; when no session shows it, the caller's policy decides.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::support::sse_server;
use nexus_knowql::query::{
    CheckpointRecord, CheckpointStore, FileCheckpointStore, IfNotFound, StartProtocol,
};
use nexus_knowql::{CheckpointedTurn, Error, error::CheckpointError};
use sse_server::{Reply, SseServer, query_json};

const QUESTION: &str = "Who approves travel?";

/// Job B's session: context `ctx-b`, the same question, completed.
fn session_b(created_at: &str) -> serde_json::Value {
    let mut first = query_json("q_b", "ses_b", "completed", "The manager approves.");
    first["input"] = serde_json::json!([{"role": "user", "content": QUESTION}]);
    serde_json::json!({
        "id": "ses_b", "created_at": created_at, "updated_at": created_at,
        "created_by": "worker", "project_id": "p_1", "models": ["nexus-large"],
        "scope": ["ctx-b"], "tools": [], "last_query_id": "q_b", "queries": [first],
    })
}

/// A server where job A's `POST /query` is refused, and job B (the same
/// question over `ctx-b`) has completed its turn in a new session by the
/// time A restarts.
async fn server() -> SseServer {
    let b_started = Arc::new(AtomicBool::new(false));
    let created = chrono::Utc::now().to_rfc3339();
    SseServer::start(move |req, _| {
        let path = req.path.split('?').next().unwrap_or_default();
        let session = session_b(&created);
        match (req.method.as_str(), path) {
            ("POST", "/query") => {
                b_started.store(true, Ordering::SeqCst);
                Reply::json(400, &[], &serde_json::json!({"message": "refused"}))
            }
            ("GET", "/sessions") if b_started.load(Ordering::SeqCst) => {
                let mut listed = session.clone();
                if let Some(fields) = listed.as_object_mut() {
                    fields.remove("queries");
                }
                Reply::json(200, &[], &serde_json::json!({"sessions": [listed]}))
            }
            ("GET", "/sessions") => Reply::json(200, &[], &serde_json::json!({"sessions": []})),
            ("GET", "/sessions/ses_b") => Reply::json(200, &[], &session),
            _ => Reply::json(404, &[], &serde_json::json!({"message": "not scripted"})),
        }
    })
    .await
}

/// Job A (over `ctx-a`) records its intent, and its `POST /query` fails:
/// the key is left `Starting`.
async fn job_a_dies_starting(
    server: &SseServer,
    store: &FileCheckpointStore,
) -> nexus_knowql::TurnBuilder {
    let client = server.client();
    let ask = || client.session(["ctx-a"]).build().unwrap().ask(QUESTION);
    let e = CheckpointedTurn::start_or_resume(&client, store, "job-a", ask()).await;
    assert!(e.is_err(), "the scripted POST is refused");
    assert!(matches!(
        store.load("job-a").unwrap(),
        Some(CheckpointRecord::Starting(_))
    ));
    ask()
}

#[tokio::test]
async fn a_job_never_adopts_another_contexts_turn_with_the_same_question() {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let ask = job_a_dies_starting(&server, &store).await;

    let protocol = StartProtocol::default().admission_horizon(Duration::ZERO);
    let client = server.client();
    let restarted =
        CheckpointedTurn::start_or_resume_with(&client, &store, "job-a", ask, &protocol).await;
    let Err(e) = restarted else {
        panic!("job A must not adopt job B's turn");
    };
    assert!(e.to_string().contains("\"job-a\""), "{e}");
    match e {
        Error::Checkpoint(CheckpointError::NotStarted { key, examined, .. }) => {
            assert_eq!(key, "job-a");
            assert_eq!(examined, 1, "job B's session was looked at");
        }
        other => panic!("expected NotStarted, got {other:?}"),
    }
    assert_eq!(
        server.count("POST", "/query"),
        1,
        "at most once: nothing posted"
    );
    assert!(!server.requests().iter().any(|r| r.path.contains("q_b")));
}

#[tokio::test]
async fn at_least_once_posts_again_when_the_turn_is_not_found() {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let ask = job_a_dies_starting(&server, &store).await;

    let protocol = StartProtocol::default()
        .admission_horizon(Duration::ZERO)
        .if_not_found(IfNotFound::AtLeastOnce);
    let client = server.client();
    let again =
        CheckpointedTurn::start_or_resume_with(&client, &store, "job-a", ask, &protocol).await;
    assert!(again.is_err(), "the scripted POST is refused again");
    assert_eq!(
        server.count("POST", "/query"),
        2,
        "at least once: posted again"
    );
}

/// The restart keeps looking until the horizon has passed since the intent:
/// a turn that appears in the listing late is still found.
#[tokio::test]
async fn a_restart_looks_until_the_horizon_has_passed() {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    let store = FileCheckpointStore::new(dir.path()).unwrap();
    let ask = job_a_dies_starting(&server, &store).await;
    let protocol = StartProtocol::default().admission_horizon(Duration::from_millis(1200));
    let client = server.client();
    let started = tokio::time::Instant::now();
    let e = CheckpointedTurn::start_or_resume_with(&client, &store, "job-a", ask, &protocol).await;
    assert!(matches!(
        e.err(),
        Some(Error::Checkpoint(CheckpointError::NotStarted { .. }))
    ));
    assert!(
        server.count("GET", "/sessions/ses_b") >= 2,
        "looked more than once within the horizon"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "the wait ends");
}
