//! End-to-end integrity of streamed turns against a scripted server that
//! bends the contract: jumping ids, early replays, a final Query that does
//! not match the deltas, keep-alives after the terminal event, failures
//! behind a gap. A turn yields exactly the final answer or an error.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::sse_server;
use crate::support::turns::{drain, text};
use futures::StreamExt;
use nexus_knowql::{CallOptions, Error, QueryEvent, QueryTurn, StreamConfig};
use sse_server::{Reply, SseServer, Step, Turn, frame, last_event_id, query_json};

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

fn stored(turn: &Turn, status: &str, answer: &str) -> Reply {
    Reply::json(
        200,
        &[],
        &query_json(&turn.query_id, &turn.session_id, status, answer),
    )
}

type Script = dyn Fn(&Turn, usize, Option<u64>) -> Reply + Send + Sync;

/// A server for `turn`: the POST answers with `post`, the `n`th events
/// request with `resume(turn, n, Last-Event-ID)`, `GET /queries/{id}` with
/// `get`.
async fn serve(turn: &Turn, post: Reply, resume: Arc<Script>, get: Reply) -> SseServer {
    let t = turn.clone();
    let resumes = AtomicUsize::new(0);
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            post.clone()
        } else if req.method == "GET" && req.path == t.events_path() {
            let n = resumes.fetch_add(1, Ordering::SeqCst);
            resume(&t, n, last_event_id(req))
        } else if req.is("GET", &format!("/queries/{}", t.query_id)) {
            get.clone()
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await
}

fn faithful_replay() -> Arc<Script> {
    Arc::new(|t, _, l| Reply::sse(vec![Step::Write(t.replay_from(l).into_bytes())]))
}

async fn stream(server: &SseServer) -> QueryTurn {
    server
        .client()
        .session(["handbook"])
        .build()
        .unwrap()
        .ask("Who approves travel?")
        .stream_config(config())
        .stream()
        .await
        .unwrap()
}

/// A jump in the ids on the live stream is resumed at once from the last
/// delivered event, whether the connection then goes on to the terminal
/// event or stays open and silent: the idle timeout is a minute, so only an
/// immediate resume finishes the turn in time. The text is exact, and the
/// missing events come from the event log, not the stored turn.
#[tokio::test]
async fn a_jump_in_the_live_stream_resumes_at_once_and_the_text_is_exact() {
    let turn = Turn::completed("q_j1", "s_j1", DELTAS);
    // After events 1 to 4, either 7 to 9 and the `query` frame (two deltas
    // never come), or only 6 (one delta never comes) and then silence.
    for after_the_jump in [frames(&turn, 7, 9, true), frames(&turn, 6, 6, false)] {
        let post = format!("{}{after_the_jump}", frames(&turn, 1, 4, false));
        let server = serve(
            &turn,
            Reply::sse(vec![Step::Write(post.into_bytes()), Step::AwaitClose]),
            faithful_replay(),
            stored(&turn, "completed", &turn.answer),
        )
        .await;
        let mut live = server
            .client()
            .session(["handbook"])
            .build()
            .unwrap()
            .ask("Who approves travel?")
            .stream_config(config().idle_timeout(Some(Duration::from_secs(60))))
            .stream()
            .await
            .unwrap();
        let (events, error) = tokio::time::timeout(Duration::from_secs(15), drain(&mut live))
            .await
            .expect("the jump is resumed at once, not after the connection goes idle");
        assert!(error.is_none(), "{error:?}");
        assert_eq!(text(&events), turn.answer);
        assert_eq!(live.text(), turn.answer);
        assert_eq!(server.last_event_ids(), vec![Some("4".to_owned())]);
        assert_eq!(server.count("POST", "/query"), 1);
        // The missing events came from the log, not from the stored turn.
        assert_eq!(server.count("GET", "/queries/q_j1"), 0);
        assert_eq!(live.finish().await.unwrap().answer_text(), turn.answer);
    }
}

