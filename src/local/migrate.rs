//! The migration of a data directory written by earlier versions (the
//! whole state in `state.json`) to the state database, done once on the
//! first start: the rows are written to a new database in one transaction,
//! the file renamed into place, then `state.json` renamed aside.

use std::path::Path;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::db::{self, Op};
use super::durable;
use super::records::{ContextRecord, SessionEntry, to_json};
use crate::types;

/// The name of the state file of earlier versions.
const STATE_FILE: &str = "state.json";
/// What `state.json` is renamed to once migrated.
const MIGRATED_FILE: &str = "state.json.migrated";
/// What `state.json.prev` is renamed to once migrated.
const PREV_MIGRATED_FILE: &str = "state.json.prev.migrated";

#[derive(Debug, Deserialize)]
struct StoredQuery {
    query: types::Query,
    trace: Option<types::Trace>,
}

/// What `state.json` holds.
#[derive(Debug, Default, Deserialize)]
struct Snapshot {
    contexts: Vec<ContextRecord>,
    tasks: Vec<types::TaskResponse>,
    sessions: Vec<SessionEntry>,
    queries: Vec<StoredQuery>,
}

/// Migrates `dir/state.json` into `dir/state.db` unless the database
/// exists. Returns whether a migration happened.
pub(crate) fn migrate(dir: &Path) -> std::io::Result<bool> {
    let db_path = dir.join(db::DB_FILE);
    let json = dir.join(STATE_FILE);
    let prev = durable::previous(&json);
    if db_path.exists() {
        // A migration that stopped after its database was in place.
        set_aside(dir)?;
        return Ok(false);
    }
    if !json.exists() && !prev.exists() {
        return Ok(false);
    }
    let snap = read_state(dir).unwrap_or_default();
    let counts = (
        snap.contexts.len(),
        snap.tasks.len(),
        snap.sessions.len(),
        snap.queries.len(),
    );
    let tmp = durable::temp_beside(&db_path);
    let result = db::create_with(&tmp, ops(snap)).and_then(|()| {
        std::fs::rename(&tmp, &db_path)?;
        durable::sync_dir(dir)
    });
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    set_aside(dir)?;
    tracing::info!(
        contexts = counts.0,
        tasks = counts.1,
        sessions = counts.2,
        queries = counts.3,
        "migrated state.json to the state database state.db (state.json kept as state.json.migrated)"
    );
    Ok(true)
}

/// Renames `state.json` and its previous version aside (never deleted:
/// an unreadable one may still be worth reading by hand).
fn set_aside(dir: &Path) -> std::io::Result<()> {
    let json = dir.join(STATE_FILE);
    let prev = durable::previous(&json);
    if json.exists() {
        std::fs::rename(&json, dir.join(MIGRATED_FILE))?;
    }
    if prev.exists() {
        std::fs::rename(&prev, dir.join(PREV_MIGRATED_FILE))?;
    }
    durable::sync_dir(dir)
}

fn ops(snap: Snapshot) -> Vec<Op> {
    let mut out = Vec::new();
    for ctx in &snap.contexts {
        out.push(Op::PutContext {
            id: ctx.id.clone(),
            doc: to_json(ctx),
            new: true,
        });
        out.push(Op::PutSources {
            context_id: ctx.id.clone(),
            rows: ctx
                .sources
                .iter()
                .map(|(p, m)| (p.clone(), m.size, m.mtime.to_rfc3339()))
                .collect(),
            replace: true,
        });
    }
    for t in &snap.tasks {
        out.push(Op::PutTask {
            id: t.id.clone(),
            doc: to_json(t),
            new: true,
        });
    }
    for s in &snap.sessions {
        out.push(Op::PutSession {
            id: s.session.id.clone(),
            doc: to_json(s),
            new: true,
        });
    }
    for q in &snap.queries {
        out.push(Op::PutQuery {
            id: q.query.id.clone(),
            session_id: q.query.session_id.clone(),
            terminal: q.query.is_terminal(),
            doc: to_json(&q.query),
            trace: q.trace.as_ref().map(to_json),
            // No events were kept; the row is new.
            events: Some(Vec::new()),
            new: true,
        });
    }
    out
}

/// Reads `state.json`, falling back to its previous version when it is
/// missing or torn; a torn file is kept aside for inspection. `None` when
/// there is no usable state (a new directory, or both files unreadable).
fn read_state(dir: &Path) -> Option<Snapshot> {
    let path = dir.join(STATE_FILE);
    let prev = durable::previous(&path);
    let parse = |p: &Path| -> Result<Snapshot, String> {
        let bytes = std::fs::read(p).map_err(|e| e.to_string())?;
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    };
    let main_error = match parse(&path) {
        Ok(s) => return Some(s),
        Err(e) if !path.exists() => {
            if !prev.exists() {
                return None;
            }
            e
        }
        Err(e) => {
            let aside = dir.join(format!("state.json.torn-{}", Utc::now().timestamp()));
            tracing::error!(error = %e, kept = %aside.display(), "state.json is unreadable");
            let _ = std::fs::rename(&path, &aside);
            e
        }
    };
    match parse(&prev) {
        Ok(s) => {
            let when = std::fs::metadata(&prev)
                .and_then(|m| m.modified())
                .map(|t| DateTime::<Utc>::from(t).to_rfc3339())
                .unwrap_or_else(|_| "an unknown time".to_owned());
            tracing::error!(
                error = %main_error,
                saved_at = %when,
                contexts = s.contexts.len(),
                tasks = s.tasks.len(),
                sessions = s.sessions.len(),
                queries = s.queries.len(),
                "started from the previous state (state.json.prev); changes made after it was saved are lost"
            );
            Some(s)
        }
        Err(e) => {
            tracing::error!(
                error = %e,
                "neither state.json nor state.json.prev is readable; starting empty (both kept; the contexts' files are set aside in quarantine/)"
            );
            None
        }
    }
}
