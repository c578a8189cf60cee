//! The hostile-server model: proptest generates servers that bend the
//! contract (statuses, content types, stalls, gaps, duplicates, replays,
//! id-less and unknown frames, non-terminal or missing final frames,
//! oversize frames, endless deltas, steps and keep-alives, cuts at any
//! byte, a stored turn that agrees with the stream or not, and servers that
//! lie about which turn they serve: another turn's events on resume, a
//! final frame, stored document or poll of another turn, another session,
//! an unnamed final frame of another turn, a delta of another turn whose
//! identity does not parse cleanly; replicas that renumber the same events
//! or send deltas without ids, in one process and across a restart),
//! and every turn run against one must keep the SDK's promise:
//!
//! 1. `Ok` ⇒ the delivered text is the stored turn's answer, its status is
//!    `completed`, and it is this turn's (its id and session);
//! 2. every public call returns by its configured deadline;
//! 3. the bytes a turn holds never pass its configured bounds;
//! 4. at most one `POST /query` is processed (answered other than 429);
//! 5. an error carries the query id whenever the server had named it.
//!
//! The server is a real loopback HTTP/1.1 server (`support::sse_server`)
//! in the same runtime, and the runtime's clock is paused: a stall of an
//! hour costs no real time, and deadlines are exact. The clock only moves
//! when every task waits on a timer; a loopback write is visible to the
//! peer at once, so no read is ever overtaken by an auto-advance.
//!
//! A second property runs servers that keep the contract in its standard
//! forms (replays from, right after or before `Last-Event-ID`, duplicates,
//! unknown events, cuts, stalls, throttles, a Query document, a stored
//! turn that runs a while): every turn must end `Ok` with the stored
//! answer, the expected text taken from the script, never from the SDK's
//! own decoder.
//!
//! A third property runs two-turn sessions whose follow-up is answered
//! with a replay of the session's first turn (streamed, not streamed, in
//! the background and its polls): it must end in a typed mismatch, never
//! with the old answer (`follow_up`).
//!
//! `PROPTEST_CASES` raises the number of cases (default 96).

use crate::support::sse_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use nexus_knowql::query::Checkpoint;
use nexus_knowql::{Client, Error, QueryEvent, QueryTurn, RetryPolicy, StreamConfig, types};
use proptest::prelude::*;
use sse_server::{Reply, SseServer, Step, Turn, frame, last_event_id, query_json};
use tokio::time::Instant;

mod follow_up;
mod script;
use follow_up::*;
use script::*;

const Q: &str = "q_h";
const S: &str = "s_h";

// The configured bounds every case runs under.
const TURN_DEADLINE: Duration = Duration::from_secs(60);
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const RETRY_ELAPSED: Duration = Duration::from_secs(10);
const MAX_TEXT: usize = 2048;
const MAX_STEPS: usize = 2048;
const MAX_FRAME: usize = 4096;
/// What a call may take beyond its bound (timer granularity, the last
/// request's own wait); exact on a paused clock.
const SLACK: Duration = Duration::from_secs(1);

/// What the scripted server saw.
struct Seen {
    /// `POST /query` requests answered other than 429.
    processed_posts: AtomicUsize,
}

