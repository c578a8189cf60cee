//! One turn is one turn: a turn ends in its own verified answer, never in
//! another turn's (events, final frame, stored document or polls naming
//! another turn or session), and every bound means the same on every path
//! (`send()`, `stream()`, `background()`). Each case is a scripted server
//! doing one thing wrong, or one standard thing the SDK once took for wrong.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::sse_server;
use crate::support::turns::{drain, text};
use nexus_knowql::{Client, Error, QueryTurn, StreamConfig, TurnBuilder};
use sse_server::{Reply, SseServer, Step, Turn, frame, last_event_id, query_json};
use tokio::time::Instant;

const QA: &str = "qry_A";
const SA: &str = "ses_A";
const QB: &str = "qry_B";
const SB: &str = "ses_B";
const DELTAS: &[&str] = &["Travel ", "is approved ", "by your ", "manager."];
// Ids of `Turn::completed` with four deltas: 1 created, 2 step, 3..=6
// deltas, 7 step, 8 rollup, 9 completed, then the `query` frame.

/// The frames of `turn` with ids in `from..=to` (`with_query`: and the `query` frame).
fn frames(turn: &Turn, from: u64, to: u64, with_query: bool) -> String {
    turn.frames
        .iter()
        .filter(|(id, _)| match id {
            Some(i) => *i >= from && *i <= to,
            None => with_query,
        })
        .map(|(_, f)| f.as_str())
        .collect()
}

fn config() -> StreamConfig {
    StreamConfig::default()
        .reconnect_delay(Duration::from_millis(5), Duration::from_millis(50))
        .final_query_wait(Duration::from_millis(300))
}

fn doc(query_id: &str, session_id: &str, status: &str, answer: &str) -> Reply {
    Reply::json(200, &[], &query_json(query_id, session_id, status, answer))
}

/// A server: `POST /query` answers `post`; `GET /queries/qry_A/events`
/// the `n`th time `events(n, Last-Event-ID)`; `GET /queries/qry_A` the
/// `n`th time `stored(n)`.
async fn serve(
    post: Reply,
    events: impl Fn(usize, Option<u64>) -> Reply + Send + Sync + 'static,
    stored: impl Fn(usize) -> Reply + Send + Sync + 'static,
) -> SseServer {
    let n_events = AtomicUsize::new(0);
    let n_stored = AtomicUsize::new(0);
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            post.clone()
        } else if req.is("GET", &format!("/queries/{QA}/events")) {
            events(n_events.fetch_add(1, Ordering::SeqCst), last_event_id(req))
        } else if req.is("GET", &format!("/queries/{QA}")) {
            stored(n_stored.fetch_add(1, Ordering::SeqCst))
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await
}

fn sse(body: String) -> Reply {
    Reply::sse(vec![Step::Write(body.into_bytes())])
}

fn gone() -> Reply {
    Reply::json(410, &[], &serde_json::json!({"message": "gone"}))
}

/// A turn asking `question` in a new session over the test's context.
fn ask(client: &Client, question: &str) -> TurnBuilder {
    client.session(["handbook"]).build().unwrap().ask(question)
}

async fn stream(client: &Client, cfg: StreamConfig) -> QueryTurn {
    ask(client, "Who approves travel?")
        .stream_config(cfg)
        .stream()
        .await
        .unwrap()
}

/// The error is the typed identity mismatch: `place` named `got` where
/// `expected` (of `kind`) was due; it names the turn and may have started.
fn assert_mismatch(e: &Error, place: &str, kind: &str, expected: &str, got: &str) {
    match e {
        Error::TurnMismatch(m) => {
            let found = (m.place, m.kind, m.expected.as_str(), m.got.as_str());
            assert_eq!(found, (place, kind, expected, got));
        }
        other => panic!("expected a turn mismatch at {place}, got {other:?}"),
    }
    assert!(
        e.to_string().contains(expected) && e.to_string().contains(got),
        "{e}"
    );
    assert!(e.may_have_started(), "{e:?}");
    assert!(!e.is_retryable(), "{e:?}");
}

