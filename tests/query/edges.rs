//! Streaming turns against servers that bend the contract: replays that do
//! not start where they were asked to, event logs that are gone, headers
//! that never come, huge numbers. Each turn ends with the exact answer or a
//! clear error, never a wrong text and never a hang or a panic.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::sse_server;
use crate::support::turns::{drain, text};
use futures::StreamExt;
use nexus_knowql::{CallOptions, Client, Error, QueryEvent, QueryTurn, RetryPolicy, StreamConfig};
use sse_server::{Reply, SseServer, Step, Turn, frame, last_event_id, query_json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DELTAS: &[&str] = &[
    "Travel ",
    "is approved ",
    "by your ",
    "manager, ",
    "then by finance.",
];

fn fast_resume() -> StreamConfig {
    StreamConfig::default().reconnect_delay(Duration::from_millis(5), Duration::from_millis(50))
}

/// The frames with ids in `from..=to`, then the id-less `query` frame when
/// `to` is the last id.
fn frames(turn: &Turn, from: u64, to: u64) -> String {
    turn.frames
        .iter()
        .filter(|(id, _)| match id {
            Some(i) => *i >= from && *i <= to,
            None => to >= turn.events() as u64,
        })
        .map(|(_, f)| f.as_str())
        .collect()
}

/// A server for `turn`: the POST sends events 1 to `cut`; every resume is
/// answered by `resume(turn, last_event_id)`; `GET /queries/{id}` by
/// `stored` (in order, the last one repeated).
async fn server(
    turn: &Turn,
    cut: u64,
    resume: impl Fn(&Turn, Option<u64>) -> Reply + Send + Sync + 'static,
    stored: Vec<Reply>,
) -> SseServer {
    let t = turn.clone();
    let gets = AtomicUsize::new(0);
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(frames(&t, 1, cut).into_bytes())])
        } else if req.method == "GET" && req.path == t.events_path() {
            resume(&t, last_event_id(req))
        } else if req.is("GET", &format!("/queries/{}", t.query_id)) {
            let n = gets.fetch_add(1, Ordering::SeqCst);
            stored[n.min(stored.len() - 1)].clone()
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await
}

fn stored(turn: &Turn, status: &str, answer: &str) -> Reply {
    Reply::json(
        200,
        &[],
        &query_json(&turn.query_id, &turn.session_id, status, answer),
    )
}

fn gone() -> Reply {
    Reply::json(
        410,
        &[],
        &serde_json::json!({"message": "event log expired"}),
    )
}

async fn stream(server: &SseServer, config: StreamConfig) -> QueryTurn {
    stream_within(server, config, Duration::from_secs(10)).await
}

/// [`stream`] under the turn timeout `limit`.
async fn stream_within(server: &SseServer, config: StreamConfig, limit: Duration) -> QueryTurn {
    server
        .client()
        .with_options(CallOptions::new().turn_timeout(limit))
        .session(["handbook"])
        .build()
        .unwrap()
        .ask("Who approves travel?")
        .stream_config(config)
        .stream()
        .await
        .unwrap()
}

// Frame ids of `Turn::completed` with five deltas: 1 created, 2 step,
// 3..=7 deltas, 8 step, 9 rollup, 10 completed, then the `query` frame.

#[tokio::test]
async fn trimmed_replay_is_recovered_from_the_stored_turn() {
    let turn = Turn::completed("q_e1", "s_e1", DELTAS);
    // The POST delivers up to the second delta (id 4); the resume skips 5 and 6.
    let server = server(
        &turn,
        4,
        |t, _| Reply::sse(vec![Step::Write(frames(t, 7, 99).into_bytes())]),
        vec![stored(&turn, "completed", &turn.answer)],
    )
    .await;
    let mut live = stream(&server, fast_resume()).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), turn.answer);
    // Delta 7 (after the gap) was never delivered as an event: the rest of
    // the answer came as one final delta.
    let deltas: Vec<&QueryEvent> = events
        .iter()
        .filter(|e| matches!(e, QueryEvent::TextDelta { .. }))
        .collect();
    assert_eq!(deltas.len(), 3);
    assert_eq!(
        deltas[2],
        &QueryEvent::TextDelta {
            delta: "by your manager, then by finance.".into()
        }
    );
    assert!(matches!(events.last(), Some(QueryEvent::Query(_))));
    assert_eq!(server.last_event_ids(), vec![Some("4".to_owned())]);
    assert_eq!(server.count("POST", "/query"), 1);
    let query = live.finish().await.unwrap();
    assert_eq!(query.answer_text(), turn.answer);
}

