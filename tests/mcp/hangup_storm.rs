//! A hang-up storm under a descriptor limit, at the default settings: the
//! `nexus-mcp` binary runs under `ulimit -n 256` with a per-caller limit of
//! 4 (nothing else set), in front of a Nexus whose turns take a second to
//! start; one key sends 600 `query_context` calls in paced waves, each
//! client hanging up after 0.2 s. The call ledger admits at most 4 of the
//! key's calls at a time (the rest get 429), each admitted call holds its
//! slot until its turn's cancel is answered, so no more than 4 turns run
//! at once and every started turn is cancelled; `accept` never fails, the
//! server's descriptors return to their count before the storm, and
//! another key is served throughout. With sessions (the default) and with
//! `--stateless`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::peer_support::{query_context, turn_nexus};
use crate::support::mcp::{HttpMcp, query_json};
use crate::support::mcp_process::{Launch, McpProcess};
use crate::support::wait::{PATIENCE, signalled, until};
use serde_json::json;
use tokio::sync::watch;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const STORM_KEY: &str = "pcsk_storm_caller_key_0123456789abcdef";
const OTHER_KEY: &str = "pcsk_storm_other_key_0123456789abcdefg";
/// The open-file limit the server runs under.
const OPEN_FILES: u32 = 256;
/// The storm key's budget: its calls in flight at once.
const LIMIT: usize = 4;
/// The storm: `WAVES` waves of `WAVE` calls, one wave every `PACE`.
const WAVES: usize = 40;
const WAVE: usize = 15;
const PACE: Duration = Duration::from_millis(100);
/// How long each storm client waits before it hangs up.
const HANG_UP_AFTER: Duration = Duration::from_millis(200);
/// How long Nexus takes to start a turn.
const TURN_START: Duration = Duration::from_secs(1);
/// Descriptors the server may hold past its count before the storm once
/// the storm is over (pooled upstream connections).
const SLACK: usize = LIMIT;

/// What the scripted Nexus has seen: turns started, cancels, and the most
/// turns started and not yet cancelled at any start.
#[derive(Debug, Clone, Copy, Default)]
struct Turns {
    started: usize,
    cancelled: usize,
    most_running: usize,
}

/// A responder that counts turn starts (`start`) or cancels.
struct Counting {
    seen: watch::Sender<Turns>,
    start: bool,
    answer: ResponseTemplate,
}

impl wiremock::Respond for Counting {
    fn respond(&self, _: &wiremock::Request) -> ResponseTemplate {
        self.seen.send_modify(|turns| {
            if self.start {
                turns.started += 1;
                let running = turns.started - turns.cancelled;
                turns.most_running = turns.most_running.max(running);
            } else {
                turns.cancelled += 1;
            }
        });
        self.answer.clone()
    }
}

/// A Nexus whose `POST /query` answers after [`TURN_START`] and whose
/// turn starts and cancels are counted as they arrive.
async fn storm_nexus() -> (MockServer, watch::Receiver<Turns>) {
    let nexus = turn_nexus(TURN_START).await;
    let (seen, signal) = watch::channel(Turns::default());
    let started = ResponseTemplate::new(202)
        .set_body_json(query_json("q_1", "in_progress", &[], None))
        .set_delay(TURN_START);
    let cancelled =
        ResponseTemplate::new(200).set_body_json(query_json("q_1", "cancelled", &[], None));
    for (route, start, answer) in [
        ("/query", true, started),
        ("/queries/q_1/cancel", false, cancelled),
    ] {
        Mock::given(method("POST"))
            .and(path(route))
            .respond_with(Counting {
                seen: seen.clone(),
                start,
                answer,
            })
            .with_priority(1)
            .mount(&nexus)
            .await;
    }
    (nexus, signal)
}

/// How a storm call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    /// Answered with this status before the client hung up.
    Answered(u16),
    /// Still running when the client hung up.
    HungUp,
    /// The connection failed or was closed without an answer.
    Cut,
}

/// The storm key's calls: posted with its key (and session, if any) on a
/// connection of their own each.
struct StormCaller {
    http: reqwest::Client,
    url: String,
    session: Option<String>,
}

impl StormCaller {
    async fn new(process: &McpProcess, sessions: bool) -> StormCaller {
        let session = if sessions {
            let mut client =
                HttpMcp::new(process.url.clone()).header("x-pinecone-api-key", STORM_KEY);
            client.initialize().await;
            client.session
        } else {
            None
        };
        StormCaller {
            // No connection is kept for a later call: each call's
            // connection ends with it.
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
            url: process.url.clone(),
            session,
        }
    }

    /// One `query_context` call, given up after [`HANG_UP_AFTER`].
    async fn call_and_hang_up(&self, id: u64) -> Outcome {
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .header("x-pinecone-api-key", STORM_KEY)
            .body(query_context(id).to_string());
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        let call = async {
            let answer = request.send().await?;
            let status = answer.status().as_u16();
            // A streamed answer's head may come first: the call runs
            // until its body ends.
            answer.bytes().await?;
            Ok::<_, reqwest::Error>(status)
        };
        match tokio::time::timeout(HANG_UP_AFTER, call).await {
            Ok(Ok(status)) => Outcome::Answered(status),
            Ok(Err(_)) => Outcome::Cut,
            // Dropping the call closes its connection: the client is gone.
            Err(_) => Outcome::HungUp,
        }
    }
}

/// `calls` calls of `caller` at once, all hung up; their outcomes.
async fn wave(caller: &Arc<StormCaller>, first_id: u64, calls: usize) -> Vec<Outcome> {
    let calls = (0..calls as u64).map(|i| {
        let caller = Arc::clone(caller);
        tokio::spawn(async move { caller.call_and_hang_up(first_id + i).await })
    });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|outcome| outcome.expect("a storm call runs to its end"))
        .collect()
}

