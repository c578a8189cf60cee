//! The rounds of the model with faults besides stops and failpoints: a
//! server restarted with its clock frozen at, or set back to, an instant
//! already used; storms of uploads refused by a quota (each refusal leaves
//! nothing staged); and files and folders missing at start (in a copy of
//! the data directory the model owns: the start is refused with the
//! documented message, `verify` reports it, and once restored everything
//! acknowledged is served).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::*;
use crate::support::wait::found_within;
use nexus_knowql::local::{ENV_FAULT_FROZEN_CLOCK_MS, LocalNexus};

/// A clock already used in every run: the instant of the first frozen
/// round, which each later frozen round repeats.
const FROZEN_MS: u64 = 1_700_000_000_000;
/// The quota (bytes of sources per context) of a storm round: far above
/// what the model's contexts hold, far below one storm upload.
const QUOTA: u64 = 64 * 1024;
/// How long a staged upload may outlive its request: its client's
/// timeout, then the wait for its turn on the context (30 s each).
const STAGED_PATIENCE: Duration = Duration::from_secs(75);
/// Clients that only send uploads past the quota in a storm round.
const STORM_CLIENTS: usize = 3;

/// The clock of a round's server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Clock {
    /// Frozen at [`FROZEN_MS`] (every frozen round repeats it).
    Frozen,
    /// Set back to the instant the run started at (the setup's ids).
    SetBack(u64),
}

impl Clock {
    pub(super) fn millis(self) -> u64 {
        match self {
            Clock::Frozen => FROZEN_MS,
            Clock::SetBack(ms) => ms,
        }
    }
}

/// What is removed from the copy of the data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Missing {
    /// One recorded source file (`uploads/seed.md` of a model context).
    File,
    /// A model context's `sources/` folder (a mount that came late).
    Folder,
    /// `state.db` (with its WAL), while contexts' files are there.
    Database,
}

/// The faults of one round besides its stop.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RoundFaults {
    pub(super) clock: Option<Clock>,
    /// An in-process server with [`QUOTA`], and storm clients.
    pub(super) storm: bool,
    /// Removed from a copy after the round's check.
    pub(super) missing: Option<Missing>,
}

pub(super) fn pick_round(rng: &mut Rng, run_start_ms: u64) -> RoundFaults {
    let storm = rng.below(8) == 0;
    let clock = match rng.below(12) {
        _ if storm => None,
        0 => Some(Clock::Frozen),
        1 => Some(Clock::SetBack(run_start_ms)),
        _ => None,
    };
    let missing = match rng.below(24) {
        0 => Some(Missing::File),
        1 => Some(Missing::Folder),
        2 => Some(Missing::Database),
        _ => None,
    };
    RoundFaults {
        clock,
        storm,
        missing,
    }
}

/// The environment of a round's server for its clock.
pub(super) fn clock_env(clock: Option<Clock>) -> Option<(&'static str, String)> {
    clock.map(|c| (ENV_FAULT_FROZEN_CLOCK_MS, c.millis().to_string()))
}

pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The names in `dir`, sorted (none when it does not exist).
/// What `dir` holds, at any depth, with each file's size.
fn tree(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.is_dir() {
            found.push(format!("{}/", path.display()));
            found.extend(tree(&path));
        } else {
            let size = e.metadata().map(|m| m.len()).unwrap_or(0);
            found.push(format!("{} ({size} bytes)", path.display()));
        }
    }
    found
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// One storm client: uploads past the quota until `stop`; each must be
/// refused (413, or 503 `busy` when shed), never acknowledged.
async fn storm_client(
    base: String,
    model: Shared,
    mut rng: Rng,
    who: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let http = client();
    for n in 0..60 {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let ctx = MODEL_CONTEXTS[rng.below(2) as usize];
        let size = QUOTA + 1 + rng.below(QUOTA);
        let text = "s".repeat(size as usize);
        let name = format!("storm-{who}-{n}.md");
        let form = reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(text.into_bytes()).file_name(name.clone()),
        );
        let a = send(
            http.post(format!("{base}/contexts/{ctx}/import/upload"))
                .multipart(form),
        )
        .await;
        let mut m = lock(&model);
        m.ops += 1;
        *m.kinds.entry("storm upload").or_default() += 1;
        match &a {
            Some((413, _)) => m.storm_refused += 1,
            Some((503, b)) if b["code"] == "busy" => m.storm_refused += 1,
            Some((status, body)) => m.violations.push(format!(
                "upload {ctx}/{name} of {size} bytes past a quota of {QUOTA}: {status} {body}"
            )),
            None => return,
        }
    }
}

