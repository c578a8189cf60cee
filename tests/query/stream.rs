//! Streaming turns against a scripted SSE server: framing variants, resume
//! after cuts, errors, and what the server received.

use std::time::Duration;

use crate::support::sse_server;
use crate::support::turns::{drain, text};
use futures::StreamExt;
use nexus_knowql::{Error, QueryEvent, QueryTurn, Session, StreamConfig, TurnView};
use sse_server::{Reply, SseServer, Step, Turn, frame, last_event_id};

const DELTAS: &[&str] = &["Travel ", "is approved ", "by your ", "manager.", " ✈️"];

fn names(events: &[QueryEvent]) -> Vec<String> {
    events.iter().map(|e| e.name().to_owned()).collect()
}

fn expected_names(turn: &Turn) -> Vec<String> {
    turn.frames
        .iter()
        .map(|(_, f)| {
            f.lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap()
                .to_owned()
        })
        .collect()
}

fn session(server: &SseServer) -> Session {
    server.client().session(["handbook"]).build().unwrap()
}

fn fast_resume() -> StreamConfig {
    StreamConfig::default().reconnect_delay(Duration::from_millis(5), Duration::from_millis(50))
}

/// A server for `turn`: the POST answers with `post`, each events request
/// replays from its `Last-Event-ID` and then does `after_replay(n)`.
async fn serve_turn(
    turn: &Turn,
    post: impl Fn(&Turn) -> Vec<Step> + Send + Sync + 'static,
    resume: impl Fn(&Turn, usize, Option<u64>) -> Reply + Send + Sync + 'static,
) -> SseServer {
    let t = turn.clone();
    let resumes = std::sync::atomic::AtomicUsize::new(0);
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(post(&t))
        } else if req.method == "GET" && req.path == t.events_path() {
            let n = resumes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            resume(&t, n, last_event_id(req))
        } else if req.is("GET", &format!("/queries/{}", t.query_id)) {
            Reply::json(
                200,
                &[],
                &sse_server::query_json(&t.query_id, &t.session_id, "completed", &t.answer),
            )
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await
}

fn replay(turn: &Turn, last: Option<u64>) -> Reply {
    Reply::sse(vec![Step::Write(turn.replay_from(last).into_bytes())])
}

#[tokio::test]
async fn stream_delivers_every_event_once_and_text_equals_answer() {
    let turn = Turn::completed("q_1", "sess_1", DELTAS);
    let server = serve_turn(
        &turn,
        |t| vec![Step::Write(t.body().into_bytes())],
        |t, _, l| replay(t, l),
    )
    .await;
    let session = session(&server);
    let mut live = session.ask("Who approves travel?").stream().await.unwrap();
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(names(&events), expected_names(&turn));
    assert_eq!(text(&events), turn.answer);
    assert_eq!(live.text(), turn.answer);
    assert_eq!(live.query_id(), Some("q_1"));
    assert_eq!(live.session_id(), Some("sess_1"));
    assert_eq!(live.last_event_id(), Some(turn.events() as u64));
    assert_eq!(live.steps().len(), 1);
    assert_eq!(live.steps()[0].status, "completed");
    assert_eq!(live.steps()[0].commentary, "searching");
    assert_eq!(live.citations().len(), 1);
    assert_eq!(live.usage().unwrap().total_tokens, 120);
    assert_eq!(live.rollup().unwrap().n_steps, Some(1));
    let query = live.finish().await.unwrap();
    assert_eq!(query.answer_text(), turn.answer);
    assert_eq!(session.id().as_deref(), Some("sess_1"));
    assert!(!session.is_busy());

    let post = &server.requests()[0];
    assert_eq!(post.header("accept"), Some("text/event-stream"));
    assert_eq!(post.json()["stream"], true);
    assert_eq!(post.json()["scope"], serde_json::json!(["handbook"]));
    assert_eq!(server.count("POST", "/query"), 1);
    assert!(server.last_event_ids().is_empty());
}

