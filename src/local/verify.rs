//! `nexus-local verify`: a consistency check of a data directory that no
//! server is using. It reads the state database and the files and reports
//! what disagrees: source rows without their file (or with another size),
//! files and directories no row names, an index that does not match its
//! chunk table, rows that cannot be read, turns and tasks whose states
//! contradict themselves.
//!
//! What the next start repairs by design is listed as a note, not a
//! problem, so `verify` right after a crash passes unless something is
//! damaged: work that was running, a move that was under way, staged
//! uploads, and files no row names (a deleted context's directory, an
//! index generation not in use, a source file whose removal had not
//! happened yet), which the next start removes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use super::db::DB_FILE;
use super::records::{ContextRecord, open_index};
use crate::status::{QueryStatus, TaskStatus};

/// The lock file a server holds on its data directory.
const LOCK_FILE: &str = ".lock";
/// Names a data directory may hold at its top.
const KNOWN_TOP: [&str; 10] = [
    LOCK_FILE,
    DB_FILE,
    "state.db-wal",
    "state.db-shm",
    "state.json.migrated",
    "state.json.prev.migrated",
    ".nexus-local",
    "quarantine",
    "staging",
    "contexts",
];
/// How a note says that the next start removes a leftover.
const SWEPT_AT_START: &str = "removed at the next start";
/// The terminal events of a turn's log.
const TERMINAL_EVENTS: [&str; 3] = [
    "response.completed",
    "response.failed",
    "response.cancelled",
];

/// What [`verify_data_dir`] found.
///
/// ```no_run
/// let report = nexus_knowql::local::verify_data_dir(std::path::Path::new("data"))?;
/// if !report.is_clean() {
///     eprintln!("{report}");
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// Inconsistencies: what the state says and what is there disagree.
    pub problems: Vec<String>,
    /// Leftovers the next start repairs (work that was running, unfinished
    /// moves, staged uploads).
    pub notes: Vec<String>,
    /// Rows and files checked.
    pub checked: u64,
}

impl VerifyReport {
    /// Whether no problem was found (notes allowed).
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    fn problem(&mut self, p: String) {
        self.problems.push(p);
    }
}

impl std::fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for p in &self.problems {
            writeln!(f, "problem: {p}")?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        write!(
            f,
            "{} checked, {} problem(s), {} note(s)",
            self.checked,
            self.problems.len(),
            self.notes.len()
        )
    }
}

/// Checks the data directory `dir` (see the module docs). Takes the
/// directory's lock for the duration, so it refuses a directory a server
/// is using.
///
/// # Errors
/// The directory cannot be read, is in use (kind `WouldBlock`), or holds no
/// state database (kind `NotFound`).
pub fn verify_data_dir(dir: &Path) -> std::io::Result<VerifyReport> {
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(LOCK_FILE))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                format!("{} is in use by a server; stop it first", dir.display()),
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    // The database gone while contexts' files are there: the start
    // refuses it, and so does the check.
    if let Some(why) = super::store::state_missing(dir) {
        let mut report = VerifyReport::default();
        report.problem(why);
        return Ok(report);
    }
    let db_path = dir.join(DB_FILE);
    if !db_path.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{} holds no {DB_FILE}", dir.display()),
        ));
    }
    let conn = Connection::open_with_flags(&db_path, OpenFlags::SQLITE_OPEN_READ_WRITE)
        .map_err(std::io::Error::other)?;
    let mut report = VerifyReport::default();
    check(&conn, dir, &mut report).map_err(std::io::Error::other)?;
    Ok(report)
}

