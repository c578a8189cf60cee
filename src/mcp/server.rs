//! [`NexusMcp`]: the one MCP server `nexus-mcp` runs, made of tool families.
//!
//! Each family is a complete [`ServerHandler`] with its own tools, testable on
//! its own. `NexusMcp` lists the union of their tools and hands each
//! `tools/call` to the family that owns the tool's name.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

use super::nexus::{INSTRUCTIONS, NexusServer};
use super::pinecone::PineconeServer;

/// The MCP name this server reports.
pub const SERVER_NAME: &str = "nexus-knowql";

/// The server's MCP identity: `nexus-knowql` and the crate version.
pub fn implementation() -> Implementation {
    Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION"))
}

/// The combined MCP server: the Nexus tools and any other tool family.
///
/// ```
/// # fn run() -> nexus_knowql::Result<()> {
/// use nexus_knowql::Client;
/// use nexus_knowql::mcp::{NexusMcp, NexusServer};
/// let client = Client::builder().base_url("http://127.0.0.1:8080/api").build()?;
/// let server = NexusMcp::new().with_nexus(NexusServer::new(client));
/// # let _ = server; Ok(()) }
/// ```
///
/// Cloning is cheap (the families are shared): the HTTP transport makes one
/// clone per request or session.
#[derive(Debug, Clone, Default)]
pub struct NexusMcp {
    nexus: Option<Arc<NexusServer>>,
    pinecone: Option<Arc<PineconeServer>>,
}

impl NexusMcp {
    /// A server with no tools yet.
    pub fn new() -> Self {
        NexusMcp::default()
    }

    /// Serves the Nexus tools.
    pub fn with_nexus(mut self, nexus: NexusServer) -> Self {
        self.nexus = Some(Arc::new(nexus));
        self
    }

    /// Serves the Pinecone retrieval tools.
    pub fn with_pinecone(mut self, pinecone: PineconeServer) -> Self {
        self.pinecone = Some(Arc::new(pinecone));
        self
    }

    /// The Pinecone family, if served.
    pub fn pinecone(&self) -> Option<&PineconeServer> {
        self.pinecone.as_deref()
    }

    /// The Nexus family, if served.
    pub fn nexus(&self) -> Option<&NexusServer> {
        self.nexus.as_deref()
    }

    /// The instructions: the Nexus flow, then each other family's own.
    fn instructions(&self) -> String {
        let mut text = String::new();
        if self.nexus.is_some() {
            text.push_str(INSTRUCTIONS);
        }
        if let Some(own) = self
            .pinecone
            .as_ref()
            .and_then(|p| p.get_info().instructions)
        {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(&own);
        }
        if text.is_empty() {
            text.push_str("No tool family is configured on this server.");
        }
        text
    }
}

/// Lists one family's tools through its own handler.
async fn tools_of<H: ServerHandler>(
    family: &H,
    ctx: &RequestContext<RoleServer>,
) -> Result<Vec<Tool>, ErrorData> {
    let mut tools = Vec::new();
    let mut cursor = None;
    loop {
        let page = family
            .list_tools(
                cursor.map(|c| PaginatedRequestParams::default().with_cursor(Some(c))),
                ctx.clone(),
            )
            .await?;
        tools.extend(page.tools);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(tools),
        }
    }
}

impl ServerHandler for NexusMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(implementation())
            .with_instructions(self.instructions())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools = Vec::new();
        if let Some(nexus) = &self.nexus {
            tools.extend(tools_of(nexus, &context).await?);
        }
        if let Some(pinecone) = &self.pinecone {
            tools.extend(tools_of(pinecone, &context).await?);
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.nexus
            .as_ref()
            .and_then(|n| n.get_tool(name))
            .or_else(|| self.pinecone.as_ref().and_then(|p| p.get_tool(name)))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Results, error results included, pass through as each family made
        // them: their structured content matches the tool's outputSchema.
        if let Some(nexus) = self.nexus.as_ref().filter(|n| n.has_tool(&request.name)) {
            nexus.call_tool(request, context).await
        } else if let Some(pinecone) = self.pinecone.as_ref().filter(|p| p.has_tool(&request.name))
        {
            pinecone.call_tool(request, context).await
        } else {
            Err(ErrorData::invalid_params(
                format!("unknown tool `{}`", request.name),
                None,
            ))
        }
    }
}
