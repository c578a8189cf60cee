//! The server's records (contexts and their sources, tasks, sessions,
//! query turns) as kept in memory; the store ([`super::store`]) holds
//! them and is the only one to change them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::events::EventLog;
use super::ledger::Ledger;
use super::search::{Chunk, ContextIndex};
use crate::types;

/// The model every local answer is attributed to.
pub(crate) const LOCAL_MODEL: &str = "local-extractive";
/// The principal and project every local caller is.
pub(crate) const LOCAL_PRINCIPAL: &str = "local";
pub(crate) const LOCAL_PROJECT: &str = "local";
pub(crate) const LOCAL_PROJECT_NAME: &str = "nexus-local";

/// Bits of an id body that are not its time.
const ID_RANDOM_BITS: u32 = 80;
const ID_RANDOM_MASK: u128 = (1 << ID_RANDOM_BITS) - 1;

/// The parts of the newest id body this process made: its milliseconds
/// and its random part.
static LAST_ID: Mutex<(u64, u128)> = Mutex::new((0, 0));

/// A fresh id body: 12 hex digits of milliseconds, then 20 of random bits,
/// fixed width. The clock alone never makes an id: a restart with a clock
/// that stands still or repeats draws new random bits, and within a process
/// bodies only increase (see [`next_id_parts`]), so ids sort by creation
/// whatever the clock does.
pub(crate) fn new_id_raw() -> String {
    let now = super::faults::id_clock_millis();
    let mut last = LAST_ID.lock().unwrap_or_else(PoisonError::into_inner);
    *last = next_id_parts(*last, now, random_id_bits);
    format!("{:012x}{:020x}", last.0, last.1)
}

/// The id parts that follow `last` at `now`: a later millisecond takes
/// fresh random bits; the same or an earlier one (a clock that stands still
/// or went back) keeps `last`'s time and counts its random part up, to the
/// next millisecond when that overflows.
fn next_id_parts(last: (u64, u128), now: u64, fresh: impl FnOnce() -> u128) -> (u64, u128) {
    if now > last.0 {
        return (now, fresh() & ID_RANDOM_MASK);
    }
    match last.1.checked_add(1).filter(|r| *r <= ID_RANDOM_MASK) {
        Some(random) => (last.0, random),
        None => (last.0.saturating_add(1), fresh() & ID_RANDOM_MASK),
    }
}

/// Random bits from the system's random source; should it fail, the
/// process id and the time in nanoseconds (weaker, still not the clock's
/// milliseconds alone).
fn random_id_bits() -> u128 {
    let mut bytes = [0u8; 16];
    match getrandom::fill(&mut bytes) {
        Ok(()) => u128::from_le_bytes(bytes),
        Err(e) => {
            tracing::warn!(error = %e, "no random source for an id");
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            nanos ^ (u128::from(std::process::id()) << 64)
        }
    }
}

pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", new_id_raw())
}

/// A record as JSON text (records always serialize).
pub(crate) fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "{}".to_owned())
}

/// Size and time of a source, as persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SourceMeta {
    pub(crate) size: u64,
    pub(crate) mtime: DateTime<Utc>,
}

/// A context as the server keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ContextRecord {
    pub(crate) id: String,
    pub(crate) slug: String,
    pub(crate) name: String,
    pub(crate) kind: String,
    pub(crate) description: Option<String>,
    pub(crate) guide: Option<String>,
    pub(crate) manifest: Option<types::Manifest>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
    pub(crate) last_curated_at: Option<DateTime<Utc>>,
    pub(crate) last_source_import_at: Option<DateTime<Utc>>,
    pub(crate) curate_task_id: Option<String>,
    pub(crate) import_task_id: Option<String>,
    #[serde(skip)]
    pub(crate) curating: bool,
    #[serde(skip)]
    pub(crate) importing: bool,
    /// Jobs that need the source tree to stay as it is (a fork copying
    /// it, a removal deleting files): no import starts while any runs.
    #[serde(skip)]
    pub(crate) sources_held: u32,
    pub(crate) sample_queries: Vec<String>,
    /// Bumped by every curation; names the index directory.
    pub(crate) index_generation: u64,
    /// Kept as rows of their own in the database.
    #[serde(default, skip_serializing)]
    pub(crate) sources: BTreeMap<String, SourceMeta>,
    /// What the latest curation recorded.
    #[serde(default)]
    pub(crate) ledger: Option<Ledger>,
}

