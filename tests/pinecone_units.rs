//! Configuration, filter validation (with property tests), routing,
//! suggestions, URL generators, fusion, counting, reassembly and the
//! Pinecone client's redaction, through the public API.
#![cfg(feature = "mcp")]

mod support;
use support::pinecone_fake;

use std::collections::HashMap;
use std::time::Duration;

use clap::Parser;
use nexus_knowql::mcp::pinecone::discovery::{NamespaceRow, SchemaSource};
use nexus_knowql::mcp::pinecone::documents::reassemble;
use nexus_knowql::mcp::pinecone::filter::validate_filter;
use nexus_knowql::mcp::pinecone::fusion::{Hit, fuse};
use nexus_knowql::mcp::pinecone::router::{rank, recommend};
use nexus_knowql::mcp::pinecone::search::count_documents;
use nexus_knowql::mcp::pinecone::suggest::{SuggestedTool, suggest};
use nexus_knowql::mcp::pinecone::urls::{UrlMethod, mailing_url, slack_url};
use nexus_knowql::mcp::pinecone::{PineconeArgs, PineconeClient, Profile, SourceMode};
use proptest::prelude::*;
use secrecy::ExposeSecret;
use serde_json::{Map, Value, json};

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

// ---- configuration -------------------------------------------------------

#[test]
fn an_api_key_alone_does_not_enable_the_core_profile() {
    let a = args(&["--pinecone-api-key", "k"]);
    assert!(a.resolve_with(&env_of(&[])).unwrap().is_none());
}

#[test]
fn core_single_key_derives_the_sparse_index_and_keeps_the_gate_off() {
    let c = args(&["--pinecone-api-key", "k", "--index-name", " idx "])
        .resolve_with(&env_of(&[]))
        .unwrap()
        .unwrap();
    assert_eq!(c.mode, SourceMode::SingleKey);
    assert_eq!(c.sources[0].index_name, "idx");
    assert_eq!(c.sources[0].sparse_index_name, "idx-sparse");
    assert_eq!(c.sources[0].rerank_model, None);
    assert!(!c.suggest_flow);
    assert!(!c.builtin_url_generators);
    assert_eq!(c.controller_host, "https://api.pinecone.io");
    let c = args(&[
        "--pinecone-api-key",
        "k",
        "--index-name",
        "idx",
        "--disable-suggest-flow=false",
    ])
    .resolve_with(&env_of(&[]))
    .unwrap()
    .unwrap();
    assert!(c.suggest_flow);
}

#[test]
fn missing_key_with_an_index_is_an_error() {
    let e = args(&["--index-name", "idx"])
        .resolve_with(&env_of(&[]))
        .unwrap_err();
    assert!(e.message().starts_with("Missing Pinecone API key"), "{e}");
}

#[test]
fn alliance_profile_reproduces_the_reference_defaults() {
    let c = args(&["--profile", "alliance", "--pinecone-api-key", "k"])
        .resolve_with(&env_of(&[]))
        .unwrap()
        .unwrap();
    assert_eq!(c.profile, Profile::Alliance);
    assert_eq!(c.sources[0].index_name, "rag-hybrid");
    assert_eq!(c.sources[0].sparse_index_name, "rag-hybrid-sparse");
    assert_eq!(
        c.sources[0].rerank_model.as_deref(),
        Some("bge-reranker-v2-m3")
    );
    assert!(c.suggest_flow);
    assert!(c.builtin_url_generators);
    let c = args(&[
        "--profile",
        "alliance",
        "--pinecone-api-key",
        "k",
        "--index-name",
        "mine",
        "--rerank-model",
        "other",
        "--disable-suggest-flow",
    ])
    .resolve_with(&env_of(&[]))
    .unwrap()
    .unwrap();
    assert_eq!(c.sources[0].index_name, "mine");
    assert_eq!(c.sources[0].rerank_model.as_deref(), Some("other"));
    assert!(!c.suggest_flow);
}

