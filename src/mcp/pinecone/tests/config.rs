//! Flags, environment, sources files and profiles.

use std::time::Duration;

use clap::Parser;
use secrecy::ExposeSecret;
use serde_json::{Value, json};

use super::{Cli, args, env_of, obj, refused, resolved};
use crate::mcp::pinecone::{PineconeConfig, Profile, SourceMode};

/// The first source searches `dense` and `sparse` and reranks with `rerank`.
fn assert_indexes(c: &PineconeConfig, (dense, sparse): (&str, &str), rerank: Option<&str>) {
    assert_eq!(c.sources[0].index_name, dense);
    assert_eq!(c.sources[0].sparse_index_name, sparse);
    assert_eq!(c.sources[0].rerank_model.as_deref(), rerank);
}

#[test]
fn an_api_key_alone_does_not_enable_the_core_profile() {
    let a = args(&["--pinecone-api-key", "k"]);
    assert!(a.resolve_with(&env_of(&[])).unwrap().is_none());
}

#[test]
fn core_single_key_derives_the_sparse_index_and_keeps_the_gate_off() {
    let c = resolved(&["--pinecone-api-key", "k", "--index-name", " idx "]);
    assert_eq!(c.mode, SourceMode::SingleKey);
    assert_indexes(&c, ("idx", "idx-sparse"), None);
    assert!(!c.suggest_flow);
    assert!(!c.builtin_url_generators);
    assert_eq!(c.controller_host, "https://api.pinecone.io");
    let c = resolved(&[
        "--pinecone-api-key",
        "k",
        "--index-name",
        "idx",
        "--disable-suggest-flow=false",
    ]);
    assert!(c.suggest_flow);
}

#[test]
fn missing_key_with_an_index_is_an_error() {
    let e = refused(&["--index-name", "idx"], &env_of(&[]));
    assert!(e.message().starts_with("Missing Pinecone API key"), "{e}");
}

#[test]
fn alliance_profile_reproduces_the_reference_defaults() {
    let c = resolved(&["--profile", "alliance", "--pinecone-api-key", "k"]);
    assert_eq!(c.profile, Profile::Alliance);
    assert_indexes(
        &c,
        ("rag-hybrid", "rag-hybrid-sparse"),
        Some("bge-reranker-v2-m3"),
    );
    assert!(c.suggest_flow);
    assert!(c.builtin_url_generators);
    let c = resolved(&[
        "--profile",
        "alliance",
        "--pinecone-api-key",
        "k",
        "--index-name",
        "mine",
        "--rerank-model",
        "other",
        "--disable-suggest-flow",
    ]);
    assert_eq!(c.sources[0].index_name, "mine");
    assert_eq!(c.sources[0].rerank_model.as_deref(), Some("other"));
    assert!(!c.suggest_flow);
}

#[test]
fn numeric_flags_are_validated_and_applied() {
    let c = resolved(&[
        "--pinecone-api-key",
        "k",
        "--index-name",
        "i",
        "--cache-ttl-seconds",
        "60",
        "--pinecone-request-timeout-ms",
        "500",
        "--top-k",
        "7",
    ]);
    assert_eq!(c.cache_ttl, Duration::from_secs(60));
    assert_eq!(c.request_timeout, Duration::from_millis(500));
    assert_eq!(c.default_top_k, 7);
    assert!(Cli::try_parse_from(["x", "--cache-ttl-seconds", "0"]).is_err());
    assert!(Cli::try_parse_from(["x", "--top-k", "101"]).is_err());
}

#[test]
fn inline_sources_resolve_env_references_and_never_echo_keys() {
    let env = env_of(&[("KEY_B", "secret-b")]);
    let c = args(&[
        "--sources",
        "a:k:with:colons:idx-a; b:${KEY_B}:idx-b",
        "--pinecone-api-key",
        "ignored",
    ])
    .resolve_with(&env)
    .unwrap()
    .unwrap();
    assert_eq!(c.mode, SourceMode::Sources);
    assert!(c.is_multi_source());
    assert_eq!(c.sources[0].api_key.expose_secret(), "k:with:colons");
    assert_eq!(c.sources[1].api_key.expose_secret(), "secret-b");
    assert_eq!(c.sources[1].sparse_index_name, "idx-b-sparse");
    assert_eq!(c.default_source, "a");

    let e = refused(&["--sources", "a:supersecretkey123"], &env);
    assert!(!e.message().contains("supersecretkey123"), "{e}");
    assert!(e.message().contains("segment #1"), "{e}");
    let e = refused(&["--sources", "a:k:i;a:k2:i2"], &env);
    assert_eq!(
        e.message(),
        "Duplicate source name \"a\" in PINECONE_SOURCES."
    );
    let e = refused(&["--sources", "bad name:k:i"], &env);
    assert!(
        e.message().starts_with("Invalid source name \"bad name\""),
        "{e}"
    );
    let e = refused(&["--sources", "{\"a\":1}"], &env);
    assert!(e.message().contains("inline JSON"), "{e}");
    let e = refused(&["--sources", "a:${NOPE}:i"], &env);
    assert_eq!(
        e.message(),
        "Environment variable NOPE is not set (referenced as ${NOPE})."
    );
}