#[tokio::test]
async fn replay_starting_elsewhere_is_deduplicated_or_never_trusted() {
    let turn = Turn::completed("q_e2", "s_e2", DELTAS);
    // A replay that starts before the id sent still holds every event: its
    // already-seen ids are dropped and the turn goes on from the replay. One
    // with a non-numeric id is broken, and the stored turn finishes the answer.
    for (case, wire, stored_reads) in [
        ("backwards", frames(&turn, 2, 99), 0),
        (
            "non-numeric",
            format!(
                "id: x5\nevent: response.output_text.delta\ndata: {{\"delta\":\"WRONG\"}}\n\n{}",
                frames(&turn, 5, 99)
            ),
            1,
        ),
    ] {
        let server = server(
            &turn,
            4,
            move |_, _| Reply::sse(vec![Step::Write(wire.clone().into_bytes())]),
            vec![stored(&turn, "completed", &turn.answer)],
        )
        .await;
        let mut live = stream(&server, fast_resume()).await;
        let (events, error) = drain(&mut live).await;
        assert!(error.is_none(), "{case}: {error:?}");
        assert_eq!(text(&events), turn.answer, "{case}");
        assert_eq!(live.text(), turn.answer, "{case}");
        // Backwards: deduplicated by id, no text twice and no stored read.
        // Non-numeric: the answer came from the stored turn, not from the
        // replay (a client that took the non-numeric frame for a valid one
        // would finish without reading it).
        assert_eq!(server.count("GET", "/queries/q_e2"), stored_reads, "{case}");
        assert_eq!(
            server.last_event_ids(),
            vec![Some("4".to_owned())],
            "{case}"
        );
    }
}

#[tokio::test]
async fn trimmed_replay_waits_for_the_stored_turn_to_end() {
    let turn = Turn::completed("q_e3", "s_e3", DELTAS);
    let server = server(
        &turn,
        4,
        |t, _| Reply::sse(vec![Step::Write(frames(t, 6, 99).into_bytes())]),
        vec![
            stored(&turn, "in_progress", "Travel is"),
            stored(&turn, "in_progress", "Travel is approved by"),
            stored(&turn, "completed", &turn.answer),
        ],
    )
    .await;
    let mut live = stream(&server, fast_resume()).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), turn.answer);
    assert_eq!(server.count("GET", "/queries/q_e3"), 3);
}