#[test]
fn numeric_flags_are_validated_and_applied() {
    let c = args(&[
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
    ])
    .resolve_with(&env_of(&[]))
    .unwrap()
    .unwrap();
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

    let e = args(&["--sources", "a:supersecretkey123"])
        .resolve_with(&env)
        .unwrap_err();
    assert!(!e.message().contains("supersecretkey123"), "{e}");
    assert!(e.message().contains("segment #1"), "{e}");
    let e = args(&["--sources", "a:k:i;a:k2:i2"])
        .resolve_with(&env)
        .unwrap_err();
    assert_eq!(
        e.message(),
        "Duplicate source name \"a\" in PINECONE_SOURCES."
    );
    let e = args(&["--sources", "bad name:k:i"])
        .resolve_with(&env)
        .unwrap_err();
    assert!(
        e.message().starts_with("Invalid source name \"bad name\""),
        "{e}"
    );
    let e = args(&["--sources", "{\"a\":1}"])
        .resolve_with(&env)
        .unwrap_err();
    assert!(e.message().contains("inline JSON"), "{e}");
    let e = args(&["--sources", "a:${NOPE}:i"])
        .resolve_with(&env)
        .unwrap_err();
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
    let e = args(&["--config-file", "/nonexistent/nexus.json"])
        .resolve_with(&env)
        .unwrap_err();
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
    let c = args(&["--pinecone-api-key", "topsecretkey", "--index-name", "i"])
        .resolve_with(&env_of(&[]))
        .unwrap()
        .unwrap();
    assert!(!format!("{c:?}").contains("topsecretkey"));
}

// ---- metadata filters ----------------------------------------------------

fn filter_err(v: Value) -> (String, String) {
    let e = validate_filter(&obj(v)).unwrap_err();
    (e.field, e.message)
}

#[test]
fn valid_filters_pass() {
    for f in [
        json!({"year": 2020}),
        json!({"tags": ["a", "b"]}),
        json!({"tags": []}),
        json!({"year": {"$gte": 2000, "$lt": 2030}}),
        json!({"author": {"$in": ["a", 1, true]}}),
        json!({"$or": [{"a": 1}, {"b": {"$ne": "x"}}]}),
        json!({"title": {"$exists": true}}),
    ] {
        assert!(validate_filter(&obj(f.clone())).is_ok(), "{f}");
    }
}

#[test]
fn invalid_filters_name_the_path() {
    assert_eq!(
        filter_err(json!({"year": {"$regex": "x"}})).0,
        "year.$regex"
    );
    assert_eq!(
        filter_err(json!({"tags": {"$in": "x"}})),
        (
            "tags.$in".into(),
            "Operator \"$in\" at \"tags\" must use an array of primitive values.".into()
        )
    );
    assert_eq!(
        filter_err(json!({"tags": {"$nin": []}})).1,
        "Operator \"$nin\" at \"tags\" must contain at least one value."
    );
    assert_eq!(
        filter_err(json!({"a": null})),
        ("a".into(), "Invalid null/undefined at \"a\".".into())
    );
    assert_eq!(
        filter_err(json!({"$and": []})).1,
        "Operator \"$and\" at \"$and\" must contain at least one filter object."
    );
    assert_eq!(
        filter_err(json!({"$and": [{"a": 1}, 3]})),
        (
            "$and.1".into(),
            "Operator \"$and\" at \"$and.1\" must use an array of filter objects.".into()
        )
    );
    assert_eq!(
        filter_err(json!({"$or": [{"a": {"$in": []}}]})).0,
        "$or.0.a.$in"
    );
    assert_eq!(filter_err(json!({"a": {"nested": 1}})).0, "a.nested");
    assert_eq!(
        filter_err(json!({"a": {"$eq": [1]}})).1,
        "Operator \"$eq\" at \"a\" must use a primitive value."
    );
    assert_eq!(
        filter_err(json!({"a": {"$exists": 1}})).1,
        "Operator \"$exists\" at \"a\" must use a boolean value."
    );
}

fn primitive() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<bool>().prop_map(Value::from),
        any::<i32>().prop_map(Value::from),
        "[a-z]{0,6}".prop_map(Value::from)
    ]
}