fn serve(
    script: &Script,
) -> (
    impl Fn(&sse_server::Request, usize) -> Reply + Send + Sync + 'static,
    Arc<Seen>,
) {
    let (turn, stored_answer) = truth(script);
    let events_turn = foreign_turn(script, &turn);
    let final_of = |t: &Turn| -> String {
        if script.lie == Some(Lie::FinalOfAnotherTurn) {
            OTHER_Q.to_owned()
        } else {
            t.query_id.clone()
        }
    };
    let (post_final, events_final) = (final_of(&turn), final_of(&events_turn));
    let script = script.clone();
    let seen = Arc::new(Seen {
        processed_posts: AtomicUsize::new(0),
    });
    let posts = AtomicUsize::new(0);
    let events = AtomicUsize::new(0);
    let polls = AtomicUsize::new(0);
    let seen2 = seen.clone();
    let server = move |req: &sse_server::Request, _: usize| -> Reply {
        let sse_head = Reply::sse(Vec::new()).head;
        if req.is("POST", "/query") {
            let n = posts.fetch_add(1, Ordering::SeqCst);
            if let Some(wait) = script.throttles.get(n) {
                return Reply::json(
                    429,
                    &[&format!("Retry-After: {wait}")],
                    &serde_json::json!({"message": "slow down"}),
                );
            }
            seen2.processed_posts.fetch_add(1, Ordering::SeqCst);
            return match &script.post {
                Post::Sse(body) => {
                    let body = post_body(&script, body);
                    let steps = render(&turn, &stored_answer, 1, &body, &post_final);
                    Reply::sse(lie_in(&script, steps, true))
                }
                Post::StallHeaders(secs, body) => {
                    let mut steps = vec![
                        Step::Sleep(Duration::from_secs(*secs)),
                        Step::Write(sse_head.into_bytes()),
                    ];
                    let body = post_body(&script, body);
                    let rendered = render(&turn, &stored_answer, 1, &body, &post_final);
                    steps.extend(lie_in(&script, rendered, true));
                    Reply {
                        head: String::new(),
                        steps,
                    }
                }
                Post::Json { status, stall } => {
                    let answer = if *status == "completed" {
                        stored_answer.as_str()
                    } else {
                        ""
                    };
                    let body = query_json(Q, S, status, answer).to_string();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let steps = if *stall {
                        vec![
                            Step::Write(body.as_bytes()[..body.len() / 2].to_vec()),
                            Step::Sleep(Duration::from_secs(3600)),
                        ]
                    } else {
                        vec![Step::Write(body.into_bytes())]
                    };
                    Reply { head, steps }
                }
                Post::Status(code, retry_after) => {
                    let header = retry_after.map(|r| format!("Retry-After: {r}"));
                    let headers: Vec<&str> = header.iter().map(String::as_str).collect();
                    Reply::json(*code, &headers, &serde_json::json!({"message": "no"}))
                }
                Post::Html => Reply {
                    head: "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\nconnection: close\r\n\r\n"
                        .into(),
                    steps: vec![Step::Write(b"<html>hello</html>".to_vec())],
                },
            };
        }
        if req.is("GET", &format!("/queries/{Q}/events")) {
            let n = events.fetch_add(1, Ordering::SeqCst);
            let from = last_event_id(req).unwrap_or(0);
            let faithful = Body {
                prefix: 99,
                mutations: Vec::new(),
                unknown_at: None,
                ending: Ending::Final,
            };
            let whole = |from: u64| {
                let body = Body {
                    prefix: 99,
                    mutations: Vec::new(),
                    unknown_at: None,
                    ending: Ending::Final,
                };
                render(&events_turn, &stored_answer, from, &body, &events_final)
            };
            let reply = match script
                .events
                .get(n)
                .cloned()
                .unwrap_or(Events::Faithful(faithful))
            {
                Events::Renumbered(k) => Reply::sse(renumbered(whole(1), k)),
                Events::StartsAgain => Reply::sse(renumbered(whole(1), from.saturating_sub(1))),
                Events::IdlessDeltas => Reply::sse(without_delta_ids(whole(from.max(1)))),
                Events::Faithful(body) => Reply::sse(render(
                    &events_turn,
                    &stored_answer,
                    from.max(1),
                    &body,
                    &events_final,
                )),
                Events::Late(k) => {
                    let body = Body {
                        prefix: 99,
                        mutations: Vec::new(),
                        unknown_at: None,
                        ending: Ending::Final,
                    };
                    Reply::sse(render(
                        &events_turn,
                        &stored_answer,
                        from.max(1) + k,
                        &body,
                        &events_final,
                    ))
                }
                Events::Early(k) => {
                    let body = Body {
                        prefix: 99,
                        mutations: Vec::new(),
                        unknown_at: None,
                        ending: Ending::Final,
                    };
                    Reply::sse(render(
                        &events_turn,
                        &stored_answer,
                        from.saturating_sub(k).max(1),
                        &body,
                        &events_final,
                    ))
                }
                Events::Gone(code) | Events::Status(code) => {
                    Reply::json(code, &[], &serde_json::json!({"message": "no events"}))
                }
                Events::StallHeaders => Reply {
                    head: String::new(),
                    steps: vec![Step::Sleep(Duration::from_secs(3600))],
                },
            };
            return Reply {
                steps: lie_in(&script, reply.steps, false),
                ..reply
            };
        }
        if req.is("GET", &format!("/queries/{Q}")) {
            if script.stored.missing {
                return Reply::json(404, &[], &serde_json::json!({"message": "no such turn"}));
            }
            let n = polls.fetch_add(1, Ordering::SeqCst);
            let status = if n < script.stored.running_polls {
                "in_progress"
            } else {
                script.stored.status
            };
            let answer = if status == "completed" {
                stored_answer.as_str()
            } else {
                ""
            };
            let id = match script.lie {
                Some(Lie::StoredOfAnotherTurn(from)) if n >= from => OTHER_Q,
                _ => Q,
            };
            return Reply::json(200, &[], &query_json(id, S, status, answer));
        }
        if req.method == "POST" && req.path.ends_with("/cancel") {
            return Reply::json(200, &[], &query_json(Q, S, "cancelled", ""));
        }
        Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
    };
    (server, seen)
}