#[tokio::test]
async fn line_endings_bom_comments_and_split_writes_change_nothing() {
    let turn = Turn::completed("q_2", "sess_2", DELTAS);
    let mut body = String::from(": welcome\nretry: 20\n");
    for (i, (_, f)) in turn.frames.iter().enumerate() {
        if i == 2 {
            // A multi-line data frame, an unknown event with extra fields, and a comment.
            body.push_str("id: 3\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\ndata: \"delta\":\"Travel \",\"extra\":{\"x\":1}}\n\n");
            body.push_str(": keep-alive\n\n");
            continue;
        }
        if i == 4 {
            body.push_str("event: response.sparkle\ndata: {\"shiny\":true}\n\n");
        }
        body.push_str(f);
    }
    for ending in ["\n", "\r\n", "\r"] {
        for bom in [false, true] {
            for split in [vec![1], vec![2, 7, 3], vec![4096]] {
                let mut wire = body.replace('\n', ending);
                if bom {
                    wire.insert(0, '\u{feff}');
                }
                let wire = wire.into_bytes();
                // Chunked, so the client's parser is fed exactly these pieces:
                // 1-byte pieces split the BOM and the multi-byte "✈️" of the
                // last delta, which a parser decoding each chunk as UTF-8 on
                // its own gets wrong.
                let server = SseServer::start(move |_, _| {
                    Reply::sse_chunked(vec![Step::WriteChunks(wire.clone(), split.clone())])
                })
                .await;
                let mut live = session(&server).ask("q").stream().await.unwrap();
                let (events, error) = drain(&mut live).await;
                let case = format!("ending {ending:?} bom {bom}");
                assert!(error.is_none(), "{case}: {error:?}");
                let mut expected = expected_names(&turn);
                expected.insert(4, "response.sparkle".into());
                assert_eq!(names(&events), expected, "{case}");
                assert_eq!(text(&events), turn.answer, "{case}");
                assert_eq!(
                    events[4],
                    QueryEvent::Unknown {
                        event: "response.sparkle".into(),
                        data: "{\"shiny\":true}".into()
                    }
                );
                assert_eq!(live.finish().await.unwrap().answer_text(), turn.answer);
            }
        }
    }
}

#[tokio::test]
async fn cut_after_frames_resumes_with_last_event_id_and_never_reposts() {
    let turn = Turn::completed("q_3", "sess_3", DELTAS);
    let server = serve_turn(
        &turn,
        |t| vec![Step::Write(t.first(4).into_bytes())],
        |t, _, l| replay(t, l),
    )
    .await;
    let mut live = session(&server)
        .ask("q")
        .stream_config(fast_resume())
        .stream()
        .await
        .unwrap();
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(names(&events), expected_names(&turn));
    assert_eq!(text(&events), turn.answer);
    assert_eq!(server.count("POST", "/query"), 1);
    assert_eq!(server.last_event_ids(), vec![Some("4".to_owned())]);
    assert_eq!(live.finish().await.unwrap().answer_text(), turn.answer);
}

#[tokio::test]
async fn resets_on_post_and_on_resume_are_both_resumed() {
    let turn = Turn::completed("q_4", "sess_4", DELTAS);
    let server = serve_turn(
        &turn,
        // A reset in the middle of the fourth frame.
        |t| {
            let mut bytes = t.first(3).into_bytes();
            bytes.extend_from_slice(&t.frames[3].1.as_bytes()[..10]);
            vec![Step::Write(bytes), Step::Reset]
        },
        |t, n, last| {
            if n == 0 {
                // Replays 3, sends 4 and 5, then resets.
                let upto: String = t
                    .frames
                    .iter()
                    .filter(|(id, _)| matches!(id, Some(i) if *i >= last.unwrap() && *i <= 5))
                    .map(|(_, f)| f.as_str())
                    .collect();
                Reply::sse(vec![Step::Write(upto.into_bytes()), Step::Reset])
            } else {
                replay(t, last)
            }
        },
    )
    .await;
    let mut live = session(&server)
        .ask("q")
        .stream_config(fast_resume())
        .stream()
        .await
        .unwrap();
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(names(&events), expected_names(&turn));
    assert_eq!(text(&events), turn.answer);
    assert_eq!(server.count("POST", "/query"), 1);
    assert_eq!(
        server.last_event_ids(),
        vec![Some("3".to_owned()), Some("5".to_owned())]
    );
}

#[tokio::test(start_paused = true)]
async fn resume_honours_503_retry_after_then_succeeds() {
    let turn = Turn::completed("q_5", "sess_5", DELTAS);
    let server = serve_turn(
        &turn,
        |t| vec![Step::Write(t.first(2).into_bytes())],
        |t, n, last| {
            if n == 0 {
                Reply::json(
                    503,
                    &["Retry-After: 3"],
                    &serde_json::json!({"message": "busy"}),
                )
            } else {
                replay(t, last)
            }
        },
    )
    .await;
    let started = tokio::time::Instant::now();
    let mut live = session(&server)
        .ask("q")
        .stream_config(fast_resume())
        .stream()
        .await
        .unwrap();
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(names(&events), expected_names(&turn));
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert_eq!(
        server.last_event_ids(),
        vec![Some("2".to_owned()), Some("2".to_owned())]
    );
    assert_eq!(server.count("POST", "/query"), 1);
}