fn valid_filter() -> impl Strategy<Value = Value> {
    let leaf = (
        "[a-z]{1,5}",
        prop_oneof![
            primitive(),
            (
                prop_oneof![Just("$eq"), Just("$ne"), Just("$gt"), Just("$lte")],
                primitive()
            )
                .prop_map(|(op, v)| json!({op: v})),
            (
                prop_oneof![Just("$in"), Just("$nin")],
                prop::collection::vec(primitive(), 1..5)
            )
                .prop_map(|(op, v)| json!({op: v})),
        ],
    )
        .prop_map(|(k, v)| json!({k: v}));
    leaf.prop_recursive(4, 32, 4, |inner| {
        (
            prop_oneof![Just("$and"), Just("$or")],
            prop::collection::vec(inner, 1..4),
        )
            .prop_map(|(op, v)| json!({op: v}))
    })
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![Just(Value::Null), primitive()];
    leaf.prop_recursive(5, 64, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        Just("$and".to_owned()),
                        Just("$in".to_owned()),
                        Just("$or".to_owned()),
                        Just("$bad".to_owned()),
                        "[a-z]{1,3}"
                    ],
                    inner
                ),
                0..4
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn generated_valid_filters_are_accepted(f in valid_filter()) {
        prop_assert!(validate_filter(f.as_object().unwrap()).is_ok(), "{}", f);
    }

    #[test]
    fn validation_never_panics_and_errors_point_into_the_filter(v in any_json()) {
        if let Value::Object(m) = &v
            && let Err(e) = validate_filter(m)
        {
            prop_assert!(!e.message.is_empty());
            let root = e.field.split('.').next().unwrap_or("");
            prop_assert!(e.field.is_empty() || m.contains_key(root), "{} not in {}", e.field, v);
        }
    }

    #[test]
    fn large_mixed_in_lists_are_accepted(n in 900usize..1100) {
        let values: Vec<Value> = (0..n).map(|i| match i % 3 { 0 => json!(i), 1 => json!(format!("s{i}")), _ => json!(i % 2 == 0) }).collect();
        let filter = obj(json!({"f": {"$in": values}}));
        prop_assert!(validate_filter(&filter).is_ok());
    }
}

// ---- routing and suggestions --------------------------------------------

fn ns(name: &str, count: u64, fields: &[&str]) -> NamespaceRow {
    NamespaceRow {
        name: name.into(),
        source: None,
        record_count: count,
        metadata_fields: fields
            .iter()
            .map(|f| ((*f).to_owned(), json!("string")))
            .collect(),
        schema_source: SchemaSource::Sampled,
        description: None,
    }
}

#[test]
fn router_ranks_by_score_then_smaller_namespace() {
    let rows = [
        ns("big-papers", 900, &[]),
        ns("papers", 10, &[]),
        ns("slack", 5, &["author"]),
    ];
    let ranked = rank("papers by author", &rows);
    let order: Vec<&str> = ranked.iter().map(|r| r.namespace.as_str()).collect();
    assert_eq!(order, ["papers", "big-papers", "slack"]);
    assert_eq!(
        (ranked[0].score, ranked[1].score, ranked[2].score),
        (3, 2, 1)
    );
    assert_eq!(recommend(&ranked).unwrap().namespace, "papers");
    let only_field = rank("by author", &rows);
    assert!(
        recommend(&only_field).is_none(),
        "a field hint alone does not route"
    );
    assert_eq!(
        recommend(&rank("anything", &[ns("solo", 1, &[])]))
            .unwrap()
            .namespace,
        "solo"
    );
    assert_eq!(
        rank("explain", &[ns("ai", 1, &[]), ns("b", 1, &[])])[0].score,
        0,
        "no substring matches"
    );
}

#[test]
fn suggestion_heuristics() {
    let fields = obj(
        json!({"document_number": "string", "title": "string", "url": "string", "author": "string[]", "chunk_text": "string", "year": "number"}),
    );
    let s = suggest(Some(&fields), "How many papers by Jane?");
    assert_eq!(
        (s.recommended_tool, s.use_count_tool),
        (SuggestedTool::Count, true)
    );
    assert_eq!(s.suggested_fields, ["document_number", "url"]);
    let s = suggest(Some(&fields), "summarize the proposal");
    assert_eq!(s.recommended_tool, SuggestedTool::Detailed);
    assert_eq!(
        s.suggested_fields,
        ["document_number", "title", "url", "author", "chunk_text"]
    );
    let s = suggest(Some(&fields), "list recent papers");
    assert_eq!(s.recommended_tool, SuggestedTool::Fast);
    assert_eq!(
        s.suggested_fields,
        ["document_number", "title", "url", "author"]
    );
    let s = suggest(None, "x");
    assert!(!s.namespace_found);
    let other = obj(
        json!({"a": "string", "b": "string", "c": "string", "d": "string", "e": "string", "f": "string"}),
    );
    assert_eq!(suggest(Some(&other), "list").suggested_fields.len(), 5);
    assert_eq!(
        suggest(Some(&other), "show the text")
            .suggested_fields
            .len(),
        6
    );
    assert!(suggest(Some(&Map::new()), "x").namespace_found);
}

