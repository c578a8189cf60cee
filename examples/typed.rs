//! A typed answer: the turn's `shape` comes from a Rust type, and the
//! answer comes back as that type.
//!
//! ```sh
//! cargo run --example typed --features local,schema
//! ```

use nexus_knowql::local::LocalNexus;
use nexus_knowql::typed::ShapeOf;
use schemars::JsonSchema;
use serde::Deserialize;
use std::io::Write;

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
    let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
    let server = LocalNexus::builder()
        .context("docs", corpus)
        .start()
        .await?;
    let session = server.client()?.session(["docs"]).build()?;
    let answer = session
        .ask("How do I resume a broken stream?")
        .shape_of::<Resume>()
        .send()
        .await?;
    let Resume { how, header, mode } = answer.value;
    let text = format!("{how}\nheader: {header:?}\nmode: {mode:?}");
    let _ = writeln!(std::io::stdout(), "{text}"); // a closed stdout is fine here
    server.shutdown().await;
    Ok(())
}
