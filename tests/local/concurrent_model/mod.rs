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
//! Some rounds add faults of their own (`faults.rs`): the server restarts
//! with its clock frozen at, or set back to, an instant already used (no
//! new record may take an earlier one's id, and every record acknowledged
//! since the run began is still served as first seen); an in-process
//! server with a per-context quota gets storms of uploads past it (each
//! refused, and `staging/` empty once every request returned); and after
//! a round's check, a copy of the data directory loses a source file, a
//! context's `sources/` folder or `state.db`: the start is refused with
//! the documented message, `verify` reports it, and once put back every
//! acknowledged record is served and the run goes on in the copy.
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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::local::*;
use crate::support::wait::{holds_within, until};
use serde_json::{Value, json};

use super::stops::{terminate, verify};

mod check;
mod faults;
mod ops;

use check::{check, check_history};
use ops::run_client;

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
    /// Ids of acknowledged records (turns, imports' tasks, new sessions,
    /// forks), each prefixed by its kind: a new record never repeats one.
    ids: BTreeSet<String>,
    /// Every acknowledged record as a check first saw it.
    history: Vec<check::Record>,
    /// Model context slug -> id (the folder of its files).
    context_ids: BTreeMap<String, String>,
    /// Uploads past a quota, refused.
    storm_refused: usize,
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

