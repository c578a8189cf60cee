//! Unit tests of the Pinecone tools' internals: configuration, filter
//! validation (with property tests), routing, suggestions, URL generators,
//! fusion, counting, reassembly and the Pinecone client's redaction and
//! outbound safety. The tools themselves are tested over MCP in
//! `tests/mcp/` (`pinecone_tools`, and `pinecone_check` for
//! `check_indexes`), against the Pinecone fake of `tests/support/`.

use std::collections::HashMap;

use clap::Parser;
use serde_json::{Map, Value};

use super::PineconeArgs;

mod client;
mod config;
mod filter;
mod shaping;

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    pinecone: PineconeArgs,
}

fn args(argv: &[&str]) -> PineconeArgs {
    let mut full = vec!["nexus-mcp"];
    full.extend_from_slice(argv);
    Cli::try_parse_from(full).expect("flags parse").pinecone
}

/// The configuration `argv` resolves to with an empty environment.
fn resolved(argv: &[&str]) -> super::PineconeConfig {
    args(argv)
        .resolve_with(&env_of(&[]))
        .expect("the flags resolve")
        .expect("the flags configure Pinecone")
}

/// Why `argv` is refused in the environment `env`.
fn refused(argv: &[&str], env: &dyn Fn(&str) -> Option<String>) -> super::ConfigError {
    args(argv)
        .resolve_with(env)
        .expect_err("the flags are refused")
}

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |k| map.get(k).cloned()
}

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap()
}