#[tokio::test]
async fn trimmed_replay_that_cannot_be_recovered_is_a_clear_error() {
    let turn = Turn::completed("q_e4", "s_e4", DELTAS);
    let server = server(
        &turn,
        4,
        |t, _| Reply::sse(vec![Step::Write(frames(t, 7, 99).into_bytes())]),
        // The stored answer does not continue what was delivered.
        vec![stored(&turn, "completed", "Something else entirely.")],
    )
    .await;
    let mut live = stream(&server, fast_resume()).await;
    let (events, error) = drain(&mut live).await;
    // Only what came before the gap was delivered: never a wrong text.
    assert_eq!(text(&events), "Travel is approved ");
    let error = error.expect("an error");
    match &error {
        Error::ReplayGap {
            query_id,
            last_event_id,
            message,
            ..
        } => {
            assert_eq!(query_id, "q_e4");
            assert_eq!(*last_event_id, Some(4));
            assert!(message.contains("event 7 instead of event 4"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let shown = error.to_string();
    assert!(
        shown.contains("q_e4") && shown.contains("event 4"),
        "{shown}"
    );
    assert!(!error.is_retryable());
    assert_eq!(error.query_id(), Some("q_e4"));
    assert!(matches!(live.finish().await, Err(Error::ReplayGap { .. })));
    assert_eq!(server.count("POST", "/query"), 1);
}

#[tokio::test]
async fn event_log_gone_mid_answer_is_recovered_or_a_clear_error() {
    let turn = Turn::completed("q_e5", "s_e5", DELTAS);
    let recovered = server(
        &turn,
        5,
        |_, _| gone(),
        vec![stored(&turn, "completed", &turn.answer)],
    )
    .await;
    let mut live = stream(&recovered, fast_resume()).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), turn.answer);
    assert_eq!(live.finish().await.unwrap().answer_text(), turn.answer);

    let lost = server(
        &turn,
        5,
        |_, _| gone(),
        vec![Reply::json(
            404,
            &[],
            &serde_json::json!({"message": "no such query"}),
        )],
    )
    .await;
    let mut live = stream(&lost, fast_resume()).await;
    let (events, error) = drain(&mut live).await;
    assert_eq!(text(&events), "Travel is approved by your ");
    let error = error.expect("an error");
    let shown = error.to_string();
    assert!(matches!(error, Error::ReplayGap { .. }), "{error:?}");
    // It names what failed: the events (410) and the stored turn (404).
    assert!(
        shown.contains("410") && shown.contains("get_query") && shown.contains("404"),
        "{shown}"
    );
    assert!(!shown.contains("context"), "{shown}");
    assert_eq!(error.query_id(), Some("q_e5"));
}

#[tokio::test]
async fn a_cut_after_the_terminal_event_is_still_a_completed_turn() {
    let turn = Turn::completed("q_e6", "s_e6", DELTAS);
    let t = turn.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            // Everything up to `response.completed`, then a reset.
            Reply::sse(vec![
                Step::Write(frames(&t, 1, 10).into_bytes()),
                Step::Reset,
            ])
        } else if req.method == "GET" && req.path == t.events_path() {
            Reply::json(404, &[], &serde_json::json!({"message": "expired"}))
        } else if req.is("GET", "/queries/q_e6") {
            Reply::json(
                200,
                &[],
                &query_json("q_e6", "s_e6", "completed", &t.answer),
            )
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await;
    let mut live = stream(&server, fast_resume()).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), turn.answer);
    let query = live.finish().await.unwrap();
    assert_eq!(query.answer_text(), turn.answer);
    assert_eq!(server.count("POST", "/query"), 1);
}

#[tokio::test]
async fn resume_404_after_the_terminal_event_is_a_completed_turn() {
    let turn = Turn::completed("q_e7", "s_e7", DELTAS);
    let t = turn.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            // Up to `response.completed`, then a clean close without the Query.
            Reply::sse(vec![Step::Write(frames(&t, 1, 10).into_bytes())])
        } else if req.method == "GET" && req.path == t.events_path() {
            Reply::json(404, &[], &serde_json::json!({"message": "expired"}))
        } else if req.is("GET", "/queries/q_e7") {
            Reply::json(
                200,
                &[],
                &query_json("q_e7", "s_e7", "completed", &t.answer),
            )
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await;
    let live = stream(&server, fast_resume()).await;
    #[derive(serde::Deserialize)]
    struct Answer {
        answer: String,
    }
    let answer: Answer = live.finish().await.unwrap().json().unwrap();
    assert_eq!(answer.answer, turn.answer);
}

#[tokio::test]
async fn the_final_query_frame_has_the_query_body_limit() {
    let long = "x".repeat(20_000);
    let turn = Turn::completed("q_e8", "s_e8", &["short ", &long]);
    let t = turn.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(t.body().into_bytes())])
        } else {
            Reply::json(
                200,
                &[],
                &query_json("q_e8", "s_e8", "completed", &t.answer),
            )
        }
    })
    .await;
    // Progress frames up to 24 KiB; the Query frame (about 40 KiB) is allowed.
    let mut live = stream(&server, fast_resume().max_frame_bytes(24 * 1024)).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert!(matches!(events.last(), Some(QueryEvent::Query(_))));
    assert_eq!(server.count("GET", "/queries/q_e8"), 0);

    // A Query frame beyond its own limit after the terminal event is no
    // error either: the stored Query is read instead.
    let mut live = stream(
        &server,
        fast_resume()
            .max_frame_bytes(24 * 1024)
            .max_query_frame_bytes(30 * 1024),
    )
    .await;
    let (_, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(live.finish().await.unwrap().answer_text(), turn.answer);
    assert_eq!(server.count("GET", "/queries/q_e8"), 1);
}

