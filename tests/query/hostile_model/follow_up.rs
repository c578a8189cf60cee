//! Two-turn sessions of the hostile-server model. The first turn is
//! answered as the contract says; the follow-up's `POST /query` (streamed,
//! not streamed, or in the background, and then its polls) is answered
//! either as the contract says or with a replay of the first turn: the same
//! session, the first turn's id, its question and its answer. A replay is
//! never the follow-up's answer: the follow-up ends in
//! [`Error::TurnMismatch`] and delivers none of the old text; answered as
//! the contract says, it ends `Ok` with its own answer.

use super::*;
use nexus_knowql::WaitPolicy;

/// The session's first turn, and what it was asked.
pub(super) const FIRST_Q: &str = "q_first";
const FIRST_ASK: &str = "the first question";
const FOLLOW_UP_ASK: &str = "the follow-up question";

/// How the follow-up is run and what answers its `POST /query`.
#[derive(Debug, Clone)]
pub(super) enum FollowUpPost {
    /// An event stream, read by `stream()` (else by `send()`).
    Sse { body: Body, stream: bool },
    /// The Query document with this status, read by `stream()` (else by
    /// `send()`); an unfinished turn is then polled.
    Json { status: &'static str, stream: bool },
    /// `background()` and `wait()`. With `replayed_post`, the 202 itself is
    /// the replay; else the 202 names the follow-up, its polls answer
    /// `in_progress` `running_polls` times and then the replay.
    Background {
        replayed_post: bool,
        running_polls: usize,
    },
}

#[derive(Debug, Clone)]
pub(super) struct TwoTurns {
    first_deltas: Vec<String>,
    deltas: Vec<String>,
    /// 429s before the follow-up's real answer, each with this `Retry-After`.
    throttles: Vec<u64>,
    post: FollowUpPost,
    keep_text: bool,
    /// The follow-up is answered with a replay of the first turn.
    replay: bool,
}

pub(super) fn two_turns_strategy() -> impl Strategy<Value = TwoTurns> {
    let deltas = || proptest::collection::vec("[a-zé ]{1,12}", 1..5);
    let post = prop_oneof![
        3 => (benign_body(true), any::<bool>())
            .prop_map(|(body, stream)| FollowUpPost::Sse { body, stream }),
        2 => (prop_oneof![Just("completed"), Just("in_progress")], any::<bool>())
            .prop_map(|(status, stream)| FollowUpPost::Json { status, stream }),
        2 => (any::<bool>(), 0usize..4).prop_map(|(replayed_post, running_polls)| {
            FollowUpPost::Background { replayed_post, running_polls }
        }),
    ];
    (
        deltas(),
        deltas(),
        proptest::collection::vec(0u64..2, 0..3),
        post,
        any::<bool>(),
        prop_oneof![3 => Just(true), 1 => Just(false)],
    )
        .prop_map(
            |(first_deltas, deltas, throttles, post, keep_text, replay)| TwoTurns {
                first_deltas,
                deltas,
                throttles,
                post,
                keep_text,
                replay,
            },
        )
}

/// One turn as the server holds it.
struct Held {
    turn: Turn,
    ask: &'static str,
    previous: Option<&'static str>,
}

impl Held {
    fn first(case: &TwoTurns) -> Held {
        let refs: Vec<&str> = case.first_deltas.iter().map(String::as_str).collect();
        Held {
            turn: Turn::completed(FIRST_Q, S, &refs),
            ask: FIRST_ASK,
            previous: None,
        }
    }

    fn follow_up(case: &TwoTurns) -> Held {
        let refs: Vec<&str> = case.deltas.iter().map(String::as_str).collect();
        Held {
            turn: Turn::completed(Q, S, &refs),
            ask: FOLLOW_UP_ASK,
            previous: Some(FIRST_Q),
        }
    }

