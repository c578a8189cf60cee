//! The Pinecone retrieval tools: hybrid search over a dense and a sparse
//! integrated-embedding index per source, as MCP tools.
//!
//! - [`PineconeArgs`] holds the flags; [`PineconeArgs::resolve`] turns them
//!   into a [`PineconeConfig`] (or `None` when Pinecone is not configured).
//! - [`PineconeServer`] is the MCP handler; another handler can delegate to
//!   [`PineconeServer::tools`] and [`PineconeServer::call`].
//!
//! # Layout
//! - `config`: flags, environment, sources file, profiles.
//! - `client`: the typed Pinecone REST client (deadline, retries, redaction,
//!   same-origin redirects, https hosts).
//! - `check`: the `--check-indexes` probe.
//! - `filter`: metadata-filter validation.
//! - `discovery`, `manifest`, `cache`, `sources`: namespaces, declarations,
//!   their cache, source resolution.
//! - `search`, `fusion`, `documents`, `format`: retrieval and result shaping.
//! - `router`, `suggest`, `gate`, `urls`: routing, suggestions, suggest-flow, URLs.
//! - `args`, `output`, `calls`, `tools`, `server`: the MCP surface (`calls`
//!   does each tool's work, `tools` defines the tools).
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod args;
pub mod cache;
mod calls;
pub mod check;
pub mod client;
pub mod config;
pub mod discovery;
pub mod documents;
pub mod failure;
pub mod filter;
pub mod format;
pub mod fusion;
pub mod gate;
pub mod manifest;
pub mod output;
pub mod router;
pub mod search;
pub mod server;
pub mod sources;
pub mod suggest;
mod tools;
pub mod urls;

pub use client::{PineconeClient, PineconeError};
pub use config::{ConfigError, PineconeArgs, PineconeConfig, Profile, SourceConfig, SourceMode};
pub use server::PineconeServer;