// ---- URL generators ------------------------------------------------------

#[test]
fn builtin_url_generators() {
    let m = mailing_url(&obj(
        json!({"list_name": "boost@lists.boost.org", "msg_id": "M1"}),
    ));
    assert_eq!(
        m.url.as_deref(),
        Some("https://lists.boost.org/archives/list/boost@lists.boost.org/message/M1/")
    );
    let m = mailing_url(&obj(json!({"thread_id": " T9 "})));
    assert_eq!(
        m.url.as_deref(),
        Some("https://lists.boost.org/archives/list/T9/")
    );
    let s = slack_url(&obj(json!({"source": "https://slack/x", "team_id": "T"})));
    assert_eq!(
        (s.url.as_deref(), s.method),
        (Some("https://slack/x"), UrlMethod::MetadataSource)
    );
    let s = slack_url(&obj(json!({"team_id": "T"})));
    assert_eq!(
        s.reason.as_deref(),
        Some("slack-Cpplang requires team_id, channel_id, and doc_id (or source)")
    );
}

// ---- fusion, counting, reassembly ---------------------------------------

fn hit(id: &str, score: f64, meta: Value, content: &str) -> Hit {
    Hit {
        id: id.into(),
        score,
        content: content.into(),
        metadata: obj(meta),
    }
}

#[test]
fn fusion_dedupes_by_id_and_orders_by_rank() {
    let out = fuse(
        vec![
            hit("a", 0.9, json!({}), "a"),
            hit("b", 0.5, json!({}), "b-dense"),
        ],
        vec![
            hit("b", 7.0, json!({}), "b-sparse"),
            hit("c", 5.0, json!({}), "c"),
        ],
    );
    let ids: Vec<&str> = out.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(ids, ["b", "a", "c"]);
    assert_eq!(
        out[0].content, "b-sparse",
        "the copy with the higher raw score is kept"
    );
}

#[test]
fn count_uses_identifier_fields_then_ids() {
    let hits = [
        hit("1", 1.0, json!({"document_number": "D1"}), ""),
        hit("2", 1.0, json!({"document_number": "D1", "url": "u"}), ""),
        hit("3", 1.0, json!({"url": "u"}), ""),
        hit("4", 1.0, json!({"doc_id": ""}), ""),
        hit("5", 1.0, json!({}), ""),
        hit("5", 1.0, json!({}), ""),
    ];
    let c = count_documents(&hits, "ns");
    assert_eq!(c.count, 4);
    assert!(!c.truncated);
}

#[test]
fn reassembly_groups_orders_and_caps() {
    let hits = [
        hit(
            "x2",
            0.4,
            json!({"doc_id": "X", "chunk_index": "2"}),
            "third",
        ),
        hit("y", 0.9, json!({"url": "Y"}), "only"),
        hit(
            "x0",
            0.8,
            json!({"doc_id": "X", "chunk_index": 0}),
            " first ",
        ),
        hit("x-", 0.1, json!({"doc_id": "X"}), "unordered"),
        hit("x1", 0.3, json!({"doc_id": "X", "start_index": 1}), ""),
        hit("", 0.3, json!({}), "no key"),
    ];
    let docs = reassemble(&hits, 5, 3);
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0].document_id, "Y");
    let x = &docs[1];
    assert_eq!(
        x.merged_content, "first\n\nthird",
        "blank chunks are dropped, the cap keeps the first three"
    );
    assert_eq!(x.chunk_count, 3);
    assert_eq!(x.best_score, 0.8);
    assert_eq!(reassemble(&hits, 1, 200).len(), 1);
}

