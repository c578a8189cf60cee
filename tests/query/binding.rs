//! A turn is bound to the request that made it: every frame (named or
//! not), the final Query, the stored turn and the answer to cancel are
//! checked against one binding, and an identity that cannot be read is a
//! mismatch, never "no identity". The final Query answers this request:
//! its question is the one sent, and a turn the session already had is not
//! a new one.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::support::sse_server;
use crate::support::turns::{drain, text};
use nexus_knowql::{Client, Error, StreamConfig};
use sse_server::{Reply, SseServer, Step, Turn, frame, query_json};

const QA: &str = "qry_A";
const SA: &str = "ses_A";
const QB: &str = "qry_B";
const SB: &str = "ses_B";
const ASKED: &str = "Who approves travel?";

fn sse(body: String) -> Reply {
    Reply::sse(vec![Step::Write(body.into_bytes())])
}

/// A server whose `POST /query` answers `post(n)` the `n`th time and whose
/// stored turns are `stored(id)`.
async fn serve(
    post: impl Fn(usize) -> Reply + Send + Sync + 'static,
    stored: impl Fn(&str) -> Reply + Send + Sync + 'static,
) -> SseServer {
    let posts = AtomicUsize::new(0);
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            post(posts.fetch_add(1, Ordering::SeqCst))
        } else if let Some(id) = req.path.strip_prefix("/queries/") {
            stored(id.trim_end_matches("/cancel"))
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await
}

fn gone() -> Reply {
    Reply::json(410, &[], &serde_json::json!({"message": "gone"}))
}

fn quick() -> StreamConfig {
    StreamConfig::default()
        .reconnect_delay(
            std::time::Duration::from_millis(5),
            std::time::Duration::from_millis(50),
        )
        .reconnect_attempts(1)
        .final_query_wait(std::time::Duration::from_millis(200))
}

fn expect_mismatch(e: Option<Error>, kind: &str) {
    match e {
        Some(Error::TurnMismatch(m)) => assert_eq!(m.kind, kind, "{m:?}"),
        other => panic!("expected a {kind} mismatch, got {other:?}"),
    }
}

/// The frames of turn A up to its terminal event, then `tail`.
fn a_then(tail: &str) -> String {
    let a = Turn::completed(QA, SA, &["Travel ", "is approved."]);
    format!("{}{tail}", a.first(a.frames.len() - 1))
}

/// A frame without `event:` and `id:` whose data is another turn's Query
/// (`"type":"query"`) is the final frame and is checked as one, on every
/// way to run the turn.
#[tokio::test]
async fn an_unnamed_final_frame_of_another_turn_is_a_mismatch() {
    let mut other = query_json(QB, SB, "completed", "Travel is approved.");
    other["type"] = "query".into();
    let body = a_then(&format!("data: {other}\n\n"));
    let server = serve(move |_| sse(body.clone()), |_| gone()).await;
    let client = server.client();
    let session = client.session(["handbook"]).build().unwrap();
    let mut turn = session
        .ask(ASKED)
        .stream_config(quick())
        .stream()
        .await
        .unwrap();
    let (_, error) = drain(&mut turn).await;
    expect_mismatch(error, "query");
    let session = client.session(["handbook"]).build().unwrap();
    let sent = session.ask(ASKED).stream_config(quick()).send().await;
    expect_mismatch(sent.err(), "query");
}

/// A delta naming another turn is refused whatever else in the frame does
/// not parse: an identity that cannot be read is a mismatch, not "none".
#[tokio::test]
async fn a_delta_whose_identity_does_not_parse_is_a_mismatch() {
    let created = frame(
        Some(1),
        "response.created",
        &serde_json::json!({"query_id": QA, "session_id": SA}),
    );
    for data in [
        r#"{"query_id":"qry_B","delta":"FOREIGN","id":7}"#,
        r#"{"query_id":"qry_B","delta":"FOREIGN","session_id":7}"#,
        r#"{"query_id":"qry_A","query_id":"qry_B","delta":"FOREIGN"}"#,
        r#"{"query_id":"qry_B","delta":"FOREIGN","note":"\q"}"#,
    ] {
        let body = format!("{created}id: 2\nevent: response.output_text.delta\ndata: {data}\n\n");
        let server = serve(move |_| sse(body.clone()), |_| gone()).await;
        let session = server.client().session(["handbook"]).build().unwrap();
        let mut turn = session
            .ask(ASKED)
            .stream_config(quick())
            .stream()
            .await
            .unwrap();
        let (events, error) = drain(&mut turn).await;
        assert_eq!(text(&events), "", "{data}: nothing of it is delivered");
        expect_mismatch(error, "identity");
    }
}

/// A final Query that answers another question is not this turn's answer.
#[tokio::test]
async fn a_final_query_for_another_question_is_a_mismatch() {
    let mut q = query_json(QA, SA, "completed", "Travel is approved.");
    q["input"] = serde_json::json!([{"role": "user", "content": "SOMEONE ELSE'S QUESTION"}]);
    let body = a_then(&frame(None, "query", &q));
    let server = serve(move |_| sse(body.clone()), |_| gone()).await;
    let session = server.client().session(["handbook"]).build().unwrap();
    let sent = session.ask(ASKED).stream_config(quick()).send().await;
    expect_mismatch(sent.err(), "question");
}

/// A follow-up whose `POST /query` is answered with a replay of the
/// session's first turn does not print the old answer as the new one.
#[tokio::test]
async fn a_follow_up_answered_with_the_first_turn_is_a_mismatch() {
    let mut q = query_json(QA, SA, "completed", "Travel is approved.");
    q["input"] = serde_json::json!([{"role": "user", "content": ASKED}]);
    let body = a_then(&frame(None, "query", &q));
    let server = serve(move |_| sse(body.clone()), |_| gone()).await;
    let session = server.client().session(["handbook"]).build().unwrap();
    let first = session.ask(ASKED).stream_config(quick()).send().await;
    assert_eq!(first.unwrap().id, QA);
    let again = session
        .ask("And for contractors?")
        .stream_config(quick())
        .send()
        .await;
    expect_mismatch(again.err(), "query");
    assert_eq!(server.count("POST", "/query"), 2);
}

/// The answer to cancel, the attach result and `nexus query`'s read must
/// name the turn asked about.
#[tokio::test]
async fn cancel_and_attach_answers_of_another_turn_are_mismatches() {
    let server = serve(
        |_| Reply::json(500, &[], &serde_json::json!({"message": "boom"})),
        |_| Reply::json(200, &[], &query_json(QB, SB, "cancelled", "")),
    )
    .await;
    let client: Client = server.client();
    let attached = client.queries().attach(QA).await;
    expect_mismatch(attached.err(), "query");
}
