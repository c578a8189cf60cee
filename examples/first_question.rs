//! The shortest complete program: ask one question and watch the answer
//! stream in.
//!
//! With `NEXUS_BASE_URL` (and `PINECONE_API_KEY`) it asks that Nexus's
//! context `NEXUS_CONTEXT` (default `docs`); without it, an embedded local
//! Nexus over the project's docs, offline with no account:
//!
//! ```sh
//! cargo run --example first_question --features local
//! ```

use std::io::Write;

use futures::StreamExt;
use nexus_knowql::QueryEvent;

#[path = "common/nexus_or_local.rs"]
mod nexus_or_local;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nexus = nexus_or_local::Nexus::connect(|local| local).await?;

    // A session pins the contexts; each `ask` is one turn.
    let session = nexus.client.session([nexus.context.as_str()]).build()?;
    let mut turn = session.ask("How do I resume a stream?").stream().await?;
    while let Some(event) = turn.next().await {
        if let QueryEvent::TextDelta { delta } = event? {
            let mut stdout = std::io::stdout();
            if write!(stdout, "{delta}")
                .and_then(|()| stdout.flush())
                .is_err()
            {
                // Nobody reads any more (`| head`): stop the turn, end quietly.
                turn.cancel().await?;
                return Ok(());
            }
        }
    }

    // The stored turn: status, citations, usage.
    let query = turn.finish().await?;
    let _ = writeln!(
        std::io::stdout(),
        "\n\n{} ({} citations)",
        query.status,
        query.citations.len()
    );

    nexus.shutdown().await;
    Ok(())
}
