//! A model-based run with concurrency and stops: several clients issue
//! uploads (files and archives), deletes, forks, curations, turns (sync,
//! background, streamed), cancels, feedback and session deletes against a
//! `nexus-local` process at once, while the harness stops it at random:
//! SIGKILL, SIGTERM, or a failpoint (crash, full disk, I/O error). After
//! each stop a clean process on the same data directory is compared with
//! a reference model of what was acknowledged, then stopped cleanly and
//! checked with `nexus-local verify`. Besides what was acknowledged, what
//! was answered `not_saved` must be absent (a fork, feedback), and a fork
//! left without an answer (its client gone mid-copy, the server stopped)
//! is whole or absent, never half made; its retry never gets 409.
//!
//! The model of a source path is a register: every write (upload, delete)
//! has a start, an end (none when its outcome is unknown) and an outcome.
//! The served value must be the value of a write that no acknowledged
//! write started after the end of (or the value at the last check, when
//! no write was acknowledged).
//!
//! `NEXUS_MODEL_OPS` (default 250) and `NEXUS_MODEL_SEED` set the run; the
//! short default runs in CI, a long run is done by hand with e.g.
//! `NEXUS_MODEL_OPS=10000` (`NEXUS_MODEL_PROGRESS=1` prints each round;
//! `NEXUS_MODEL_CLIENTS` sets the number of clients).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::local::*;
use serde_json::{Value, json};

use super::stops::{terminate, verify};

/// Contexts whose sources the model tracks.
const MODEL_CONTEXTS: [&str; 2] = ["m0", "m1"];
/// Concurrent clients (`NEXUS_MODEL_CLIENTS` for more).
const CLIENTS: usize = 4;
/// Names the uploads draw from (shared by all clients, so writes race).
const NAMES: usize = 4;

/// A small deterministic generator (xorshift64*).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// 2xx: applied and on disk.
    Acked,
    /// Refused (4xx, 503): never applied.
    Refused,
    /// No answer, or one that leaves it open (500, `cancel_pending`).
    Unknown,
}

/// One write to a source path: `value` is the content (`None`: deleted).
#[derive(Debug, Clone)]
struct Write {
    value: Option<String>,
    start: Instant,
    /// `None` while unknown.
    end: Option<Instant>,
    outcome: Outcome,
}

/// What the clients were told, and what the model expects.
#[derive(Debug, Default)]
struct Model {
    /// Value of each source path at the last check, by context.
    base: BTreeMap<(String, String), Option<String>>,
    /// Writes since the last check.
    writes: BTreeMap<(String, String), Vec<Write>>,
    /// Acknowledged turns: id -> status answered (None: only accepted).
    turns: BTreeMap<String, Option<String>>,
    /// Turns whose cancel was answered `cancelled`.
    cancelled: Vec<String>,
    /// Feedback acknowledged: turn id -> rating.
    feedback: BTreeMap<String, String>,
    /// Sessions in use and sessions deleted (acknowledged).
    sessions: Vec<String>,
    deleted_sessions: Vec<String>,
    /// Acknowledged forks and tasks (curations, imports).
    forks: Vec<String>,
    /// Forks answered `not_saved` (absent after a restart) or left without
    /// an answer (whole or absent, never half made).
    refused_forks: Vec<String>,
    open_forks: Vec<String>,
    /// Turns whose every feedback was answered `not_saved`: none stored.
    refused_feedback: Vec<String>,
    /// Turns that got a feedback answered anything but `not_saved`.
    touched_feedback: Vec<String>,
    /// What the clients saw that breaks a rule (checked at each check).
    violations: Vec<String>,
    tasks: Vec<String>,
    /// Tasks of acknowledged imports: must be `completed`.
    imports: Vec<String>,
    /// Figures.
    ops: usize,
    acked: usize,
    kinds: BTreeMap<&'static str, usize>,
}

type Shared = Arc<Mutex<Model>>;

