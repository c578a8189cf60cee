//! The scripts of the hostile-server model: how a generated server bends
//! the contract, the strategies that generate it, and the frames it sends.

use super::*;

/// How a streamed body (the answer to `POST /query` or an events request)
/// goes wrong, applied to the true turn's frames.
#[derive(Debug, Clone)]
pub(super) struct Body {
    /// The true frames sent (ids `1..=prefix`), before the ending.
    pub(super) prefix: usize,
    /// Per frame: 0 as is, 1 dropped (a gap), 2 twice, 3 without its id.
    pub(super) mutations: Vec<u8>,
    /// An unknown event inserted after this many frames, if any.
    pub(super) unknown_at: Option<usize>,
    pub(super) ending: Ending,
}

#[derive(Debug, Clone)]
pub(super) enum Ending {
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
pub(super) enum Post {
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
pub(super) enum Events {
    /// From `Last-Event-ID` inclusively, as the contract says.
    Faithful(Body),
    /// Starting this many events late.
    Late(u64),
    /// Starting this many events early.
    Early(u64),
    Gone(u16),
    Status(u16),
    StallHeaders,
    /// The whole turn again from its start, every id shifted by this many
    /// (a replica that numbers the same events otherwise).
    Renumbered(u64),
    /// The whole turn again from its start, its first frame numbered as
    /// the `Last-Event-ID` sent: every id passes, the text starts over.
    StartsAgain,
    /// From `Last-Event-ID` inclusively, the text deltas without ids.
    IdlessDeltas,
}

/// The stored turn (`GET /queries/{id}`).
#[derive(Debug, Clone)]
pub(super) struct Stored {
    /// Polls that answer `in_progress` before the final status.
    pub(super) running_polls: usize,
    /// The final status: completed, failed, cancelled, or in_progress forever.
    pub(super) status: &'static str,
    /// Whether the stored answer is the streamed one (else it differs).
    pub(super) agrees: bool,
    /// Answers 404 instead.
    pub(super) missing: bool,
}

/// Where the server lies about which turn it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lie {
    /// The events requests (resumes) stream another turn (same text).
    EventsOfAnotherTurn,
    /// Every final `query` frame names another turn (same text).
    FinalOfAnotherTurn,
    /// `GET /queries/{id}` answers another turn's document from this poll on.
    StoredOfAnotherTurn(usize),
    /// The events requests stream this turn of another session.
    AnotherSession,
    /// Every final frame has no `event:` and no `id:`, and is another
    /// turn's Query (`"type":"query"`).
    UnnamedFinalOfAnotherTurn,
    /// After its first frame the answer to `POST /query` has a delta of
    /// another turn whose identity does not parse cleanly: 0 a numeric
    /// `id`, 1 a numeric `session_id`, 2 a duplicated `query_id`, 3 a bad
    /// escape elsewhere. Its text ([`FOREIGN`]) is never delivered.
    FailOpenIdentity(u8),
}

/// The text of a lying server's foreign delta.
pub(super) const FOREIGN: &str = "FOREIGN";

/// `steps` as a lying server changes them: an unnamed final frame of
/// another turn, or (`post`: in the answer to `POST /query`) a foreign
/// delta whose identity does not parse cleanly after the first frame.
pub(super) fn lie_in(script: &Script, steps: Vec<Step>, post: bool) -> Vec<Step> {
    let rewrite = |text: String| -> String {
        match script.lie {
            // A final frame that is the body's first names the turn: the
            // lie needs a frame that named the true one before it.
            Some(Lie::UnnamedFinalOfAnotherTurn) if text.starts_with("event: query\n") => {
                text.replace("event: query\ndata: {", "data: {\"type\":\"query\",")
            }
            Some(Lie::UnnamedFinalOfAnotherTurn) => text
                .replace("event: query\ndata: {", "data: {\"type\":\"query\",")
                .replace(&format!("\"id\":\"{Q}\""), &format!("\"id\":\"{OTHER_Q}\"")),
            Some(Lie::FailOpenIdentity(variant)) if post => {
                let data = match variant {
                    0 => format!(
                        r#"{{"type":"response.output_text.delta","query_id":"{OTHER_Q}","id":5,"delta":"{FOREIGN}"}}"#
                    ),
                    1 => format!(
                        r#"{{"type":"response.output_text.delta","query_id":"{OTHER_Q}","session_id":7,"delta":"{FOREIGN}"}}"#
                    ),
                    2 => format!(
                        r#"{{"type":"response.output_text.delta","query_id":"{Q}","query_id":"{OTHER_Q}","delta":"{FOREIGN}"}}"#
                    ),
                    _ => format!(
                        r#"{{"type":"response.output_text.delta","query_id":"{OTHER_Q}","note":"\q","delta":"{FOREIGN}"}}"#
                    ),
                };
                let foreign = format!("event: response.output_text.delta\ndata: {data}\n\n");
                match text.find("\n\n") {
                    Some(at) => format!("{}{foreign}{}", &text[..at + 2], &text[at + 2..]),
                    None => text,
                }
            }
            _ => text,
        }
    };
    let mut first = true;
    steps
        .into_iter()
        .map(|step| match step {
            Step::Write(bytes) if first || !post => {
                first = false;
                match String::from_utf8(bytes) {
                    Ok(text) => Step::Write(rewrite(text).into_bytes()),
                    Err(e) => Step::Write(e.into_bytes()),
                }
            }
            other => other,
        })
        .collect()
}

#[derive(Debug, Clone)]
pub(super) enum Mode {
    /// `stream()`, `next()` to the end, `finish()`.
    Stream,
    /// `send()`.
    Send,
    /// `stream()` read for this many events, dropped, then `attach` and
    /// `resume_from` its checkpoint from a fresh client.
    Resume(usize),
}

#[derive(Debug, Clone)]
pub(super) struct Script {
    pub(super) deltas: Vec<String>,
    /// 429s before the real answer, each with this `Retry-After`.
    pub(super) throttles: Vec<u64>,
    pub(super) post: Post,
    pub(super) events: Vec<Events>,
    pub(super) stored: Stored,
    pub(super) keep_text: bool,
    pub(super) mode: Mode,
    /// The server lies about the turn's identity, this way.
    pub(super) lie: Option<Lie>,
    /// A server that keeps the contract (in one of its standard forms): the
    /// turn must end `Ok` with the stored answer.
    pub(super) benign: bool,
}

pub(super) fn body_strategy() -> impl Strategy<Value = Body> {
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

pub(super) fn script_strategy() -> impl Strategy<Value = Script> {
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
            1 => (0u64..8).prop_map(Events::Renumbered),
            1 => Just(Events::StartsAgain),
            1 => Just(Events::IdlessDeltas),
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
    let lie = proptest::option::weighted(
        0.25,
        prop_oneof![
            Just(Lie::EventsOfAnotherTurn),
            Just(Lie::FinalOfAnotherTurn),
            (0usize..4).prop_map(Lie::StoredOfAnotherTurn),
            Just(Lie::AnotherSession),
            Just(Lie::UnnamedFinalOfAnotherTurn),
            (0u8..4).prop_map(Lie::FailOpenIdentity),
        ],
    );
    (
        deltas,
        proptest::collection::vec(0u64..3, 0..3),
        post,
        events,
        stored,
        any::<bool>(),
        mode_strategy(),
        lie,
    )
        .prop_map(
            |(deltas, throttles, post, events, stored, keep_text, mode, lie)| Script {
                deltas,
                throttles,
                post,
                events,
                stored,
                keep_text,
                mode,
                lie,
                benign: false,
            },
        )
}

fn mode_strategy() -> impl Strategy<Value = Mode> {
    prop_oneof![
        4 => Just(Mode::Stream),
        2 => Just(Mode::Send),
        2 => (0usize..8).prop_map(Mode::Resume),
    ]
}

/// A body that keeps the contract: duplicated frames, unknown events,
/// a close, a cut or a stall that the idle timeout ends, but every frame
/// that arrives is true. With `named`, its first frame arrives whole (a
/// connection cut before the server named the turn cannot be resumed).
pub(super) fn benign_body(named: bool) -> impl Strategy<Value = Body> {
    let min = usize::from(named);
    (
        min..12,
        proptest::collection::vec(prop_oneof![6 => Just(0u8), 1 => Just(2)], 12),
        proptest::option::weighted(0.15, min..12),
        if named {
            prop_oneof![
                3 => Just(Ending::Final),
                1 => Just(Ending::Close),
                1 => Just(Ending::FinalThenStall),
                1 => Just(Ending::FinalNotTerminal),
                1 => (1u64..400).prop_map(Ending::Stall),
            ]
            .boxed()
        } else {
            prop_oneof![
                3 => Just(Ending::Final),
                1 => Just(Ending::Close),
                2 => (0u16..1000).prop_map(Ending::Cut),
                1 => Just(Ending::FinalThenStall),
                1 => Just(Ending::FinalNotTerminal),
                1 => (1u64..400).prop_map(Ending::Stall),
            ]
            .boxed()
        },
    )
        .prop_map(|(prefix, mutations, unknown_at, ending)| Body {
            prefix,
            mutations,
            unknown_at,
            ending,
        })
}

/// Servers that keep the contract, in its standard forms: a replay from
/// `Last-Event-ID` inclusively, right after it, or earlier; a Query
/// document for an answer; throttles within the retry policy; a stored
/// turn that runs a while and then holds the streamed answer. Every one
/// must end `Ok` with the stored answer.
pub(super) fn benign_strategy() -> impl Strategy<Value = Script> {
    let deltas = proptest::collection::vec("[a-zé ]{1,12}", 1..5);
    let post = prop_oneof![
        6 => benign_body(true).prop_map(Post::Sse),
        2 => prop_oneof![Just("completed"), Just("in_progress")]
            .prop_map(|status| Post::Json { status, stall: false }),
        1 => ((1u64..3), benign_body(true)).prop_map(|(s, b)| Post::StallHeaders(s, b)),
    ];
    // At most two scripted connections, so that the resume budget (three
    // connections without progress) is never spent on them alone.
    let events = proptest::collection::vec(
        prop_oneof![
            4 => benign_body(false).prop_map(Events::Faithful),
            1 => Just(Events::Late(1)),
            1 => (1u64..4).prop_map(Events::Early),
        ],
        0..3,
    );
    let stored = (0usize..4).prop_map(|running_polls| Stored {
        running_polls,
        status: "completed",
        agrees: true,
        missing: false,
    });
    // Throttles and a stall before the headers stay within the header
    // timeout together.
    (
        deltas,
        proptest::collection::vec(0u64..2, 0..3),
        post,
        events,
        stored,
        any::<bool>(),
        mode_strategy(),
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
                lie: None,
                benign: true,
            },
        )
}

/// The true turn of a script, and the answer its stored turn holds.
pub(super) fn truth(script: &Script) -> (Turn, String) {
    let refs: Vec<&str> = script.deltas.iter().map(String::as_str).collect();
    let turn = Turn::completed(Q, S, &refs);
    let stored = if script.stored.agrees {
        turn.answer.clone()
    } else {
        format!("Not {}", turn.answer)
    };
    (turn, stored)
}

/// The other turn and session a lying server names.
pub(super) const OTHER_Q: &str = "q_other";
pub(super) const OTHER_S: &str = "s_other";

/// `body` as a lying server sends it in answer to `POST /query`: when the
/// lie is about the session, the first frame (which names it) always
/// arrives, so that the turn knows its session before the lie.
pub(super) fn post_body(script: &Script, body: &Body) -> Body {
    let mut body = body.clone();
    if script.lie == Some(Lie::AnotherSession) {
        body.prefix = body.prefix.max(1);
        if let Some(first) = body.mutations.first_mut() {
            *first = 0;
        }
        // Nothing before it: a cut is then either inside it (the turn is
        // never named) or after it.
        body.unknown_at = None;
    }
    body
}

/// The turn a lying server streams on its events requests.
pub(super) fn foreign_turn(script: &Script, turn: &Turn) -> Turn {
    let refs: Vec<&str> = script.deltas.iter().map(String::as_str).collect();
    match script.lie {
        Some(Lie::EventsOfAnotherTurn) => Turn::completed(OTHER_Q, S, &refs),
        Some(Lie::AnotherSession) => Turn::completed(Q, OTHER_S, &refs),
        _ => turn.clone(),
    }
}

pub(super) fn delta_frame(id: u64, text: &str) -> String {
    frame(
        Some(id),
        "response.output_text.delta",
        &serde_json::json!({"type": "response.output_text.delta", "query_id": Q, "delta": text}),
    )
}

/// The bytes of a streamed body: the frames of `turn` from `from` (exclusive
/// of none: `from` is the first id sent) mutated and ended as `body` says;
/// its final frame names `final_id` (the turn's own, unless the server lies).
pub(super) fn render(
    turn: &Turn,
    stored_answer: &str,
    from: u64,
    body: &Body,
    final_id: &str,
) -> Vec<Step> {
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
    // A final frame that is the body's first names the turn: a lie needs a
    // frame that named the true one before it.
    let final_id = if out.is_empty() {
        turn.query_id.as_str()
    } else {
        final_id
    };
    let final_frame = |status: &str, answer: &str| {
        let doc = query_json(final_id, &turn.session_id, status, answer);
        frame(None, "query", &doc)
    };
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

/// Rewrites the text of every write of `steps` with `f`.
pub(super) fn map_writes(steps: Vec<Step>, f: impl Fn(&str) -> String) -> Vec<Step> {
    steps
        .into_iter()
        .map(|step| match step {
            Step::Write(bytes) => match String::from_utf8(bytes) {
                Ok(text) => Step::Write(f(&text).into_bytes()),
                Err(e) => Step::Write(e.into_bytes()),
            },
            other => other,
        })
        .collect()
}

/// `steps` with every `id:` shifted by `by`.
pub(super) fn renumbered(steps: Vec<Step>, by: u64) -> Vec<Step> {
    map_writes(steps, |text| {
        text.split_inclusive('\n')
            .map(|line| {
                match line
                    .strip_prefix("id: ")
                    .and_then(|n| n.trim_end().parse::<u64>().ok())
                {
                    Some(n) => format!("id: {}\n", n + by),
                    None => line.to_owned(),
                }
            })
            .collect()
    })
}

/// `steps` with the text deltas' `id:` lines left out.
pub(super) fn without_delta_ids(steps: Vec<Step>) -> Vec<Step> {
    map_writes(steps, |text| {
        text.split_inclusive("\n\n")
            .map(|frame| {
                if frame.contains("event: response.output_text.delta") {
                    frame
                        .split_inclusive('\n')
                        .filter(|l| !l.starts_with("id: "))
                        .collect()
                } else {
                    frame.to_owned()
                }
            })
            .collect()
    })
}