#[tokio::test]
async fn a_replay_that_jumps_after_its_first_frame_is_reconciled_from_the_final_query() {
    let turn = Turn::completed("q_j2", "s_j2", DELTAS);
    // The POST is cut after event 3; every replay starts right at the id
    // sent and then skips events 5 and 6.
    let replay: Arc<Script> = Arc::new(|t, _, l| {
        let from = l.unwrap_or(0);
        let body = format!("{}{}", frames(t, from, 4, false), frames(t, 7, 9, true));
        Reply::sse(vec![Step::Write(body.into_bytes())])
    });
    let server = serve(
        &turn,
        Reply::sse(vec![
            Step::Write(frames(&turn, 1, 3, false).into_bytes()),
            Step::Reset,
        ]),
        replay,
        stored(&turn, "completed", &turn.answer),
    )
    .await;
    let mut live = stream(&server).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), turn.answer);
    assert_eq!(server.count("POST", "/query"), 1);
    assert!(server.count("GET", "/queries/q_j2") >= 1);
    assert_eq!(live.finish().await.unwrap().answer_text(), turn.answer);
}

#[tokio::test]
async fn a_final_query_that_contradicts_the_deltas_is_an_error_never_ok() {
    let turn = Turn::completed("q_m1", "s_m1", DELTAS);
    let mut body = frames(&turn, 1, 9, false);
    body.push_str(&frame(
        None,
        "query",
        &query_json(
            "q_m1",
            "s_m1",
            "completed",
            "Travel is approved by the CFO.",
        ),
    ));
    let server = serve(
        &turn,
        Reply::sse(vec![Step::Write(body.into_bytes())]),
        faithful_replay(),
        stored(&turn, "completed", "Travel is approved by the CFO."),
    )
    .await;
    let mut live = stream(&server).await;
    let (_, error) = drain(&mut live).await;
    match error {
        Some(Error::AnswerMismatch {
            query_id,
            delivered_len,
            final_len,
            first_difference,
            ..
        }) => {
            assert_eq!(query_id, "q_m1");
            assert_eq!(delivered_len, turn.answer.len() as u64);
            assert_eq!(final_len, 30);
            assert_eq!(first_difference, "Travel is approved by ".len() as u64);
        }
        other => panic!("{other:?}"),
    }
    let e = live.finish().await.unwrap_err();
    assert!(matches!(e, Error::AnswerMismatch { .. }), "{e}");
    assert!(!e.is_retryable());
    assert_eq!(e.query_id(), Some("q_m1"));
}

#[tokio::test]
async fn a_final_answer_that_goes_on_is_delivered_as_one_last_delta() {
    let turn = Turn::completed("q_m2", "s_m2", DELTAS);
    let longer = format!("{} Then finance.", turn.answer);
    let mut body = frames(&turn, 1, 9, false);
    body.push_str(&frame(
        None,
        "query",
        &query_json("q_m2", "s_m2", "completed", &longer),
    ));
    let server = serve(
        &turn,
        Reply::sse(vec![Step::Write(body.into_bytes())]),
        faithful_replay(),
        stored(&turn, "completed", &longer),
    )
    .await;
    let mut live = stream(&server).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), longer);
    assert!(matches!(
        &events[events.len() - 2],
        QueryEvent::TextDelta { delta } if delta == " Then finance."
    ));
    assert!(matches!(events.last(), Some(QueryEvent::Query(_))));
    assert_eq!(live.text(), longer);
    assert_eq!(live.finish().await.unwrap().answer_text(), longer);
}

#[tokio::test]
async fn keep_alives_after_the_terminal_event_end_with_the_stored_turn_within_seconds() {
    let turn = Turn::completed("q_k1", "s_k1", DELTAS);
    let mut steps = vec![Step::Write(frames(&turn, 1, 9, false).into_bytes())];
    for _ in 0..600 {
        steps.push(Step::Sleep(Duration::from_millis(100)));
        steps.push(Step::Write(b": keep-alive\n\n".to_vec()));
    }
    let server = serve(
        &turn,
        Reply::sse(steps),
        faithful_replay(),
        stored(&turn, "completed", &turn.answer),
    )
    .await;
    let live = stream(&server).await;
    let query = tokio::time::timeout(Duration::from_secs(10), live.finish())
        .await
        .expect("the turn ended within seconds")
        .unwrap();
    assert_eq!(query.answer_text(), turn.answer);
    assert_eq!(server.count("GET", "/queries/q_k1"), 1);
}