fn client(url: &str) -> Client {
    Client::builder()
        .base_url(url)
        .api_key("pcsk_model")
        .header_timeout(Some(HEADER_TIMEOUT))
        .request_timeout(Some(REQUEST_TIMEOUT))
        .read_timeout(Some(Duration::from_secs(2)))
        .turn_timeout(Some(TURN_DEADLINE))
        .retry(
            RetryPolicy::default()
                .initial_delay(Duration::from_millis(10))
                .max_delay(Duration::from_secs(3))
                .max_elapsed(RETRY_ELAPSED),
        )
        .build()
        .unwrap()
}

fn config(keep_text: bool) -> StreamConfig {
    StreamConfig::default()
        .idle_timeout(Some(Duration::from_secs(3)))
        .final_query_wait(Duration::from_secs(1))
        .reconnect_attempts(3)
        .reconnect_delay(Duration::from_millis(10), Duration::from_millis(200))
        .max_frame_bytes(MAX_FRAME)
        .max_text_bytes(MAX_TEXT)
        .max_step_bytes(MAX_STEPS)
        .keep_text(keep_text)
}

/// A lower bound of the bytes the turn holds in steps.
fn step_bytes(steps: &[types::QueryStep]) -> usize {
    steps
        .iter()
        .map(|s| s.step_id.len() + s.status.len() + s.commentary.len())
        .sum()
}

/// A violated invariant, for proptest.
type Check = Result<(), TestCaseError>;

/// Reads a turn to its end, checking the bounds after every event; returns
/// the text delivered, the first error, and whether the turn was named.
async fn drain(
    turn: &mut QueryTurn,
    started: Instant,
    named: &mut bool,
) -> Result<(String, Option<Error>), TestCaseError> {
    let mut text = String::new();
    let mut first = None;
    loop {
        let next = tokio::time::timeout_at(started + TURN_DEADLINE + SLACK, turn.next()).await;
        let Ok(next) = next else {
            return Err(TestCaseError::fail(format!(
                "next() ran past the turn deadline; text so far {:?}",
                text
            )));
        };
        *named |= turn.query_id().is_some();
        match next {
            None => break,
            Some(Ok(QueryEvent::TextDelta { delta })) => {
                prop_assert!(
                    !delta.contains(FOREIGN),
                    "a delta of another turn was delivered"
                );
                text.push_str(&delta)
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                first.get_or_insert(e);
            }
        }
        prop_assert!(
            turn.text_len() <= MAX_TEXT,
            "text held {} > {MAX_TEXT}",
            turn.text_len()
        );
        prop_assert!(turn.text().len() <= MAX_TEXT);
        prop_assert!(
            step_bytes(turn.steps()) <= MAX_STEPS,
            "steps held {}",
            step_bytes(turn.steps())
        );
    }
    Ok((text, first))
}