/// A resume of `qry_A` answered with `qry_B`'s events (same text, so only
/// the ids tell) ends in the mismatch: not one of B's events is delivered.
#[tokio::test]
async fn a_resume_answered_with_another_turns_events_is_a_mismatch() {
    let a = Turn::completed(QA, SA, DELTAS);
    let b = Turn::completed(QB, SB, DELTAS);
    let server = serve(
        sse(frames(&a, 1, 3, false)),
        move |_, last| sse(b.replay_from(last)),
        |_| doc(QA, SA, "completed", &DELTAS.concat()),
    )
    .await;
    let mut live = stream(&server.client(), config()).await;
    let (events, error) = drain(&mut live).await;
    assert_eq!(text(&events), DELTAS[0], "only A's first delta");
    assert_mismatch(&error.expect("an error"), "an event", "query", QA, QB);
    assert_eq!(live.query_id(), Some(QA));
    assert!(live.finish().await.is_err());
    assert_eq!(server.count("POST", "/query"), 1);
}

/// A final `query` frame naming another turn is not this turn's result,
/// even with the same text.
#[tokio::test]
async fn a_final_frame_naming_another_turn_is_a_mismatch() {
    let a = Turn::completed(QA, SA, DELTAS);
    let body = format!(
        "{}{}",
        frames(&a, 1, 9, false),
        frame(None, "query", &query_json(QB, SB, "completed", &a.answer))
    );
    let server = serve(sse(body), |_, _| gone(), |_| doc(QB, SB, "completed", "")).await;
    let mut live = stream(&server.client(), config()).await;
    let (_, error) = drain(&mut live).await;
    assert_mismatch(
        &error.expect("an error"),
        "the final query frame",
        "query",
        QA,
        QB,
    );
    assert!(live.finish().await.is_err());
}

/// After the event log answers 410, the stored document must be this
/// turn's: another turn's document (with the same text) is a mismatch.
#[tokio::test]
async fn a_stored_document_of_another_turn_is_a_mismatch() {
    let a = Turn::completed(QA, SA, DELTAS);
    let server = serve(
        sse(frames(&a, 1, 4, false)),
        |_, _| gone(),
        |_| doc(QB, SB, "completed", &DELTAS.concat()),
    )
    .await;
    let mut live = stream(&server.client(), config()).await;
    let (_, error) = drain(&mut live).await;
    assert_mismatch(
        &error.expect("an error"),
        "the stored turn",
        "query",
        QA,
        QB,
    );
    assert_eq!(
        server.count("GET", &format!("/queries/{QA}")),
        1,
        "never retried"
    );
}

/// A background turn's polls must answer about it: a poll naming another
/// turn is a mismatch, and the handle keeps its own id.
#[tokio::test]
async fn a_poll_answered_with_another_turn_is_a_mismatch() {
    let post = Reply::json(202, &[], &query_json(QA, SA, "in_progress", ""));
    let server = serve(
        post,
        |_, _| gone(),
        |_| doc(QB, SB, "completed", "someone else's answer"),
    )
    .await;
    let session = server.client().session(["handbook"]).build().unwrap();
    let mut handle = session.ask("Who?").background().await.unwrap();
    let e = handle
        .wait(nexus_knowql::WaitPolicy::default())
        .await
        .unwrap_err();
    assert_mismatch(&e, "a poll", "query", QA, QB);
    assert_eq!(handle.id(), QA);
    assert_eq!(handle.session_id(), SA);
}

/// A session never adopts a session id it was not given: a turn whose
/// events name another session is a mismatch, and the next turn is still
/// posted into the session's own.
#[tokio::test]
async fn a_session_never_adopts_another_session() {
    let other = Turn::completed(QA, SB, DELTAS);
    let server = serve(
        sse(other.body()),
        |_, _| gone(),
        |_| doc(QA, SA, "completed", &DELTAS.concat()),
    )
    .await;
    let client = server.client();
    let session = client.continue_session(SA);
    let mut live = session
        .ask("first")
        .stream_config(config())
        .stream()
        .await
        .unwrap();
    let (events, error) = drain(&mut live).await;
    assert_eq!(text(&events), "");
    assert_mismatch(&error.expect("an error"), "an event", "session", SA, SB);
    drop(live);
    let _ = session.ask("second").stream_config(config()).send().await;
    let posted: Vec<serde_json::Value> = server
        .requests()
        .iter()
        .filter(|r| r.is("POST", "/query"))
        .map(|r| r.json())
        .collect();
    assert_eq!(posted.len(), 2);
    for body in &posted {
        assert_eq!(body["session_id"], SA, "{body}");
    }
    // A 202 about another session is refused the same way.
    let post = Reply::json(202, &[], &query_json(QA, SB, "in_progress", ""));
    let server = serve(post, |_, _| gone(), |_| doc(QA, SA, "completed", "")).await;
    let client = server.client();
    let e = client
        .continue_session(SA)
        .ask("third")
        .background()
        .await
        .unwrap_err();
    assert_mismatch(&e, "the answer to POST /query", "session", SA, SB);
}