#[tokio::test]
async fn keep_alives_do_not_extend_the_turn_timeout() {
    let turn = Turn::completed("q_k2", "s_k2", DELTAS);
    let mut steps = vec![Step::Write(frames(&turn, 1, 3, false).into_bytes())];
    for _ in 0..600 {
        steps.push(Step::Sleep(Duration::from_millis(50)));
        steps.push(Step::Write(b": keep-alive\n\n".to_vec()));
    }
    let server = serve(
        &turn,
        Reply::sse(steps),
        faithful_replay(),
        stored(&turn, "in_progress", ""),
    )
    .await;
    let live = server
        .client()
        .with_options(CallOptions::new().turn_timeout(Duration::from_millis(800)))
        .session(["handbook"])
        .build()
        .unwrap()
        .ask("q")
        .stream_config(config())
        .stream()
        .await
        .unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), live.finish())
        .await
        .expect("the turn timeout ended the turn")
        .unwrap_err();
    match &e {
        Error::Timeout { operation, .. } => assert_eq!(*operation, "query_turn"),
        other => panic!("{other:?}"),
    }
    assert!(!e.is_retryable(), "a timed-out turn may still run");
    assert_eq!(server.count("POST", "/query"), 1);
}

#[tokio::test]
async fn an_early_replay_is_deduplicated_and_the_turn_keeps_streaming_live() {
    let turn = Turn::completed("q_e1", "s_e1", DELTAS);
    // The POST is cut after event 5; the replay starts at event 2 (it still
    // holds everything) and then streams the rest slowly.
    let replay: Arc<Script> = Arc::new(|t, _, _| {
        let mut steps = vec![Step::Write(frames(t, 2, 5, false).into_bytes())];
        for id in 6..=9 {
            steps.push(Step::Sleep(Duration::from_millis(20)));
            steps.push(Step::Write(frames(t, id, id, false).into_bytes()));
        }
        steps.push(Step::Write(frames(t, 10, 10, true).into_bytes()));
        Reply::sse(steps)
    });
    let server = serve(
        &turn,
        Reply::sse(vec![
            Step::Write(frames(&turn, 1, 5, false).into_bytes()),
            Step::Reset,
        ]),
        replay,
        stored(&turn, "completed", &turn.answer),
    )
    .await;
    let mut live = stream(&server).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    // Every delta arrived on its own (live), none from the stored turn.
    let deltas: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            QueryEvent::TextDelta { delta } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, DELTAS);
    assert_eq!(server.count("GET", "/queries/q_e1"), 0);
    assert_eq!(server.last_event_ids(), vec![Some("5".to_owned())]);
    assert_eq!(live.finish().await.unwrap().answer_text(), turn.answer);
}

#[tokio::test]
async fn frames_without_an_id_are_not_delivered_again_after_a_resume() {
    let turn = Turn::completed("q_n1", "s_n1", DELTAS);
    // An id-less notice after event 3, before and after the cut.
    let notice = "event: response.notice\ndata: {\"note\":\"warming up\"}\n\n";
    let with_notice = |from: u64| {
        let mut s = frames(&turn, from, 3, false);
        s.push_str(notice);
        s
    };
    let post = with_notice(1);
    let t2 = turn.clone();
    let replay: Arc<Script> = Arc::new(move |t, _, l| {
        let from = l.unwrap_or(0);
        let mut s = frames(t, from, 3, false);
        s.push_str(notice);
        s.push_str(&frames(&t2, 4, 9, true));
        Reply::sse(vec![Step::Write(s.into_bytes())])
    });
    let server = serve(
        &turn,
        Reply::sse(vec![Step::Write(post.into_bytes()), Step::Reset]),
        replay,
        stored(&turn, "completed", &turn.answer),
    )
    .await;
    let mut live = stream(&server).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    let notices = events
        .iter()
        .filter(|e| matches!(e, QueryEvent::Unknown { event, .. } if event == "response.notice"))
        .count();
    assert_eq!(notices, 1);
    assert_eq!(text(&events), turn.answer);
    assert_eq!(server.last_event_ids(), vec![Some("3".to_owned())]);
}

