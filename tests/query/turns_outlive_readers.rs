//! Turns that outlive their reader: attach by id, continue after a
//! checkpoint, detach, a busy session, cancel on drop, and `send()` across a
//! cut connection. Scripted servers that really stream, cut and replay.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::props::regressions_beside_source;
use crate::support::sse_server;
use crate::support::turns::text;
use futures::StreamExt;
use nexus_knowql::{Error, QueryEvent, QueryTurn, StreamConfig, WaitPolicy, WhenBusy};
use proptest::prelude::*;
use sse_server::{Reply, SseServer, Step, Turn, last_event_id, query_json};

/// Events as the caller saw them, each with the checkpoint after it.
type Delivered = Vec<(Option<u64>, QueryEvent)>;

const DELTAS: &[&str] = &["Travel ", "is approved ", "by your ", "manager."];

fn fast() -> StreamConfig {
    StreamConfig::default()
        .reconnect_delay(Duration::from_millis(1), Duration::from_millis(5))
        .reconnect_attempts(20)
}

async fn drain(turn: &mut QueryTurn) -> (Delivered, Option<Error>) {
    let mut events = Vec::new();
    let mut error = None;
    while let Some(item) = turn.next().await {
        match item {
            Ok(e) => events.push((turn.last_event_id(), e)),
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    (events, error)
}

/// Every event of the uncut stream, with its id (`None` for the `query`
/// frame), read from the script's own frames rather than through the SSE
/// parser under test: a framing bug (a lost event name, id or frame) shows
/// up as a difference instead of being expected.
/// The checkpoint after event `k` of `turn`: the text up to it.
fn checkpoint_of(turn: &Turn, k: u64) -> nexus_knowql::query::Checkpoint {
    let text: String = turn
        .frames
        .iter()
        .filter(|(id, _)| id.is_some_and(|id| id <= k))
        .filter_map(|(_, f)| {
            let data = f.lines().find_map(|l| l.strip_prefix("data: "))?;
            let v: serde_json::Value = serde_json::from_str(data).ok()?;
            Some(v.get("delta")?.as_str()?.to_owned())
        })
        .collect();
    nexus_knowql::query::Checkpoint::after_text(turn.query_id.clone(), k, &text)
}

fn uncut(turn: &Turn) -> Delivered {
    turn.frames
        .iter()
        .map(|(id, f)| {
            let field = |name: &str| f.lines().find_map(|l| l.strip_prefix(name)).unwrap();
            (*id, QueryEvent::decode(field("event: "), field("data: ")))
        })
        .collect()
}

/// A server for `turn`: `POST /query` streams `post`, `GET /queries/{id}`
/// answers `status`, the events endpoint replays inclusively from
/// `Last-Event-ID`, and cancel answers `cancelled`.
async fn serve(
    turn: &Turn,
    status: &'static str,
    post: impl Fn(&Turn) -> Vec<Step> + Send + Sync + 'static,
) -> SseServer {
    let t = turn.clone();
    SseServer::start(move |req, _| {
        let q = &t.query_id;
        if req.is("POST", "/query") {
            Reply::sse(post(&t))
        } else if req.is("GET", &t.events_path()) {
            Reply::sse(vec![Step::Write(
                t.replay_from(last_event_id(req)).into_bytes(),
            )])
        } else if req.is("GET", &format!("/queries/{q}")) {
            let answer = if status == "completed" { &t.answer } else { "" };
            Reply::json(200, &[], &query_json(q, &t.session_id, status, answer))
        } else if req.is("POST", &format!("/queries/{q}/cancel")) {
            Reply::json(200, &[], &query_json(q, &t.session_id, "cancelled", ""))
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await
}

#[tokio::test]
async fn attach_learns_the_turn_and_resume_from_a_checkpoint_deliver_the_rest() {
    let turn = Turn::completed("q_a", "sess_a", DELTAS);
    let server = serve(&turn, "in_progress", |t| vec![Step::Write(t.body().into())]).await;
    // A client that did not start the turn.
    let other = server.client();
    let handle = other.queries().attach("q_a").await.unwrap();
    assert_eq!(handle.id(), "q_a");
    assert_eq!(handle.session_id(), "sess_a");
    assert_eq!(handle.last_seen().status, "in_progress");
    let mut rest = handle.resume_from(&checkpoint_of(&turn, 4)).await.unwrap();
    assert_eq!(rest.last_event_id(), Some(4));
    let (events, error) = drain(&mut rest).await;
    assert!(error.is_none(), "{error:?}");
    let expected: Vec<_> = uncut(&turn)
        .into_iter()
        .filter(|(id, _)| id.is_none_or(|id| id > 4))
        .collect();
    let got: Vec<_> = events.iter().map(|(_, e)| e.clone()).collect();
    let want: Vec<_> = expected.iter().map(|(_, e)| e.clone()).collect();
    assert_eq!(got, want);
    assert_eq!(rest.session_id(), Some("sess_a"));
    let query = rest.finish().await.unwrap();
    assert_eq!(query.answer_text(), turn.answer);
    assert_eq!(server.last_event_ids(), vec![Some("4".to_owned())]);
    assert_eq!(server.count("POST", "/query"), 0);
}

#[tokio::test]
async fn a_checkpoint_at_zero_reads_from_the_start() {
    let turn = Turn::completed("q_z", "sess_z", DELTAS);
    let server = serve(&turn, "in_progress", |t| vec![Step::Write(t.body().into())]).await;
    let handle = server.client().queries().attach("q_z").await.unwrap();
    let mut all = handle.resume_from(&checkpoint_of(&turn, 0)).await.unwrap();
    let (events, error) = drain(&mut all).await;
    assert!(error.is_none());
    assert_eq!(events.len(), uncut(&turn).len());
    assert_eq!(server.last_event_ids(), vec![None]);
}

#[tokio::test]
async fn a_replay_that_skips_past_the_checkpoint_is_made_up_for_by_the_stored_turn() {
    let turn = Turn::completed("q_g", "sess_g", DELTAS);
    let t = turn.clone();
    let polls = Arc::new(AtomicUsize::new(0));
    let p = polls.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("GET", "/queries/q_g") {
            // Running when attached, completed when the gap is checked.
            let status = if p.fetch_add(1, Ordering::SeqCst) == 0 {
                "in_progress"
            } else {
                "completed"
            };
            Reply::json(200, &[], &query_json("q_g", "sess_g", status, &t.answer))
        } else {
            // A trimmed buffer: the replay starts two events late.
            let from = last_event_id(req).unwrap_or(0) + 2;
            Reply::sse(vec![Step::Write(t.replay_from(Some(from)).into_bytes())])
        }
    })
    .await;
    let handle = server.client().queries().attach("q_g").await.unwrap();
    let checkpoint = checkpoint_of(&turn, 3);
    let mut rest = handle
        .stream_config(fast())
        .resume_from(&checkpoint)
        .await
        .unwrap();
    let (events, error) = drain(&mut rest).await;
    assert!(error.is_none(), "{error:?}");
    // Nothing after the gap comes from the events: the rest of the stored
    // answer after the checkpoint's text, as one delta.
    let rest_text: String = events
        .iter()
        .filter_map(|(_, e)| match e {
            QueryEvent::TextDelta { delta } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(rest_text, turn.answer[checkpoint.text_len as usize..]);
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(server.last_event_ids(), vec![Some("3".to_owned())]);
}

#[tokio::test]
async fn attach_to_an_unknown_turn_is_not_found() {
    let turn = Turn::completed("q_k", "sess_k", DELTAS);
    let server = serve(&turn, "in_progress", |_| Vec::new()).await;
    let e = server
        .client()
        .queries()
        .attach("q_missing")
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e:?}");
}

/// Checkpoint `k` of a turn, then a fresh client continues from it while
/// the replay connections are cut at `cuts`. Returns (delivered, the
/// `Last-Event-ID`s sent).
fn continue_from(turn: &Turn, k: u64, cuts: Vec<usize>) -> (Delivered, Vec<Option<String>>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let turn = turn.clone();
    rt.block_on(async move {
        let connection = Arc::new(AtomicUsize::new(0));
        let t = turn.clone();
        let server = SseServer::start(move |req, _| {
            if req.is("GET", &format!("/queries/{}", t.query_id)) {
                return Reply::json(
                    200,
                    &[],
                    &query_json(&t.query_id, &t.session_id, "completed", &t.answer),
                );
            }
            let body = t.replay_from(last_event_id(req)).into_bytes();
            let n = connection.fetch_add(1, Ordering::SeqCst);
            match cuts.get(n) {
                Some(&c) => Reply::sse(vec![
                    Step::Write(body[..c.min(body.len())].to_vec()),
                    Step::Reset,
                ]),
                None => Reply::sse(vec![Step::Write(body)]),
            }
        })
        .await;
        let handle = server
            .client()
            .queries()
            .attach(&turn.query_id)
            .await
            .unwrap();
        let mut rest = handle
            .stream_config(fast())
            .resume_from(&checkpoint_of(&turn, k))
            .await
            .unwrap();
        let (events, error) = drain(&mut rest).await;
        assert!(error.is_none(), "{error:?}");
        // The whole stored Query, whether its frame came or (cut after the
        // terminal event) it was fetched.
        let query = rest.finish().await.unwrap();
        assert_eq!(query.answer_text(), turn.answer);
        (events, server.last_event_ids())
    })
}

proptest! {
    // 48 cases unless `PROPTEST_CASES` says otherwise.
    #![proptest_config(regressions_beside_source(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48)
    )))]

    /// Whatever checkpoint a worker stored and wherever the continuing
    /// connections are cut, it receives exactly the events after the
    /// checkpoint, each once, in order.
    #[test]
    fn resume_from_any_checkpoint_delivers_exactly_the_rest(
        n_deltas in 1usize..8,
        k_frac in 0.0f64..=1.0,
        cuts in proptest::collection::vec(0usize..600, 0..3),
    ) {
        let deltas: Vec<String> = (0..n_deltas).map(|i| format!("d{i} ")).collect();
        let refs: Vec<&str> = deltas.iter().map(String::as_str).collect();
        let turn = Turn::completed("q_p", "sess_p", &refs);
        let k = (k_frac * turn.events() as f64).floor() as u64;
        let (events, ids) = continue_from(&turn, k, cuts.clone());
        let expected: Vec<_> = uncut(&turn)
            .into_iter()
            .filter(|(id, _)| id.is_none_or(|id| id > k))
            .collect();
        // A cut after the terminal event needs no resume: the final Query
        // then comes from `finish()` instead of its frame.
        let progress = |e: &&QueryEvent| !matches!(e, QueryEvent::Query(_));
        let got: Vec<_> = events.iter().map(|(_, e)| e).filter(progress).cloned().collect();
        let want: Vec<_> = expected.iter().map(|(_, e)| e).filter(progress).cloned().collect();
        prop_assert_eq!(&got, &want);
        // The same, against the script's own JSON (no decoding by the crate):
        // the names and every delta's exact text. Catches a decoding bug that
        // the expectation above would share, such as trimmed deltas.
        let script: Vec<(String, Option<String>)> = turn
            .frames
            .iter()
            .filter(|(id, _)| id.is_some_and(|id| id > k))
            .map(|(_, f)| {
                let field = |name: &str| f.lines().find_map(|l| l.strip_prefix(name)).unwrap();
                let data: serde_json::Value = serde_json::from_str(field("data: ")).unwrap();
                let delta = data.get("delta").and_then(|d| d.as_str()).map(str::to_owned);
                (field("event: ").to_owned(), delta)
            })
            .collect();
        let seen: Vec<(String, Option<String>)> = got
            .iter()
            .map(|e| match e {
                QueryEvent::TextDelta { delta } => (e.name().to_owned(), Some(delta.clone())),
                _ => (e.name().to_owned(), None),
            })
            .collect();
        prop_assert_eq!(seen, script);
        // Each delivered event moved the checkpoint to its own id.
        let got_ids: Vec<u64> = events.iter().filter_map(|(id, _)| *id).collect();
        prop_assert!(got_ids.windows(2).all(|w| w[0] <= w[1]));
        // The first request asked from the checkpoint; none went backwards.
        let first = if k == 0 { None } else { Some(k.to_string()) };
        prop_assert_eq!(ids.first().cloned().flatten(), first);
        let sent: Vec<u64> = ids.iter().flatten().map(|v| v.parse().unwrap()).collect();
        prop_assert!(sent.windows(2).all(|w| w[0] <= w[1]));
        prop_assert!(sent.iter().all(|&s| s >= k));
    }
}