/// An event id that is not a decimal number cannot be ordered: its text is
/// never delivered twice (the old stream delivered it id-less, then again
/// from the replay); the turn ends in the stored answer, exactly.
#[tokio::test]
async fn a_non_decimal_event_id_never_delivers_text_twice() {
    let a = Turn::completed(QA, SA, DELTAS);
    let odd = frame(
        None,
        "response.output_text.delta",
        &serde_json::json!({"type": "response.output_text.delta", "query_id": QA, "delta": DELTAS[0]}),
    );
    let body = format!("{}id: 3a\n{odd}", frames(&a, 1, 2, false));
    let replay = a.clone();
    let server = serve(
        sse(body),
        move |_, last| sse(replay.replay_from(last)),
        |_| doc(QA, SA, "completed", &DELTAS.concat()),
    )
    .await;
    let mut live = stream(&server.client(), config()).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), a.answer);
    assert_eq!(live.finish().await.unwrap().answer_text(), a.answer);
}

/// `send()` holds the bound `stream()` holds: a text past
/// `max_text_bytes` is `TurnTooLarge`, not a poll that returns it anyway,
/// whether the answer streams or comes as one JSON document.
#[tokio::test]
async fn send_honours_the_text_bound_on_every_path() {
    let a = Turn::completed(QA, SA, DELTAS);
    let json = Reply::json(200, &[], &query_json(QA, SA, "completed", &a.answer));
    for post in [sse(a.body()), json] {
        let server = serve(
            post,
            |_, _| gone(),
            |_| doc(QA, SA, "completed", &DELTAS.concat()),
        )
        .await;
        let e = ask(&server.client(), "Who?")
            .stream_config(config().max_text_bytes(8))
            .send()
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::TurnTooLarge {
                    part: "text",
                    limit: 8,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(server.count("GET", &format!("/queries/{QA}")), 0);
    }
}

/// `send()` does not hide a text that is not the answer behind a poll.
#[tokio::test]
async fn send_reports_an_answer_mismatch() {
    let a = Turn::completed(QA, SA, DELTAS);
    let body = format!(
        "{}{}",
        frames(&a, 1, 9, false),
        frame(
            None,
            "query",
            &query_json(QA, SA, "completed", "Not the text.")
        )
    );
    let server = serve(
        sse(body),
        |_, _| gone(),
        |_| doc(QA, SA, "completed", "Not the text."),
    )
    .await;
    let e = ask(&server.client(), "Who?")
        .stream_config(config())
        .send()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::AnswerMismatch { .. }), "{e:?}");
}