fn lock(m: &Shared) -> std::sync::MutexGuard<'_, Model> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Status and JSON body, or `None` when no answer came.
async fn send(req: reqwest::RequestBuilder) -> Option<(u16, Value)> {
    let resp = req.send().await.ok()?;
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    Some((status, body))
}

fn outcome(answer: &Option<(u16, Value)>) -> Outcome {
    match answer {
        Some((s, _)) if (200..300).contains(s) => Outcome::Acked,
        Some((503, b)) if b["code"] == "cancel_pending" || b["code"] == "outcome_unknown" => {
            Outcome::Unknown
        }
        Some((s, _)) if (400..500).contains(s) || *s == 503 => Outcome::Refused,
        _ => Outcome::Unknown,
    }
}

/// Whether an answer says nothing of the request was saved.
fn not_saved(answer: &Option<(u16, Value)>) -> bool {
    matches!(answer, Some((503, b)) if b["code"] == "not_saved")
}

/// Records what a fork request was answered.
fn note_fork(model: &Shared, target: &str, answer: &Option<(u16, Value)>) {
    let mut m = lock(model);
    match outcome(answer) {
        Outcome::Acked => m.forks.push(target.to_owned()),
        _ if not_saved(answer) => m.refused_forks.push(target.to_owned()),
        Outcome::Unknown => m.open_forks.push(target.to_owned()),
        Outcome::Refused => {}
    }
}

