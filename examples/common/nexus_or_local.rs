//! Where the short examples find a Nexus. `NEXUS_BASE_URL` names one (with
//! `PINECONE_API_KEY` and `NEXUS_API_VERSION`, read by `Client::from_env`),
//! and `NEXUS_CONTEXT` the context to ask (default `docs`). Without a base
//! URL, an embedded local Nexus serves the project's docs as `docs`.

use nexus_knowql::Client;
use nexus_knowql::local::{LocalNexus, LocalNexusBuilder};

/// A client, the context to ask, and the embedded server when one runs.
#[derive(Debug)]
pub(crate) struct Nexus {
    pub(crate) client: Client,
    pub(crate) context: String,
    local: Option<LocalNexus>,
}

impl Nexus {
    /// Connects as the environment says; `local` configures the embedded
    /// server when there is one.
    pub(crate) async fn connect(
        local: impl FnOnce(LocalNexusBuilder) -> LocalNexusBuilder,
    ) -> Result<Nexus, Box<dyn std::error::Error>> {
        let base_url = std::env::var("NEXUS_BASE_URL").unwrap_or_default();
        if !base_url.trim().is_empty() {
            let context = std::env::var("NEXUS_CONTEXT")
                .ok()
                .filter(|c| !c.trim().is_empty())
                .unwrap_or_else(|| "docs".to_owned());
            let client = Client::from_env()?;
            return Ok(Nexus {
                client,
                context,
                local: None,
            });
        }
        let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/corpus");
        let server = local(LocalNexus::builder().context("docs", corpus))
            .start()
            .await?;
        let client = server.client()?;
        Ok(Nexus {
            client,
            context: "docs".to_owned(),
            local: Some(server),
        })
    }

    /// Stops the embedded server, if one runs.
    pub(crate) async fn shutdown(self) {
        if let Some(server) = self.local {
            server.shutdown().await;
        }
    }
}