/// A 202 whose body drips counts against the turn timeout, and the
/// timeout names the time really waited.
#[tokio::test(start_paused = true)]
async fn a_background_start_counts_against_the_turn_timeout() {
    let body = query_json(QA, SA, "in_progress", "").to_string();
    let post = Reply {
        head: format!(
            "HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        ),
        steps: vec![
            Step::Write(body.as_bytes()[..10].to_vec()),
            Step::Sleep(Duration::from_secs(3600)),
        ],
    };
    let server = serve(post, |_, _| gone(), |_| gone()).await;
    let client = Client::builder()
        .base_url(&server.url)
        .api_key("pcsk_test")
        .request_timeout(Some(Duration::from_secs(60)))
        .turn_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let started = Instant::now();
    let e = client
        .session(["handbook"])
        .build()
        .unwrap()
        .ask("Who?")
        .stream_config(config().idle_timeout(None))
        .background()
        .await
        .unwrap_err();
    let waited = started.elapsed();
    match &e {
        Error::Timeout { elapsed_ms, .. } => {
            assert!((5000..6000).contains(elapsed_ms), "{e:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(waited < Duration::from_secs(6), "{waited:?}");
    assert!(e.may_have_started(), "{e:?}");
}

/// A JSON answer that stops moving is a dead connection after the idle
/// timeout, not a wait for the turn's whole deadline.
#[tokio::test(start_paused = true)]
async fn a_json_answer_that_stops_moving_is_dead_after_the_idle_timeout() {
    let body = query_json(QA, SA, "completed", "x").to_string();
    let post = Reply {
        head: format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        ),
        steps: vec![
            Step::Write(body.as_bytes()[..body.len() / 2].to_vec()),
            Step::Sleep(Duration::from_secs(3600)),
        ],
    };
    let server = serve(post, |_, _| gone(), |_| gone()).await;
    let client = Client::builder()
        .base_url(&server.url)
        .api_key("pcsk_test")
        .request_timeout(None)
        .build()
        .unwrap();
    let started = Instant::now();
    let e = client
        .session(["handbook"])
        .build()
        .unwrap()
        .ask("Who?")
        .stream_config(config().idle_timeout(Some(Duration::from_secs(3))))
        .stream()
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "{e:?}");
    assert!(e.is_timeout(), "{e:?}");
    assert!(e.may_have_started(), "{e:?}");
    assert_eq!(
        e.query_id(),
        Some(QA),
        "the half read names the turn: {e:?}"
    );
}

/// A `retry:` that arrives in the same read as the end of the stream sets
/// the delay of the reconnection that end causes.
#[tokio::test(start_paused = true)]
async fn a_retry_with_the_end_of_the_stream_applies() {
    let a = Turn::completed(QA, SA, DELTAS);
    let body = format!("{}retry: 30000\n\n", frames(&a, 1, 4, false));
    let resumed_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let seen = resumed_at.clone();
    let server = serve(
        sse(body),
        move |_, last| {
            seen.lock().unwrap().get_or_insert_with(Instant::now);
            sse(a.replay_from(last))
        },
        |_| doc(QA, SA, "completed", &DELTAS.concat()),
    )
    .await;
    let started = Instant::now();
    let cfg = config().reconnect_delay(Duration::from_millis(10), Duration::from_secs(60));
    let mut live = stream(&server.client(), cfg).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), DELTAS.concat());
    let waited = resumed_at.lock().unwrap().expect("resumed") - started;
    // The server's 30 s, up to a fifth shorter at random.
    assert!(waited >= Duration::from_secs(23), "{waited:?}");
}

/// An unknown status word in the final frame (and the stored turn) is a
/// typed outcome at once, not a poll until the recovery wait runs out.
#[tokio::test(start_paused = true)]
async fn an_unknown_status_word_is_a_typed_outcome() {
    let a = Turn::completed(QA, SA, DELTAS);
    let body = format!(
        "{}{}",
        frames(&a, 1, 9, false),
        frame(None, "query", &query_json(QA, SA, "Completed", &a.answer))
    );
    let server = serve(
        sse(body),
        |_, _| gone(),
        |_| doc(QA, SA, "Completed", &DELTAS.concat()),
    )
    .await;
    let started = Instant::now();
    let mut live = stream(&server.client(), config()).await;
    let (_, error) = drain(&mut live).await;
    let e = error.expect("an error");
    match &e {
        Error::UnknownTurnStatus {
            query_id, status, ..
        } => {
            assert_eq!((query_id.as_str(), status.as_str()), (QA, "Completed"));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.count("GET", &format!("/queries/{QA}")), 1);
}

/// A background `wait()` refuses an unknown status word at once, as the
/// stored-read path does, instead of polling it until the deadline.
#[tokio::test(start_paused = true)]
async fn a_background_wait_refuses_an_unknown_status_at_once() {
    let post = Reply::json(202, &[], &query_json(QA, SA, "in_progress", ""));
    let server = serve(post, |_, _| gone(), |_| doc(QA, SA, "Completed", "x")).await;
    let mut handle = ask(&server.client(), "Who?").background().await.unwrap();
    let e = handle
        .wait(nexus_knowql::WaitPolicy::default())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::UnknownTurnStatus { .. }), "{e:?}");
    assert_eq!(server.count("GET", &format!("/queries/{QA}")), 1);
}

/// Media types compare as HTTP says: case-insensitive, parameters ignored.
#[tokio::test]
async fn media_types_compare_without_case_or_parameters() {
    let a = Turn::completed(QA, SA, DELTAS);
    let events = Reply {
        head: "HTTP/1.1 200 OK\r\ncontent-type: Text/Event-Stream; charset=UTF-8\r\nconnection: close\r\n\r\n".into(),
        steps: vec![Step::Write(a.body().into_bytes())],
    };
    let server = serve(events, |_, _| gone(), |_| gone()).await;
    let query = ask(&server.client(), "Who?").send().await.unwrap();
    assert_eq!(query.answer_text(), a.answer);
    let doc = serde_json::to_vec(&query_json(QA, SA, "completed", &a.answer)).unwrap();
    let json = Reply {
        head: format!(
            "HTTP/1.1 200 OK\r\ncontent-type: Application/JSON\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            doc.len()
        ),
        steps: vec![Step::Write(doc)],
    };
    let server = serve(json, |_, _| gone(), |_| gone()).await;
    let query = ask(&server.client(), "Who?").send().await.unwrap();
    assert_eq!(query.answer_text(), a.answer);
    assert_eq!(server.count("POST", "/query"), 1);
}

