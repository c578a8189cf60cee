//! A turn that runs in the background: start it, do other work, then wait
//! for it with a polling policy, and read its typed status.
//!
//! ```sh
//! cargo run --example background_turn --features local
//! ```
//!
//! `NEXUS_BASE_URL` (with `PINECONE_API_KEY`, `NEXUS_CONTEXT`) points it at
//! a Nexus of your own; without it an embedded local Nexus serves the docs.

use std::io::Write;
use std::time::Duration;

use nexus_knowql::{QueryStatus, WaitPolicy};

#[path = "common/nexus_or_local.rs"]
mod nexus_or_local;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nexus = nexus_or_local::Nexus::connect(|local| local).await?;
    let session = nexus.client.session([nexus.context.as_str()]).build()?;

    // The server runs the turn; the handle polls only when asked. The
    // turn's one bound, a minute, covers the start and each wait.
    let mut handle = session
        .ask("What is a context?")
        .turn_timeout(Duration::from_secs(60))
        .background()
        .await?;
    // A closed stdout (`| head -1`): nobody reads the answer, so the turn
    // is cancelled and the program ends quietly.
    if writeln!(std::io::stdout(), "started turn {}", handle.id()).is_err() {
        handle.cancel().await?;
        return Ok(());
    }

    // Every answer carries a request id (quote it in a support ticket);
    // `with_metadata` hands it out with the answer.
    let (now, meta) = nexus
        .client
        .queries()
        .get(handle.id())
        .with_metadata()
        .await?;
    let request = meta.request_id().unwrap_or("none");
    if writeln!(std::io::stdout(), "request {request}").is_err() {
        handle.cancel().await?;
        return Ok(());
    }
    if now.status == QueryStatus::InProgress
        && writeln!(std::io::stdout(), "still running...").is_err()
    {
        handle.cancel().await?;
        return Ok(());
    }

    // Wait (within the turn's bound), polling every 100 ms at first, then
    // up to 1 s.
    let policy = WaitPolicy::default().interval(Duration::from_millis(100), Duration::from_secs(1));
    // A failed or cancelled turn is an error here (`Query::into_result`).
    let query = handle.wait(policy).await?;
    let _ = writeln!(
        std::io::stdout(),
        "{}\n\n{}",
        query.status,
        query.answer_text()
    );

    nexus.shutdown().await;
    Ok(())
}