impl ContextRecord {
    /// The API's view of this context.
    pub(crate) fn to_response(&self) -> types::ContextResponse {
        types::ContextResponse {
            created_at: self.created_at,
            created_by: LOCAL_PRINCIPAL.to_owned(),
            curate_task_id: self.curate_task_id.clone(),
            description: self.description.clone(),
            explore_task_id: None,
            groom_artifact_count: None,
            groom_task_id: None,
            guide: self.guide.clone(),
            has_sources: !self.sources.is_empty(),
            id: self.id.clone(),
            import_task_id: self.import_task_id.clone(),
            is_curating: self.curating,
            is_exploring: false,
            is_grooming: false,
            is_importing: self.importing,
            is_optimizing: false,
            is_restoring: false,
            kind: types::ContextKind(self.kind.clone()),
            last_curated_at: self.last_curated_at,
            last_groomed_at: None,
            last_optimized_at: None,
            last_source_import_at: self.last_source_import_at,
            manifest: self.manifest.clone(),
            manifest_suggestion: None,
            name: self.name.clone(),
            optimize_iterations: None,
            optimize_score: None,
            optimize_task_id: None,
            restore_task_id: None,
            sample_queries: self.sample_queries.clone(),
            slug: self.slug.clone(),
            stats: None,
            updated_at: self.updated_at,
            workspace: None,
        }
    }

    /// Whether a turn may search this context now.
    pub(crate) fn is_queryable(&self) -> bool {
        self.kind == "work" || self.last_curated_at.is_some()
    }
}

/// A task and the token that stops it.
#[derive(Debug, Clone)]
pub(crate) struct TaskEntry {
    pub(crate) task: types::TaskResponse,
    pub(crate) cancel: CancellationToken,
    /// Past its point of no return: a cancellation no longer stops it.
    pub(crate) committed: bool,
}

/// A session as the server keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SessionEntry {
    pub(crate) session: types::Session,
    /// The scoped contexts, by id (slugs may change).
    pub(crate) context_ids: Vec<String>,
    /// The turn running now, if any.
    #[serde(skip)]
    pub(crate) in_flight: Option<String>,
}

/// A query turn, its event log and the token that cancels it.
#[derive(Debug, Clone)]
pub(crate) struct QueryEntry {
    pub(crate) query: types::Query,
    pub(crate) trace: Option<types::Trace>,
    pub(crate) log: Arc<EventLog>,
    pub(crate) cancel: CancellationToken,
    /// The number of the newest write of this turn sent to the database.
    pub(crate) saved_seq: u64,
    /// Whether its events have been sent to the database.
    pub(crate) events_saved: bool,
}

/// Opens the persisted index of one generation.
pub(crate) fn open_index(ctx_dir: &Path, generation: u64) -> Result<ContextIndex, String> {
    let chunks_file = ctx_dir.join(format!("chunks-{generation}.json"));
    let text = std::fs::read(&chunks_file).map_err(|e| e.to_string())?;
    let chunks: Vec<Chunk> = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    ContextIndex::open(&ctx_dir.join(format!("index-{generation}")), chunks)
        .map_err(|e| e.to_string())
}

/// The generation an index file of a context's directory belongs to
/// (`index-N` or `chunks-N.json`), or `None` for any other name.
pub(crate) fn index_generation(file_name: &str) -> Option<u64> {
    file_name
        .strip_prefix("index-")
        .or_else(|| {
            file_name
                .strip_prefix("chunks-")
                .and_then(|r| r.strip_suffix(".json"))
        })
        .and_then(|g| g.parse().ok())
}