    /// Its Query document with `status` (the answer once completed).
    fn document(&self, status: &str) -> serde_json::Value {
        let answer = if status == "completed" {
            self.turn.answer.as_str()
        } else {
            ""
        };
        let mut doc = query_json(&self.turn.query_id, S, status, answer);
        doc["input"] = serde_json::json!([{"role": "user", "content": self.ask}]);
        doc["previous_query_id"] = serde_json::json!(self.previous);
        doc
    }

    /// Its frames from `from` as `body` says, the final frame its document.
    fn stream(&self, from: u64, body: &Body) -> Vec<Step> {
        let steps = render(
            &self.turn,
            &self.turn.answer,
            from,
            body,
            &self.turn.query_id,
        );
        let input = self.document("completed");
        let bare = r#""input":[]"#;
        let bound = format!(
            r#""input":{},"previous_query_id":{}"#,
            input["input"], input["previous_query_id"]
        );
        map_writes(steps, |text| text.replace(bare, &bound))
    }
}

fn whole() -> Body {
    Body {
        prefix: 99,
        mutations: Vec::new(),
        unknown_at: None,
        ending: Ending::Final,
    }
}

fn serve_two_turns(
    case: &TwoTurns,
) -> (
    impl Fn(&sse_server::Request, usize) -> Reply + Send + Sync + 'static,
    Arc<Seen>,
) {
    let first = Held::first(case);
    let own = Held::follow_up(case);
    let case = case.clone();
    let seen = Arc::new(Seen {
        processed_posts: AtomicUsize::new(0),
    });
    let seen2 = seen.clone();
    let posts = AtomicUsize::new(0);
    let polls = AtomicUsize::new(0);
    let server = move |req: &sse_server::Request, _: usize| -> Reply {
        // What the server serves as the follow-up: its own turn or the replay.
        let served = if case.replay { &first } else { &own };
        if req.is("POST", "/query") {
            let n = posts.fetch_add(1, Ordering::SeqCst);
            if n == 0 {
                seen2.processed_posts.fetch_add(1, Ordering::SeqCst);
                return Reply::sse(first.stream(1, &whole()));
            }
            if let Some(wait) = case.throttles.get(n - 1) {
                return Reply::json(
                    429,
                    &[&format!("Retry-After: {wait}")],
                    &serde_json::json!({"message": "slow down"}),
                );
            }
            seen2.processed_posts.fetch_add(1, Ordering::SeqCst);
            return match &case.post {
                FollowUpPost::Sse { body, .. } => Reply::sse(served.stream(1, body)),
                FollowUpPost::Json { status, .. } => {
                    Reply::json(200, &[], &served.document(status))
                }
                FollowUpPost::Background { replayed_post, .. } => {
                    let doc = if *replayed_post {
                        served.document("completed")
                    } else {
                        own.document("in_progress")
                    };
                    Reply::json(202, &[], &doc)
                }
            };
        }
        let from = last_event_id(req).unwrap_or(0).max(1);
        if req.is("GET", &format!("/queries/{FIRST_Q}/events")) {
            return Reply::sse(first.stream(from, &whole()));
        }
        if req.is("GET", &format!("/queries/{FIRST_Q}")) {
            return Reply::json(200, &[], &first.document("completed"));
        }
        if req.is("GET", &format!("/queries/{Q}/events")) {
            return Reply::sse(served.stream(from, &whole()));
        }
        if req.is("GET", &format!("/queries/{Q}")) {
            let n = polls.fetch_add(1, Ordering::SeqCst);
            let running = match case.post {
                FollowUpPost::Background { running_polls, .. } => running_polls,
                _ => 0,
            };
            let doc = if n < running {
                own.document("in_progress")
            } else {
                served.document("completed")
            };
            return Reply::json(200, &[], &doc);
        }
        if req.method == "POST" && req.path.ends_with("/cancel") {
            return Reply::json(200, &[], &own.document("cancelled"));
        }
        Reply::json(404, &[], &serde_json::json!({"message": "not scripted"}))
    };
    (server, seen)
}

/// Runs the follow-up as `case.post` says; returns its outcome and the
/// text it delivered.
async fn follow_up(
    session: &nexus_knowql::Session,
    case: &TwoTurns,
) -> Result<(Result<types::Query, Error>, String), TestCaseError> {
    let cfg = config(case.keep_text);
    let started = Instant::now();
    let bound = TURN_DEADLINE + SLACK;
    let ask = || session.ask(FOLLOW_UP_ASK).stream_config(cfg.clone());
    let stream = match case.post {
        FollowUpPost::Sse { stream, .. } | FollowUpPost::Json { stream, .. } => stream,
        FollowUpPost::Background { .. } => {
            let wait =
                WaitPolicy::default().interval(Duration::from_secs(1), Duration::from_secs(2));
            let run = async {
                let mut handle = ask().background().await?;
                handle.wait(wait).await
            };
            let Ok(result) = tokio::time::timeout(bound, run).await else {
                return Err(TestCaseError::fail(
                    "background() and wait() ran past the turn deadline",
                ));
            };
            return Ok((result, String::new()));
        }
    };
    if !stream {
        let Ok(result) = tokio::time::timeout(bound, ask().send()).await else {
            return Err(TestCaseError::fail("send() ran past the turn deadline"));
        };
        return Ok((result, String::new()));
    }
    let Ok(opened) = tokio::time::timeout(bound, ask().stream()).await else {
        return Err(TestCaseError::fail("stream() ran past the turn deadline"));
    };
    let mut live = match opened {
        Ok(live) => live,
        Err(e) => return Ok((Err(e), String::new())),
    };
    let mut named = false;
    let (text, error) = drain(&mut live, started, &mut named).await?;
    let Ok(finished) = tokio::time::timeout_at(started + bound, live.finish()).await else {
        return Err(TestCaseError::fail("finish() ran past the turn deadline"));
    };
    Ok((error.map_or(finished, Err), text))
}

pub(super) async fn run_two_turns(case: TwoTurns) -> Check {
    let (script_fn, seen) = serve_two_turns(&case);
    let server = SseServer::start(script_fn).await;
    let client = client(&server.url);
    let session = client.session(["ctx"]).build().unwrap();
    let first = Held::first(&case);
    let sent = tokio::time::timeout(
        TURN_DEADLINE + SLACK,
        session.ask(FIRST_ASK).stream_config(config(true)).send(),
    )
    .await;
    let Ok(sent) = sent else {
        return Err(TestCaseError::fail("the first turn ran past its deadline"));
    };
    match sent {
        Ok(q) => {
            prop_assert_eq!(q.id.as_str(), FIRST_Q);
            prop_assert_eq!(q.answer_text(), first.turn.answer.as_str());
        }
        Err(e) => return Err(TestCaseError::fail(format!("the first turn failed: {e:?}"))),
    }
    let (result, text) = follow_up(&session, &case).await?;
    if case.replay {
        // The first turn again is not the follow-up's answer, in any mode.
        prop_assert!(
            matches!(result, Err(Error::TurnMismatch(_))),
            "a replay of the first turn answered the follow-up: {:?}",
            result.map(|q| q.id)
        );
        prop_assert_eq!(text, "", "text of the first turn was delivered again");
    } else {
        let own = Held::follow_up(&case);
        match result {
            Ok(q) => {
                prop_assert_eq!(q.id.as_str(), Q);
                prop_assert_eq!(q.answer_text(), own.turn.answer.as_str());
                if matches!(case.post, FollowUpPost::Sse { stream: true, .. }) {
                    prop_assert_eq!(text, own.turn.answer);
                }
            }
            Err(e) => {
                return Err(TestCaseError::fail(format!(
                    "a follow-up answered as the contract says failed: {e:?}"
                )));
            }
        }
    }
    prop_assert_eq!(
        seen.processed_posts.load(Ordering::SeqCst),
        2,
        "one POST /query per turn"
    );
    Ok(())
}