/// Records the id of a record an acknowledged request made: a violation
/// when an earlier record had it.
fn note_new_id(model: &Shared, kind: &str, id: &str) {
    let mut m = lock(model);
    if !m.ids.insert(format!("{kind} {id}")) {
        m.violations
            .push(format!("a new {kind} has the id {id} of an earlier one"));
    }
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

/// How a round ends.
fn pick_fault(rng: &mut Rng) -> Option<String> {
    const SPECS: [&str; 15] = [
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
        // A fork moved into place, stopped before its record is saved.
        "fork.publish=crash",
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
    /// Rounds whose server ran with its clock frozen or set back.
    frozen_clock: usize,
    set_back_clock: usize,
    /// Rounds with a quota and refused-upload storms (clean shutdowns).
    storms: usize,
    /// Missing-data starts: a source file, a sources folder, `state.db`.
    missing_file: usize,
    missing_folder: usize,
    missing_db: usize,
}

fn run(total_ops: usize, seed: u64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let root = TempDir::new("model");
    let mut dir = root.path().join("data-0");
    let mut rng = Rng(seed | 1);
    let model: Shared = Arc::default();
    let mut figures = Figures::default();
    // The instant the setup's ids were made at: set-back rounds reuse it.
    let run_start_ms = faults::now_ms();
    setup(&rt, &dir, &model);
    let clients = env_u64("NEXUS_MODEL_CLIENTS").map_or(CLIENTS, |n| n as usize);
    while lock(&model).ops < total_ops {
        figures.rounds += 1;
        let round = faults::pick_round(&mut rng, run_start_ms);
        let fault = if round.storm {
            None
        } else {
            pick_fault(&mut rng)
        };
        let why = format!(
            "seed {seed} round {} fault {fault:?} {round:?}",
            figures.rounds
        );
        let path = dir.to_str().unwrap().to_owned();
        if round.storm {
            figures.storms += 1;
            faults::storm_round(&rt, &dir, &model, &mut rng, clients, &why);
        } else {
            match round.clock {
                Some(faults::Clock::Frozen) => figures.frozen_clock += 1,
                Some(faults::Clock::SetBack(_)) => figures.set_back_clock += 1,
                None => {}
            }
            let clock = faults::clock_env(round.clock);
            let mut envs: Vec<(&str, &str)> = Vec::new();
            if let Some(f) = fault.as_deref() {
                envs.push((nexus_knowql::local::ENV_FAILPOINTS, f));
            }
            if let Some((k, v)) = &clock {
                envs.push((k, v));
            }
            match stopped_round(&rt, &path, &envs, &model, &mut rng, clients, &why) {
                Stop::Failpoint => figures.failpoint_stops += 1,
                Stop::Kill => figures.sigkill += 1,
                Stop::Term => figures.sigterm += 1,
            }
        }
        let mut clean = faults::start_logged(&path, &[], &format!("{why} (clean start)"));
        rt.block_on(async {
            check(&clean.url, &model, &why).await;
            if round.clock.is_some() {
                check_history(&clean.url, &model, &why).await;
            }
        });
        terminate(&mut clean, Duration::from_secs(60));
        let (ok, report) = verify(&path);
        assert!(ok, "{why}: verify found problems:\n{report}");
        if let Some(missing) = round.missing {
            match missing {
                faults::Missing::File => figures.missing_file += 1,
                faults::Missing::Folder => figures.missing_folder += 1,
                faults::Missing::Database => figures.missing_db += 1,
            }
            dir = faults::missing_data_round(
                &rt,
                &dir,
                &model,
                &mut rng,
                missing,
                figures.rounds,
                &why,
            );
        }
        if std::env::var_os("NEXUS_MODEL_PROGRESS").is_some() {
            let m = lock(&model);
            eprintln!(
                "round {}: {} operations ({} acknowledged); {figures:?}",
                figures.rounds, m.ops, m.acked,
            );
        }
    }
    let m = lock(&model);
    eprintln!(
        "concurrent model: seed {seed}, {} operations ({} acknowledged), {} uploads past a quota refused, {} records kept; {figures:?}; kinds {:?}; lost: 0, wrongly answered: 0",
        m.ops,
        m.acked,
        m.storm_refused,
        m.history.len(),
        m.kinds
    );
}

/// Creates the model's contexts with a seed file each, curates one, and
/// checks it, on a first server stopped with SIGTERM.
fn setup(rt: &tokio::runtime::Runtime, dir: &std::path::Path, model: &Shared) {
    let mut server = LocalBinary::start(&["--data", dir.to_str().unwrap()], &[]);
    rt.block_on(async {
        for ctx in MODEL_CONTEXTS {
            let (s, b) = post_json(
                &format!("{}/contexts", server.url),
                json!({"slug": ctx, "name": ctx}),
            )
            .await;
            assert_eq!(s, 200, "{b}");
            let id = b["id"].as_str().unwrap().to_owned();
            lock(model).context_ids.insert(ctx.to_owned(), id);
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
            lock(model).base.insert(
                (ctx.to_owned(), "uploads/seed.md".to_owned()),
                Some("# Seed\n\nThe first words.\n".to_owned()),
            );
        }
        let (s, b) = post_json(&format!("{}/contexts/m0/curate", server.url), json!({})).await;
        assert_eq!(s, 200, "{b}");
        let task = b["task_id"].as_str().unwrap().to_owned();
        let url = format!("{}/tasks/{task}", server.url);
        until(
            Duration::from_secs(60),
            "the first curation ending",
            async || get_json(&url).await.1["state"] == "completed",
        )
        .await;
        check(&server.url, model, "setup").await;
    });
    terminate(&mut server, Duration::from_secs(60));
}

/// How a round's server stopped.
enum Stop {
    Failpoint,
    Kill,
    Term,
}

/// A round on the binary with `envs` (failpoints, a clock): clients work
/// until a failpoint stops the server or it is stopped by SIGKILL or
/// SIGTERM.
fn stopped_round(
    rt: &tokio::runtime::Runtime,
    path: &str,
    envs: &[(&str, &str)],
    model: &Shared,
    rng: &mut Rng,
    clients: usize,
    why: &str,
) -> Stop {
    let mut server = faults::start_logged(path, envs, why);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> = (0..clients)
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
    // Let the clients work (paced load: the round's length), then stop
    // the server unless a failpoint did.
    let work = Duration::from_millis(300 + rng.below(2000));
    let died = holds_within(work, || server.child.try_wait().unwrap().is_some());
    let how = if died {
        Stop::Failpoint
    } else if rng.below(2) == 0 {
        let _ = server.child.kill();
        let _ = server.child.wait();
        Stop::Kill
    } else {
        terminate(&mut server, Duration::from_secs(60));
        Stop::Term
    };
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        let _ = rt.block_on(t);
    }
    how
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
