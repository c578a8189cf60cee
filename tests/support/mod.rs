//! Support shared by the integration tests. Each group's `main.rs` declares
//! `#[path = "../support/mod.rs"] mod support;` (a standalone `tests/*.rs`
//! declares `mod support;`) and its modules use the parts they need:
//!
//! - `sse_server`: a scripted Nexus that really streams, cuts connections
//!   and replays events; `turns`: reading a streamed turn to its end;
//! - `examples`: runs the example binaries (plainly, or in a pseudo-terminal
//!   on Unix);
//! - `openapi` (feature `local`): the Nexus spec's operations and a schema
//!   checker for the local server's answers;
//! - `props`: proptest settings (shrunk failures kept beside the source);
//! - `schema`: checks MCP tool results against their declared schemas;
//! - `fidelity`: instances of the spec's schemas, the generated type of each
//!   schema and answer, and what a decode and encode may change;
//! - `local` (feature `local`): the embedded local Nexus and a corpus;
//! - `mcp` and `pinecone_fake` (feature `mcp`): an in-process MCP client and
//!   a fake Pinecone;
//! - `mcp_process` (feature `mcp`): the `nexus-mcp` binary as a child
//!   process, its log, open descriptors and resident memory;
//! - `rmcp_http` (feature `mcp`): rmcp's Streamable HTTP client on reqwest;
//! - `wait`: the one bounded wait, on a test double's signal or, where
//!   nothing can signal, a poll with an end.
#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod examples;
pub mod fidelity;
#[cfg(feature = "local")]
pub mod local;
#[cfg(feature = "mcp")]
pub mod mcp;
#[cfg(feature = "mcp")]
pub mod mcp_process;
#[cfg(feature = "local")]
pub mod openapi;
#[cfg(feature = "mcp")]
pub mod pinecone_fake;
pub mod props;
#[cfg(feature = "mcp")]
pub mod rmcp_http;
pub mod schema;
pub mod sse_server;
pub mod turns;
pub mod wait;