#[tokio::test]
async fn the_query_id_is_learned_from_any_event() {
    let q = "q_e9";
    let t = Turn::completed(q, "s_e9", DELTAS);
    // No `response.created`: the first event is a step, and the POST is cut
    // after it. The turn is still resumed, never posted again.
    let step = t.frames[1].1.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(step.clone().into_bytes()), Step::Reset])
        } else if req.method == "GET" && req.path == t.events_path() {
            Reply::sse(vec![Step::Write(
                t.replay_from(last_event_id(req)).into_bytes(),
            )])
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await;
    let mut live = stream(&server, fast_resume()).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(live.query_id(), Some(q));
    assert_eq!(text(&events), DELTAS.concat());
    assert_eq!(server.last_event_ids(), vec![Some("2".to_owned())]);
    assert_eq!(server.count("POST", "/query"), 1);
}

#[tokio::test]
async fn a_stream_that_dies_before_the_turn_is_named_is_not_retryable() {
    let server = SseServer::start(|_, _| {
        Reply::sse(vec![Step::Write(b": hello\n\n".to_vec()), Step::Reset])
    })
    .await;
    let mut live = stream(&server, fast_resume()).await;
    let (_, error) = drain(&mut live).await;
    let error = error.expect("an error");
    assert!(
        matches!(error, Error::Stream { query_id: None, .. }),
        "{error:?}"
    );
    assert!(!error.is_retryable());
    assert_eq!(error.query_id(), None);
    assert_eq!(server.requests().len(), 1);
}

/// A listener that reads requests and never answers; counts the requests.
async fn silent_server() -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut sock, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            held.push(sock);
        }
    });
    (url, count, task)
}

#[tokio::test]
async fn headers_that_never_come_are_a_timeout_and_one_post() {
    let (url, requests, task) = silent_server().await;
    let client = Client::builder()
        .base_url(&url)
        .api_key("pcsk_test")
        .header_timeout(Some(Duration::from_millis(300)))
        .build()
        .unwrap();
    let session = client.session(["handbook"]).build().unwrap();
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        session.ask("Who approves travel?").stream(),
    )
    .await
    .expect("the header timeout ends the wait");
    let elapsed = started.elapsed();
    let error = result.expect_err("no headers, no turn");
    assert!(
        matches!(
            error,
            Error::Timeout {
                operation: "create_query",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.is_timeout());
    assert!(!error.is_retryable(), "retrying could start a second turn");
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    // Retries run inside `stream()`, which has returned: the count is final.
    assert_eq!(requests.load(Ordering::SeqCst), 1);
    assert!(!session.is_busy());
    task.abort();
}

#[tokio::test]
async fn a_login_that_never_answers_is_bounded() {
    // Records each request and never answers it.
    let server = SseServer::start(|_, _| Reply {
        head: String::new(),
        steps: vec![Step::AwaitClose],
    })
    .await;
    let client = Client::builder()
        .base_url(&server.url)
        .api_key("pcsk_test")
        .login(true)
        .request_timeout(Some(Duration::from_millis(300)))
        .retry(RetryPolicy::default().max_retries(0))
        .build()
        .unwrap();
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(10), client.contexts().list())
        .await
        .expect("the login has a deadline");
    let elapsed = started.elapsed();
    // A timeout of the login itself, after the request timeout: not some
    // other error, and the listing was never sent without a token.
    let error = result.expect_err("the login never answers");
    assert!(error.is_timeout(), "{error:?}");
    assert!(elapsed >= Duration::from_millis(250), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    let sent: Vec<(String, String)> = server
        .requests()
        .into_iter()
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(
        sent,
        vec![("POST".to_owned(), "/auth/login".to_owned())],
        "only the login was sent"
    );
}

#[tokio::test]
async fn an_error_body_that_never_ends_is_bounded() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            let _ = sock
                .write_all(b"HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"message\":\"busy")
                .await;
            held.push(sock);
        }
    });
    let client = Client::builder()
        .base_url(&url)
        .api_key("pcsk_test")
        .header_timeout(None)
        .read_timeout(Some(Duration::from_millis(200)))
        .build()
        .unwrap();
    let session = client.session(["handbook"]).build().unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), session.ask("q").stream())
        .await
        .expect("the error body read has a deadline");
    let error = result.expect_err("a 409");
    assert_eq!(error.status().map(|s| s.as_u16()), Some(409), "{error:?}");
    task.abort();
}

