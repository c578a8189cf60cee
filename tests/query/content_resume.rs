//! Exactly once by content: a replay whose ids pass every check but whose
//! text starts the answer again (a replica that renumbers the same events,
//! deltas without ids) is aligned on the text already delivered, in this
//! process and after a restart from a checkpoint.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::sse_server;
use crate::support::turns::{drain, text};
use futures::StreamExt;
use nexus_knowql::query::Checkpoint;
use nexus_knowql::{QueryTurn, StreamConfig};
use sse_server::{Reply, SseServer, Step, Turn, last_event_id, query_json};

const DELTAS: &[&str] = &[
    "p00 ", "p01 ", "p02 ", "p03 ", "p04 ", "p05 ", "p06 ", "p07 ", "p08 ", "p09 ",
];
/// What five deltas deliver.
const FIVE: &str = "p00 p01 p02 p03 p04 ";

type Script = dyn Fn(&Turn, Option<u64>) -> Reply + Send + Sync;

fn config() -> StreamConfig {
    StreamConfig::default()
        .reconnect_delay(Duration::from_millis(5), Duration::from_millis(50))
        .final_query_wait(Duration::from_millis(300))
}

/// `body` with every `id: N` line shifted by `by`.
fn renumbered(body: &str, by: u64) -> String {
    body.lines()
        .map(|line| match line.strip_prefix("id: ") {
            Some(n) => format!("id: {}\n", n.parse::<u64>().unwrap() + by),
            None => format!("{line}\n"),
        })
        .collect()
}

/// `frame` without its `id:` line.
fn strip_ids(frame: &str) -> String {
    frame
        .lines()
        .filter(|l| !l.starts_with("id: "))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `turn` with its text deltas sent without ids; the other events keep
/// consecutive ids (1 created, 2 step, then 3 step, 4 rollup, 5 completed).
fn without_delta_ids(turn: &Turn) -> Turn {
    let mut next = 0;
    let frames = turn
        .frames
        .iter()
        .map(|(id, f)| {
            let body = strip_ids(f);
            if id.is_none() || f.contains("output_text.delta") {
                (None, body)
            } else {
                next += 1;
                (Some(next), format!("id: {next}\n{body}"))
            }
        })
        .collect();
    Turn {
        frames,
        ..turn.clone()
    }
}

/// The frames of `turn` up to and including the `n`th one.
fn first(turn: &Turn, n: usize) -> String {
    turn.first(n)
}

/// A server for `turn`: the POST answers with `post`, every events request
/// with `replay(turn, Last-Event-ID)`, `GET /queries/{id}` with the stored,
/// completed turn.
async fn serve(turn: &Turn, post: Reply, replay: Arc<Script>) -> SseServer {
    let t = turn.clone();
    SseServer::start(move |req, _| {
        if req.is("POST", "/query") {
            post.clone()
        } else if req.method == "GET" && req.path == t.events_path() {
            replay(&t, last_event_id(req))
        } else if req.is("GET", &format!("/queries/{}", t.query_id)) {
            Reply::json(
                200,
                &[],
                &query_json(&t.query_id, &t.session_id, "completed", &t.answer),
            )
        } else {
            Reply::json(404, &[], &serde_json::json!({"message": "no route"}))
        }
    })
    .await
}

async fn stream(server: &SseServer) -> QueryTurn {
    server
        .client()
        .session(["handbook"])
        .build()
        .unwrap()
        .ask("List the parts")
        .stream_config(config())
        .stream()
        .await
        .unwrap()
}

/// Reads `live` until it delivered `text`, then checkpoints it, as a
/// worker persists after each event before it is killed.
async fn checkpoint_after(live: &mut QueryTurn, text: &str) -> Checkpoint {
    while live.text() != text {
        live.next().await.unwrap().unwrap();
    }
    // Persisted as text and read back by the next process.
    live.checkpoint().unwrap().to_string().parse().unwrap()
}

/// The rest of `query_id` from `checkpoint`, in a new client (a restarted
/// process): the text it delivers, and the final answer.
async fn restart(server: &SseServer, query_id: &str, checkpoint: &Checkpoint) -> (String, String) {
    let handle = server.client().queries().attach(query_id).await.unwrap();
    let mut rest = handle.resume_from(checkpoint).await.unwrap();
    let (events, error) = drain(&mut rest).await;
    assert!(error.is_none(), "{error:?}");
    let answer = rest.finish().await.unwrap().answer_text();
    (text(&events), answer)
}

/// Every replay renumbers the same events by +5 and starts from the
/// beginning: after events 1 to 7 (five deltas), the ids 6 and 7 pass as
/// the replay reaching `Last-Event-ID: 7`, and id 8 carries `p00` again.
fn renumbered_replay() -> Arc<Script> {
    Arc::new(|t, _| Reply::sse(vec![Step::Write(renumbered(&t.body(), 5).into_bytes())]))
}

#[tokio::test]
async fn a_renumbered_replay_in_process_repeats_no_text() {
    let turn = Turn::completed("q_rn1", "s_rn1", DELTAS);
    let post = Reply::sse(vec![Step::Write(first(&turn, 7).into_bytes()), Step::Reset]);
    let server = serve(&turn, post, renumbered_replay()).await;
    let mut live = stream(&server).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), turn.answer);
    assert_eq!(server.count("POST", "/query"), 1);
}