fn check_outcome(
    result: &Result<types::Query, Error>,
    text: Option<&str>,
    stored_answer: &str,
    named: bool,
    benign: bool,
) -> Check {
    if benign && let Err(e) = result {
        return Err(TestCaseError::fail(format!(
            "a server that keeps the contract, and the turn failed: {e:?}"
        )));
    }
    match result {
        Ok(q) => {
            // The turn's own answer: its id and session, never another's.
            prop_assert_eq!(q.id.as_str(), Q, "Ok with another turn's Query");
            prop_assert_eq!(q.session_id.as_str(), S, "Ok with another session's Query");
            prop_assert_eq!(
                q.status.as_str(),
                "completed",
                "Ok with a turn that is not completed"
            );
            prop_assert_eq!(
                q.answer_text(),
                stored_answer,
                "Ok with an answer that is not the stored one"
            );
            if let Some(text) = text {
                prop_assert_eq!(
                    text,
                    stored_answer,
                    "Ok, but the delivered text is not the stored answer"
                );
            }
        }
        Err(e) => {
            if named && !matches!(e, Error::SessionBusy { .. }) {
                prop_assert_eq!(
                    e.query_id(),
                    Some(Q),
                    "the error does not name the turn: {:?}",
                    e
                );
            }
        }
    }
    Ok(())
}

async fn run(script: Script) -> Check {
    let (turn, stored_answer) = truth(&script);
    let _ = turn;
    let (script_fn, seen) = serve(&script);
    let server = SseServer::start(script_fn).await;
    let client = client(&server.url);
    let session = client.session(["ctx"]).build().unwrap();
    let cfg = config(script.keep_text);
    let started = Instant::now();
    match script.mode {
        Mode::Send => {
            let sent = tokio::time::timeout(
                TURN_DEADLINE + SLACK,
                session.ask("q").stream_config(cfg).send(),
            )
            .await;
            let Ok(result) = sent else {
                return Err(TestCaseError::fail("send() ran past the turn timeout"));
            };
            let named = session.last_query_id().is_some();
            check_outcome(&result, None, &stored_answer, named, script.benign)?;
        }
        Mode::Stream | Mode::Resume(_) => {
            let opened = tokio::time::timeout(
                TURN_DEADLINE + SLACK,
                session.ask("q").stream_config(cfg.clone()).stream(),
            )
            .await;
            let Ok(opened) = opened else {
                return Err(TestCaseError::fail("stream() ran past the turn deadline"));
            };
            let mut live = match opened {
                Ok(live) => live,
                Err(e) if script.benign => {
                    return Err(TestCaseError::fail(format!(
                        "a server that keeps the contract, and stream() failed: {e:?}"
                    )));
                }
                Err(_) => return Ok(()),
            };
            let mut named = live.query_id().is_some();
            if let Mode::Resume(k) = script.mode {
                let mut read = 0;
                while read < k {
                    match tokio::time::timeout_at(started + TURN_DEADLINE + SLACK, live.next())
                        .await
                    {
                        Err(_) => {
                            return Err(TestCaseError::fail("next() ran past the turn deadline"));
                        }
                        Ok(Some(Err(e))) if script.benign => {
                            return Err(TestCaseError::fail(format!(
                                "a server that keeps the contract, and the turn failed: {e:?}"
                            )));
                        }
                        Ok(None) | Ok(Some(Err(_))) => break,
                        Ok(Some(Ok(_))) => read += 1,
                    }
                }
                let Some(checkpoint) = live.checkpoint() else {
                    return Ok(());
                };
                let delivered_before = checkpoint.text_len;
                drop(live);
                check_resume(
                    &server.url,
                    &checkpoint,
                    delivered_before,
                    &stored_answer,
                    (script.keep_text, script.benign),
                )
                .await?;
            } else {
                let (text, error) = drain(&mut live, started, &mut named).await?;
                let finished =
                    tokio::time::timeout_at(started + TURN_DEADLINE + SLACK, live.finish()).await;
                let Ok(finished) = finished else {
                    return Err(TestCaseError::fail("finish() ran past the turn deadline"));
                };
                let result = match error {
                    Some(e) => Err(e),
                    None => finished,
                };
                check_outcome(&result, Some(&text), &stored_answer, named, script.benign)?;
            }
        }
    }
    prop_assert!(
        seen.processed_posts.load(Ordering::SeqCst) <= 1,
        "POST /query was processed {} times",
        seen.processed_posts.load(Ordering::SeqCst)
    );
    Ok(())
}

