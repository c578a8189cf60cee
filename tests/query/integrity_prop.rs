//! Property: whatever ids a misbehaving server sends (gaps, duplicates,
//! reorders, replays that start early or late) and wherever it cuts, a
//! streamed turn returns exactly the final answer or an error, never `Ok`
//! with other text, and never sends `POST /query` twice.
//!
//! The number of cases is proptest's default, `PROPTEST_CASES` overrides it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::props::regressions_beside_source;
use crate::support::sse_server;
use futures::StreamExt;
use nexus_knowql::{CallOptions, QueryEvent, StreamConfig};
use proptest::prelude::*;
use sse_server::{Reply, SseServer, Step, Turn, last_event_id, query_json};

#[derive(Debug, Clone)]
enum Op {
    /// The next event.
    Next,
    /// Skip this many events (a gap).
    Skip(u64),
    /// The previous event again.
    Dup,
    /// The two next events, swapped.
    Swap,
}

/// What one connection sends.
#[derive(Debug, Clone)]
struct Conn {
    /// Where a replay starts, relative to `Last-Event-ID` (negative: early).
    start: i64,
    ops: Vec<Op>,
    /// Frames sent before a reset; `None`: to the end, then the `query` frame.
    cut: Option<usize>,
    /// Whether the `query` frame is left out at the end.
    no_query: bool,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::Next),
        1 => (1u64..4).prop_map(Op::Skip),
        1 => Just(Op::Dup),
        1 => Just(Op::Swap),
    ]
}

fn conn() -> impl Strategy<Value = Conn> {
    (
        -3i64..3,
        proptest::collection::vec(op(), 0..12),
        proptest::option::of(0usize..14),
        any::<bool>(),
    )
        .prop_map(|(start, ops, cut, no_query)| Conn {
            start,
            ops,
            cut,
            no_query,
        })
}

/// The frames a connection sends, from event `from`.
fn emit(turn: &Turn, conn: &Conn, from: u64) -> Vec<u8> {
    let n = turn.events() as u64;
    let event = |id: u64| turn.frames[(id - 1) as usize].1.clone();
    let mut out = Vec::new();
    let mut pos = from.max(1);
    let mut ops = conn.ops.iter();
    while pos <= n {
        match ops.next().unwrap_or(&Op::Next) {
            Op::Next => {
                out.push(event(pos));
                pos += 1;
            }
            Op::Skip(k) => pos += k,
            Op::Dup => {
                if pos > 1 {
                    out.push(event(pos - 1));
                }
            }
            Op::Swap => {
                if pos < n {
                    out.push(event(pos + 1));
                }
                out.push(event(pos));
                pos += 2;
            }
        }
    }
    let query = turn
        .frames
        .last()
        .map(|(_, f)| f.clone())
        .unwrap_or_default();
    match conn.cut {
        Some(c) => out.truncate(c),
        None if !conn.no_query => out.push(query),
        None => {}
    }
    out.concat().into_bytes()
}

struct Outcome {
    posts: usize,
    /// The text of the deltas, and whether the stream yielded an error.
    streamed: String,
    stream_error: bool,
    finished: Result<String, String>,
}

fn run(turn: Turn, conns: Vec<Conn>) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let connection = Arc::new(AtomicUsize::new(0));
        let t = turn.clone();
        let stored = query_json(&t.query_id, &t.session_id, "completed", &t.answer);
        let server = SseServer::start(move |req, _| {
            if req.is("GET", &format!("/queries/{}", t.query_id)) {
                return Reply::json(200, &[], &stored);
            }
            let i = connection.fetch_add(1, Ordering::SeqCst);
            let last = last_event_id(req);
            let body = match conns.get(i) {
                // Once the script is over, a faithful server.
                None => t.replay_from(last).into_bytes(),
                Some(c) if req.is("POST", "/query") => emit(&t, c, 1),
                Some(c) => {
                    let from = last.unwrap_or(1).saturating_add_signed(c.start);
                    emit(&t, c, from)
                }
            };
            let cut = conns.get(i).is_some_and(|c| c.cut.is_some());
            let mut steps = vec![Step::Write(body)];
            if cut {
                steps.push(Step::Reset);
            }
            Reply::sse(steps)
        })
        .await;
        let client = server
            .client()
            .with_options(CallOptions::new().turn_timeout(Duration::from_secs(30)));
        let session = client.session(["docs"]).build().unwrap();
        let config = StreamConfig::default()
            .reconnect_delay(Duration::from_millis(1), Duration::from_millis(5))
            .reconnect_attempts(30)
            .final_query_wait(Duration::from_millis(50));
        let mut live = session
            .ask("q")
            .stream_config(config)
            .stream()
            .await
            .unwrap();
        let mut streamed = String::new();
        let mut stream_error = false;
        while let Some(item) = live.next().await {
            match item {
                Ok(QueryEvent::TextDelta { delta }) => streamed.push_str(&delta),
                Ok(_) => {}
                Err(_) => stream_error = true,
            }
        }
        let finished = live
            .finish()
            .await
            .map(|q| q.answer_text())
            .map_err(|e| e.to_string());
        Outcome {
            posts: server.count("POST", "/query"),
            streamed,
            stream_error,
            finished,
        }
    })
}

proptest! {
    #![proptest_config(regressions_beside_source(ProptestConfig::default()))]

    #[test]
    fn a_turn_is_the_final_answer_or_an_error(
        n_deltas in 1usize..10,
        conns in proptest::collection::vec(conn(), 1..5),
    ) {
        let deltas: Vec<String> = (0..n_deltas).map(|i| format!("w{i} ")).collect();
        let refs: Vec<&str> = deltas.iter().map(String::as_str).collect();
        let turn = Turn::completed("q_p", "s_p", &refs);
        // The POST must name the turn, or it cannot be resumed (and is
        // rightly an error): keep its first frame.
        let mut conns = conns;
        if let Some(first) = conns.first_mut() {
            first.ops.insert(0, Op::Next);
            if let Some(c) = &mut first.cut {
                *c = (*c).max(1);
            }
        }
        let out = run(turn.clone(), conns);
        prop_assert_eq!(out.posts, 1);
        if !out.stream_error {
            // A stream without an error delivered exactly the answer.
            prop_assert_eq!(&out.streamed, &turn.answer);
        }
        match &out.finished {
            Ok(answer) => {
                prop_assert_eq!(answer, &turn.answer);
                prop_assert!(!out.stream_error, "finish Ok after a stream error");
                prop_assert_eq!(&out.streamed, &turn.answer);
            }
            Err(_) => prop_assert!(out.stream_error, "finish failed after a clean stream"),
        }
    }
}
