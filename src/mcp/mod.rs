//! The MCP server (feature `mcp`): Nexus tools and Pinecone retrieval tools.

pub mod pinecone;
pub mod redact;
pub mod tool_error;

pub use tool_error::{ToolError, ToolErrorCode};
