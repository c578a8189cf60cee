//! The MCP server (feature `mcp`): Nexus tools and Pinecone retrieval tools.
//!
//! - [`NexusServer`]: the Nexus tools (`list_contexts`, `query_context`,
//!   `get_query`), a complete MCP server on its own.
//! - [`NexusMcp`]: the server `nexus-mcp` runs, the union of the tool families.
//! - [`http`]: the Streamable HTTP transport (Origin checks, per-caller keys).
//! - [`ToolError`]: the body of every failed tool call.

pub mod http;
pub mod nexus;
pub mod pinecone;
pub mod redact;
pub mod server;
pub mod tool_error;

pub use nexus::{KeyPolicy, NexusServer};
pub use server::NexusMcp;
pub use tool_error::{ToolError, ToolErrorCode};
