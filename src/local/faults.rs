//! Fault injection for tests: cut event streams, slow turns down, answer
//! with 503, and named failpoints on every durability step (crash, full
//! disk, I/O error, delay; see [`ENV_FAILPOINTS`]). Everything is off by
//! default; failpoints exist only in builds with the `failpoints` feature.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Environment variable: cut every event stream after this many frames.
pub const ENV_FAULT_CUT_AFTER: &str = "NEXUS_LOCAL_FAULT_CUT_AFTER";
/// Environment variable: milliseconds between the events of a running turn.
pub const ENV_FAULT_FRAME_DELAY_MS: &str = "NEXUS_LOCAL_FAULT_FRAME_DELAY_MS";
/// Environment variable: answer the next N requests with 503 and `Retry-After`.
pub const ENV_FAULT_503: &str = "NEXUS_LOCAL_FAULT_503";

/// Environment variable, read in builds with the `failpoints` feature only:
/// the clock ids are made from stands still at this many milliseconds since
/// 1970 (a clock frozen or reset, as under `faketime` or on a device
/// without a real-time clock).
pub const ENV_FAULT_FROZEN_CLOCK_MS: &str = "NEXUS_LOCAL_FAULT_FROZEN_CLOCK_MS";

/// Milliseconds since 1970 for a new id: the system clock, or the frozen
/// one of [`ENV_FAULT_FROZEN_CLOCK_MS`] in a test build that sets it.
pub(crate) fn id_clock_millis() -> u64 {
    #[cfg(feature = "failpoints")]
    {
        static FROZEN: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
        let frozen = FROZEN.get_or_init(|| {
            std::env::var(ENV_FAULT_FROZEN_CLOCK_MS)
                .ok()
                .and_then(|v| v.trim().parse().ok())
        });
        if let Some(ms) = *frozen {
            return ms;
        }
    }
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0)
}

/// The faults a server injects. Shared by every request.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// Close the connection of every event stream after this many frames.
    cut_after_frames: Option<usize>,
    /// Pause between the events a running turn emits.
    frame_delay: Duration,
    /// Requests still to answer with 503.
    fail_next: AtomicUsize,
    /// The `Retry-After` seconds sent with an injected 503.
    retry_after_secs: AtomicU64,
}

impl Faults {
    pub(crate) fn new(
        cut_after_frames: Option<usize>,
        frame_delay: Duration,
        fail_next: usize,
        retry_after_secs: u64,
    ) -> Self {
        Faults {
            cut_after_frames,
            frame_delay,
            fail_next: AtomicUsize::new(fail_next),
            retry_after_secs: AtomicU64::new(retry_after_secs),
        }
    }

    pub(crate) fn cut_after_frames(&self) -> Option<usize> {
        self.cut_after_frames
    }

    pub(crate) fn frame_delay(&self) -> Duration {
        self.frame_delay
    }

    /// Arms `n` more 503 answers.
    pub(crate) fn fail_next(&self, n: usize) {
        self.fail_next.fetch_add(n, Ordering::SeqCst);
    }

    /// Whether this request gets an injected 503; returns its `Retry-After`.
    pub(crate) fn take_503(&self) -> Option<u64> {
        self.fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .ok()
            .map(|_| self.retry_after_secs.load(Ordering::Relaxed))
    }
}

/// Environment variable: named failpoints, `name=action[@N];...`, read once
/// at the first failpoint reached. Only in builds with the `failpoints`
/// feature (and the crate's own tests); elsewhere failpoints do nothing.
///
/// `action` is `crash` (the process aborts, as on a power cut), `enospc`
/// (the step fails with "no space left on device"), `eio` (it fails with
/// an I/O error) or `delay(MS)` (it pauses). With `@N` the action starts at
/// the N-th time the point is reached (counting from 1) and then applies
/// every time; without it, from the first.
pub const ENV_FAILPOINTS: &str = "NEXUS_LOCAL_FAILPOINTS";

/// The named steps of the durability path a failpoint can break.
pub(crate) mod point {
    /// The state database's commit of one batch (before `COMMIT`).
    pub(crate) const DB_COMMIT: &str = "db.commit";
    /// Right after a batch is committed, before it is reported saved.
    pub(crate) const DB_COMMITTED: &str = "db.committed";
    /// A crash-safe file write, before its rename into place.
    pub(crate) const FILE_WRITE: &str = "file.write";
    /// An imported file's move from staging into a context's sources.
    pub(crate) const FILE_MOVE: &str = "file.move";
    /// Writing an upload into its staging directory.
    pub(crate) const STAGING: &str = "staging.write";
    /// A new index generation written, before it is swapped in.
    pub(crate) const INDEX_SWAP: &str = "index.swap";
    /// Removed sources' files, deleted once their removal is saved.
    pub(crate) const SOURCE_REMOVE: &str = "source.remove";
    /// A fork's directory moved into place, before its record is saved.
    pub(crate) const FORK_PUBLISH: &str = "fork.publish";
    /// Every point, for tests and the documentation.
    #[cfg(any(test, feature = "failpoints"))]
    pub(crate) const ALL: [&str; 8] = [
        DB_COMMIT,
        DB_COMMITTED,
        FILE_WRITE,
        FILE_MOVE,
        STAGING,
        INDEX_SWAP,
        SOURCE_REMOVE,
        FORK_PUBLISH,
    ];
}

