//! The `worker` example under `kill -9` at random instants: every job's
//! output file is its turn's answer exactly once, and no job starts a
//! second turn.
//!
//! The server is as an ordinary busy one is: its listing admits a new
//! session only [`ADMISSION`] after it was created (a proxy in front of the
//! embedded Nexus leaves younger ones out), other clients crowd it with
//! [`CROWD`] newer sessions while a job is down, the jobs ask one question
//! over two contexts, and some jobs are run by two workers at once on one
//! key (one of them runs it, the other is refused as busy and touches
//! nothing). Every job's answer must be its own context's (no foreign
//! answer).
//!
//! CI runs a short version; a by-hand run sets the number of jobs (and,
//! to replay one, the seed):
//!
//! ```text
//! NEXUS_KILL_JOBS=200 cargo test --all-features --test examples kill_anywhere -- --nocapture
//! NEXUS_KILL_SEED=7 NEXUS_KILL_JOBS=200 cargo test --all-features --test examples kill_anywhere -- --nocapture
//! ```

use std::future::IntoFuture;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::support::examples;
use crate::support::wait::holds_within;
use examples::{corpus, example, runtime};
use nexus_knowql::local::LocalNexus;
use nexus_knowql::query::{CheckpointRecord, CheckpointStore, FileCheckpointStore};

mod listing_proxy;

/// Jobs in a CI run.
const CI_JOBS: usize = 12;
/// How long after its creation a session shows in the workers' listing.
const ADMISSION: Duration = Duration::from_secs(2);
/// The sessions other clients create while a crowded job is down.
const CROWD: usize = 50;
/// The contexts the jobs share their question across.
const CONTEXTS: [&str; 2] = ["docs", "docs-eu"];
/// The text a worker refused as busy says.
const BUSY: &str = "another process runs this job now";
/// The most kills one job gets before it is let finish.
const MAX_KILLS_PER_JOB: u32 = 3;
/// How long one worker may take to finish a job on a busy machine.
const WORKER_LIMIT: Duration = Duration::from_secs(120);

/// A small xorshift generator: the test picks its instants from a seed it
/// prints, so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn spawn_worker(url: &str, store: &Path, output: &Path, key: &str, context: &str) -> Child {
    let store = store.display().to_string();
    let output = output.display().to_string();
    example(
        "worker",
        &[
            "--once",
            "--base-url",
            url,
            "--context",
            context,
            "--store",
            &store,
            "--output",
            &output,
            "--key",
            key,
            // Half of a worker's time between writing a part and saving
            // the checkpoint after it: where a kill would duplicate text.
            "--slow-sink-ms",
            "10",
            "How do I resume a broken stream?",
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap()
}

/// Waits for `child` up to `limit`: its exit status, or `None` when it was
/// still running (and has been killed).
fn wait_up_to(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let mut status = None;
    let exited = holds_within(limit, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
    }
    status
}

fn stderr_of(child: &mut Child) -> String {
    use std::io::Read;
    let mut text = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut text);
    }
    text
}

/// Other clients' turns: `CROWD` new sessions in a context of their own
/// (each turn cancelled once started: the sessions are what counts).
fn crowd(rt: &tokio::runtime::Runtime, client: &nexus_knowql::Client) {
    rt.block_on(async {
        for n in 0..CROWD {
            let session = client.session(["crowd"]).build().unwrap();
            let turn = session.ask(format!("crowd {n}")).stream().await.unwrap();
            let _ = turn.cancel().await;
        }
    });
}

/// What the job's last run did: every worker's stderr, and whether one of
/// them finished it (a twin refused as busy is counted in `busy`).
fn finish_job(children: Vec<Child>, job: usize, stderr: &mut String, busy: &mut u32) {
    let mut finished = false;
    for mut child in children {
        let status = wait_up_to(&mut child, WORKER_LIMIT);
        let text = stderr_of(&mut child);
        match status {
            Some(s) if s.success() => finished = true,
            Some(_) if text.contains(BUSY) => *busy += 1,
            other => panic!("job {job}: {other:?}\n{stderr}{text}"),
        }
        stderr.push_str(&text);
    }
    assert!(finished, "job {job} never finished\n{stderr}");
}

/// The figures of a run.
#[derive(Debug, Default)]
struct Figures {
    duplicated: u32,
    missing: u32,
    second_turns: u32,
    foreign: u32,
    busy: u32,
}

