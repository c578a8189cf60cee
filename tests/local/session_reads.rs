//! A long session against the `nexus-local` binary: its turns are rows
//! (the session's own document does not grow with them), `GET
//! /sessions/{id}` pages them, and reading a big session keeps other
//! requests answered quickly (reads run off the async threads).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::local::*;

/// Turns in the session. Each is a real turn through the server, one after
/// the other (a session runs one turn at a time); 600 take about
/// `TURNS * 15 ms` in a debug build.
const TURNS: usize = 600;
/// Longest acceptable answer to `GET /models` while the session is read.
const MODELS_BOUND: Duration = Duration::from_millis(250);

/// A question of about 7,900 characters that still finds the corpus, so
/// every stored turn weighs several KiB.
fn long_ask(i: usize) -> String {
    let mut ask = format!("turn {i}: how long does green tea steep? ");
    while ask.len() < 7_900 {
        ask.push_str("steeping tea lighthouse ships resume stream ");
    }
    ask
}

fn session_doc_len(data: &std::path::Path, session_id: &str) -> usize {
    let conn = rusqlite::Connection::open_with_flags(
        data.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    conn.query_row(
        "SELECT LENGTH(doc) FROM sessions WHERE id = ?1",
        [session_id],
        |r| r.get::<_, i64>(0),
    )
    .unwrap() as usize
}

/// Catches a session whose document lists its turns (it grows with each
/// one and is written again per turn), a `GET /sessions/{id}` that is not
/// paged, and session reads on the async threads (`Store::blocking`
/// running its job in place): `GET /models` then waits behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_session_is_paged_and_read_off_the_async_threads() {
    let corpus = corpus();
    let data = TempDir::new("long-session");
    let ctx = format!("docs={}", corpus.path().display());
    let server = LocalBinary::start(
        &["--data", data.path().to_str().unwrap(), "--context", &ctx],
        &[],
    );
    let base = server.url.clone();

    let started = Instant::now();
    let (status, first) = post_json(
        &format!("{base}/query"),
        json!({"ask": long_ask(0), "scope": ["docs"]}),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    let session_id = first["session_id"].as_str().unwrap().to_owned();
    let first_doc = session_doc_len(data.path(), &session_id);
    let mut ids = vec![first["id"].as_str().unwrap().to_owned()];
    for i in 1..TURNS {
        let (status, q) = post_json(
            &format!("{base}/query"),
            json!({"ask": long_ask(i), "session_id": session_id}),
        )
        .await;
        assert_eq!(status, 200, "turn {i}: {q}");
        ids.push(q["id"].as_str().unwrap().to_owned());
    }
    let writing = started.elapsed();
    // The session's row is the same size after 600 turns as after one (a
    // few bytes: its updated time and last turn change).
    let last_doc = session_doc_len(data.path(), &session_id);
    assert!(
        last_doc < first_doc + 64,
        "the session document grew from {first_doc} to {last_doc} bytes"
    );

    // Pages: the newest `limit` before the `offset` newest, oldest first.
    let page = |limit: usize, offset: usize| {
        let url = format!("{base}/sessions/{session_id}?limit={limit}&offset={offset}");
        async move { get_json(&url).await }
    };
    let (status, default) = get_json(&format!("{base}/sessions/{session_id}")).await;
    assert_eq!(status, 200);
    let turn_ids = |v: &Value| -> Vec<String> {
        v["queries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(turn_ids(&default), ids[TURNS - 50..], "the default page");
    let mut seen = Vec::new();
    for offset in (0..TURNS).step_by(200).rev() {
        let (status, body) = page(200, offset).await;
        assert_eq!(status, 200);
        seen.extend(turn_ids(&body));
    }
    assert_eq!(
        seen, ids,
        "three pages of 200 give every turn once, in order"
    );
    let (_, past) = page(200, TURNS).await;
    assert!(turn_ids(&past).is_empty());
    assert_eq!(page(201, 0).await.0, 400);
    assert_eq!(page(0, 0).await.0, 400);

    // Readers of the biggest pages, all at once, while `GET /models` is
    // timed.
    let reading = Instant::now() + Duration::from_secs(4);
    let mut readers = Vec::new();
    let (pages_read, mut pages_seen) = tokio::sync::watch::channel(0u32);
    let pages_read = std::sync::Arc::new(pages_read);
    for r in 0..6 {
        let pages_read = pages_read.clone();
        let url = format!(
            "{base}/sessions/{session_id}?limit=200&offset={}",
            (r % 3) * 200
        );
        readers.push(tokio::spawn(async move {
            let (mut reads, mut bytes) = (0u32, 0usize);
            while Instant::now() < reading {
                let body = http()
                    .get(&url)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap();
                bytes += body.len();
                reads += 1;
                pages_read.send_modify(|n| *n += 1);
            }
            (reads, bytes)
        }));
    }
    // The readers are under way (pages come back) before the timing.
    crate::support::wait::within(
        Duration::from_secs(4),
        "six pages read",
        pages_seen.wait_for(|n| *n >= 6),
    )
    .await
    .unwrap();
    let mut models = Vec::new();
    while Instant::now() < reading {
        let asked = Instant::now();
        let resp = http().get(format!("{base}/models")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        models.push(asked.elapsed());
        // Paces load: one timed request every 20 ms.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (mut reads, mut bytes) = (0, 0);
    for r in readers {
        let (n, b) = r.await.unwrap();
        reads += n;
        bytes += b;
    }
    models.sort();
    let worst = *models.last().unwrap();
    let median = models[models.len() / 2];
    eprintln!(
        "{TURNS} turns written in {writing:?}; {reads} pages of 200 read ({} MiB) in 4 s; \
         GET /models x{}: median {median:?}, worst {worst:?}",
        bytes >> 20,
        models.len()
    );
    assert!(reads >= 6, "the session was hardly read: {reads} pages");
    assert!(
        worst < MODELS_BOUND,
        "GET /models took {worst:?} while the session was read (median {median:?})"
    );
    server.kill();
}