fn check(conn: &Connection, dir: &Path, report: &mut VerifyReport) -> rusqlite::Result<()> {
    let integrity: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    if integrity != "ok" {
        report.problem(format!("database integrity check: {integrity}"));
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "staging" {
            let staged = std::fs::read_dir(entry.path()).map_or(0, |d| d.count());
            if staged > 0 {
                report.notes.push(format!(
                    "{staged} staged upload(s), cleared at the next start"
                ));
            }
        } else if !KNOWN_TOP.contains(&name.as_str()) && !name.starts_with(".state.db") {
            report
                .notes
                .push(format!("unknown entry {name:?} at the top"));
        }
    }
    let moving = check_moves(conn, report)?;
    let contexts = check_contexts(conn, dir, &moving, report)?;
    check_tasks(conn, report)?;
    check_queries(conn, report)?;
    // Rows of tasks and contexts that no longer exist.
    for (orphans, what) in [
        (
            "SELECT COUNT(*) FROM task_files WHERE task_id NOT IN (SELECT id FROM tasks)",
            "task file row(s) of tasks",
        ),
        (
            "SELECT COUNT(*) FROM sources WHERE context_id NOT IN (SELECT id FROM contexts)",
            "source row(s) of contexts",
        ),
    ] {
        let orphans: i64 = conn.query_row(orphans, [], |r| r.get(0))?;
        if orphans > 0 {
            report.problem(format!("{orphans} {what} that do not exist"));
        }
    }
    let contexts_dir = dir.join("contexts");
    for entry in std::fs::read_dir(&contexts_dir)
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !contexts.contains(&name) {
            report.notes.push(format!(
                "directory contexts/{name} belongs to no context (orphan); {SWEPT_AT_START}"
            ));
        }
    }
    Ok(())
}

/// Unfinished moves: `(context id, path)` of every file named.
fn check_moves(
    conn: &Connection,
    report: &mut VerifyReport,
) -> rusqlite::Result<BTreeSet<(String, String)>> {
    let mut moving = BTreeSet::new();
    let mut stmt = conn.prepare("SELECT context_id, files FROM moves")?;
    let rows = stmt.query_map([], |r| <(String, String)>::try_from(r))?;
    for row in rows {
        let (context_id, files) = row?;
        let files = super::store::MoveRecord::parse(&files).files;
        report.notes.push(format!(
            "an import into context {context_id} was moving {} file(s); finished at the next start",
            files.len()
        ));
        moving.extend(files.into_iter().map(|(p, _)| (context_id.clone(), p)));
    }
    Ok(moving)
}

/// Checks contexts, their sources and indexes; returns their ids.
fn check_contexts(
    conn: &Connection,
    dir: &Path,
    moving: &BTreeSet<(String, String)>,
    report: &mut VerifyReport,
) -> rusqlite::Result<BTreeSet<String>> {
    let mut ids = BTreeSet::new();
    let mut rows: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    {
        let mut stmt = conn.prepare("SELECT context_id, path, size FROM sources")?;
        let it = stmt.query_map([], |r| <(String, String, i64)>::try_from(r))?;
        for row in it {
            let (ctx, path, size) = row?;
            rows.entry(ctx)
                .or_default()
                .insert(path, size.max(0) as u64);
        }
    }
    let mut stmt = conn.prepare("SELECT id, doc FROM contexts")?;
    let it = stmt.query_map([], |r| <(String, String)>::try_from(r))?;
    for row in it {
        let (id, doc) = row?;
        report.checked += 1;
        ids.insert(id.clone());
        let ctx: ContextRecord = match serde_json::from_str(&doc) {
            Ok(c) => c,
            Err(e) => {
                report.problem(format!("context {id}: unreadable row ({e})"));
                continue;
            }
        };
        let ctx_dir = dir.join("contexts").join(&id);
        let sources = ctx_dir.join("sources");
        let recorded = rows.remove(&id).unwrap_or_default();
        for (path, size) in &recorded {
            report.checked += 1;
            match super::paths::safe_join(&sources, path).map(|p| std::fs::metadata(&p)) {
                Some(Ok(m)) if m.is_file() && m.len() == *size => {}
                Some(Ok(m)) if m.is_file() => report.problem(format!(
                    "context {}: source {path:?} is {} bytes, recorded {size}",
                    ctx.slug,
                    m.len()
                )),
                _ => report.problem(format!(
                    "context {}: source {path:?} is recorded but its file is missing",
                    ctx.slug
                )),
            }
        }
        for path in super::paths::files_below(&sources) {
            report.checked += 1;
            if !recorded.contains_key(&path) && !moving.contains(&(id.clone(), path.clone())) {
                report.notes.push(format!(
                    "context {}: file sources/{path} is in no source row (orphan); {SWEPT_AT_START}",
                    ctx.slug
                ));
            }
        }
        check_index(&ctx, &ctx_dir, report);
    }
    Ok(ids)
}