/// Another process: `attach` and `resume_from` the checkpoint.
async fn check_resume(
    url: &str,
    checkpoint: &Checkpoint,
    delivered_before: u64,
    stored_answer: &str,
    (keep_text, benign): (bool, bool),
) -> Check {
    let other = client(url);
    let attached = tokio::time::timeout(
        REQUEST_TIMEOUT * 4 + RETRY_ELAPSED + SLACK,
        other.queries().attach(&checkpoint.query_id),
    )
    .await;
    let Ok(attached) = attached else {
        return Err(TestCaseError::fail("attach() ran past its bound"));
    };
    let handle = match attached {
        Ok(handle) => handle,
        Err(e) if benign => {
            return Err(TestCaseError::fail(format!("attach() failed: {e:?}")));
        }
        Err(_) => return Ok(()),
    };
    let started = Instant::now();
    let opened = tokio::time::timeout(
        HEADER_TIMEOUT + SLACK,
        handle
            .stream_config(config(keep_text))
            .resume_from(checkpoint),
    )
    .await;
    let Ok(opened) = opened else {
        return Err(TestCaseError::fail(
            "resume_from() ran past the header timeout",
        ));
    };
    let mut rest = match opened {
        Ok(rest) => rest,
        Err(e) => {
            prop_assert!(!benign, "resume_from() failed: {:?}", e);
            prop_assert_eq!(e.query_id(), Some(Q), "{:?}", e);
            return Ok(());
        }
    };
    let mut named = true;
    let (text, error) = drain(&mut rest, started, &mut named).await?;
    let finished = tokio::time::timeout_at(started + TURN_DEADLINE + SLACK, rest.finish()).await;
    let Ok(finished) = finished else {
        return Err(TestCaseError::fail(
            "finish() after resume_from ran past the turn deadline",
        ));
    };
    let result = match error {
        Some(e) => Err(e),
        None => finished,
    };
    // The text before the checkpoint was delivered by the first reader:
    // what this one delivers must be the stored answer after it.
    let after = stored_answer.get(delivered_before as usize..);
    if result.is_ok() {
        prop_assert_eq!(
            Some(text.as_str()),
            after,
            "the resumed text is not the rest of the stored answer"
        );
    }
    check_outcome(&result, None, stored_answer, named, benign)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

proptest! {
    // A shrunk failure is written to hostile_model.proptest-regressions,
    // which is committed: its cases run first, every time.
    #![proptest_config(crate::support::props::regressions_beside_source(
        ProptestConfig::with_cases(cases())
    ))]

    /// Whatever the server does, a turn ends in the verified answer or a
    /// typed error, in time, within its bounds, started at most once.
    #[test]
    fn a_turn_ends_in_the_verified_answer_or_a_typed_error(script in script_strategy()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(run(script))?;
    }

    /// A server that keeps the contract, in any of its standard forms,
    /// gets the stored answer: `Ok`, exactly, from any path.
    #[test]
    fn a_server_that_keeps_the_contract_gets_the_answer(script in benign_strategy()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(run(script))?;
    }

    /// A follow-up answered with a replay of the session's first turn is
    /// refused with a typed mismatch; answered as the contract says, it
    /// gets its own answer.
    #[test]
    fn a_follow_up_answered_with_an_earlier_turn_is_refused(case in two_turns_strategy()) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(run_two_turns(case))?;
    }
}