/// A round on an in-process server whose contexts have a quota of
/// [`QUOTA`] bytes: the usual clients work beside storm clients whose
/// every upload is past it. Once every request has returned, `staging/`
/// is empty: no refusal left a staged copy. Ends with a clean shutdown.
pub(super) fn storm_round(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    model: &Shared,
    rng: &mut Rng,
    clients: usize,
    why: &str,
) {
    rt.block_on(async {
        let server = LocalNexus::builder()
            .data_dir(dir)
            .context_bytes_limit(QUOTA)
            .start()
            .await
            .unwrap_or_else(|e| panic!("{why}: start with a quota: {e}"));
        let base = server.base_url().to_owned();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks: Vec<_> = (0..clients)
            .map(|who| {
                let c = Rng(rng.next() | 1);
                tokio::spawn(run_client(
                    base.clone(),
                    model.clone(),
                    c,
                    who,
                    60,
                    stop.clone(),
                ))
            })
            .collect();
        tasks.extend((0..STORM_CLIENTS).map(|who| {
            let c = Rng(rng.next() | 1);
            tokio::spawn(storm_client(
                base.clone(),
                model.clone(),
                c,
                who,
                stop.clone(),
            ))
        }));
        // Paces load: the round's length, as the other rounds.
        tokio::time::sleep(Duration::from_millis(300 + rng.below(2000))).await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in tasks {
            let _ = t.await;
        }
        // A fork or an upload whose client went away (a client times out
        // after 30 s) may still be finishing, or waiting up to 30 s for
        // its turn on the context before it is refused.
        let staging = dir.join("staging");
        let empty = async || entries(&staging).is_empty().then_some(());
        found_within(STAGED_PATIENCE, empty).await;
        let left = entries(&staging);
        assert!(
            left.is_empty(),
            "{why}: staging/ still holds {left:?} {STAGED_PATIENCE:?} after every request returned: {:?}",
            left.iter().map(|d| tree(&staging.join(d))).collect::<Vec<_>>()
        );
        server.shutdown().await;
    });
}

/// Starts the binary on `dir` with `envs`, its log in `dir`'s parent
/// (`server.log`, the last start's): a start that fails panics with the
/// end of that log and `why`.
pub(super) fn start_logged(dir: &str, envs: &[(&str, &str)], why: &str) -> LocalBinary {
    use std::io::BufRead;
    let log_path = Path::new(dir).parent().unwrap().join("server.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nexus-local"))
        .args(["--bind", "127.0.0.1:0", "--data", dir])
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
    let url = line.trim().to_owned();
    if url.is_empty() {
        let _ = child.kill();
        let status = child.wait().unwrap();
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: String = log
            .chars()
            .rev()
            .take(3000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        panic!("{why}: nexus-local did not start ({status}) with {envs:?}:\n{tail}");
    }
    LocalBinary { child, url }
}

/// Starts the binary on `dir`, which must refuse: its exit status and
/// what it wrote on stderr.
fn refused_start(dir: &Path, why: &str) -> (Option<i32>, String) {
    use std::io::{BufRead, Read};
    let mut child = Command::new(env!("CARGO_BIN_EXE_nexus-local"))
        .args(["--bind", "127.0.0.1:0", "--data"])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
    if !line.trim().is_empty() {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{why}: started at {} with acknowledged data missing",
            line.trim()
        );
    }
    let mut err = String::new();
    let _ = stderr.read_to_string(&mut err);
    let status = child.wait().unwrap();
    (status.code(), err)
}

