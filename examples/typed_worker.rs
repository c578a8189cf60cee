//! A typed, checkpointed job in a few lines: the adapters stack over one
//! turn. `CheckpointedTurn` keeps the job's place in a store (a worker
//! whose store outlives it, as `worker --store DIR` does, continues from it
//! instead of asking again), `TypedTurn` decodes the
//! answer into a Rust type, and `text_stream` shows the text as it comes.
//!
//! ```sh
//! cargo run --example typed_worker --features local,schema
//! ```
//!
//! `NEXUS_BASE_URL` (with `PINECONE_API_KEY`, `NEXUS_CONTEXT`) points it at
//! a Nexus of your own; without it an embedded local Nexus serves the docs.

use std::io::Write;

use nexus_knowql::prelude::*;
use nexus_knowql::query::{CheckpointStore, FileCheckpointStore};
use nexus_knowql::typed::shape_for;

#[path = "common/nexus_or_local.rs"]
mod nexus_or_local;

/// The answer's type; its shape is sent with the question.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct Resume {
    /// How to resume a broken stream.
    how: String,
    /// The header that carries the last event id.
    header: Option<String>,
}

#[tokio::main]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let nexus = nexus_or_local::Nexus::connect(|local| local).await?;
    // A directory of this run's own (create_dir fails if it exists), so the
    // cleanup below removes only what this run made.
    let dir = std::env::temp_dir().join(format!("nexus-typed-worker-{}", std::process::id()));
    std::fs::create_dir(&dir)?;
    let store = FileCheckpointStore::new(&dir)?;

    // Started once; with a store that outlives the process, a run after a
    // crash would resume the turn from it (this one is the process's own).
    let ask = (nexus.client.session([nexus.context.as_str()]).build()?)
        .ask("How do I resume a broken stream?")
        .shape(shape_for::<Resume>()?);
    let job = CheckpointedTurn::start_or_resume(&nexus.client, &store, "resume-job", ask).await?;
    let mut text = TypedTurn::<Resume, _>::new(job)?.text_stream();
    while let Some(delta) = text.next().await {
        let _ = write!(std::io::stderr(), "{}", delta?);
    }
    // Every layer gives back the one below it: the typed turn decodes.
    let answer = text.into_inner().finish().await?;
    let Resume { how, header } = answer.value;
    let _ = writeln!(std::io::stdout(), "\n{how}\nheader: {header:?}");

    // The job's result is handed on: the store can forget it.
    store.clear("resume-job")?;
    let _ = std::fs::remove_dir_all(&dir);
    nexus.shutdown().await;
    Ok(())
}