#[tokio::test]
async fn detach_keeps_the_turn_and_its_checkpoint() {
    let turn = Turn::completed("q_d", "sess_d", DELTAS);
    let server = serve(&turn, "in_progress", |t| {
        vec![Step::Write(t.first(4).into_bytes()), Step::AwaitClose]
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let mut live = session
        .ask("q")
        .stream_config(fast())
        .stream()
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(live.next().await.unwrap().unwrap());
    }
    let checkpoint = live.checkpoint().unwrap();
    assert_eq!(checkpoint.event_id, 4);
    let handle = live.detach();
    assert_eq!(handle.id(), "q_d");
    assert_eq!(handle.session_id(), "sess_d");
    assert_eq!(handle.last_seen().status, "in_progress");
    // The session counts the detached turn as in flight.
    assert!(session.is_busy());
    let e = session.ask("meanwhile").send().await.unwrap_err();
    assert!(
        matches!(&e, Error::SessionBusy { query_id, .. } if query_id == "q_d"),
        "{e:?}"
    );
    assert!(e.is_conflict());
    let mut rest = handle.resume_from(&checkpoint).await.unwrap();
    let (events, error) = drain(&mut rest).await;
    assert!(error.is_none());
    seen.extend(events.into_iter().map(|(_, e)| e));
    assert_eq!(text(&seen), turn.answer);
    assert_eq!(seen.len(), uncut(&turn).len());
    assert!(!session.is_busy());
    assert_eq!(server.count("POST", "/query"), 1);
    // Detaching never cancels.
    assert_eq!(server.count("POST", "/queries/q_d/cancel"), 0);
}

#[tokio::test]
async fn a_dropped_running_turn_makes_the_next_ask_session_busy_not_a_409() {
    let turn = Turn::completed("q_b", "sess_b", DELTAS);
    let server = serve(&turn, "in_progress", |t| {
        vec![Step::Write(t.first(3).into_bytes()), Step::AwaitClose]
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let mut live = session.ask("first").stream().await.unwrap();
    live.next().await.unwrap().unwrap();
    drop(live);
    assert!(!session.is_busy());
    assert_eq!(session.unfinished_query_id().as_deref(), Some("q_b"));
    for ask in [
        session.ask("second").send().await.unwrap_err(),
        session.ask("second").stream().await.unwrap_err(),
        session.ask("second").background().await.unwrap_err(),
    ] {
        match &ask {
            Error::SessionBusy { query_id, .. } => assert_eq!(query_id, "q_b"),
            other => panic!("{other:?}"),
        }
        assert!(ask.is_conflict());
        assert!(ask.to_string().contains("q_b"));
    }
    // Nothing more was sent: the server was only asked about the old turn.
    assert_eq!(server.count("POST", "/query"), 1);
    assert_eq!(server.count("GET", "/queries/q_b"), 3);
    // A wait that runs out ends the same way.
    let e = session
        .ask("second")
        .turn_timeout(Duration::from_millis(400))
        .when_busy(WhenBusy::Wait(
            WaitPolicy::default().interval(Duration::from_millis(5), Duration::from_millis(10)),
        ))
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::SessionBusy { query_id, .. } if query_id == "q_b"),
        "{e:?}"
    );
    assert!(server.count("GET", "/queries/q_b") > 4);
    assert_eq!(server.count("POST", "/query"), 1);
}

#[tokio::test]
async fn a_busy_session_waits_when_told_to_and_then_asks() {
    let turn = Turn::completed("q_w", "sess_w", DELTAS);
    let second = Turn::completed("q_w2", "sess_w", DELTAS);
    let polls = Arc::new(AtomicUsize::new(0));
    let (t, t2, p) = (turn.clone(), second.clone(), polls.clone());
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            if req.json()["session_id"] == "sess_w" {
                Reply::sse(vec![Step::Write(t2.body().into_bytes())])
            } else {
                Reply::sse(vec![Step::Write(t.first(3).into_bytes()), Step::AwaitClose])
            }
        } else if req.is("GET", "/queries/q_w") {
            // Running for two polls, then completed.
            let status = if p.fetch_add(1, Ordering::SeqCst) < 2 {
                "in_progress"
            } else {
                "completed"
            };
            Reply::json(200, &[], &query_json("q_w", "sess_w", status, ""))
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await;
    let session = server
        .client()
        .session(["docs"])
        .when_busy(WhenBusy::Wait(
            WaitPolicy::default().interval(Duration::from_millis(5), Duration::from_millis(10)),
        ))
        .build()
        .unwrap();
    let mut live = session.ask("first").stream().await.unwrap();
    live.next().await.unwrap().unwrap();
    drop(live);
    let query = session.ask("second").send().await.unwrap();
    assert_eq!(query.id, "q_w2");
    assert_eq!(query.answer_text(), second.answer);
    assert!(polls.load(Ordering::SeqCst) >= 3);
    assert_eq!(server.count("POST", "/query"), 2);
    assert_eq!(session.unfinished_query_id(), None);
}

#[tokio::test]
async fn a_409_from_a_turn_started_elsewhere_is_session_busy() {
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::json(
                409,
                &[],
                &serde_json::json!({"message": "session busy", "code": "conflict"}),
            )
        } else if req.is("GET", "/sessions/sess_o") {
            let mut done = query_json("q_old", "sess_o", "completed", "x");
            let running = query_json("q_run", "sess_o", "in_progress", "");
            done["id"] = "q_old".into();
            Reply::json(
                200,
                &[],
                &serde_json::json!({
                    "id": "sess_o", "project_id": "p", "created_by": "u", "scope": ["docs"],
                    "models": [], "tools": [], "created_at": "2026-07-01T00:00:00Z",
                    "updated_at": "2026-07-01T00:00:00Z", "queries": [done, running]
                }),
            )
        } else if req.is("GET", "/queries/q_run") {
            Reply::json(200, &[], &query_json("q_run", "sess_o", "in_progress", ""))
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
        }
    })
    .await;
    let session = server.client().continue_session("sess_o");
    let e = session.ask("q").send().await.unwrap_err();
    assert!(
        matches!(&e, Error::SessionBusy { query_id, .. } if query_id == "q_run"),
        "{e:?}"
    );
    // The session now remembers the running turn: no second POST.
    let e = session.ask("q").send().await.unwrap_err();
    assert!(
        matches!(&e, Error::SessionBusy { query_id, .. } if query_id == "q_run"),
        "{e:?}"
    );
    assert_eq!(server.count("POST", "/query"), 1);
}