// ---- client --------------------------------------------------------------

#[tokio::test]
async fn client_errors_are_redacted_and_4xx_is_not_retried() {
    let fake = pinecone_fake::PineconeFake::start().await;
    let client = PineconeClient::new(
        reqwest::Client::new(),
        fake.url.clone(),
        pinecone_fake::KEY_A.to_owned().into(),
        Duration::from_secs(5),
    );
    fake.fail("stats:kb", 403, 1);
    let e = client.describe_index_stats("kb").await.unwrap_err();
    assert_eq!(e.status(), Some(403));
    let text = format!("{e} {e:?}");
    assert!(!text.contains(pinecone_fake::KEY_A), "{text}");
    assert_eq!(fake.count("stats:kb"), 1);
    let stats = client.describe_index_stats("kb").await.unwrap();
    assert_eq!(stats.dimension, Some(4));
    assert_eq!(fake.count("describe_index"), 1, "the host is resolved once");
}

#[tokio::test]
async fn check_indexes_probes_dense_and_sparse_indexes() {
    let fake = pinecone_fake::PineconeFake::start().await;
    let server = nexus_knowql::mcp::pinecone::PineconeServer::new(fake.config()).unwrap();
    assert_eq!(
        server.check_indexes().await.unwrap(),
        "dense index \"kb\" and sparse index \"kb-sparse\" reachable."
    );
    fake.fail("stats:kb-sparse", 404, 1);
    let errors = server.check_indexes().await.unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0]
            .starts_with("Sparse index \"kb-sparse\": describeIndexStats failed with HTTP 404"),
        "{errors:?}"
    );
    assert!(!errors[0].contains(pinecone_fake::KEY_A));
    let multi = nexus_knowql::mcp::pinecone::PineconeServer::new(fake.multi_config()).unwrap();
    assert_eq!(
        multi.check_indexes().await.unwrap(),
        "all 2 source(s) reachable."
    );
}

// ---------------------------------------------------------------------------
// Outbound safety: redirects, plain http, namespaces.

/// Every request a listener received: (path, Api-Key, X-Pinecone-Api-Key, Authorization).
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, String, String, String)>>>;

/// A listener that records the credential headers of every request and
/// answers `{}`.
async fn recorder() -> (String, Seen) {
    let seen = Seen::default();
    let log = seen.clone();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let log = log.clone();
        async move {
            let h = |n: &str| {
                req.headers()
                    .get(n)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned()
            };
            log.lock().unwrap().push((
                req.uri().path().to_owned(),
                h("api-key"),
                h("x-pinecone-api-key"),
                h("authorization"),
            ));
            axum::Json(json!({"host": "unused", "namespaces": {}}))
        }
    });
    (serve(app).await, seen)
}

async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    url
}

/// A control plane whose describe-index answers with `status` and a
/// `Location` of `target` + the request path; `/same/...` paths are answered
/// in place (a same-origin redirect target).
async fn redirector(status: u16, target: Option<String>) -> String {
    use axum::extract::{Request, State};
    use axum::response::IntoResponse;
    #[derive(Clone)]
    struct S {
        status: u16,
        target: Option<String>,
        own: std::sync::Arc<std::sync::Mutex<String>>,
    }
    let own = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let state = S {
        status,
        target,
        own: own.clone(),
    };
    let app = axum::Router::new()
        .fallback(|State(s): State<S>, req: Request| async move {
            let path = req.uri().path().to_owned();
            if let Some(rest) = path.strip_prefix("/same") {
                let own = s.own.lock().unwrap().clone();
                return axum::Json(json!({"host": format!("{own}/same/idx"), "dimension": 4, "namespaces": {"ns": {"vectorCount": 1}}, "rest": rest})).into_response();
            }
            let target = s
                .target
                .clone()
                .unwrap_or_else(|| format!("{}/same", s.own.lock().unwrap()));
            (
                axum::http::StatusCode::from_u16(s.status).unwrap(),
                [(axum::http::header::LOCATION, format!("{target}{path}"))],
            )
                .into_response()
        })
        .with_state(state);
    let url = serve(app).await;
    *own.lock().unwrap() = url.clone();
    url
}