/// A replay that starts right after `Last-Event-ID` (SSE's usual meaning)
/// proves nothing is missing: its events are delivered one by one, with no
/// read of the stored turn. One that starts later still is a gap.
#[tokio::test]
async fn a_replay_after_the_last_event_id_is_accepted_and_a_real_gap_is_not() {
    for (first, gap) in [(5, false), (6, true)] {
        let a = Turn::completed(QA, SA, DELTAS);
        let replay = a.clone();
        let server = serve(
            sse(frames(&a, 1, 4, false)),
            move |_, _| sse(frames(&replay, first, 9, true)),
            |_| doc(QA, SA, "completed", &DELTAS.concat()),
        )
        .await;
        let mut live = stream(&server.client(), config()).await;
        let (events, error) = drain(&mut live).await;
        assert!(error.is_none(), "{error:?}");
        assert_eq!(text(&events), a.answer);
        let stored_reads = server.count("GET", &format!("/queries/{QA}"));
        let deltas = events
            .iter()
            .filter(|e| matches!(e, nexus_knowql::QueryEvent::TextDelta { .. }))
            .count();
        if gap {
            assert_eq!(stored_reads, 1, "a real gap reads the stored turn");
        } else {
            assert_eq!(stored_reads, 0, "nothing was missing");
            assert_eq!(deltas, DELTAS.len(), "delivered one by one");
            assert_eq!(server.last_event_ids(), vec![Some("4".to_owned())]);
        }
    }
}

/// A `200` to `POST /query` whose body does not decode may have started
/// the turn, and names it when the body does.
#[tokio::test]
async fn an_undecodable_answer_to_the_post_may_have_started_the_turn() {
    let cut = br#"{"id": "qry_A", "object": "query", "status": "in_pro"#.to_vec();
    let post = Reply {
        head: format!(
            "HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            cut.len()
        ),
        steps: vec![Step::Write(cut)],
    };
    let server = serve(post, |_, _| gone(), |_| gone()).await;
    let e = ask(&server.client(), "Who?")
        .background()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Decode { .. }), "{e:?}");
    assert!(e.may_have_started(), "{e:?}");
    assert!(e.to_string().contains("the turn may have started"), "{e}");
    assert_eq!(e.query_id(), Some(QA), "{e:?}");
    assert!(!e.is_retryable());
}

/// A compressed answer is named, not read as garbage: an event stream sent
/// gzip-encoded, a Query document deflate-encoded.
#[tokio::test]
async fn a_content_encoding_is_named() {
    let gz = Reply {
        head: "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\nconnection: close\r\n\r\n".into(),
        steps: vec![Step::Write(vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xfe])],
    };
    let server = serve(gz, |_, _| gone(), |_| gone()).await;
    let e = ask(&server.client(), "Who?").stream().await.unwrap_err();
    assert!(e.to_string().contains("gzip"), "{e}");
    assert!(e.may_have_started(), "{e:?}");
    let deflate = Reply {
        head: "HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-encoding: deflate\r\ncontent-length: 4\r\nconnection: close\r\n\r\n".into(),
        steps: vec![Step::Write(vec![0x78, 0x9c, 3, 0])],
    };
    let server = serve(deflate, |_, _| gone(), |_| gone()).await;
    let e = ask(&server.client(), "Who?")
        .background()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("deflate"), "{e}");
    assert!(e.may_have_started(), "{e:?}");
}

/// A same-origin 307 loop never sends `POST /query` a second time.
#[tokio::test]
async fn a_redirect_never_sends_the_post_again() {
    let server = SseServer::start(|req, _| {
        if req.is("POST", "/query") {
            Reply {
                head: "HTTP/1.1 307 Temporary Redirect\r\nlocation: /query\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".into(),
                steps: Vec::new(),
            }
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await;
    for run in 0..2 {
        let turn = ask(&server.client(), "Who?");
        let e = if run == 0 {
            turn.send().await.unwrap_err()
        } else {
            turn.background().await.unwrap_err()
        };
        assert!(matches!(e, Error::Redirect { .. }), "{e:?}");
        assert_eq!(server.count("POST", "/query"), run + 1, "sent once per ask");
    }
}
