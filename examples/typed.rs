//! A typed answer: the turn's `shape` comes from a Rust type, and the
//! answer comes back as that type.
//!
//! ```sh
//! cargo run --example typed --features local,schema
//! ```
//!
//! `NEXUS_BASE_URL` (with `PINECONE_API_KEY`, `NEXUS_CONTEXT`) points it at
//! a Nexus of your own; without it an embedded local Nexus serves the docs.

use nexus_knowql::typed::ShapeOf;
use schemars::JsonSchema;
use serde::Deserialize;
use std::io::Write;

#[path = "common/nexus_or_local.rs"]
mod nexus_or_local;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Stream,
    Background,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct Resume {
    /// How to resume a broken stream.
    how: String,
    /// The header that carries the last event id.
    header: Option<String>,
    /// The mode the answer is about.
    mode: Mode,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nexus = nexus_or_local::Nexus::connect(|local| local).await?;
    let session = nexus.client.session([nexus.context.as_str()]).build()?;
    let answer = session
        .ask("How do I resume a broken stream?")
        .shape_of::<Resume>()
        .send()
        .await?;
    let Resume { how, header, mode } = answer.value;
    let text = format!("{how}\nheader: {header:?}\nmode: {mode:?}");
    let _ = writeln!(std::io::stdout(), "{text}"); // a closed stdout is fine here
    nexus.shutdown().await;
    Ok(())
}