#[test]
fn killed_workers_write_each_answer_exactly_once_with_one_turn_per_job() {
    let jobs = env_number("NEXUS_KILL_JOBS").map_or(CI_JOBS, |n| n as usize);
    let seed = env_number("NEXUS_KILL_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    }) | 1;
    eprintln!("kill_anywhere: {jobs} jobs, NEXUS_KILL_SEED={seed}");
    let mut rng = Rng(seed);
    let rt = runtime();
    let server = rt
        .block_on(
            LocalNexus::builder()
                .context(CONTEXTS[0], corpus())
                .context(CONTEXTS[1], corpus())
                .context("crowd", corpus())
                .frame_delay(Duration::from_millis(10))
                .start(),
        )
        .unwrap();
    let client = server.client().unwrap();
    let url = rt.block_on(listing_proxy::start(server.base_url(), ADMISSION));
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let store = FileCheckpointStore::new(&store_dir).unwrap();
    let started = Instant::now();
    let (mut kills, mut runs, mut crowded, mut twins) = (0u32, 0u32, 0u32, 0u32);
    let mut kill_window = Duration::from_millis(500);
    let mut figures = Figures::default();
    let sessions = || {
        rt.block_on(client.sessions().list().page_size(200).into_future())
            .unwrap()
    };
    for job in 0..jobs {
        let key = format!("job-{job}");
        let context = CONTEXTS[job % CONTEXTS.len()];
        let output = dir.path().join(format!("{key}.txt"));
        let before = sessions();
        // Kill the job's worker at random instants, then let one finish.
        // The first two jobs run whole, to learn how long a worker takes
        // (the first one also warms the machine up).
        let kills_here = if job < 2 {
            0
        } else {
            1 + rng.below(u64::from(MAX_KILLS_PER_JOB)) as u32
        };
        // One of each in every run, however short, then a quarter.
        let crowd_here = job == 2 || (job > 2 && rng.below(4) == 0);
        let twin_here = job == 3 || (job > 3 && rng.below(4) == 0);
        let job_started = Instant::now();
        let mut stderr = String::new();
        for _ in 0..kills_here {
            runs += 1;
            let mut child = spawn_worker(&url, &store_dir, &output, &key, context);
            // Anywhere from the process start to past its usual end; half
            // of the kills in its first quarter, where it posts the turn.
            let window = kill_window.as_micros() as u64;
            let window = if rng.below(2) == 0 {
                window
            } else {
                window / 4
            };
            let limit = Duration::from_micros(rng.below(window));
            if let Some(status) = wait_up_to(&mut child, limit) {
                let text = stderr_of(&mut child);
                assert!(status.success(), "job {job}: {status}\n{stderr}{text}");
                stderr.push_str(&text);
                continue;
            }
            kills += 1;
            stderr.push_str(&stderr_of(&mut child));
            stderr.push_str("-- killed --\n");
            if crowd_here {
                crowd(&rt, &client);
            }
        }
        crowded += u32::from(crowd_here && kills_here > 0);
        runs += 1;
        let mut last = vec![spawn_worker(&url, &store_dir, &output, &key, context)];
        if twin_here {
            twins += 1;
            runs += 1;
            last.push(spawn_worker(&url, &store_dir, &output, &key, context));
        }
        finish_job(last, job, &mut stderr, &mut figures.busy);
        if job < 2 {
            kill_window = job_started.elapsed().mul_f32(1.2);
        }
        check_job(
            &rt,
            &client,
            job,
            context,
            &before,
            &stderr,
            &output,
            &mut figures,
        );
        // The finished job's record proves its whole answer; no temporary
        // file is left. Then the job is handed on and forgotten.
        store.clear(&key).unwrap();
        let left: Vec<_> = std::fs::read_dir(&store_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "job {job}: {left:?}");
    }
    eprintln!(
        "kill_anywhere: {jobs} jobs ({crowded} crowded, {twins} with two workers), {runs} worker \
         runs, {kills} kill -9s (within {kill_window:.0?} of a start) in {:.1?}: {} duplicated, \
         {} missing, {} with a second turn, {} foreign answers; {} twins refused as busy",
        started.elapsed(),
        figures.duplicated,
        figures.missing,
        figures.second_turns,
        figures.foreign,
        figures.busy,
    );
    assert_eq!(
        (
            figures.duplicated,
            figures.missing,
            figures.second_turns,
            figures.foreign
        ),
        (0, 0, 0, 0),
        "seed {seed}"
    );
}

/// Checks a finished job: one session of its own started (crowd sessions
/// aside), in its context, and its output is that turn's answer exactly.
#[allow(clippy::too_many_arguments)]
fn check_job(
    rt: &tokio::runtime::Runtime,
    client: &nexus_knowql::Client,
    job: usize,
    context: &str,
    before: &[nexus_knowql::types::Session],
    stderr: &str,
    output: &Path,
    figures: &mut Figures,
) {
    // The turn the job finished, and the sessions it started.
    let query_id = stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("worker: ")?.strip_suffix(" citations"))
        .and_then(|l| l.split(' ').next())
        .unwrap_or_else(|| panic!("job {job}: no completion line\n{stderr}"))
        .to_owned();
    let after = rt
        .block_on(client.sessions().list().page_size(200).into_future())
        .unwrap();
    let new: Vec<_> = after
        .iter()
        .filter(|s| !before.iter().any(|b| b.id == s.id))
        .filter(|s| s.scope != ["crowd"])
        .collect();
    let query = rt.block_on(client.queries().get(&query_id)).unwrap();
    if new.len() != 1 || new[0].id != query.session_id {
        figures.second_turns += 1;
        eprintln!("job {job}: sessions started {new:?}, finished {query_id}\n{stderr}");
    }
    let own = after.iter().find(|s| s.id == query.session_id);
    if own.is_none_or(|s| s.scope != [context]) {
        figures.foreign += 1;
        eprintln!("job {job}: finished {query_id} of another context: {own:?}\n{stderr}");
    }
    let written = std::fs::read_to_string(output).unwrap();
    let answer = query.answer_text();
    if written != answer {
        if written.len() > answer.len() {
            figures.duplicated += 1;
        } else {
            figures.missing += 1;
        }
        eprintln!(
            "job {job}: wrote {} bytes, the answer has {}\n{stderr}",
            written.len(),
            answer.len()
        );
    }
    let key = format!("job-{job}");
    let store_dir = output.parent().unwrap().join("store");
    let store = FileCheckpointStore::new(&store_dir).unwrap();
    match store.load(&key).unwrap() {
        Some(CheckpointRecord::At(cp)) => {
            assert!(cp.proves_prefix_of(&answer) && cp.text_len == answer.len() as u64);
        }
        other => panic!("job {job}: {other:?}"),
    }
}
