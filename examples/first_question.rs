//! The shortest complete program: ask one question and watch the answer
//! stream in.
//!
//! It starts the embedded local Nexus over the project's docs, so it runs
//! offline with no account:
//!
//! ```sh
//! cargo run --example first_question --features local
//! ```
//!
//! Against a real Nexus, build the client with `Client::from_env()` instead.

use std::io::Write;

use futures::StreamExt;
use nexus_knowql::QueryEvent;
use nexus_knowql::local::LocalNexus;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
    let server = LocalNexus::builder()
        .context("docs", corpus)
        .start()
        .await?;
    let client = server.client()?;

    // A session pins the contexts; each `ask` is one turn.
    let session = client.session(["docs"]).build()?;
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
        query.status(),
        query.citations.len()
    );

    server.shutdown().await;
    Ok(())
}
