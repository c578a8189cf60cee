//! The Pinecone retrieval tools: hybrid search over a dense and a sparse
//! integrated-embedding index per source, as MCP tools.
//!
//! - [`PineconeArgs`] holds the flags; [`PineconeArgs::resolve`] turns them
//!   into a [`PineconeConfig`] (or `None` when Pinecone is not configured).
//! - [`PineconeServer`] is the MCP handler; another handler can delegate to
//!   [`PineconeServer::tools`] and [`PineconeServer::call`].
//! - [`check_indexes`] probes every configured index once (`nexus-mcp
//!   --check-indexes`); [`http_client`] builds the HTTP client the server
//!   uses by default (see [`PineconeServer::with_http_client`]).
//! - [`UrlGenerator`] turns a record's metadata into a link
//!   ([`PineconeServer::register_url_generator`]).
//!
//! Everything else is internal.
//!
//! # Layout (internal modules)
//! - `config`: flags, environment, sources file, profiles.
//! - `client`: the typed Pinecone REST client (deadline, retries, redaction,
//!   same-origin redirects, https hosts).
//! - `check`: the `--check-indexes` probe.
//! - `filter`: metadata-filter validation.
//! - `discovery`, `manifest`, `cache`, `sources`: namespaces, declarations,
//!   their cache, source resolution.
//! - `search`, `fusion`, `documents`, `format`: retrieval and result shaping.
//! - `router`, `suggest`, `gate`, `urls`: routing, suggestions, suggest-flow, URLs.
//! - `args`, `output`, `listing`, `calls`, `tools`, `server`: the MCP surface
//!   (`calls` does each tool's work, `tools` defines the tools, `listing`
//!   writes the `list_namespaces` text once per cache entry).
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod args;
mod cache;
mod calls;
mod check;
mod client;
mod config;
mod discovery;
mod documents;
mod failure;
mod filter;
mod format;
mod fusion;
mod gate;
mod listing;
mod manifest;
mod output;
mod router;
mod search;
mod server;
mod sources;
mod suggest;
mod tenants;
mod tools;
mod urls;

// The tests parse flags as `nexus-mcp` does, with the binaries' `cli` feature.
#[cfg(all(test, feature = "cli"))]
mod tests;

pub use check::{IndexKind, IndexProbe, check_indexes};
pub use client::{PineconeError, http_client, same_origin_redirects};
pub use config::{
    ConfigError, NamespaceDecl, PineconeArgs, PineconeConfig, Profile, SourceConfig, SourceMode,
};
pub(crate) use discovery::{NamespaceRow, SchemaSource};
pub use server::PineconeServer;
pub use urls::{UrlGenerator, UrlMethod, UrlResolution};
