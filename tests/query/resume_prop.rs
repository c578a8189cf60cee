//! Property: whatever byte the connections are cut at and however the writes
//! are split, the caller receives exactly the uncut event sequence.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::props::regressions_beside_source;
use crate::support::sse_server;
use futures::StreamExt;
use nexus_knowql::{QueryEvent, StreamConfig};
use proptest::prelude::*;
use sse_server::{Reply, SseServer, Step, Turn, last_event_id};

/// Runs one turn whose POST and resumes are cut at the given byte offsets
/// (each offset counted within that connection's body) and whose writes are
/// split into `splits` sizes. Returns what the caller saw.
fn run(
    turn: Turn,
    cuts: Vec<usize>,
    splits: Vec<usize>,
    crlf: bool,
) -> (Vec<QueryEvent>, Vec<Option<u64>>, usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let connection = Arc::new(AtomicUsize::new(0));
        let t = turn.clone();
        let ending = if crlf { "\r\n" } else { "\n" };
        let server = SseServer::start(move |req, _| {
            let n = connection.fetch_add(1, Ordering::SeqCst);
            let body = if req.is("POST", "/query") {
                t.body()
            } else {
                t.replay_from(last_event_id(req))
            };
            let body = body.replace('\n', ending).into_bytes();
            let cut = cuts.get(n).copied().map(|c| c.min(body.len()));
            match cut {
                Some(c) => Reply::sse(vec![
                    Step::WriteSplit(body[..c].to_vec(), splits.clone()),
                    Step::Reset,
                ]),
                None => Reply::sse(vec![Step::WriteSplit(body, splits.clone())]),
            }
        })
        .await;
        let session = server.client().session(["docs"]).build().unwrap();
        let mut live = session
            .ask("q")
            .stream_config(
                StreamConfig::default()
                    .reconnect_delay(Duration::from_millis(1), Duration::from_millis(5))
                    .reconnect_attempts(20),
            )
            .stream()
            .await
            .unwrap();
        let mut events = Vec::new();
        while let Some(item) = live.next().await {
            events.push(item.unwrap());
        }
        let ids = server
            .last_event_ids()
            .into_iter()
            .map(|v| v.map(|v| v.parse().unwrap()))
            .collect();
        (events, ids, server.count("POST", "/query"))
    })
}

fn uncut(turn: &Turn) -> Vec<QueryEvent> {
    let mut decoder = nexus_knowql::query::EventDecoder::new();
    decoder.feed(turn.body().as_bytes());
    let mut out = Vec::new();
    while let Some((_, e)) = decoder.next_event().unwrap() {
        out.push(e);
    }
    out
}

proptest! {
    // 64 cases unless `PROPTEST_CASES` says otherwise.
    #![proptest_config(regressions_beside_source(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
    )))]

    #[test]
    fn delivered_sequence_equals_the_uncut_one(
        n_deltas in 1usize..25,
        cuts in proptest::collection::vec(0usize..4000, 0..4),
        splits in proptest::collection::vec(1usize..300, 1..5),
        crlf in any::<bool>(),
    ) {
        let deltas: Vec<String> = (0..n_deltas).map(|i| format!("word{i} ")).collect();
        let refs: Vec<&str> = deltas.iter().map(String::as_str).collect();
        let turn = Turn::completed("q_prop", "s_prop", &refs);
        // The first cut must fall after `response.created`, or the turn
        // cannot be resumed (that case has its own test).
        let ending = if crlf { "\r\n" } else { "\n" };
        let created_len = turn.frames[0].1.replace('\n', ending).len();
        let mut cuts = cuts;
        if let Some(first) = cuts.first_mut() {
            *first += created_len;
        }
        let expected = uncut(&turn);
        let (events, ids, posts) = run(turn.clone(), cuts, splits, crlf);
        prop_assert_eq!(posts, 1);
        prop_assert_eq!(&events, &expected);
        let text: String = events.iter().filter_map(|e| match e {
            QueryEvent::TextDelta { delta } => Some(delta.as_str()),
            _ => None,
        }).collect();
        prop_assert_eq!(text, turn.answer);
        // Every resume asked from the last event delivered before it: never backwards.
        prop_assert!(ids.iter().all(Option::is_some));
        prop_assert!(ids.windows(2).all(|w| w[0] <= w[1]));
    }
}