/// Copies the directory tree `from` to `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Copies the stopped data directory `dir`, removes what `missing` names
/// from the copy, checks that a start on it is refused with the
/// documented message and `verify` reports it, puts it back and checks a
/// start serves everything acknowledged. The run goes on in the copy,
/// which is returned (the model made both; `dir` is removed).
pub(super) fn missing_data_round(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    model: &Shared,
    rng: &mut Rng,
    missing: Missing,
    round: usize,
    why: &str,
) -> PathBuf {
    let root = dir.parent().unwrap();
    let copy = root.join(format!("data-{round}"));
    let aside = root.join(format!("aside-{round}"));
    copy_tree(dir, &copy);
    std::fs::create_dir_all(&aside).unwrap();
    let slug = MODEL_CONTEXTS[rng.below(2) as usize];
    let (ctx_id, count) = {
        let m = lock(model);
        let count = m.base.keys().filter(|(c, _)| c == slug).count();
        (m.context_ids[slug].clone(), count)
    };
    let sources = copy.join("contexts").join(&ctx_id).join("sources");
    // What is moved aside (from, to), and what the start must say.
    let (moved, needles): (Vec<(PathBuf, PathBuf)>, Vec<String>) = match missing {
        Missing::File => (
            vec![(sources.join("uploads/seed.md"), aside.join("seed.md"))],
            vec![format!(
                "1 recorded source file(s) are missing ({slug}/uploads/seed.md)"
            )],
        ),
        Missing::Folder => (
            vec![(sources.clone(), aside.join("sources"))],
            vec![
                format!("{count} recorded source file(s) are missing ("),
                format!("{slug}/"),
            ],
        ),
        Missing::Database => (
            ["state.db", "state.db-wal", "state.db-shm"]
                .iter()
                .map(|f| (copy.join(f), aside.join(f)))
                .filter(|(from, _)| from.exists())
                .collect(),
            vec!["state.db is missing".to_owned(), "from a backup".to_owned()],
        ),
    };
    // Set aside by earlier recoveries (files no row named), if any.
    let quarantined = entries(&copy.join("quarantine"));
    for (from, to) in &moved {
        std::fs::rename(from, to).unwrap();
    }
    let why = format!("{why} missing {missing:?} of {slug}");
    let (code, err) = refused_start(&copy, &why);
    assert_eq!(code, Some(1), "{why}: exit status; stderr:\n{err}");
    assert!(err.contains("refusing to start"), "{why}: {err}");
    for n in &needles {
        assert!(err.contains(n.as_str()), "{why}: says no {n:?}:\n{err}");
    }
    let (ok, report) = super::verify(copy.to_str().unwrap());
    assert!(!ok, "{why}: verify found nothing:\n{report}");
    let what = match missing {
        Missing::Database => "state.db".to_owned(),
        _ => "uploads/seed.md".to_owned(),
    };
    assert!(
        report.contains(&what),
        "{why}: verify names no {what}:\n{report}"
    );
    // Nothing was changed, set aside or forgotten: put back, all is served.
    assert_eq!(
        entries(&copy.join("quarantine")),
        quarantined,
        "{why}: a refused start set data aside"
    );
    for (from, to) in &moved {
        std::fs::rename(to, from).unwrap();
    }
    let mut server = start_logged(copy.to_str().unwrap(), &[], &why);
    rt.block_on(async {
        check(&server.url, model, &why).await;
        check_history(&server.url, model, &why).await;
    });
    terminate(&mut server, Duration::from_secs(60));
    std::fs::remove_dir_all(dir).unwrap();
    let _ = std::fs::remove_dir_all(&aside);
    copy
}