#[tokio::test]
async fn a_synchronous_turn_has_its_own_deadline() {
    let t = Turn::completed("q_e10", "s_e10", DELTAS);
    let answer = t.answer.clone();
    let server = SseServer::start(move |_, _| {
        let body = query_json("q_e10", "s_e10", "completed", &answer).to_string();
        Reply {
            head: format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            ),
            steps: vec![
                Step::Sleep(Duration::from_millis(400)),
                Step::Write(body.into_bytes()),
            ],
        }
    })
    .await;
    let build = |turn: Duration| {
        Client::builder()
            .base_url(&server.url)
            .api_key("pcsk_test")
            .request_timeout(Some(Duration::from_millis(100)))
            .turn_timeout(Some(turn))
            .build()
            .unwrap()
    };
    // The ordinary request timeout does not cut a turn...
    let session = build(Duration::from_secs(10))
        .session(["h"])
        .build()
        .unwrap();
    let query = session.ask("q").send().await.unwrap();
    assert_eq!(query.answer_text(), t.answer);
    // ...its own deadline does, and the turn is not asked again.
    let session = build(Duration::from_millis(150))
        .session(["h"])
        .build()
        .unwrap();
    let error = session.ask("q").send().await.unwrap_err();
    assert!(error.is_timeout(), "{error:?}");
    assert!(!error.is_retryable());
    assert_eq!(server.count("POST", "/query"), 2);
}

#[tokio::test]
async fn huge_numbers_from_the_server_or_the_caller_never_panic() {
    let q = "q_e11";
    let t = Turn::completed(q, "s_e11", DELTAS);
    let mut body = String::from("retry: 18446744073709551615\n\n");
    body.push_str(&t.first(2));
    // Cumulative counts that each fit an i64 but whose sum does not.
    body.push_str(&frame(
        Some(3),
        "response.step",
        &serde_json::json!({"query_id": q, "step_id": "s1", "status": "running",
            "cum_input_tokens": i64::MAX, "cum_output_tokens": i64::MAX}),
    ));
    let turn = t.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(body.clone().into_bytes())])
        } else {
            let from = last_event_id(req);
            let rest: String = turn
                .frames
                .iter()
                .filter(|(id, _)| id.is_none_or(|i| i > 3))
                .map(|(_, f)| f.as_str())
                .collect();
            // Replays event 3 as asked (same id), then the rest.
            let again = frame(
                from,
                "response.step",
                &serde_json::json!({"query_id": q, "step_id": "s1", "status": "running"}),
            );
            Reply::sse(vec![Step::Write(format!("{again}{rest}").into_bytes())])
        }
    })
    .await;
    let config = StreamConfig::default()
        .idle_timeout(Some(Duration::MAX))
        .reconnect_max_elapsed(Duration::MAX)
        .reconnect_attempts(u32::MAX)
        .reconnect_delay(Duration::from_millis(5), Duration::from_millis(50));
    let started = Instant::now();
    let mut live = stream(&server, config).await;
    let mut saw_huge = false;
    while let Some(item) = live.next().await {
        // Event 3 (a delta) was replaced, so the final answer does not match.
        if let Err(e) = item {
            assert!(matches!(e, Error::AnswerMismatch { .. }), "{e:?}");
        }
        if let Some(u) = live.usage()
            && u.input_tokens == i64::MAX
        {
            saw_huge = true;
            assert_eq!(u.total_tokens, i64::MAX);
        }
    }
    assert!(saw_huge);
    // `retry:` was clamped to the policy's cap (50 ms), not waited out.
    assert!(started.elapsed() < Duration::from_secs(5));
    // Event 3 (the first delta) was replaced by the step with huge counts.
    assert_eq!(live.text(), DELTAS[1..].concat());
    assert_eq!(server.last_event_ids(), vec![Some("3".to_owned())]);

    // Configuration at its extremes is accepted too.
    let _ = StreamConfig::default()
        .max_frame_bytes(usize::MAX)
        .max_query_frame_bytes(usize::MAX)
        .reconnect_delay(Duration::MAX, Duration::MAX);
    let client = Client::builder()
        .base_url(&server.url)
        .request_timeout(Some(Duration::MAX))
        .header_timeout(Some(Duration::MAX))
        .read_timeout(Some(Duration::MAX))
        .turn_timeout(Some(Duration::MAX))
        .connect_timeout(Duration::MAX)
        .build();
    assert!(client.is_ok());
}