#[tokio::test]
async fn cancel_on_drop_cancels_the_turn_on_the_server() {
    let turn = Turn::completed("q_c", "sess_c", DELTAS);
    let server = serve(&turn, "in_progress", |t| {
        vec![Step::Write(t.first(3).into_bytes()), Step::AwaitClose]
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let mut live = session
        .ask("q")
        .stream_config(StreamConfig::default().cancel_on_drop(true))
        .stream()
        .await
        .unwrap();
    live.next().await.unwrap().unwrap();
    drop(live);
    server
        .wait_for("the cancel", |s| {
            s.count("POST", "/queries/q_c/cancel") >= 1
        })
        .await;
    assert_eq!(server.count("POST", "/queries/q_c/cancel"), 1);
}

#[tokio::test]
async fn without_cancel_on_drop_a_dropped_turn_keeps_running() {
    let turn = Turn::completed("q_n", "sess_n", DELTAS);
    let server = serve(&turn, "in_progress", |t| {
        vec![Step::Write(t.first(3).into_bytes()), Step::AwaitClose]
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let mut live = session.ask("q").stream().await.unwrap();
    live.next().await.unwrap().unwrap();
    drop(live);
    // Wait until the server saw the connection close, then a little more.
    server
        .wait_for("the close", |s| s.closed_by_client() >= 1)
        .await;
    assert_eq!(server.closed_by_client(), 1);
    // A cancel is spawned on the test's runtime at the drop, so it would be
    // sent before this later request: once the server has this one, it
    // would have that one (a signal, not a sleep).
    let _ = server.client().queries().get("q_n").await;
    assert_eq!(server.count("GET", "/queries/q_n"), 1);
    assert_eq!(server.count("POST", "/queries/q_n/cancel"), 0);
}

#[tokio::test]
async fn a_finished_turn_never_cancels_on_drop() {
    let turn = Turn::completed("q_f", "sess_f", DELTAS);
    let server = serve(&turn, "completed", |t| vec![Step::Write(t.body().into())]).await;
    let session = server.client().session(["docs"]).build().unwrap();
    let live = session
        .ask("q")
        .stream_config(StreamConfig::default().cancel_on_drop(true))
        .stream()
        .await
        .unwrap();
    let q = live.finish().await.unwrap();
    assert_eq!(q.answer_text(), turn.answer);
    // A cancel is spawned on the test's runtime when the finished turn is
    // dropped, so it would be sent before this later request: once the
    // server has this one, it would have that one (a signal, not a sleep).
    let _ = server.client().queries().get("q_f").await;
    assert_eq!(server.count("GET", "/queries/q_f"), 1);
    assert_eq!(server.count("POST", "/queries/q_f/cancel"), 0);
    assert!(session.unfinished_query_id().is_none());
}

#[tokio::test]
async fn send_across_a_connection_cut_returns_the_answer_with_one_turn() {
    let turn = Turn::completed("q_s", "sess_s", DELTAS);
    let server = serve(&turn, "completed", |t| {
        vec![Step::Write(t.first(4).into_bytes()), Step::Reset]
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let query = session.ask("q").stream_config(fast()).send().await.unwrap();
    assert_eq!(query.answer_text(), turn.answer);
    assert_eq!(query.id, "q_s");
    assert_eq!(server.count("POST", "/query"), 1);
    assert_eq!(server.last_event_ids(), vec![Some("4".to_owned())]);
    assert!(!session.is_busy());
    assert_eq!(session.id().as_deref(), Some("sess_s"));
}

#[tokio::test]
async fn send_polls_the_stored_turn_when_its_events_are_gone() {
    let turn = Turn::completed("q_e", "sess_e", DELTAS);
    let polls = Arc::new(AtomicUsize::new(0));
    let (t, p) = (turn.clone(), polls.clone());
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            Reply::sse(vec![Step::Write(t.first(2).into_bytes()), Step::Reset])
        } else if req.is("GET", "/queries/q_e") {
            let status = if p.fetch_add(1, Ordering::SeqCst) < 1 {
                "in_progress"
            } else {
                "completed"
            };
            let answer = if status == "completed" {
                t.answer.as_str()
            } else {
                ""
            };
            Reply::json(200, &[], &query_json("q_e", "sess_e", status, answer))
        } else {
            // The event log expired.
            Reply::json(410, &[], &serde_json::json!({"message": "gone"}))
        }
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let query = session.ask("q").stream_config(fast()).send().await.unwrap();
    assert_eq!(query.answer_text(), turn.answer);
    assert_eq!(server.count("POST", "/query"), 1);
    assert!(polls.load(Ordering::SeqCst) >= 2);
    assert!(!session.is_busy());
    assert!(session.unfinished_query_id().is_none());
}

#[tokio::test]
async fn send_cut_before_the_turn_is_named_is_a_stream_error_never_a_second_post() {
    let server = SseServer::start(|_, _| {
        Reply::sse(vec![Step::Write(b": hello\n\n".to_vec()), Step::Reset])
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let e = session
        .ask("q")
        .stream_config(fast())
        .send()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Stream { query_id: None, .. }), "{e:?}");
    assert_eq!(server.count("POST", "/query"), 1);
}

#[tokio::test]
async fn send_accepts_a_synchronous_answer() {
    let server = SseServer::start(|_, _| {
        Reply::json(200, &[], &query_json("q_j", "sess_j", "completed", "Yes."))
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let q = session.ask("q").send().await.unwrap();
    assert_eq!(q.answer_text(), "Yes.");
    assert!(session.unfinished_query_id().is_none());
}

/// Captured `tracing` output.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_turn_is_a_span_with_its_ids_mode_and_resumes() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .finish();
    // Global, not scoped: with tests running in parallel threads, a scoped
    // subscriber can miss events whose callsites another thread registered
    // first. Only this test installs one; the others' output is ignored.
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let turn = Turn::completed("q_t", "sess_t", DELTAS);
    let server = serve(&turn, "completed", |t| {
        vec![Step::Write(t.first(4).into_bytes()), Step::Reset]
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    session.ask("q").stream_config(fast()).send().await.unwrap();
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let in_span = |needle: &str| {
        text.lines().any(|l| {
            l.contains("query_turn{")
                && l.contains("mode=\"send\"")
                && l.contains("query_id=\"q_t\"")
                && l.contains("session_id=\"sess_t\"")
                && l.contains(needle)
        })
    };
    assert!(in_span("resuming the event stream"), "{text}");
    assert!(in_span("resumes=1"), "{text}");
    assert!(!text.contains("pcsk_test"), "{text}");
    // A turn read in one go records no resume.
    let whole = Turn::completed("q_w", "sess_w", DELTAS);
    let server = serve(&whole, "completed", |t| {
        vec![Step::Write(t.body().into_bytes())]
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    session.ask("q").stream_config(fast()).send().await.unwrap();
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.lines().any(|l| l.contains("query_turn{")
            && l.contains("query_id=\"q_w\"")
            && l.contains("resumes=0")),
        "{text}"
    );
}

#[tokio::test]
async fn a_409_after_a_dropped_turn_is_session_busy_even_when_the_server_cannot_say_which() {
    let turn = Turn::completed("q_x", "sess_x", DELTAS);
    let t = turn.clone();
    let server = SseServer::start(move |req, _| {
        if req.is("POST", "/query") && req.json().get("session_id").is_none() {
            Reply::sse(vec![Step::Write(t.first(3).into_bytes()), Step::AwaitClose])
        } else if req.is("POST", "/query") {
            Reply::json(
                409,
                &[],
                &serde_json::json!({"message": "a turn is in flight"}),
            )
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "not here"}))
        }
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let mut live = session.ask("first").stream().await.unwrap();
    live.next().await.unwrap().unwrap();
    drop(live);
    let e = session.ask("second").send().await.unwrap_err();
    assert!(
        matches!(&e, Error::SessionBusy { query_id, .. } if query_id == "q_x"),
        "{e:?}"
    );
    assert!(e.is_conflict());
    assert_eq!(e.query_id(), Some("q_x"));
}

#[test]
fn new_futures_and_handles_are_send() {
    fn send<T: Send>(_: &T) {}
    fn send_static<T: Send + 'static>(_: &T) {}
    fn send_sync<T: Send + Sync>() {}
    send_sync::<nexus_knowql::QueryHandle>();
    send_sync::<WhenBusy>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let client = nexus_knowql::Client::builder()
        .base_url("http://127.0.0.1:9")
        .build()
        .unwrap();
    let queries = client.queries();
    let attach = queries.attach("q");
    send(&attach);
    let session = client.session(["docs"]).build().unwrap();
    let turn = session.ask("q").when_busy(WhenBusy::Fail).send();
    send_static(&turn);
    let _ = client.continue_session("s").with_when_busy(WhenBusy::Fail);
}

#[tokio::test]
async fn a_turn_detached_before_it_is_named_learns_its_id_when_needed() {
    let turn = Turn::completed("q_u", "sess_u", DELTAS);
    let server = serve(&turn, "completed", |t| {
        vec![
            Step::Write(b": accepted\n\n".to_vec()),
            Step::Sleep(Duration::from_millis(30)),
            Step::Write(t.body().into_bytes()),
        ]
    })
    .await;
    let session = server.client().session(["docs"]).build().unwrap();
    let live = session.ask("q").stream().await.unwrap();
    let mut handle = live.detach();
    assert_eq!(handle.id(), "");
    let query = handle
        .wait(nexus_knowql::WaitPolicy::default())
        .await
        .unwrap();
    assert_eq!(query.id, "q_u");
    assert_eq!(handle.id(), "q_u");
    assert_eq!(handle.session_id(), "sess_u");
    assert_eq!(query.answer_text(), turn.answer);
    assert!(!session.is_busy());
    assert!(session.unfinished_query_id().is_none());
}