/// The other key's `list_contexts` calls, one every 200 ms until `stop`;
/// how many were made. Each must succeed.
async fn other_key_calls(mut other: HttpMcp, stop: watch::Receiver<bool>) -> usize {
    let mut calls = 0;
    while !*stop.borrow() {
        let result = other.call("list_contexts", json!({})).await;
        assert_eq!(result["isError"], false, "{result}");
        calls += 1;
        // Paced load: the other key's pace between its calls.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    calls
}

/// The other key's client, initialized in a session when `sessions`.
async fn other_key(process: &McpProcess, sessions: bool) -> HttpMcp {
    let mut other = HttpMcp::new(process.url.clone()).header("x-pinecone-api-key", OTHER_KEY);
    if sessions {
        other.initialize().await;
    }
    other
}

/// Waits until the scripted Nexus has seen at least `started` turns
/// started, and every started turn cancelled.
async fn every_turn_cancelled(turns: &mut watch::Receiver<Turns>, started: usize) -> Turns {
    let watched = turns.clone();
    signalled(turns, "every started turn is cancelled", || {
        let seen = *watched.borrow();
        seen.started >= started && seen.cancelled == seen.started
    })
    .await;
    *turns.borrow()
}

async fn hang_up_storm(per_caller: usize, sessions: bool) {
    let (nexus, mut turns) = storm_nexus().await;
    let per_caller = per_caller.to_string();
    let mut args = vec!["--max-requests-per-caller", per_caller.as_str()];
    if !sessions {
        args.push("--stateless");
    }
    let mut process = Launch::args(&args)
        .env("NEXUS_BASE_URL", &nexus.uri())
        .open_files(OPEN_FILES)
        .start()
        .await;
    let storm = Arc::new(StormCaller::new(&process, sessions).await);
    let mut other = other_key(&process, sessions).await;
    let first = other.call("list_contexts", json!({})).await;
    assert_eq!(first["isError"], false, "{first}");

    // Warm up: the key's budget of calls, each hung up; their turns are
    // cancelled and the upstream connections they opened stay pooled.
    let warm = wave(&storm, 1, LIMIT).await;
    assert!(warm.iter().all(|o| *o == Outcome::HungUp), "{warm:?}");
    every_turn_cancelled(&mut turns, LIMIT).await;
    let baseline = process.open_descriptors();

    let (stop, stopped) = watch::channel(false);
    let other_calls = tokio::spawn(other_key_calls(other, stopped));
    let began = Instant::now();
    let mut waves = Vec::new();
    let mut pace = tokio::time::interval(PACE);
    for n in 0..WAVES {
        // Paced load: the storm's next wave.
        pace.tick().await;
        let storm = Arc::clone(&storm);
        let first_id = 1000 + (n * WAVE) as u64;
        waves.push(tokio::spawn(
            async move { wave(&storm, first_id, WAVE).await },
        ));
    }
    let mut outcomes = BTreeMap::<Outcome, usize>::new();
    for wave in waves {
        for outcome in wave.await.expect("a wave runs to its end") {
            *outcomes.entry(outcome).or_default() += 1;
        }
    }
    let storm_time = began.elapsed();
    stop.send(true).unwrap();
    let other_calls = other_calls
        .await
        .expect("the other key is served throughout");
    let seen = every_turn_cancelled(&mut turns, LIMIT).await;
    eprintln!(
        "{} mode: {outcomes:?} in {storm_time:?}; Nexus saw {seen:?}; other key: {other_calls} calls; \
         descriptors before the storm {baseline}, now {}",
        if sessions { "sessions" } else { "stateless" },
        process.open_descriptors(),
    );

    // (a) `accept` never failed, and the server is still up.
    let log = process.log().join("\n");
    assert!(!log.contains("accept failed"), "{log}");
    let accept_failed = process
        .metric("nexus_mcp_refusals_total{reason=\"accept_failed\"}")
        .await;
    assert_eq!(accept_failed, 0.0, "failed accepts counted");
    assert!(process.running(), "the server is up after the storm");
    // (b) Never more than the key's budget of turns running at once; the
    // calls past it refused with 429, and every started turn cancelled.
    let calls = WAVES * WAVE;
    assert_eq!(outcomes.values().sum::<usize>(), calls);
    let hung_up = outcomes.get(&Outcome::HungUp).copied().unwrap_or(0);
    let refused = outcomes.get(&Outcome::Answered(429)).copied().unwrap_or(0);
    assert_eq!(
        hung_up + refused,
        calls,
        "each call was refused with 429 or ran until its client left: {outcomes:?}"
    );
    assert!(refused >= calls / 2, "{outcomes:?}");
    assert!(
        seen.most_running <= LIMIT,
        "{} turns ran at once for one key: {seen:?}",
        seen.most_running
    );
    let storm_turns = seen.started - LIMIT;
    assert!(
        (1..=hung_up).contains(&storm_turns),
        "{storm_turns} turns started by the storm, {hung_up} calls admitted"
    );
    // (c) The descriptors come back once every cancel is answered.
    until(
        PATIENCE,
        "the server's descriptors return to their count before the storm",
        async || process.open_descriptors() <= baseline + SLACK,
    )
    .await;
    // (d) The other key was served during the storm, and still is.
    assert!(other_calls >= 3, "{other_calls} calls of the other key");
    let mut other = other_key(&process, sessions).await;
    let after = other.call("list_contexts", json!({})).await;
    assert_eq!(after["isError"], false, "{after}");
    drop(nexus);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_up_storm_under_a_descriptor_limit_with_sessions() {
    hang_up_storm(LIMIT, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_up_storm_under_a_descriptor_limit_stateless() {
    hang_up_storm(LIMIT, false).await;
}