/// Catches the resume cycle ignoring its time limit (`spent + delay >
/// reconnect_max_elapsed` turned into `==`): with unlimited attempts, only the
/// elapsed-time limit ends a stream whose every resume is reset.
#[tokio::test]
async fn resuming_gives_up_at_its_time_limit() {
    let turn = Turn::completed("q_e8", "s_e8", DELTAS);
    let server = server(
        &turn,
        4,
        |_, _| Reply::sse(vec![Step::Reset]),
        vec![stored(&turn, "in_progress", "Travel is")],
    )
    .await;
    let config = StreamConfig::default()
        .reconnect_attempts(u32::MAX)
        .reconnect_max_elapsed(Duration::from_millis(300))
        .reconnect_delay(Duration::from_millis(5), Duration::from_millis(20));
    let mut live = stream(&server, config).await;
    let (_, error) = tokio::time::timeout(Duration::from_secs(20), drain(&mut live))
        .await
        .expect("the stream gives up within its time limit, not after unlimited attempts");
    let error = error.expect("a stream that could not be resumed is an error");
    assert!(matches!(error, Error::Stream { .. }), "{error:?}");
    assert!(error.to_string().contains("gave up"), "{error}");
    assert!(server.count("GET", &turn.events_path()) >= 1);
    assert_eq!(server.count("POST", "/query"), 1);
}

/// Catches the reading of the stored turn escaping the turn timeout: the
/// events are gone, the stored turn never ends, and the client's 1 s turn
/// timeout, not a default of its own, bounds `finish`.
#[tokio::test]
async fn the_turn_timeout_bounds_reading_the_stored_turn() {
    let turn = Turn::completed("q_e9", "s_e9", DELTAS);
    let t = turn.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            // Every event up to `response.completed`, then a clean close
            // without the final Query frame.
            let events: String = t
                .frames
                .iter()
                .filter(|(id, _)| id.is_some())
                .map(|(_, f)| f.as_str())
                .collect();
            Reply::sse(vec![Step::Write(events.into_bytes())])
        } else if req.method == "GET" && req.path == t.events_path() {
            Reply::json(404, &[], &serde_json::json!({"message": "expired"}))
        } else if req.is("GET", "/queries/q_e9") {
            stored(&t, "in_progress", "Travel is")
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await;
    let started = Instant::now();
    let mut live = stream_within(&server, fast_resume(), Duration::from_secs(1)).await;
    let result = tokio::time::timeout(Duration::from_secs(20), async {
        let _ = drain(&mut live).await;
        live.finish().await
    })
    .await
    .expect("the turn is bounded by its turn timeout");
    let error = result.expect_err("a stored turn that never ends is an error");
    assert!(error.is_timeout(), "{error:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert!(server.count("GET", "/queries/q_e9") >= 2);
}
