//! Scratch directories for unit tests: one fresh, unused path per call.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// A path below the system's temporary directory that nothing else uses:
/// named after `label`, this process and a counter, emptied of what an
/// earlier run left there, and not yet created.
pub(crate) fn fresh(label: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "nexus-local-{label}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