/// Removes every index generation in `ctx_dir` but `keep` (all of them
/// when `None`).
pub(crate) fn remove_index_generations_except(ctx_dir: &Path, keep: Option<u64>) {
    for entry in std::fs::read_dir(ctx_dir).into_iter().flatten().flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if index_generation(&file).is_some_and(|g| Some(g) != keep) {
            tracing::info!(dir = %ctx_dir.display(), file, "removing an index generation not in use");
            let path = entry.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}

/// Whether a slug is acceptable: 1-64 of `a-z 0-9 - _`, starting alphanumeric.
pub(crate) fn valid_slug(slug: &str) -> bool {
    (1..=64).contains(&slug.len())
        && slug
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && slug.as_bytes()[0].is_ascii_alphanumeric()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::error::LocalResult;
    use crate::local::store::Inner;

    fn create(inner: &mut Inner, slug: &str) -> LocalResult<ContextRecord> {
        inner.create_context(types::CreateContextRequest {
            description: None,
            guide: None,
            kind: None,
            manifest: None,
            name: slug.to_uppercase(),
            slug: slug.to_owned(),
        })
    }

    #[test]
    fn contexts_resolve_by_slug_or_id_and_slugs_are_unique() {
        let mut inner = Inner::default();
        let rec = create(&mut inner, "docs").unwrap();
        assert_eq!(inner.context("docs").unwrap().id, rec.id);
        assert_eq!(inner.context(&rec.id).unwrap().slug, "docs");
        assert_eq!(create(&mut inner, "docs").unwrap_err().status, 409);
        assert_eq!(create(&mut inner, "Bad Slug").unwrap_err().status, 400);
        assert_eq!(inner.context("nope").unwrap_err().status, 404);
    }

    #[test]
    fn ids_sort_by_creation() {
        let a = new_id_raw();
        let b = new_id_raw();
        assert!(a < b, "{a} < {b}");
    }

    /// A clock that stands still, goes back, or repeats after a restart
    /// never repeats an id.
    #[test]
    fn ids_never_repeat_when_the_clock_does() {
        let frozen = 1_700_000_000_000;
        let mut draws = [7u128, 7].into_iter();
        let mut fresh = || draws.next().unwrap();
        // One process: the clock stands still, then goes back.
        let first = next_id_parts((0, 0), frozen, &mut fresh);
        let second = next_id_parts(first, frozen, &mut fresh);
        let third = next_id_parts(second, frozen - 5, &mut fresh);
        assert!(
            first < second && second < third,
            "{first:?} {second:?} {third:?}"
        );
        assert_eq!(third.0, frozen);
        // The random part overflowing moves to the next millisecond.
        let wrapped = next_id_parts((frozen, ID_RANDOM_MASK), frozen, &mut fresh);
        assert_eq!(wrapped, (frozen + 1, 7));
        // Real draws: many ids at one frozen millisecond, all distinct.
        let mut last = (0, 0);
        let mut seen = std::collections::HashSet::new();
        for round in 0..200 {
            if round % 50 == 0 {
                last = (0, 0); // a restart
            }
            last = next_id_parts(last, frozen, random_id_bits);
            assert!(seen.insert(last), "id {last:?} repeated");
        }
    }

    #[test]
    fn a_task_ends_once() {
        let mut inner = Inner::default();
        let input: types::TaskInput = serde_json::from_value(serde_json::json!({})).unwrap();
        let t = inner.new_task("curate", None, None, input, CancellationToken::new());
        inner.end_task(&t.id, crate::status::word::CANCELLED, None, None);
        inner.end_task(&t.id, crate::status::word::COMPLETED, None, None);
        assert_eq!(
            inner.tasks()[&t.id].task.state.as_str(),
            crate::status::word::CANCELLED
        );
    }
}
