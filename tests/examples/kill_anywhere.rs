//! The `worker` example under `kill -9` at random instants: every job's
//! output file is its turn's answer exactly once, and no job starts a
//! second turn.
//!
//! CI runs a short version; a by-hand run sets the number of jobs (and,
//! to replay one, the seed):
//!
//! ```text
//! NEXUS_KILL_JOBS=200 cargo test --features local --test examples kill_anywhere -- --nocapture
//! NEXUS_KILL_SEED=7 NEXUS_KILL_JOBS=200 cargo test --features local --test examples kill_anywhere -- --nocapture
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

/// Jobs in a CI run.
const CI_JOBS: usize = 12;
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

fn spawn_worker(url: &str, store: &Path, output: &Path, key: &str) -> Child {
    let store = store.display().to_string();
    let output = output.display().to_string();
    example(
        "worker",
        &[
            "--once",
            "--base-url",
            url,
            "--context",
            "docs",
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
                .context("docs", corpus())
                .frame_delay(Duration::from_millis(10))
                .start(),
        )
        .unwrap();
    let client = server.client().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let store = FileCheckpointStore::new(&store_dir).unwrap();
    let started = Instant::now();
    let (mut kills, mut runs) = (0u32, 0u32);
    let mut kill_window = Duration::from_millis(500);
    let (mut duplicated, mut missing, mut second_turns) = (0, 0, 0);
    for job in 0..jobs {
        let key = format!("job-{job}");
        let output = dir.path().join(format!("{key}.txt"));
        let before = rt.block_on(client.sessions().list().into_future()).unwrap();
        // Kill the job's worker at random instants, then let one finish.
        // The first two jobs run whole, to learn how long a worker takes
        // (the first one also warms the machine up).
        let kills_here = if job < 2 {
            0
        } else {
            1 + rng.below(u64::from(MAX_KILLS_PER_JOB)) as u32
        };
        let job_started = Instant::now();
        let mut stderr = String::new();
        let mut done = false;
        for attempt in 0..=kills_here {
            runs += 1;
            let mut child = spawn_worker(server.base_url(), &store_dir, &output, &key);
            let limit = if attempt < kills_here {
                // Anywhere from the process start to past its usual end;
                // half of the kills in its first quarter, where it posts
                // the job's turn.
                let window = kill_window.as_micros() as u64;
                let window = if rng.below(2) == 0 {
                    window
                } else {
                    window / 4
                };
                Duration::from_micros(rng.below(window))
            } else {
                WORKER_LIMIT
            };
            match wait_up_to(&mut child, limit) {
                Some(status) => {
                    let text = stderr_of(&mut child);
                    assert!(status.success(), "job {job}: {status}\n{stderr}{text}");
                    stderr.push_str(&text);
                    done = true;
                    break;
                }
                None => {
                    kills += 1;
                    stderr.push_str(&stderr_of(&mut child));
                    stderr.push_str("-- killed --\n");
                }
            }
        }
        assert!(done, "job {job} never finished\n{stderr}");
        if job < 2 {
            kill_window = job_started.elapsed().mul_f32(1.2);
        }
        // The turn the job finished, and the sessions it started.
        let query_id = stderr
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("worker: ")?.strip_suffix(" citations"))
            .and_then(|l| l.split(' ').next())
            .unwrap_or_else(|| panic!("job {job}: no completion line\n{stderr}"))
            .to_owned();
        let after = rt.block_on(client.sessions().list().into_future()).unwrap();
        let new: Vec<_> = after
            .iter()
            .filter(|s| !before.iter().any(|b| b.id == s.id))
            .collect();
        let query = rt.block_on(client.queries().get(&query_id)).unwrap();
        if new.len() != 1 || new[0].id != query.session_id {
            second_turns += 1;
            eprintln!("job {job}: sessions started {new:?}, finished {query_id}\n{stderr}");
        }
        let written = std::fs::read_to_string(&output).unwrap();
        let answer = query.answer_text();
        if written != answer {
            if written.len() > answer.len() {
                duplicated += 1;
            } else {
                missing += 1;
            }
            eprintln!(
                "job {job}: wrote {} bytes, the answer has {}\n{stderr}",
                written.len(),
                answer.len()
            );
        }
        // The finished job's record proves its whole answer; no temporary
        // file is left. Then the job is handed on and forgotten.
        match store.load(&key).unwrap() {
            Some(CheckpointRecord::At(cp)) => {
                assert!(cp.proves_prefix_of(&answer) && cp.text_len == answer.len() as u64);
            }
            other => panic!("job {job}: {other:?}"),
        }
        store.clear(&key).unwrap();
        let left: Vec<_> = std::fs::read_dir(&store_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "job {job}: {left:?}");
    }
    eprintln!(
        "kill_anywhere: {jobs} jobs, {runs} worker runs, {kills} kill -9s (within {kill_window:.0?} \
         of a start) in {:.1?}: {duplicated} duplicated, {missing} missing, {second_turns} \
         with a second turn",
        started.elapsed()
    );
    assert_eq!(
        (duplicated, missing, second_turns),
        (0, 0, 0),
        "seed {seed}"
    );
}
