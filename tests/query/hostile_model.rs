//! The hostile-server model: proptest generates servers that bend the
//! contract (statuses, content types, stalls, gaps, duplicates, replays,
//! id-less and unknown frames, non-terminal or missing final frames,
//! oversize frames, endless deltas, steps and keep-alives, cuts at any
//! byte, a stored turn that agrees with the stream or not), and every turn
//! run against one must keep the SDK's promise:
//!
//! 1. `Ok` ⇒ the delivered text is the stored turn's answer, and its
//!    status is `completed`;
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

/// How a streamed body (the answer to `POST /query` or an events request)
/// goes wrong, applied to the true turn's frames.
#[derive(Debug, Clone)]
struct Body {
    /// The true frames sent (ids `1..=prefix`), before the ending.
    prefix: usize,
    /// Per frame: 0 as is, 1 dropped (a gap), 2 twice, 3 without its id.
    mutations: Vec<u8>,
    /// An unknown event inserted after this many frames, if any.
    unknown_at: Option<usize>,
    ending: Ending,
}

#[derive(Debug, Clone)]
enum Ending {
    /// Closed cleanly.
    Close,
    /// Reset after this fraction (per mille) of the body.
    Cut(u16),
    /// The final `query` frame (terminal, the true answer), then a close.
    Final,
    /// The final frame, then the connection stays open.
    FinalThenStall,
    /// A final frame that says `in_progress` with part of the answer.
    FinalNotTerminal,
    /// A stall of this many seconds mid-body, then a close.
    Stall(u64),
    /// A frame past the frame limit.
    Oversize,
    /// Deltas without end (until the client goes).
    EndlessDeltas,
    /// Steps with fresh ids without end.
    EndlessSteps,
    /// Keep-alive comments, one a second, without end.
    EndlessKeepAlives,
}

/// The answer to `POST /query`.
#[derive(Debug, Clone)]
enum Post {
    Sse(Body),
    /// `200 application/json` with the Query (status, the true answer?);
    /// stalls after half the body when `stall`.
    Json {
        status: &'static str,
        stall: bool,
    },
    /// An error status (with `Retry-After` seconds when given).
    Status(u16, Option<u64>),
    /// `200 text/html`.
    Html,
    /// No headers for this many seconds, then the event stream.
    StallHeaders(u64, Body),
}

/// The answer to `GET /queries/{id}/events`, by connection.
#[derive(Debug, Clone)]
enum Events {
    /// From `Last-Event-ID` inclusively, as the contract says.
    Faithful(Body),
    /// Starting this many events late.
    Late(u64),
    /// Starting this many events early.
    Early(u64),
    Gone(u16),
    Status(u16),
    StallHeaders,
}

/// The stored turn (`GET /queries/{id}`).
#[derive(Debug, Clone)]
struct Stored {
    /// Polls that answer `in_progress` before the final status.
    running_polls: usize,
    /// The final status: completed, failed, cancelled, or in_progress forever.
    status: &'static str,
    /// Whether the stored answer is the streamed one (else it differs).
    agrees: bool,
    /// Answers 404 instead.
    missing: bool,
}

#[derive(Debug, Clone)]
enum Mode {
    /// `stream()`, `next()` to the end, `finish()`.
    Stream,
    /// `send()`.
    Send,
    /// `stream()` read for this many events, dropped, then `attach` and
    /// `events_from` its checkpoint from a fresh client.
    Resume(usize),
}

#[derive(Debug, Clone)]
struct Script {
    deltas: Vec<String>,
    /// 429s before the real answer, each with this `Retry-After`.
    throttles: Vec<u64>,
    post: Post,
    events: Vec<Events>,
    stored: Stored,
    keep_text: bool,
    mode: Mode,
}

fn body_strategy() -> impl Strategy<Value = Body> {
    (
        0usize..12,
        proptest::collection::vec(
            prop_oneof![6 => Just(0u8), 1 => Just(1), 1 => Just(2), 1 => Just(3)],
            12,
        ),
        proptest::option::weighted(0.15, 0usize..12),
        prop_oneof![
            3 => Just(Ending::Final),
            1 => Just(Ending::Close),
            2 => (0u16..1000).prop_map(Ending::Cut),
            1 => Just(Ending::FinalThenStall),
            2 => Just(Ending::FinalNotTerminal),
            1 => (1u64..400).prop_map(Ending::Stall),
            1 => Just(Ending::Oversize),
            1 => Just(Ending::EndlessDeltas),
            1 => Just(Ending::EndlessSteps),
            1 => Just(Ending::EndlessKeepAlives),
        ],
    )
        .prop_map(|(prefix, mutations, unknown_at, ending)| Body {
            prefix,
            mutations,
            unknown_at,
            ending,
        })
}

