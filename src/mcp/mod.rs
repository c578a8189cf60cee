//! The MCP server (feature `mcp`): Nexus tools and Pinecone retrieval tools.
//!
//! - [`NexusServer`]: the Nexus tools (`list_contexts`, `query_context`,
//!   `get_query`), a complete MCP server on its own.
//! - [`NexusMcp`]: the server `nexus-mcp` runs, the union of the tool families.
//! - [`http`]: the Streamable HTTP transport (Origin checks, per-caller keys).
//! - [`ToolError`]: the body of every failed tool call.
//! - resources, prompts and completions (`catalog`): Nexus contexts and
//!   knowledge files, Pinecone namespaces, `ask_context` and
//!   `research_namespace`, and completion of their names.

mod allow_list;
mod arguments;
mod caller;
mod catalog;
pub mod http;
mod jsonrpc;
mod logging;
mod metrics;
mod nexus;
mod notifier;
pub mod pinecone;
mod recent;
mod redact;
mod schema;
mod server;
pub mod stdio;
mod structured;
pub mod tasks;
mod tool_error;

/// The MCP SDK whose types this module's servers implement and return
/// ([`rmcp::ServerHandler`], [`rmcp::model::Tool`]), so an application names
/// them at the same version.
pub use rmcp;

pub use allow_list::ToolAllowListError;
pub use catalog::{COMPLETION_TTL, MAX_KNOWLEDGE_READ_BYTES, RESOURCE_PAGE_SIZE};
pub use metrics::Metrics;
pub use nexus::{
    DEFAULT_CALL_TIMEOUT, KeyPolicy, MAX_QUESTION_CHARS, MAX_WAIT_SECONDS, NexusServer,
};
pub use server::{NexusMcp, PROTOCOL_VERSIONS};
pub use tool_error::{ToolError, ToolErrorCode};

/// The MCP name this server reports.
pub const SERVER_NAME: &str = "nexus-knowql";

/// The server's MCP identity: `nexus-knowql` and the crate version.
pub fn implementation() -> rmcp::model::Implementation {
    rmcp::model::Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION"))
}

pub(crate) use crate::serving::instant_after;
