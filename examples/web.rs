//! Ask in a browser and watch the answer stream: an axum server serves one
//! page, starts turns on a Nexus and relays them to
//! the page's `EventSource` with `nexus_knowql::web::TurnRelay`. A
//! reconnect mid-answer (the network, a laptop lid, `--cut-after`) neither
//! loses nor repeats text.
//!
//! ```sh
//! cargo run --example web --features local,web
//! cargo run --example web --features local,web -- --port 8080 --cut-after 5
//! ```
//!
//! It binds 127.0.0.1 and prints the page's address on stderr.
//! `NEXUS_BASE_URL` (with `PINECONE_API_KEY`, `NEXUS_CONTEXT`) points it at
//! a Nexus of your own; without it an embedded local Nexus serves the docs.

#[path = "web/app.rs"]
mod app;
#[path = "common/nexus_or_local.rs"]
mod nexus_or_local;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use nexus_knowql::web::{RelayConfig, TurnRelay};

/// Serve a page that asks the project's docs.
#[derive(Debug, Parser)]
struct Args {
    /// The port on 127.0.0.1 (0: any free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// End each event connection after this many frames (the browser reconnects).
    #[arg(long)]
    cut_after: Option<usize>,
    /// The pause between events of the embedded local server, in milliseconds.
    #[arg(long, default_value_t = 30)]
    frame_delay_ms: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let frame_delay = Duration::from_millis(args.frame_delay_ms);
    let nexus = nexus_or_local::Nexus::connect(|local| local.frame_delay(frame_delay)).await?;
    let app = Arc::new(app::App {
        client: nexus.client.clone(),
        context: nexus.context.clone(),
        relay: TurnRelay::new(RelayConfig::default().retry(Duration::from_millis(200))),
        cut_after: args.cut_after,
    });
    let listener =
        tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], args.port))).await?;
    eprintln!("web: open http://{}/", listener.local_addr()?);
    axum::serve(listener, app::router(app))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    nexus.shutdown().await;
    Ok(())
}