fn script_strategy() -> impl Strategy<Value = Script> {
    let deltas = proptest::collection::vec("[a-zé ]{1,12}", 1..5);
    let post = prop_oneof![
        6 => body_strategy().prop_map(Post::Sse),
        2 => (prop_oneof![Just("completed"), Just("in_progress"), Just("failed")], any::<bool>())
            .prop_map(|(status, stall)| Post::Json { status, stall }),
        1 => (prop_oneof![Just(400u16), Just(404), Just(500), Just(502), Just(503), Just(504)],
              proptest::option::of(0u64..4))
            .prop_map(|(s, r)| Post::Status(s, r)),
        1 => Just(Post::Html),
        1 => ((1u64..20), body_strategy()).prop_map(|(s, b)| Post::StallHeaders(s, b)),
    ];
    let events = proptest::collection::vec(
        prop_oneof![
            4 => body_strategy().prop_map(Events::Faithful),
            1 => (1u64..4).prop_map(Events::Late),
            1 => (1u64..4).prop_map(Events::Early),
            1 => prop_oneof![Just(404u16), Just(410)].prop_map(Events::Gone),
            1 => prop_oneof![Just(500u16), Just(503), Just(403)].prop_map(Events::Status),
            1 => Just(Events::StallHeaders),
        ],
        0..4,
    );
    let stored = (
        0usize..4,
        prop_oneof![
            4 => Just("completed"),
            1 => Just("failed"),
            1 => Just("cancelled"),
            1 => Just("in_progress"),
        ],
        prop_oneof![3 => Just(true), 1 => Just(false)],
        prop_oneof![9 => Just(false), 1 => Just(true)],
    )
        .prop_map(|(running_polls, status, agrees, missing)| Stored {
            running_polls,
            status,
            agrees,
            missing,
        });
    let mode = prop_oneof![
        4 => Just(Mode::Stream),
        2 => Just(Mode::Send),
        2 => (0usize..8).prop_map(Mode::Resume),
    ];
    (
        deltas,
        proptest::collection::vec(0u64..3, 0..3),
        post,
        events,
        stored,
        any::<bool>(),
        mode,
    )
        .prop_map(
            |(deltas, throttles, post, events, stored, keep_text, mode)| Script {
                deltas,
                throttles,
                post,
                events,
                stored,
                keep_text,
                mode,
            },
        )
}

/// The true turn of a script, and the answer its stored turn holds.
fn truth(script: &Script) -> (Turn, String) {
    let refs: Vec<&str> = script.deltas.iter().map(String::as_str).collect();
    let turn = Turn::completed(Q, S, &refs);
    let stored = if script.stored.agrees {
        turn.answer.clone()
    } else {
        format!("Not {}", turn.answer)
    };
    (turn, stored)
}

fn delta_frame(id: u64, text: &str) -> String {
    frame(
        Some(id),
        "response.output_text.delta",
        &serde_json::json!({"type": "response.output_text.delta", "query_id": Q, "delta": text}),
    )
}