fn write_config(name: &str, body: &Value) -> std::path::PathBuf {
    let path =
        std::env::temp_dir().join(format!("nexus-pinecone-{}-{name}.json", std::process::id()));
    std::fs::write(&path, body.to_string()).unwrap();
    path
}

#[test]
fn config_file_sources_with_declarations_and_defaults() {
    let path = write_config(
        "ok",
        &json!({
            "defaultSource": "src_b",
            "sources": {
                "src_a": {"apiKey": "${A_KEY}", "indexName": "idx-a", "sparseIndexName": null, "description": " public ", "namespaces": {"ns1": {"description": "hint", "metadata_schema": {"title": "string"}}, "old": {}}},
                "src_b": {"indexName": "idx-b", "rerankModel": "m"}
            }
        }),
    );
    let env = env_of(&[("A_KEY", "ka"), ("src_b", "kb")]);
    let p = path.to_str().unwrap();
    let c = args(&["--config-file", p, "--sources", "x:y:z"])
        .resolve_with(&env)
        .unwrap()
        .unwrap();
    assert_eq!(c.default_source, "src_b");
    assert_eq!(c.sources[0].api_key.expose_secret(), "ka");
    assert_eq!(c.sources[0].sparse_index_name, "idx-a-sparse");
    assert_eq!(c.sources[0].description.as_deref(), Some("public"));
    assert_eq!(c.sources[0].namespaces.len(), 2);
    assert_eq!(
        c.sources[0].namespaces[0].1.metadata_schema,
        Some(obj(json!({"title": "string"})))
    );
    assert_eq!(
        c.sources[1].api_key.expose_secret(),
        "kb",
        "a missing apiKey reads the variable named like the source"
    );
    assert_eq!(c.sources[1].rerank_model.as_deref(), Some("m"));

    let bad = |name: &str, body: Value| {
        let path = write_config(name, &body);
        args(&["--config-file", path.to_str().unwrap()])
            .resolve_with(&env)
            .unwrap_err()
            .message()
            .to_owned()
    };
    assert!(bad("nosrc", json!({})).ends_with("must contain a \"sources\" object."));
    assert!(bad("empty", json!({"sources": {}})).ends_with("has no sources."));
    assert_eq!(
        bad(
            "default",
            json!({"defaultSource": "zz", "sources": {"src_b": {"indexName": "i"}}})
        ),
        "defaultSource \"zz\" is not a configured source name."
    );
    assert_eq!(
        bad(
            "desc",
            json!({"sources": {"src_b": {"indexName": "i", "description": 3}}})
        ),
        "Source \"src_b\": description must be a string."
    );
    assert_eq!(
        bad(
            "schema",
            json!({"sources": {"src_b": {"indexName": "i", "namespaces": {"n": {"metadata_schema": {"f": ""}}}}}})
        ),
        "Source \"src_b\": namespaces[\"n\"].metadata_schema[\"f\"] must be a non-empty string type."
    );
    assert_eq!(
        bad("noindex", json!({"sources": {"src_b": {}}})),
        "Source \"src_b\": indexName is required."
    );
    assert!(
        bad("hyphen", json!({"sources": {"src-c": {"indexName": "i"}}}))
            .starts_with("Invalid environment variable reference")
    );
    let e = refused(&["--config-file", "/nonexistent/nexus.json"], &env);
    assert!(
        e.message()
            .starts_with("Failed to read PINECONE config file \"/nonexistent/nexus.json\"")
    );
}

#[test]
fn debug_output_never_shows_keys() {
    let a = args(&[
        "--pinecone-api-key",
        "topsecretkey",
        "--sources",
        "a:othersecret:i",
    ]);
    let text = format!("{a:?}");
    assert!(
        !text.contains("topsecretkey") && !text.contains("othersecret"),
        "{text}"
    );
    let c = resolved(&["--pinecone-api-key", "topsecretkey", "--index-name", "i"]);
    assert!(!format!("{c:?}").contains("topsecretkey"));
}