#[tokio::test]
async fn a_renumbered_replay_after_a_restart_repeats_no_text() {
    let turn = Turn::completed("q_rn2", "s_rn2", DELTAS);
    let post = Reply::sse(vec![
        Step::Write(first(&turn, 7).into_bytes()),
        Step::AwaitClose,
    ]);
    let server = serve(&turn, post, renumbered_replay()).await;
    let mut live = stream(&server).await;
    let checkpoint = checkpoint_after(&mut live, FIVE).await;
    drop(live);
    assert_eq!((checkpoint.event_id, checkpoint.text_len), (7, 20));
    let (rest, answer) = restart(&server, "q_rn2", &checkpoint).await;
    assert_eq!(format!("{FIVE}{rest}"), turn.answer);
    assert_eq!(answer, turn.answer);
}

/// Deltas without ids: after a restart the replay from `Last-Event-ID: 2`
/// sends them all again (nothing tells them apart but their text).
#[tokio::test]
async fn deltas_without_ids_after_a_restart_repeat_no_text() {
    let turn = without_delta_ids(&Turn::completed("q_il1", "s_il1", DELTAS));
    let post = Reply::sse(vec![
        Step::Write(first(&turn, 7).into_bytes()),
        Step::AwaitClose,
    ]);
    let faithful: Arc<Script> =
        Arc::new(|t, l| Reply::sse(vec![Step::Write(t.replay_from(l).into_bytes())]));
    let server = serve(&turn, post, faithful).await;
    let mut live = stream(&server).await;
    let checkpoint = checkpoint_after(&mut live, FIVE).await;
    drop(live);
    assert_eq!((checkpoint.event_id, checkpoint.text_len), (2, 20));
    let (rest, answer) = restart(&server, "q_il1", &checkpoint).await;
    assert_eq!(format!("{FIVE}{rest}"), turn.answer);
    assert_eq!(answer, turn.answer);
}

/// A server that sends no ids at all and replays from the start, in
/// pieces other than the first connection's.
#[tokio::test]
async fn a_replay_without_ids_in_other_pieces_repeats_no_text() {
    let turn = Turn::completed("q_il2", "s_il2", DELTAS);
    let bare = Turn {
        frames: turn
            .frames
            .iter()
            .map(|(_, f)| (None, strip_ids(f)))
            .collect(),
        ..turn.clone()
    };
    let resumes = Arc::new(AtomicUsize::new(0));
    let counter = resumes.clone();
    let rechunked: Arc<Script> = Arc::new(move |t, _| {
        counter.fetch_add(1, Ordering::SeqCst);
        // The same answer in two-byte deltas.
        let pieces: Vec<String> = t
            .answer
            .as_bytes()
            .chunks(2)
            .map(|c| String::from_utf8(c.to_vec()).unwrap())
            .collect();
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let again = Turn::completed(&t.query_id, &t.session_id, &refs);
        let body: String = again.frames.iter().map(|(_, f)| strip_ids(f)).collect();
        Reply::sse(vec![Step::Write(body.into_bytes())])
    });
    let post = Reply::sse(vec![Step::Write(first(&bare, 7).into_bytes()), Step::Reset]);
    let server = serve(&bare, post, rechunked).await;
    let mut live = stream(&server).await;
    let (events, error) = drain(&mut live).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text(&events), turn.answer);
    assert!(resumes.load(Ordering::SeqCst) >= 1);
}

/// After a restart the replay's first text is held until it can be told
/// from the delivered beginning; a checkpoint taken as the held events are
/// handed out names the last one delivered, not the last one read.
#[tokio::test]
async fn a_checkpoint_while_a_replay_is_aligned_names_the_event_delivered() {
    let turn = Turn::completed("q_cp1", "s_cp1", DELTAS);
    let post = Reply::sse(vec![Step::Write(turn.body().into_bytes())]);
    let faithful: Arc<Script> =
        Arc::new(|t, l| Reply::sse(vec![Step::Write(t.replay_from(l).into_bytes())]));
    let server = serve(&turn, post, faithful).await;
    let checkpoint: Checkpoint = Checkpoint::after_text("q_cp1", 7, FIVE)
        .to_string()
        .parse()
        .unwrap();
    let handle = server.client().queries().attach("q_cp1").await.unwrap();
    let mut rest = handle.resume_from(&checkpoint).await.unwrap();
    while rest.text().is_empty() {
        rest.next().await.unwrap().unwrap();
    }
    assert_eq!(rest.text(), "p05 ");
    let at = rest.checkpoint().unwrap();
    assert_eq!((at.event_id, at.text_len), (8, 24));
    assert!(at.proves_prefix_of(&turn.answer));
}