/// The bytes of a streamed body: the true frames from `from` (exclusive
/// of none: `from` is the first id sent) mutated and ended as `body` says.
fn render(turn: &Turn, stored_answer: &str, from: u64, body: &Body) -> Vec<Step> {
    let progress: Vec<&(Option<u64>, String)> = turn
        .frames
        .iter()
        .filter(|(id, _)| id.is_some_and(|id| id >= from))
        .collect();
    let mut out = String::new();
    for (i, (id, text)) in progress.iter().take(body.prefix).enumerate() {
        if body.unknown_at == Some(i) {
            out.push_str(&frame(
                None,
                "response.mystery",
                &serde_json::json!({"query_id": Q, "x": 1}),
            ));
        }
        match body.mutations.get(i).copied().unwrap_or(0) {
            1 => {}
            2 => {
                out.push_str(text);
                out.push_str(text);
            }
            3 => {
                let prefix = format!("id: {}\n", id.unwrap_or_default());
                out.push_str(text.strip_prefix(&prefix).unwrap_or(text));
            }
            _ => out.push_str(text),
        }
    }
    let next_id = progress
        .iter()
        .take(body.prefix)
        .filter_map(|(id, _)| *id)
        .max()
        .map_or(from, |m| m + 1);
    let final_frame =
        |status: &str, answer: &str| frame(None, "query", &query_json(Q, S, status, answer));
    let mut steps = Vec::new();
    match &body.ending {
        Ending::Close => steps.push(Step::Write(out.into_bytes())),
        Ending::Cut(per_mille) => {
            let bytes = out.into_bytes();
            let at = bytes.len() * usize::from(*per_mille) / 1000;
            steps.push(Step::Write(bytes[..at].to_vec()));
            steps.push(Step::Reset);
        }
        Ending::Final | Ending::FinalThenStall => {
            out.push_str(&final_frame("completed", stored_answer));
            steps.push(Step::Write(out.into_bytes()));
            if matches!(body.ending, Ending::FinalThenStall) {
                steps.push(Step::Sleep(Duration::from_secs(3600)));
            }
        }
        Ending::FinalNotTerminal => {
            let half: String = stored_answer
                .chars()
                .take(stored_answer.chars().count() / 2)
                .collect();
            out.push_str(&final_frame("in_progress", &half));
            steps.push(Step::Write(out.into_bytes()));
        }
        Ending::Stall(secs) => {
            steps.push(Step::Write(out.into_bytes()));
            steps.push(Step::Sleep(Duration::from_secs(*secs)));
        }
        Ending::Oversize => {
            out.push_str(&delta_frame(next_id, &"x".repeat(MAX_FRAME + 10)));
            steps.push(Step::Write(out.into_bytes()));
        }
        Ending::EndlessDeltas => {
            steps.push(Step::Write(out.into_bytes()));
            let chunk: String = (0..64)
                .map(|i| delta_frame(next_id + i, &"y".repeat(60)))
                .collect();
            // "Endless": far past every bound, then held open.
            steps.push(Step::Write(chunk.into_bytes()));
            steps.push(Step::Sleep(Duration::from_secs(3600)));
        }
        Ending::EndlessSteps => {
            steps.push(Step::Write(out.into_bytes()));
            let chunk: String = (0..64)
                .map(|i| {
                    frame(
                        Some(next_id + i),
                        "response.step",
                        &serde_json::json!({"type": "response.step", "query_id": Q,
                            "step_id": format!("fresh{i}"), "status": "running",
                            "commentary": "z".repeat(60)}),
                    )
                })
                .collect();
            steps.push(Step::Write(chunk.into_bytes()));
            steps.push(Step::Sleep(Duration::from_secs(3600)));
        }
        Ending::EndlessKeepAlives => {
            steps.push(Step::Write(out.into_bytes()));
            for _ in 0..300 {
                steps.push(Step::Write(b": keep-alive\n\n".to_vec()));
                steps.push(Step::Sleep(Duration::from_secs(1)));
            }
        }
    }
    steps
}

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
                Post::Sse(body) => Reply::sse(render(&turn, &stored_answer, 1, body)),
                Post::StallHeaders(secs, body) => {
                    let mut steps = vec![
                        Step::Sleep(Duration::from_secs(*secs)),
                        Step::Write(sse_head.into_bytes()),
                    ];
                    steps.extend(render(&turn, &stored_answer, 1, body));
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
            return match script
                .events
                .get(n)
                .cloned()
                .unwrap_or(Events::Faithful(faithful))
            {
                Events::Faithful(body) => {
                    Reply::sse(render(&turn, &stored_answer, from.max(1), &body))
                }
                Events::Late(k) => {
                    let body = Body {
                        prefix: 99,
                        mutations: Vec::new(),
                        unknown_at: None,
                        ending: Ending::Final,
                    };
                    Reply::sse(render(&turn, &stored_answer, from.max(1) + k, &body))
                }
                Events::Early(k) => {
                    let body = Body {
                        prefix: 99,
                        mutations: Vec::new(),
                        unknown_at: None,
                        ending: Ending::Final,
                    };
                    Reply::sse(render(
                        &turn,
                        &stored_answer,
                        from.saturating_sub(k).max(1),
                        &body,
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
            return Reply::json(200, &[], &query_json(Q, S, status, answer));
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
        .turn_deadline(Some(TURN_DEADLINE))
        .idle_timeout(Some(Duration::from_secs(3)))
        .recovery_wait(Duration::from_secs(30))
        .final_query_wait(Duration::from_secs(1))
        .resume_attempts(3)
        .resume_delay(Duration::from_millis(10), Duration::from_millis(200))
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
            Some(Ok(QueryEvent::TextDelta { delta })) => text.push_str(&delta),
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
) -> Check {
    match result {
        Ok(q) => {
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
            check_outcome(&result, None, &stored_answer, named)?;
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
            let Ok(mut live) = opened else {
                return Ok(());
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
                    script.keep_text,
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
                check_outcome(&result, Some(&text), &stored_answer, named)?;
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

/// Another process: `attach` and `events_from` the checkpoint.
async fn check_resume(
    url: &str,
    checkpoint: &Checkpoint,
    delivered_before: u64,
    stored_answer: &str,
    keep_text: bool,
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
    let Ok(handle) = attached else {
        return Ok(());
    };
    let started = Instant::now();
    let opened = tokio::time::timeout(
        HEADER_TIMEOUT + SLACK,
        handle
            .stream_config(config(keep_text))
            .events_from(checkpoint),
    )
    .await;
    let Ok(opened) = opened else {
        return Err(TestCaseError::fail(
            "events_from() ran past the header timeout",
        ));
    };
    let mut rest = match opened {
        Ok(rest) => rest,
        Err(e) => {
            prop_assert_eq!(e.query_id(), Some(Q), "{:?}", e);
            return Ok(());
        }
    };
    let mut named = true;
    let (text, error) = drain(&mut rest, started, &mut named).await?;
    let finished = tokio::time::timeout_at(started + TURN_DEADLINE + SLACK, rest.finish()).await;
    let Ok(finished) = finished else {
        return Err(TestCaseError::fail(
            "finish() after events_from ran past the turn deadline",
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
    check_outcome(&result, None, stored_answer, named)
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
}