fn safe_client(controller: &str) -> PineconeClient {
    PineconeClient::new(
        nexus_knowql::mcp::pinecone::client::http_client().unwrap(),
        controller.to_owned(),
        pinecone_fake::KEY_A.to_owned().into(),
        Duration::from_secs(5),
    )
}

#[tokio::test]
async fn the_key_is_never_sent_across_origins_on_redirect() {
    let (elsewhere, seen) = recorder().await;
    for status in [301, 302, 303, 307, 308] {
        let control = redirector(status, Some(elsewhere.clone())).await;
        let e = safe_client(&control)
            .describe_index_stats("kb")
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(status), "{e}");
        let text = format!("{e} {e:?}");
        assert!(!text.contains(pinecone_fake::KEY_A), "{text}");
    }
    // The other origin was never contacted at all, so no key reached it.
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
}

#[tokio::test]
async fn the_recorder_sees_keys_when_called_directly() {
    // The recorder records what arrives: a direct call shows the key, so the
    // test above would notice a forwarded one.
    let (elsewhere, seen) = recorder().await;
    let _ = safe_client(&elsewhere).describe_index("kb").await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].1, pinecone_fake::KEY_A);
}

#[tokio::test]
async fn same_origin_redirects_are_followed() {
    let control = redirector(307, None).await;
    let stats = safe_client(&control)
        .describe_index_stats("kb")
        .await
        .unwrap();
    assert_eq!(stats.namespaces, vec![("ns".to_owned(), 1)]);
}

#[tokio::test]
async fn plain_http_is_refused_outside_loopback_before_any_request() {
    // A documentation-only address: had a request been attempted it would
    // fail as a transport error or time out, not be refused.
    let client = safe_client("http://pinecone.example");
    let e = client.describe_index("kb").await.unwrap_err();
    assert!(
        matches!(
            e,
            nexus_knowql::mcp::pinecone::PineconeError::Refused { .. }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("https"), "{e}");

    // An index host reported as plain http on a remote host is refused too.
    let app = axum::Router::new().fallback(|| async {
        axum::Json(json!({"host": "http://idx.pinecone.example", "dimension": 4}))
    });
    let control = serve(app).await;
    let e = safe_client(&control)
        .describe_index_stats("kb")
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            nexus_knowql::mcp::pinecone::PineconeError::Refused { .. }
        ),
        "{e:?}"
    );

    // And a configured http controller host is a startup error.
    let e = args(&[
        "--index-name",
        "kb",
        "--pinecone-api-key",
        "k",
        "--pinecone-controller-host",
        "http://api.pinecone.example",
    ])
    .resolve_with(&env_of(&[]))
    .unwrap_err();
    assert!(e.message().contains("https"), "{e}");
    assert!(
        args(&[
            "--index-name",
            "kb",
            "--pinecone-api-key",
            "k",
            "--pinecone-controller-host",
            "http://127.0.0.1:9",
        ])
        .resolve_with(&env_of(&[]))
        .is_ok()
    );
}

#[tokio::test]
async fn namespaces_that_change_the_path_never_reach_pinecone() {
    let fake = pinecone_fake::PineconeFake::start().await;
    let client = PineconeClient::new(
        reqwest::Client::new(),
        fake.url.clone(),
        pinecone_fake::KEY_A.to_owned().into(),
        Duration::from_secs(5),
    );
    let request: nexus_knowql::mcp::pinecone::client::SearchRequest =
        nexus_knowql::mcp::pinecone::client::SearchRequest {
            query: nexus_knowql::mcp::pinecone::client::SearchQuery {
                top_k: 1,
                inputs: nexus_knowql::mcp::pinecone::client::SearchInputs { text: "x".into() },
                filter: None,
            },
            fields: None,
        };
    for bad in ["", ".", "..", "a/b", "../kb"] {
        let e = client
            .search_records("kb", bad, &request)
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                nexus_knowql::mcp::pinecone::PineconeError::Refused { .. }
            ),
            "{bad:?}: {e:?}"
        );
    }
    assert_eq!(fake.count("search:kb"), 0);
    client
        .search_records("kb", "wg21-papers", &request)
        .await
        .unwrap();
    assert_eq!(fake.count("search:kb"), 1);
}