#[tokio::test]
async fn resume_answered_404_finishes_from_the_stored_turn() {
    let turn = Turn::completed("q_6", "sess_6", DELTAS);
    let server = serve_turn(
        &turn,
        |t| vec![Step::Write(t.first(3).into_bytes())],
        |_, _, _| Reply::json(404, &[], &serde_json::json!({"message": "no such query"})),
    )
    .await;
    let session = session(&server);
    let mut live = session
        .ask("q")
        .stream_config(fast_resume())
        .stream()
        .await
        .unwrap();
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    // The delivered events, then the rest of the stored answer as one delta,
    // the terminal event and the stored Query: nothing across the gap.
    let mut expected = expected_names(&turn)[..3].to_vec();
    expected
        .extend(["response.output_text.delta", "response.completed", "query"].map(String::from));
    assert_eq!(names(&events), expected);
    assert_eq!(text(&events), turn.answer);
    assert_eq!(server.last_event_ids(), vec![Some("3".to_owned())]);
    assert_eq!(server.count("GET", "/queries/q_6"), 1);
    assert_eq!(server.count("POST", "/query"), 1);
    drop(live);
    assert!(!session.is_busy());
}

#[tokio::test]
async fn failed_turn_yields_turn_failed_after_the_events_before_it() {
    let q = "q_7";
    let body = [
        frame(
            Some(1),
            "response.created",
            &serde_json::json!({"query_id": q, "session_id": "s"}),
        ),
        frame(
            Some(2),
            "response.output_text.delta",
            &serde_json::json!({"query_id": q, "delta": "Par"}),
        ),
        frame(
            Some(3),
            "response.failed",
            &serde_json::json!({"query_id": q, "error": "the model failed"}),
        ),
        frame(
            None,
            "query",
            &sse_server::query_json(q, "s", "failed", "Par"),
        ),
    ]
    .concat();
    let server =
        SseServer::start(move |_, _| Reply::sse(vec![Step::Write(body.clone().into_bytes())]))
            .await;
    let mut live = session(&server).ask("q").stream().await.unwrap();
    let first = live.next().await.unwrap().unwrap();
    assert!(matches!(first, QueryEvent::Created { .. }));
    let second = live.next().await.unwrap().unwrap();
    assert_eq!(
        second,
        QueryEvent::TextDelta {
            delta: "Par".into()
        }
    );
    match live.next().await.unwrap() {
        Err(Error::TurnFailed {
            query_id, message, ..
        }) => {
            assert_eq!(query_id, q);
            assert_eq!(message, "the model failed");
        }
        other => panic!("{other:?}"),
    }
    match live.finish().await {
        Err(Error::TurnFailed { message, .. }) => assert_eq!(message, "the model failed"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn drop_before_created_is_a_stream_error_and_never_reposts() {
    let server = SseServer::start(|_, _| {
        Reply::sse(vec![Step::Write(
            b": hello\nretry: 5\n\nid: 1\nevent: response.cre".to_vec(),
        )])
    })
    .await;
    let session = session(&server);
    let mut live = session.ask("q").stream().await.unwrap();
    let (events, error) = drain(&mut live).await;
    assert!(events.is_empty());
    match error {
        Some(Error::Stream {
            query_id: None,
            message,
            ..
        }) => {
            assert!(message.contains("cannot be resumed"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    // `finish()` returning is the signal that the turn is over: nothing it
    // could still send is pending.
    assert!(matches!(live.finish().await, Err(Error::Stream { .. })));
    assert_eq!(server.count("POST", "/query"), 1);
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn idle_connection_is_resumed() {
    let turn = Turn::completed("q_8", "sess_8", DELTAS);
    let server = serve_turn(
        &turn,
        |t| vec![Step::Write(t.first(3).into_bytes()), Step::AwaitClose],
        |t, _, l| replay(t, l),
    )
    .await;
    let mut live = session(&server)
        .ask("q")
        .stream_config(fast_resume().idle_timeout(Some(Duration::from_millis(200))))
        .stream()
        .await
        .unwrap();
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(names(&events), expected_names(&turn));
    assert_eq!(server.last_event_ids(), vec![Some("3".to_owned())]);
    // The idle connection was closed by the client (waits for the server to
    // see it, with an end).
    server
        .wait_for("the close", |s| s.closed_by_client() >= 1)
        .await;
    assert_eq!(server.closed_by_client(), 1);
}

#[tokio::test]
async fn comments_keep_an_idle_stream_alive() {
    let turn = Turn::completed("q_9", "sess_9", DELTAS);
    let server = serve_turn(
        &turn,
        |t| {
            let mut steps = vec![Step::Write(t.first(2).into_bytes())];
            for _ in 0..6 {
                steps.push(Step::Sleep(Duration::from_millis(60)));
                steps.push(Step::Write(b": ping\n".to_vec()));
            }
            steps.push(Step::Write(t.replay_from(Some(3)).into_bytes()));
            steps
        },
        |t, _, l| replay(t, l),
    )
    .await;
    let mut live = session(&server)
        .ask("q")
        .stream_config(fast_resume().idle_timeout(Some(Duration::from_millis(150))))
        .stream()
        .await
        .unwrap();
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(names(&events), expected_names(&turn));
    assert!(server.last_event_ids().is_empty(), "no resume was needed");
}

#[tokio::test]
async fn stream_ending_after_the_terminal_event_fetches_the_query() {
    let turn = Turn::completed("q_10", "sess_10", DELTAS);
    let server = serve_turn(
        &turn,
        |t| vec![Step::Write(t.first(t.frames.len() - 1).into_bytes())],
        |t, _, l| replay(t, l),
    )
    .await;
    let live = session(&server).ask("q").stream().await.unwrap();
    let query = live.finish().await.unwrap();
    assert_eq!(query.answer_text(), turn.answer);
    assert_eq!(server.count("GET", "/queries/q_10"), 1);
    assert!(server.last_event_ids().is_empty());
}

#[tokio::test]
async fn oversized_frame_ends_the_stream_without_resuming() {
    let turn = Turn::completed("q_11", "sess_11", DELTAS);
    let big = "x".repeat(8192);
    let server = serve_turn(
        &turn,
        move |t| {
            let mut b = t.first(2);
            b.push_str(&frame(
                Some(3),
                "response.output_text.delta",
                &serde_json::json!({"delta": big}),
            ));
            vec![Step::Write(b.into_bytes())]
        },
        |t, _, l| replay(t, l),
    )
    .await;
    let mut live = session(&server)
        .ask("q")
        .stream_config(fast_resume().max_frame_bytes(4096))
        .stream()
        .await
        .unwrap();
    let (events, error) = drain(&mut live).await;
    assert_eq!(events.len(), 2);
    match error {
        Some(Error::Stream {
            query_id, message, ..
        }) => {
            assert_eq!(query_id.as_deref(), Some("q_11"));
            assert!(message.contains("4096"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(server.last_event_ids().is_empty());
}

#[tokio::test]
async fn invalid_utf8_ends_the_stream_with_an_error() {
    let turn = Turn::completed("q_12", "sess_12", DELTAS);
    let server = serve_turn(
        &turn,
        |t| {
            let mut b = t.first(1).into_bytes();
            b.extend_from_slice(
                b"id: 2\nevent: response.output_text.delta\ndata: {\"delta\":\"\xff\xfe\"}\n\n",
            );
            vec![Step::Write(b)]
        },
        |t, _, l| replay(t, l),
    )
    .await;
    let mut live = session(&server).ask("q").stream().await.unwrap();
    let (events, error) = drain(&mut live).await;
    assert_eq!(events.len(), 1);
    assert!(matches!(error, Some(Error::Stream { .. })), "{error:?}");
}

#[tokio::test]
async fn dropping_a_turn_closes_the_connection_and_frees_the_session() {
    let turn = Turn::completed("q_13", "sess_13", DELTAS);
    let server = serve_turn(
        &turn,
        |t| vec![Step::Write(t.first(2).into_bytes()), Step::AwaitClose],
        |t, _, l| replay(t, l),
    )
    .await;
    let session = session(&server);
    let mut live = session.ask("q").stream().await.unwrap();
    live.next().await.unwrap().unwrap();
    assert!(session.is_busy());
    // (Asking again here would consult the server, whose stored turn has
    // ended, and go ahead: tests/query/session.rs covers a held turn.)
    drop(live);
    assert!(!session.is_busy());
    server
        .wait_for("the close", |s| s.closed_by_client() >= 1)
        .await;
    assert_eq!(server.closed_by_client(), 1);
    assert_eq!(server.count("POST", "/query"), 1);
}

#[tokio::test]
async fn cancel_stops_the_turn_on_the_server() {
    let turn = Turn::completed("q_14", "sess_14", DELTAS);
    let t = turn.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(t.first(1).into_bytes()), Step::AwaitClose])
        } else if req.is("POST", "/queries/q_14/cancel") {
            Reply::json(
                200,
                &[],
                &sse_server::query_json("q_14", "sess_14", "cancelled", ""),
            )
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await;
    let live = session(&server).ask("q").stream().await.unwrap();
    let query = live.cancel().await.unwrap();
    assert_eq!(query.status, "cancelled");
    assert_eq!(server.count("POST", "/queries/q_14/cancel"), 1);
}

#[tokio::test]
async fn text_stream_yields_only_the_deltas() {
    let turn = Turn::completed("q_15", "sess_15", DELTAS);
    let server = serve_turn(
        &turn,
        |t| vec![Step::Write(t.body().into_bytes())],
        |t, _, l| replay(t, l),
    )
    .await;
    let mut deltas = session(&server)
        .ask("q")
        .stream()
        .await
        .unwrap()
        .text_stream();
    let mut got = Vec::new();
    while let Some(d) = deltas.next().await {
        got.push(d.unwrap());
    }
    assert_eq!(got, DELTAS);
    let query = deltas.into_inner().finish().await.unwrap();
    assert_eq!(query.answer_text(), turn.answer);
}

#[tokio::test]
async fn json_reads_output_json_of_a_streamed_turn() {
    let turn = Turn::completed("q_16", "sess_16", DELTAS);
    let server = serve_turn(
        &turn,
        |t| vec![Step::Write(t.body().into_bytes())],
        |t, _, l| replay(t, l),
    )
    .await;
    #[derive(serde::Deserialize)]
    struct Answer {
        answer: String,
    }
    let answer: Answer = session(&server)
        .ask("q")
        .stream()
        .await
        .unwrap()
        .finish()
        .await
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(answer.answer, turn.answer);
}

#[tokio::test]
async fn background_events_resume_exactly_once() {
    let turn = Turn::completed("q_17", "sess_17", DELTAS);
    let t = turn.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::json(
                202,
                &[],
                &sse_server::query_json(&t.query_id, &t.session_id, "in_progress", ""),
            )
        } else if req.method == "GET" && req.path == t.events_path() {
            match last_event_id(req) {
                // The first attach is cut after five frames.
                None => Reply::sse(vec![Step::Write(t.first(5).into_bytes()), Step::Reset]),
                last => replay(&t, last),
            }
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await;
    let session = session(&server);
    let handle = session
        .ask("q")
        .stream_config(fast_resume())
        .background()
        .await
        .unwrap();
    assert_eq!(handle.id(), "q_17");
    assert_eq!(session.id().as_deref(), Some("sess_17"));
    assert!(session.is_busy());
    let mut live = handle.events().await.unwrap();
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(names(&events), expected_names(&turn));
    assert_eq!(text(&events), turn.answer);
    assert_eq!(server.last_event_ids(), vec![None, Some("5".to_owned())]);
    assert_eq!(server.count("POST", "/query"), 1);
    assert!(server.requests()[0].json()["background"] == true);
    assert!(server.requests()[0].json().get("stream").is_none());
    assert!(!session.is_busy());
}

#[tokio::test]
async fn resume_gives_up_after_the_attempt_cap() {
    let turn = Turn::completed("q_18", "sess_18", DELTAS);
    let server = serve_turn(
        &turn,
        |t| vec![Step::Write(t.first(2).into_bytes())],
        // Every resume replays event 2 (the one asked for), nothing new, and closes.
        |t, _, _| Reply::sse(vec![Step::Write(t.frames[1].1.clone().into_bytes())]),
    )
    .await;
    let mut live = session(&server)
        .ask("q")
        .stream_config(fast_resume().reconnect_attempts(3))
        .stream()
        .await
        .unwrap();
    let (events, error) = drain(&mut live).await;
    assert_eq!(events.len(), 2);
    match error {
        Some(Error::Stream {
            query_id, message, ..
        }) => {
            assert_eq!(query_id.as_deref(), Some("q_18"));
            assert!(message.contains("gave up after 3"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.last_event_ids(), vec![Some("2".to_owned()); 3]);
}

#[test]
fn public_types_are_send_and_futures_are_static() {
    fn send<T: Send + 'static>(_: &T) {}
    fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<Session>();
    fn is_send<T: Send>() {}
    is_send::<QueryTurn>();
    is_send::<nexus_knowql::QueryHandle>();
    let client = nexus_knowql::Client::builder()
        .base_url("http://127.0.0.1:9")
        .build()
        .unwrap();
    let session = client.session(["x"]).build().unwrap();
    send(&session.ask("q").send());
    send(&session.ask("q").stream());
    send(&session.ask("q").background());
}