fn tar_gz(files: &[(String, String)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (path, text) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, path, text.as_bytes()).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

fn record_writes(model: &Shared, ctx: &str, writes: Vec<(String, Option<String>)>, w: Write) {
    let mut m = lock(model);
    for (path, value) in writes {
        m.writes
            .entry((ctx.to_owned(), path))
            .or_default()
            .push(Write { value, ..w.clone() });
    }
}

/// One client's operations until `stop` (or `budget` operations).
async fn run_client(
    base: String,
    model: Shared,
    mut rng: Rng,
    who: usize,
    budget: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let http = client();
    let mut own_turns: Vec<String> = Vec::new();
    let mut session: Option<String> = None;
    for n in 0..budget {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let ctx = MODEL_CONTEXTS[rng.below(2) as usize];
        let tag = format!("c{who}-{n}-{}", rng.next() % 1_000_000);
        let kind = rng.below(12);
        let start = Instant::now();
        let (name, answer): (&'static str, Option<(u16, Value)>) = match kind {
            0..=2 => {
                let file = format!("p{}.md", rng.below(NAMES as u64));
                let text = format!("# {tag}\n\nwritten by {tag}\n");
                let form = reqwest::multipart::Form::new().part(
                    "file",
                    reqwest::multipart::Part::bytes(text.clone().into_bytes())
                        .file_name(file.clone()),
                );
                let a = send(
                    http.post(format!("{base}/contexts/{ctx}/import/upload"))
                        .multipart(form),
                )
                .await;
                let o = outcome(&a);
                if o != Outcome::Refused {
                    let end = (o == Outcome::Acked).then(Instant::now);
                    record_writes(
                        &model,
                        ctx,
                        vec![(format!("uploads/{file}"), Some(text))],
                        Write {
                            value: None,
                            start,
                            end,
                            outcome: o,
                        },
                    );
                }
                if let Some(t) = a
                    .as_ref()
                    .filter(|_| o == Outcome::Acked)
                    .and_then(|(_, b)| b["task_id"].as_str())
                {
                    lock(&model).imports.push(t.to_owned());
                }
                ("upload", a)
            }
            3 => {
                let files: Vec<(String, String)> = (0..2)
                    .map(|k| {
                        (
                            format!("a/p{}.md", (rng.below(NAMES as u64) + k) % NAMES as u64),
                            format!("# {tag} {k}\n\narchived by {tag}\n"),
                        )
                    })
                    .collect::<BTreeMap<_, _>>()
                    .into_iter()
                    .collect();
                let form = reqwest::multipart::Form::new().part(
                    "file",
                    reqwest::multipart::Part::bytes(tar_gz(&files)).file_name("batch.tar.gz"),
                );
                let a = send(
                    http.post(format!("{base}/contexts/{ctx}/import/upload"))
                        .multipart(form),
                )
                .await;
                let o = outcome(&a);
                if o != Outcome::Refused {
                    let end = (o == Outcome::Acked).then(Instant::now);
                    let writes = files
                        .into_iter()
                        .map(|(p, t)| (format!("uploads/{p}"), Some(t)))
                        .collect();
                    record_writes(
                        &model,
                        ctx,
                        writes,
                        Write {
                            value: None,
                            start,
                            end,
                            outcome: o,
                        },
                    );
                }
                if let Some(t) = a
                    .as_ref()
                    .filter(|_| o == Outcome::Acked)
                    .and_then(|(_, b)| b["task_id"].as_str())
                {
                    lock(&model).imports.push(t.to_owned());
                }
                ("archive", a)
            }
            4 | 5 => {
                let path = if rng.below(2) == 0 {
                    format!("uploads/p{}.md", rng.below(NAMES as u64))
                } else {
                    format!("uploads/a/p{}.md", rng.below(NAMES as u64))
                };
                let a =
                    send(http.delete(format!("{base}/contexts/{ctx}/source/delete/{path}"))).await;
                let o = outcome(&a);
                if o != Outcome::Refused {
                    let end = (o == Outcome::Acked).then(Instant::now);
                    record_writes(
                        &model,
                        ctx,
                        vec![(path, None)],
                        Write {
                            value: None,
                            start,
                            end,
                            outcome: o,
                        },
                    );
                }
                ("delete", a)
            }
            6 => {
                let target = format!("fork-{tag}");
                if rng.below(2) == 0 {
                    // A client that goes away mid-fork, then retries.
                    let gone = reqwest::Client::builder()
                        .timeout(Duration::from_millis(1 + rng.below(20)))
                        .build()
                        .unwrap();
                    let first = send(
                        gone.post(format!("{base}/contexts/{ctx}/fork"))
                            .json(&json!({"target_slug": target})),
                    )
                    .await;
                    note_fork(&model, &target, &first);
                    if first.is_some() {
                        ("fork", first)
                    } else {
                        // Busy while the first request still builds it.
                        let mut a = None;
                        for _ in 0..100 {
                            a = send(
                                http.post(format!("{base}/contexts/{ctx}/fork"))
                                    .json(&json!({"target_slug": target})),
                            )
                            .await;
                            match &a {
                                Some((503, b)) if b["code"] == "busy" => {
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                }
                                _ => break,
                            }
                        }
                        if let Some((409, b)) = &a
                            && b["message"]
                                .as_str()
                                .is_some_and(|m| m.contains("already exists"))
                        {
                            // Only a fork the first request published
                            // (whole) makes its retry a conflict on its
                            // slug (an import on the source is another).
                            let seen = send(http.get(format!("{base}/contexts/{target}"))).await;
                            if let Some((code, seen)) = seen
                                && (code != 200 || seen["is_importing"] == true)
                            {
                                lock(&model).violations.push(format!(
                                    "the retry of fork {target} whose client went away got {b}; the fork: {code} {seen}"
                                ));
                            }
                        }
                        note_fork(&model, &target, &a);
                        ("fork retried", a)
                    }
                } else {
                    let a = send(
                        http.post(format!("{base}/contexts/{ctx}/fork"))
                            .json(&json!({"target_slug": target})),
                    )
                    .await;
                    note_fork(&model, &target, &a);
                    ("fork", a)
                }
            }
            7 => {
                let a = send(
                    http.post(format!("{base}/contexts/{ctx}/curate"))
                        .json(&json!({})),
                )
                .await;
                if let Some(t) = a
                    .as_ref()
                    .filter(|_| outcome(&a) == Outcome::Acked)
                    .and_then(|(_, b)| b["task_id"].as_str())
                {
                    lock(&model).tasks.push(t.to_owned());
                }
                ("curate", a)
            }
            8 => {
                let mut body = json!({"ask": "What was written?", "scope": ["m0"]});
                if let Some(s) = &session {
                    body["session_id"] = json!(s);
                }
                let a = send(http.post(format!("{base}/query")).json(&body)).await;
                if outcome(&a) == Outcome::Acked
                    && let Some((_, q)) = &a
                {
                    let id = q["id"].as_str().unwrap_or_default().to_owned();
                    let sid = q["session_id"].as_str().unwrap_or_default().to_owned();
                    let mut m = lock(&model);
                    m.turns
                        .insert(id.clone(), q["status"].as_str().map(str::to_owned));
                    if session.is_none() && !sid.is_empty() {
                        m.sessions.push(sid.clone());
                        session = Some(sid);
                    }
                    own_turns.push(id);
                }
                ("turn", a)
            }
            9 => {
                let body =
                    json!({"ask": "What was archived?", "scope": ["m0"], "background": true});
                let a = send(http.post(format!("{base}/query")).json(&body)).await;
                if let Some(id) = a
                    .as_ref()
                    .filter(|_| outcome(&a) == Outcome::Acked)
                    .and_then(|(_, q)| q["id"].as_str())
                {
                    lock(&model).turns.insert(id.to_owned(), None);
                    let c = send(
                        http.post(format!("{base}/queries/{id}/cancel"))
                            .json(&json!({})),
                    )
                    .await;
                    if let Some((200, q)) = &c
                        && q["status"] == "cancelled"
                    {
                        lock(&model).cancelled.push(id.to_owned());
                    }
                    own_turns.push(id.to_owned());
                }
                ("background+cancel", a)
            }
            10 => {
                let Some(id) = own_turns
                    .get(rng.below(own_turns.len() as u64) as usize)
                    .cloned()
                else {
                    continue;
                };
                let rating = if rng.below(2) == 0 { "up" } else { "down" };
                let a = send(
                    http.post(format!("{base}/queries/{id}/feedback"))
                        .json(&json!({"rating": rating})),
                )
                .await;
                let o = outcome(&a);
                let mut m = lock(&model);
                if not_saved(&a) {
                    if !m.touched_feedback.contains(&id) && !m.refused_feedback.contains(&id) {
                        m.refused_feedback.push(id.clone());
                    }
                } else if !m.touched_feedback.contains(&id) {
                    m.refused_feedback.retain(|t| t != &id);
                    m.touched_feedback.push(id.clone());
                }
                match o {
                    Outcome::Acked => {
                        m.feedback.insert(id, rating.to_owned());
                    }
                    // Either rating may be the one kept.
                    Outcome::Unknown => {
                        m.feedback.remove(&id);
                    }
                    Outcome::Refused => {}
                }
                ("feedback", a)
            }
            _ => {
                let a = send(
                    http.post(format!("{base}/query"))
                        .json(&json!({"ask": "Anything?", "scope": ["m1"]})),
                )
                .await;
                let Some(sid) = a
                    .as_ref()
                    .filter(|_| outcome(&a) == Outcome::Acked)
                    .and_then(|(_, q)| q["session_id"].as_str())
                    .map(str::to_owned)
                else {
                    lock(&model).ops += 1;
                    continue;
                };
                let d = send(http.delete(format!("{base}/sessions/{sid}"))).await;
                if outcome(&d) == Outcome::Acked {
                    lock(&model).deleted_sessions.push(sid);
                }
                ("session delete", d)
            }
        };
        let mut m = lock(&model);
        m.ops += 1;
        *m.kinds.entry(name).or_default() += 1;
        if outcome(&answer) == Outcome::Acked {
            m.acked += 1;
        }
        if answer.is_none() {
            // The server is gone: stop issuing.
            return;
        }
    }
}

/// The value each path may have: every write no acknowledged write
/// started after the end of; the base value when none was acknowledged.
fn allowed(base: &Option<String>, writes: &[Write]) -> Vec<Option<String>> {
    let last_acked_start = writes
        .iter()
        .filter(|w| w.outcome == Outcome::Acked)
        .map(|w| w.start)
        .max();
    let mut out: Vec<Option<String>> = writes
        .iter()
        .filter(|w| match (w.end, last_acked_start) {
            (_, None) | (None, _) => true,
            (Some(end), Some(s)) => end >= s,
        })
        .map(|w| w.value.clone())
        .collect();
    if last_acked_start.is_none() {
        out.push(base.clone());
    }
    out
}

/// Every listed source of `ctx` with its content; asserts each is
/// readable and its listed size is its real size.
async fn served_sources(base: &str, ctx: &str, why: &str) -> BTreeMap<String, String> {
    let (status, manifest) = get_json(&format!("{base}/contexts/{ctx}/source/manifest")).await;
    assert_eq!(status, 200, "{why}: manifest of {ctx}: {manifest}");
    let mut out = BTreeMap::new();
    for f in manifest["files"].as_array().cloned().unwrap_or_default() {
        let path = f["path"].as_str().unwrap().to_owned();
        let resp = http()
            .get(format!("{base}/contexts/{ctx}/source/read/{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            200,
            "{why}: {ctx}/{path} is listed but not readable"
        );
        let text = resp.text().await.unwrap();
        assert_eq!(
            f["size"].as_u64(),
            Some(text.len() as u64),
            "{why}: {ctx}/{path}: listed size is not its size"
        );
        out.insert(path, text);
    }
    out
}

/// Compares the served state with the model, then makes what is served
/// the model's new base.
async fn check(base: &str, model: &Shared, why: &str) {
    let mut served = BTreeMap::new();
    for ctx in MODEL_CONTEXTS {
        for (path, text) in served_sources(base, ctx, why).await {
            served.insert((ctx.to_owned(), path), text);
        }
    }
    // What this round acknowledged is checked now; sessions every round.
    let violations = std::mem::take(&mut lock(model).violations);
    assert!(violations.is_empty(), "{why}: {violations:#?}");
    let (refused_forks, open_forks, refused_feedback) = {
        let mut m = lock(model);
        (
            std::mem::take(&mut m.refused_forks),
            std::mem::take(&mut m.open_forks),
            std::mem::take(&mut m.refused_feedback),
        )
    };
    let (writes, turns, cancelled, feedback, sessions, deleted, forks, tasks, imports) = {
        let mut m = lock(model);
        (
            std::mem::take(&mut m.writes),
            std::mem::take(&mut m.turns),
            std::mem::take(&mut m.cancelled),
            std::mem::take(&mut m.feedback),
            m.sessions.clone(),
            m.deleted_sessions.clone(),
            std::mem::take(&mut m.forks),
            std::mem::take(&mut m.tasks),
            std::mem::take(&mut m.imports),
        )
    };
    let base_values = lock(model).base.clone();
    for (key, ws) in &writes {
        let now = served.get(key).cloned();
        let was = base_values.get(key).cloned().flatten();
        let ok = allowed(&was, ws);
        assert!(
            ok.contains(&now),
            "{why}: {key:?} serves {now:?}, allowed {ok:?}; writes {ws:#?}"
        );
    }
    for (key, was) in &base_values {
        if !writes.contains_key(key) {
            assert_eq!(
                served.get(key),
                was.as_ref(),
                "{why}: {key:?} changed without a write"
            );
        }
    }
    for key in served.keys() {
        assert!(
            writes.contains_key(key) || base_values.contains_key(key),
            "{why}: {key:?} appeared from nowhere"
        );
    }
    for (id, status) in &turns {
        let (code, q) = get_json(&format!("{base}/queries/{id}")).await;
        assert_eq!(code, 200, "{why}: turn {id}: {q}");
        if let Some(s) = status {
            assert_eq!(
                q["status"].as_str(),
                Some(s.as_str()),
                "{why}: turn {id} answered {s}, now {q}"
            );
        }
        if cancelled.contains(id) {
            assert_eq!(
                q["status"], "cancelled",
                "{why}: turn {id} was answered cancelled: {q}"
            );
        }
        if let Some(r) = feedback.get(id) {
            assert_eq!(
                q["feedback"]["rating"].as_str(),
                Some(r.as_str()),
                "{why}: feedback on {id}: {q}"
            );
        }
    }
    for s in &sessions {
        if deleted.contains(s) {
            continue;
        }
        let (code, body) = get_json(&format!("{base}/sessions/{s}")).await;
        assert_eq!(code, 200, "{why}: session {s}: {body}");
    }
    for s in &deleted {
        let (code, body) = get_json(&format!("{base}/sessions/{s}")).await;
        assert_eq!(code, 404, "{why}: deleted session {s} is back: {body}");
    }
    for f in &forks {
        let (code, body) = get_json(&format!("{base}/contexts/{f}")).await;
        assert_eq!(code, 200, "{why}: fork {f}: {body}");
        served_sources(base, f, why).await;
    }
    for f in &refused_forks {
        let (code, body) = get_json(&format!("{base}/contexts/{f}")).await;
        assert_eq!(
            code, 404,
            "{why}: fork {f} answered not_saved exists: {body}"
        );
    }
    for f in &open_forks {
        let (code, body) = get_json(&format!("{base}/contexts/{f}")).await;
        assert!(
            code == 404 || (code == 200 && body["is_importing"] != true),
            "{why}: fork {f} (no answer) is half made: {code} {body}"
        );
    }
    for id in &refused_feedback {
        let (code, q) = get_json(&format!("{base}/queries/{id}")).await;
        if code == 200 {
            assert!(
                q["feedback"].is_null(),
                "{why}: feedback on {id} answered not_saved is stored: {q}"
            );
        }
    }
    for t in &tasks {
        let (code, body) = get_json(&format!("{base}/tasks/{t}")).await;
        assert_eq!(code, 200, "{why}: task {t}: {body}");
    }
    for t in &imports {
        let (code, body) = get_json(&format!("{base}/tasks/{t}")).await;
        assert_eq!(code, 200, "{why}: import task {t}: {body}");
        assert_eq!(
            body["state"], "completed",
            "{why}: acknowledged import {t}: {body}"
        );
    }
    let mut m = lock(model);
    m.base = served.into_iter().map(|(k, v)| (k, Some(v))).collect();
}

/// How a round ends.
fn pick_fault(rng: &mut Rng) -> Option<String> {
    const SPECS: [&str; 14] = [
        // Slow steps widen races and keep moves running into a stop.
        "db.commit=delay(60)",
        "file.move=delay(40)",
        "file.write=delay(40)",
        "db.commit=crash",
        "db.committed=crash",
        "file.write=crash",
        "file.move=crash",
        "staging.write=crash",
        "index.swap=crash",
        "db.commit=enospc",
        "file.move=eio",
        "staging.write=enospc",
        "file.write=eio",
        // A failed commit of a batch many clients share.
        "db.commit=eio",
    ];
    if rng.below(3) == 0 {
        return None;
    }
    let spec = SPECS[rng.below(SPECS.len() as u64) as usize];
    Some(format!("{spec}@{}", 1 + rng.below(40)))
}

/// Figures of a run.
#[derive(Debug, Default)]
struct Figures {
    rounds: usize,
    sigkill: usize,
    sigterm: usize,
    failpoint_stops: usize,
}

fn run(total_ops: usize, seed: u64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let data = TempDir::new("model");
    let dir = data.path().to_str().unwrap().to_owned();
    let mut rng = Rng(seed | 1);
    let model: Shared = Arc::default();
    let mut figures = Figures::default();
    {
        let server = LocalBinary::start(&["--data", &dir], &[]);
        rt.block_on(async {
            for ctx in MODEL_CONTEXTS {
                let (s, b) = post_json(
                    &format!("{}/contexts", server.url),
                    json!({"slug": ctx, "name": ctx}),
                )
                .await;
                assert_eq!(s, 200, "{b}");
            }
            for ctx in MODEL_CONTEXTS {
                let form = reqwest::multipart::Form::new().part(
                    "file",
                    reqwest::multipart::Part::bytes(b"# Seed\n\nThe first words.\n".to_vec())
                        .file_name("seed.md"),
                );
                let a = send(
                    http()
                        .post(format!("{}/contexts/{ctx}/import/upload", server.url))
                        .multipart(form),
                )
                .await;
                assert_eq!(outcome(&a), Outcome::Acked, "{a:?}");
                lock(&model).base.insert(
                    (ctx.to_owned(), "uploads/seed.md".to_owned()),
                    Some("# Seed\n\nThe first words.\n".to_owned()),
                );
            }
            let (s, b) = post_json(&format!("{}/contexts/m0/curate", server.url), json!({})).await;
            assert_eq!(s, 200, "{b}");
            let task = b["task_id"].as_str().unwrap().to_owned();
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let (_, t) = get_json(&format!("{}/tasks/{task}", server.url)).await;
                if t["state"] == "completed" {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the first curation never ended: {t}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            check(&server.url, &model, "setup").await;
        });
        let mut server = server;
        terminate(&mut server, Duration::from_secs(60));
    }
    while lock(&model).ops < total_ops {
        figures.rounds += 1;
        let fault = pick_fault(&mut rng);
        let envs: Vec<(&str, &str)> = fault
            .as_deref()
            .map(|f| vec![(nexus_knowql::local::ENV_FAILPOINTS, f)])
            .unwrap_or_default();
        let mut server = LocalBinary::start(&["--data", &dir], &envs);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients: Vec<_> = (0..env_u64("NEXUS_MODEL_CLIENTS").map_or(CLIENTS, |n| n as usize))
            .map(|who| {
                let c = Rng(rng.next() | 1);
                rt.spawn(run_client(
                    server.url.clone(),
                    model.clone(),
                    c,
                    who,
                    60,
                    stop.clone(),
                ))
            })
            .collect();
        // Let the clients work, then stop the server unless a failpoint did.
        let work = Duration::from_millis(300 + rng.below(2000));
        let deadline = Instant::now() + work;
        let mut died = false;
        while Instant::now() < deadline {
            if server.child.try_wait().unwrap().is_some() {
                died = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let why = format!("seed {seed} round {} fault {fault:?}", figures.rounds);
        if died {
            figures.failpoint_stops += 1;
        } else if rng.below(2) == 0 {
            figures.sigkill += 1;
            let _ = server.child.kill();
            let _ = server.child.wait();
        } else {
            figures.sigterm += 1;
            terminate(&mut server, Duration::from_secs(60));
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for c in clients {
            let _ = rt.block_on(c);
        }
        drop(server);
        let mut clean = LocalBinary::start(&["--data", &dir], &[]);
        rt.block_on(check(&clean.url, &model, &why));
        terminate(&mut clean, Duration::from_secs(60));
        let (ok, report) = verify(&dir);
        assert!(ok, "{why}: verify found problems:\n{report}");
        if std::env::var_os("NEXUS_MODEL_PROGRESS").is_some() {
            let m = lock(&model);
            eprintln!(
                "round {}: {} operations ({} acknowledged); stops {} SIGKILL, {} SIGTERM, {} by failpoint",
                figures.rounds,
                m.ops,
                m.acked,
                figures.sigkill,
                figures.sigterm,
                figures.failpoint_stops
            );
        }
    }
    let m = lock(&model);
    eprintln!(
        "concurrent model: seed {seed}, {} operations ({} acknowledged), {} rounds, stops: {} SIGKILL, {} SIGTERM, {} by failpoint; kinds {:?}; lost: 0",
        m.ops,
        m.acked,
        figures.rounds,
        figures.sigkill,
        figures.sigterm,
        figures.failpoint_stops,
        m.kinds
    );
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The short run (CI); `NEXUS_MODEL_OPS` and `NEXUS_MODEL_SEED` for more.
#[test]
fn concurrent_clients_and_random_stops_lose_nothing_acknowledged() {
    let seed = env_u64("NEXUS_MODEL_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(7, |d| d.as_nanos() as u64)
    });
    let ops = env_u64("NEXUS_MODEL_OPS").unwrap_or(250) as usize;
    run(ops, seed);
}