/// What an armed failpoint does.
#[cfg(any(test, feature = "failpoints"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Crash,
    NoSpace,
    Io,
    Delay(Duration),
}

/// One armed failpoint: its action, from which hit, and the hits so far.
#[cfg(any(test, feature = "failpoints"))]
#[derive(Debug)]
struct Armed {
    action: Action,
    from: u64,
    hits: AtomicU64,
}

/// Parses `name=action[@N];...`; an unknown point or action is an error
/// that names it.
#[cfg(any(test, feature = "failpoints"))]
fn parse_failpoints(spec: &str) -> Result<Vec<(String, Armed)>, String> {
    let mut out = Vec::new();
    for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, rest) = part
            .split_once('=')
            .ok_or_else(|| format!("failpoint {part:?}: expected name=action"))?;
        let name = name.trim();
        if !point::ALL.contains(&name) {
            return Err(format!("unknown failpoint {name:?}"));
        }
        let (action, from) = match rest.split_once('@') {
            Some((a, n)) => (
                a.trim(),
                n.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("failpoint {name:?}: bad hit number {n:?}"))?,
            ),
            None => (rest.trim(), 1),
        };
        let action = match action {
            "crash" => Action::Crash,
            "enospc" => Action::NoSpace,
            "eio" => Action::Io,
            other => {
                let ms = other
                    .strip_prefix("delay(")
                    .and_then(|r| r.strip_suffix(')'))
                    .and_then(|ms| ms.trim().parse::<u64>().ok())
                    .ok_or_else(|| format!("failpoint {name:?}: unknown action {other:?}"))?;
                Action::Delay(Duration::from_millis(ms))
            }
        };
        out.push((
            name.to_owned(),
            Armed {
                action,
                from,
                hits: AtomicU64::new(0),
            },
        ));
    }
    Ok(out)
}

#[cfg(any(test, feature = "failpoints"))]
fn armed() -> &'static [(String, Armed)] {
    static ARMED: std::sync::OnceLock<Vec<(String, Armed)>> = std::sync::OnceLock::new();
    ARMED.get_or_init(|| {
        let spec = std::env::var(ENV_FAILPOINTS).unwrap_or_default();
        match parse_failpoints(&spec) {
            Ok(points) => {
                if !points.is_empty() {
                    tracing::warn!(%spec, "failpoints armed");
                }
                points
            }
            Err(e) => {
                tracing::error!(error = %e, "{ENV_FAILPOINTS} ignored");
                Vec::new()
            }
        }
    })
}

/// Passes the failpoint `name` (one of [`point`]): does what it is armed
/// to do, if anything. Blocking (a delay sleeps the thread).
///
/// # Errors
/// The injected I/O error of an armed `enospc` or `eio`.
#[cfg(any(test, feature = "failpoints"))]
pub(crate) fn failpoint(name: &str) -> std::io::Result<()> {
    let Some((_, armed)) = armed().iter().find(|(n, _)| n == name) else {
        return Ok(());
    };
    let hit = armed.hits.fetch_add(1, Ordering::SeqCst).saturating_add(1);
    if hit < armed.from {
        return Ok(());
    }
    match armed.action {
        Action::Crash => {
            tracing::error!(failpoint = name, "failpoint: crashing");
            std::process::abort()
        }
        Action::NoSpace => Err(std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            format!("no space left on device (failpoint {name})"),
        )),
        Action::Io => Err(std::io::Error::other(format!(
            "input/output error (failpoint {name})"
        ))),
        Action::Delay(d) => {
            std::thread::sleep(d);
            Ok(())
        }
    }
}

/// Failpoints are compiled out of this build.
#[cfg(not(any(test, feature = "failpoints")))]
#[inline(always)]
pub(crate) fn failpoint(_name: &str) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_next_counts_down_to_zero() {
        let f = Faults::new(None, Duration::ZERO, 2, 1);
        assert_eq!(f.take_503(), Some(1));
        assert_eq!(f.take_503(), Some(1));
        assert_eq!(f.take_503(), None);
        f.fail_next(1);
        assert_eq!(f.take_503(), Some(1));
        assert_eq!(f.take_503(), None);
    }

    #[test]
    fn failpoints_parse_with_their_start() {
        let points =
            parse_failpoints("db.commit=enospc@3; file.move=crash;index.swap=delay(20)").unwrap();
        assert_eq!(points.len(), 3);
        assert_eq!((points[0].1.action, points[0].1.from), (Action::NoSpace, 3));
        assert_eq!((points[1].1.action, points[1].1.from), (Action::Crash, 1));
        assert_eq!(points[2].1.action, Action::Delay(Duration::from_millis(20)));
        for bad in [
            "nope=crash",
            "db.commit=melt",
            "db.commit=eio@0",
            "db.commit",
        ] {
            assert!(parse_failpoints(bad).is_err(), "{bad} accepted");
        }
        assert!(parse_failpoints("").unwrap().is_empty());
    }
}