#[tokio::test]
async fn a_failed_turn_behind_a_gap_reports_the_servers_failure() {
    let turn = Turn::completed("q_f1", "s_f1", DELTAS);
    // The replay skips to event 7: the stored turn failed.
    let replay: Arc<Script> =
        Arc::new(|t, _, _| Reply::sse(vec![Step::Write(frames(t, 7, 8, false).into_bytes())]));
    let server = serve(
        &turn,
        Reply::sse(vec![
            Step::Write(frames(&turn, 1, 4, false).into_bytes()),
            Step::Reset,
        ]),
        replay,
        stored(&turn, "failed", "Travel is"),
    )
    .await;
    let live = stream(&server).await;
    match live.finish().await {
        Err(Error::TurnFailed {
            query_id, message, ..
        }) => {
            assert_eq!(query_id, "q_f1");
            assert_eq!(message, "the model failed");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn detach_after_a_failed_terminal_event_reports_failed() {
    let turn = Turn::completed("q_d1", "s_d1", DELTAS);
    let mut body = frames(&turn, 1, 4, false);
    body.push_str(&frame(
        Some(5),
        "response.failed",
        &serde_json::json!({"type": "response.failed", "query_id": "q_d1", "error": "boom"}),
    ));
    let server = serve(
        &turn,
        Reply::sse(vec![Step::Write(body.into_bytes()), Step::AwaitClose]),
        faithful_replay(),
        stored(&turn, "failed", "Travel "),
    )
    .await;
    let mut live = stream(&server).await;
    loop {
        match live.next().await {
            Some(Err(Error::TurnFailed { .. })) => break,
            Some(_) => {}
            None => panic!("no failure"),
        }
    }
    let handle = live.detach();
    assert_eq!(handle.last_seen().status, "failed");
}

#[tokio::test]
async fn after_a_reconciled_gap_the_checkpoint_is_the_end_of_the_turn() {
    let turn = Turn::completed("q_c1", "s_c1", DELTAS);
    // The replay after the cut skips to event 6: the stored turn fills in.
    let replay: Arc<Script> =
        Arc::new(|t, _, _| Reply::sse(vec![Step::Write(frames(t, 6, 9, true).into_bytes())]));
    let server = serve(
        &turn,
        Reply::sse(vec![
            Step::Write(frames(&turn, 1, 3, false).into_bytes()),
            Step::Reset,
        ]),
        replay,
        stored(&turn, "completed", &turn.answer),
    )
    .await;
    let mut live = stream(&server).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), turn.answer);
    assert_eq!(live.last_event_id(), Some(nexus_knowql::query::END_OF_TURN));
    let checkpoint = live.checkpoint().unwrap();
    assert_eq!(checkpoint.event_id, nexus_knowql::query::END_OF_TURN);
    assert_eq!(checkpoint.text_len, turn.answer.len() as u64);
    let events_before = server.last_event_ids().len();

    // Continuing from it repeats no text and reads no events.
    let client = server.client();
    let handle = client.queries().attach("q_c1").await.unwrap();
    let mut rest = handle.resume_from(&checkpoint).await.unwrap();
    let (events, error) = drain(&mut rest).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), "");
    assert_eq!(server.last_event_ids().len(), events_before);
}

#[tokio::test]
async fn a_persisted_checkpoint_lets_another_process_finish_across_a_broken_replay() {
    let turn = Turn::completed("q_c2", "s_c2", DELTAS);
    // Every replay skips to event 6 (the log lost event 5).
    let replay: Arc<Script> =
        Arc::new(|t, _, _| Reply::sse(vec![Step::Write(frames(t, 6, 9, true).into_bytes())]));
    let server = serve(
        &turn,
        Reply::sse(vec![Step::Write(turn.body().into_bytes())]),
        replay,
        stored(&turn, "completed", &turn.answer),
    )
    .await;
    // What a worker persisted after event 4 ("Travel is approved ").
    let before = "Travel is approved ";
    let saved = nexus_knowql::query::Checkpoint::after_text("q_c2", 4, before).to_string();
    let checkpoint: nexus_knowql::query::Checkpoint = saved.parse().unwrap();
    let client = server.client();
    let mut rest = client
        .queries()
        .attach("q_c2")
        .await
        .unwrap()
        .resume_from(&checkpoint)
        .await
        .unwrap();
    let (events, error) = drain(&mut rest).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(format!("{before}{}", text(&events)), turn.answer);
    assert_eq!(rest.finish().await.unwrap().answer_text(), turn.answer);
}

#[tokio::test]
async fn a_json_answer_to_stream_keeps_the_turn_and_its_id() {
    let turn = Turn::completed("q_js", "s_js", DELTAS);
    let server = serve(
        &turn,
        stored(&turn, "completed", &turn.answer),
        faithful_replay(),
        stored(&turn, "completed", &turn.answer),
    )
    .await;
    let mut live = stream(&server).await;
    assert_eq!(live.query_id(), Some("q_js"));
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), turn.answer);
    assert_eq!(live.session_id(), Some("s_js"));
    assert_eq!(live.finish().await.unwrap().answer_text(), turn.answer);
    assert_eq!(server.count("POST", "/query"), 1);
}