/// The index of a curated context opens and matches its chunk table; no
/// other generation is left beside it.
fn check_index(ctx: &ContextRecord, ctx_dir: &Path, report: &mut VerifyReport) {
    let curated = ctx.last_curated_at.is_some();
    if curated {
        report.checked += 1;
        if let Err(e) = open_index(ctx_dir, ctx.index_generation) {
            report.problem(format!(
                "context {}: index generation {} does not open or disagrees with its chunks ({e})",
                ctx.slug, ctx.index_generation
            ));
        }
    }
    for entry in std::fs::read_dir(ctx_dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(g) = crate::local::records::index_generation(&name)
            && !(curated && g == ctx.index_generation)
        {
            report.notes.push(format!(
                "context {}: {name} is no index in use (orphan); {SWEPT_AT_START}",
                ctx.slug
            ));
        }
    }
}

fn check_tasks(conn: &Connection, report: &mut VerifyReport) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare("SELECT id, doc FROM tasks")?;
    let it = stmt.query_map([], |r| <(String, String)>::try_from(r))?;
    for row in it {
        let (id, doc) = row?;
        report.checked += 1;
        let state = serde_json::from_str::<serde_json::Value>(&doc)
            .ok()
            .and_then(|v| v.get("state").and_then(|s| s.as_str()).map(str::to_owned));
        match state {
            None => report.problem(format!("task {id}: unreadable row")),
            Some(s) if !TaskStatus::from(s.as_str()).is_terminal() => report.notes.push(format!(
                "task {id} was {s} when its server stopped; marked failed at the next start"
            )),
            Some(_) => {}
        }
    }
    Ok(())
}

fn check_queries(conn: &Connection, report: &mut VerifyReport) -> rusqlite::Result<()> {
    let mut last_events: BTreeMap<String, (i64, i64, String)> = BTreeMap::new();
    {
        let mut stmt = conn.prepare(
            "SELECT query_id, COUNT(*), MAX(seq), (SELECT event FROM events e2 WHERE e2.query_id = e.query_id ORDER BY seq DESC LIMIT 1) FROM events e GROUP BY query_id",
        )?;
        let it = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                (r.get(1)?, r.get(2)?, r.get::<_, String>(3)?),
            ))
        })?;
        for row in it {
            let (id, v) = row?;
            last_events.insert(id, v);
        }
    }
    let mut stmt = conn.prepare("SELECT id, terminal, doc FROM queries")?;
    let it = stmt.query_map([], |r| <(String, bool, String)>::try_from(r))?;
    for row in it {
        let (id, terminal, doc) = row?;
        report.checked += 1;
        let status = serde_json::from_str::<serde_json::Value>(&doc)
            .ok()
            .and_then(|v| v.get("status").and_then(|s| s.as_str()).map(str::to_owned));
        let Some(status) = status else {
            report.problem(format!("turn {id}: unreadable row"));
            continue;
        };
        let ended = QueryStatus::from(status.as_str()).is_terminal();
        if ended != terminal {
            report.problem(format!(
                "turn {id}: status {status} but stored as {}",
                if terminal { "ended" } else { "running" }
            ));
        }
        if !terminal {
            report.notes.push(format!(
                "turn {id} was running when its server stopped; marked failed at the next start"
            ));
        }
        if let Some((count, max, last)) = last_events.remove(&id) {
            if count != max {
                report.problem(format!("turn {id}: its events are not numbered 1..{count}"));
            }
            // A running turn's log ends where it was cut; the next start
            // marks the turn failed.
            if terminal && !TERMINAL_EVENTS.contains(&last.as_str()) {
                report.problem(format!(
                    "turn {id}: its stored events end with {last:?}, not a terminal event"
                ));
            }
        }
    }
    for id in last_events.keys() {
        report.problem(format!("events of turn {id}, which does not exist"));
    }
    Ok(())
}
