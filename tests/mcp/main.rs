//! The MCP server (feature `mcp`): the Nexus and Pinecone tools, the
//! protocol over stdio and Streamable HTTP, availability and operation.
//! Modules that also run the local Nexus need feature `local`.

#[path = "../support/mod.rs"]
mod support;

mod availability;
mod call_ledger;
mod call_notes;
mod callers;
#[cfg(feature = "local")]
mod catalog;
#[cfg(target_os = "linux")]
mod hangup_storm;
mod hostile_callers;
mod hostile_peers;
mod http;
mod http_direct;
mod http_service;
mod http_spliced;
#[cfg(feature = "local")]
mod local;
mod mode_differential;
mod namespace_listing;
mod operations;
mod operations_honest;
mod operations_limits;
mod peer_support;
mod pinecone_check;
mod pinecone_harness;
mod pinecone_sources;
mod pinecone_tools;
#[cfg(feature = "local")]
mod protocol;
mod protocol_errors;
#[cfg(feature = "local")]
mod rmcp_http;
mod stateless_differential;
mod stateless_paths;
mod stdio;
#[cfg(target_os = "linux")]
mod stdio_ends;
mod stdio_ledger;
mod stdio_ping;
mod stdio_results;
mod tasks;
#[cfg(target_os = "linux")]
mod tenant_cache;
mod tool_list;
mod tools;
mod trusted_proxy;
mod usefulness;
