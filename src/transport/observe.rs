//! Counting the retries of the calls made within one scope: the MCP server
//! runs each tool call in [`counting_retries`] and tells its caller when
//! Nexus calls had to be retried.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

tokio::task_local! {
    static RETRIES: Arc<AtomicU32>;
}

/// Counts one retry in the current scope, if any.
pub(crate) fn note_retry() {
    let _ = RETRIES.try_with(|count| count.fetch_add(1, Ordering::Relaxed));
}

/// Runs `work` and returns its output with how many times the calls it made
/// (on this task) were retried.
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
pub(crate) async fn counting_retries<F: Future>(work: F) -> (F::Output, u32) {
    let count = Arc::new(AtomicU32::new(0));
    let out = RETRIES.scope(Arc::clone(&count), work).await;
    (out, count.load(Ordering::Relaxed))
}
