//! An in-process fake of the Pinecone endpoints the tools use: describe
//! index (control plane), describe index stats, records search, vector query
//! (data plane) and rerank (inference), over a small corpus.
//!
//! Index hosts point back at the fake (`http://127.0.0.1:PORT/idx/<index>`),
//! so one base URL serves everything. Failures and delays can be scripted per
//! route; every request body is recorded, and each recording is signalled
//! ([`PineconeFake::wait_for`]).

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use nexus_knowql::mcp::pinecone::{PineconeConfig, SourceConfig};
use serde_json::{Map, Value, json};

/// The API key the fake accepts for project A.
pub const KEY_A: &str = "pcsk_testkeyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
/// The API key the fake accepts for project B.
pub const KEY_B: &str = "pcsk_testkeyBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";

#[derive(Clone, Debug)]
pub struct Record {
    pub index: String,
    pub namespace: String,
    pub id: String,
    pub fields: Map<String, Value>,
}

#[derive(Default)]
struct Script {
    /// route -> remaining scripted failure statuses
    failures: HashMap<String, Vec<u16>>,
    delays: HashMap<String, Duration>,
    requests: HashMap<String, Vec<Value>>,
    headers: Vec<(String, String)>,
    /// Keys accepted besides `KEY_A` and `KEY_B`: those with this prefix.
    accepted_prefix: Option<String>,
}

struct FakeState {
    base: Mutex<String>,
    records: Mutex<Vec<Record>>,
    /// Extra namespaces reported by stats (name, count) per index.
    extra_namespaces: Mutex<Vec<(String, String, u64)>>,
    script: Mutex<Script>,
    /// Fires each time a request is recorded.
    seen: tokio::sync::watch::Sender<u64>,
}

/// A running fake; stops when dropped.
pub struct PineconeFake {
    pub url: String,
    state: Arc<FakeState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PineconeFake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn rec(index: &str, namespace: &str, id: &str, fields: Value) -> Record {
    Record {
        index: index.to_owned(),
        namespace: namespace.to_owned(),
        id: id.to_owned(),
        fields: fields.as_object().cloned().unwrap_or_default(),
    }
}

/// The corpus: index `kb` (project A) with namespaces `wg21-papers` and
/// `mailing` (+ the reserved `_mcp_config`); index `kb2` (project B) with
/// `wg21-papers` and `internal`.
pub fn corpus() -> Vec<Record> {
    vec![
        rec(
            "kb",
            "wg21-papers",
            "p2300-1",
            json!({"document_number": "P2300R10", "title": "std::execution", "author": ["Michal Dominiak", "Eric Niebler"], "url": "https://wg21.link/p2300r10", "chunk_index": 1, "chunk_text": "Schedulers and senders: the second part describes scheduler concepts."}),
        ),
        rec(
            "kb",
            "wg21-papers",
            "p2300-0",
            json!({"document_number": "P2300R10", "title": "std::execution", "author": ["Michal Dominiak", "Eric Niebler"], "url": "https://wg21.link/p2300r10", "chunk_index": 0, "chunk_text": "std::execution proposes senders and receivers for asynchronous execution."}),
        ),
        rec(
            "kb",
            "wg21-papers",
            "p1234-0",
            json!({"document_number": "P1234R0", "title": "Exception safety", "author": ["Jane Doe"], "url": "https://wg21.link/p1234r0", "chunk_index": 0, "chunk_text": "Exception safety guarantees for containers."}),
        ),
        rec(
            "kb",
            "wg21-papers",
            "p0001-0",
            json!({"document_number": "P0001R0", "title": "Coroutines", "author": ["John Roe"], "url": "https://wg21.link/p0001r0", "chunk_index": 0, "chunk_text": "Coroutines let functions suspend and resume execution."}),
        ),
        rec(
            "kb",
            "mailing",
            "m-1",
            json!({"doc_id": "boost-announce@lists.boost.org/message/ABC123", "list_name": "boost-announce@lists.boost.org", "thread_id": "T1", "chunk_text": "Boost 1.90 released with new asio features."}),
        ),
        rec(
            "kb",
            "mailing",
            "m-2",
            json!({"doc_id": "MSG2", "list_name": "boost@lists.boost.org", "thread_id": "T2", "chunk_text": "Review of the proposed scheduler library."}),
        ),
        rec(
            "kb",
            "_mcp_config",
            "schema_manifest",
            json!({"chunk_text": "{}"}),
        ),
        rec(
            "kb2",
            "wg21-papers",
            "q-1",
            json!({"document_number": "P9999R0", "title": "Other paper", "chunk_text": "Private copy of a paper about schedulers."}),
        ),
        rec(
            "kb2",
            "internal",
            "i-1",
            json!({"doc_id": "I1", "chunk_text": "Internal notes about release planning."}),
        ),
    ]
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| w.len() > 1)
        .map(str::to_ascii_lowercase)
        .collect()
}

fn family(index: &str) -> (&str, bool) {
    match index.strip_suffix("-sparse") {
        Some(dense) => (dense, true),
        None => (index, false),
    }
}

fn value_matches(field: Option<&Value>, cond: &Value) -> bool {
    let eq = |v: &Value| match field {
        Some(Value::Array(items)) => items.contains(v),
        Some(f) => f == v,
        None => false,
    };
    match cond {
        Value::Object(ops) => ops.iter().all(|(op, arg)| match op.as_str() {
            "$eq" => eq(arg),
            "$ne" => !eq(arg),
            "$in" => arg.as_array().is_some_and(|a| a.iter().any(eq)),
            "$nin" => arg.as_array().is_some_and(|a| !a.iter().any(eq)),
            "$exists" => field.is_some() == arg.as_bool().unwrap_or(true),
            _ => true,
        }),
        v => eq(v),
    }
}

fn filter_matches(fields: &Map<String, Value>, filter: &Value) -> bool {
    let Some(filter) = filter.as_object() else {
        return true;
    };
    filter.iter().all(|(key, cond)| match key.as_str() {
        "$and" => cond
            .as_array()
            .is_some_and(|a| a.iter().all(|f| filter_matches(fields, f))),
        "$or" => cond
            .as_array()
            .is_some_and(|a| a.iter().any(|f| filter_matches(fields, f))),
        _ => value_matches(fields.get(key), cond),
    })
}

impl PineconeFake {
    /// Starts the fake with [`corpus`].
    pub async fn start() -> PineconeFake {
        Self::start_with(corpus()).await
    }

    /// Starts the fake with `records`.
    pub async fn start_with(records: Vec<Record>) -> PineconeFake {
        let state = Arc::new(FakeState {
            base: Mutex::new(String::new()),
            records: Mutex::new(records),
            extra_namespaces: Mutex::new(Vec::new()),
            script: Mutex::new(Script::default()),
            seen: tokio::sync::watch::channel(0).0,
        });
        let app = Router::new()
            .route("/indexes/{index}", get(describe_index))
            .route("/idx/{index}/describe_index_stats", post(stats))
            .route("/idx/{index}/records/namespaces/{ns}/search", post(search))
            .route("/idx/{index}/query", post(query))
            .route("/idx/{index}/vectors/fetch", get(fetch))
            .route("/rerank", post(rerank))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        *state.base.lock().unwrap() = url.clone();
        // Answers leave at once, not after the client's delayed ACK.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        PineconeFake { url, state, task }
    }

    /// Makes the next `times` calls of `route` answer `status`.
    /// Routes: `describe_index`, `stats:<index>`, `search:<index>`, `query:<index>`, `rerank`.
    pub fn fail(&self, route: &str, status: u16, times: usize) {
        let mut s = self.state.script.lock().unwrap();
        s.failures
            .entry(route.to_owned())
            .or_default()
            .extend(std::iter::repeat_n(status, times));
    }

    /// Also accepts every key that starts with `prefix` (many tenants).
    pub fn accept_keys_starting(&self, prefix: &str) {
        self.state.script.lock().unwrap().accepted_prefix = Some(prefix.to_owned());
    }

    /// Delays every answer of `route`.
    pub fn delay(&self, route: &str, delay: Duration) {
        self.state
            .script
            .lock()
            .unwrap()
            .delays
            .insert(route.to_owned(), delay);
    }

    /// Request bodies received on `route`.
    pub fn requests(&self, route: &str) -> Vec<Value> {
        self.state
            .script
            .lock()
            .unwrap()
            .requests
            .get(route)
            .cloned()
            .unwrap_or_default()
    }

    /// Number of requests received on `route`.
    pub fn count(&self, route: &str) -> usize {
        self.requests(route).len()
    }

    /// Waits until `check` holds over what the fake recorded, looking again
    /// at each request it records (bounded, see
    /// [`wait::PATIENCE`](super::wait::PATIENCE)).
    pub async fn wait_for(&self, what: &str, check: impl Fn(&PineconeFake) -> bool) {
        let mut signal = self.state.seen.subscribe();
        super::wait::signalled(&mut signal, what, || check(self)).await;
    }

    /// `(Api-Key, X-Pinecone-Api-Version)` of every request.
    pub fn headers(&self) -> Vec<(String, String)> {
        self.state.script.lock().unwrap().headers.clone()
    }

    /// Adds records.
    pub fn add(&self, records: Vec<Record>) {
        self.state.records.lock().unwrap().extend(records);
    }

    /// Replaces the `chunk_text` of the schema manifest of `index`.
    pub fn set_manifest(&self, index: &str, text: &str) {
        let mut records = self.state.records.lock().unwrap();
        records.retain(|r| !(r.index == index && r.namespace == "_mcp_config"));
        records.push(rec(
            index,
            "_mcp_config",
            "schema_manifest",
            json!({"chunk_text": text}),
        ));
    }

    /// Reports a namespace in stats without records.
    pub fn add_empty_namespace(&self, index: &str, namespace: &str, count: u64) {
        self.state.extra_namespaces.lock().unwrap().push((
            index.to_owned(),
            namespace.to_owned(),
            count,
        ));
    }

    /// A single-key configuration on index `kb` talking to this fake.
    pub fn config(&self) -> PineconeConfig {
        let mut c = PineconeConfig::single(KEY_A, "kb");
        c.controller_host = self.url.clone();
        c
    }

    /// A two-source configuration: `src_a` (index `kb`) and `src_b` (index `kb2`).
    pub fn multi_config(&self) -> PineconeConfig {
        let mut c = self.config();
        let a = c.sources[0].clone();
        c.mode = nexus_knowql::mcp::pinecone::SourceMode::Sources;
        c.sources = vec![
            SourceConfig {
                name: "src_a".into(),
                description: Some("public papers".into()),
                ..a.clone()
            },
            SourceConfig {
                name: "src_b".into(),
                api_key: KEY_B.to_owned().into(),
                index_name: "kb2".into(),
                sparse_index_name: "kb2-sparse".into(),
                ..a
            },
        ];
        c.default_source = "src_a".into();
        c
    }
}

/// Records the call; answers a scripted failure when one is due.
async fn enter(
    state: &FakeState,
    route: &str,
    headers: &HeaderMap,
    body: Value,
) -> Result<(), Response> {
    let (delay, failure, accepted) = {
        let mut s = state.script.lock().unwrap();
        s.requests.entry(route.to_owned()).or_default().push(body);
        let h = |n: &str| {
            headers
                .get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        s.headers.push((h("api-key"), h("x-pinecone-api-version")));
        let failure = s
            .failures
            .get_mut(route)
            .and_then(|f| (!f.is_empty()).then(|| f.remove(0)));
        let accepted = s.accepted_prefix.clone();
        (s.delays.get(route).copied(), failure, accepted)
    };
    state.seen.send_modify(|n| *n += 1);
    if let Some(d) = delay {
        // Scripted latency: the route answers this late (the arrival is
        // signalled above, before it).
        tokio::time::sleep(d).await;
    }
    let key = headers
        .get("api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let many = accepted.is_some_and(|prefix| key.starts_with(&prefix));
    if key != KEY_A && key != KEY_B && !many {
        return Err((StatusCode::UNAUTHORIZED, axum::Json(json!({"error": {"code": "UNAUTHENTICATED", "message": "Invalid API key."}, "status": 401}))).into_response());
    }
    if let Some(status) = failure {
        let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        // Echoes the key, as careless upstream errors do, to exercise redaction.
        return Err((code, axum::Json(json!({"code": 13, "message": format!("scripted failure {status} for Api-Key {key}")}))).into_response());
    }
    Ok(())
}

async fn describe_index(
    State(state): State<Arc<FakeState>>,
    Path(index): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = enter(&state, "describe_index", &headers, json!({"index": index})).await {
        return r;
    }
    let base = state.base.lock().unwrap().clone();
    let (_, sparse) = family(&index);
    let mut body = json!({"name": index, "host": format!("{base}/idx/{index}"), "metric": if sparse {"dotproduct"} else {"cosine"}});
    if !sparse {
        body["dimension"] = json!(4);
    }
    axum::Json(body).into_response()
}

async fn stats(
    State(state): State<Arc<FakeState>>,
    Path(index): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = enter(&state, &format!("stats:{index}"), &headers, json!({})).await {
        return r;
    }
    let (fam, sparse) = family(&index);
    let mut namespaces = Map::new();
    for r in state
        .records
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.index == fam)
    {
        let entry = namespaces
            .entry(r.namespace.clone())
            .or_insert(json!({"vectorCount": 0}));
        entry["vectorCount"] = json!(entry["vectorCount"].as_u64().unwrap_or(0) + 1);
    }
    for (i, ns, count) in state.extra_namespaces.lock().unwrap().iter() {
        if i == fam {
            namespaces.insert(ns.clone(), json!({"vectorCount": count}));
        }
    }
    let mut body = json!({"namespaces": namespaces, "totalVectorCount": 0});
    if !sparse {
        body["dimension"] = json!(4);
    }
    axum::Json(body).into_response()
}

async fn search(
    State(state): State<Arc<FakeState>>,
    Path((index, ns)): Path<(String, String)>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    if let Err(r) = enter(
        &state,
        &format!("search:{index}"),
        &headers,
        json!({"namespace": ns, "body": body.clone()}),
    )
    .await
    {
        return r;
    }
    let (fam, sparse) = family(&index);
    let query = body["query"]["inputs"]["text"].as_str().unwrap_or("");
    let q = words(query);
    let top_k = body["query"]["top_k"].as_u64().unwrap_or(10) as usize;
    let filter = body["query"].get("filter").cloned().unwrap_or(Value::Null);
    let fields: Option<Vec<String>> = body
        .get("fields")
        .and_then(|f| serde_json::from_value(f.clone()).ok());
    // Only the namespace's matching records are copied out of the lock.
    let records: Vec<Record> = state
        .records
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.index == fam && r.namespace == ns && filter_matches(&r.fields, &filter))
        .cloned()
        .collect();
    let mut hits: Vec<(f64, Record)> = records
        .into_iter()
        .map(|r| {
            let text = format!(
                "{} {}",
                r.fields
                    .get("chunk_text")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
                r.fields.get("title").and_then(Value::as_str).unwrap_or("")
            );
            let doc = words(&text);
            let matched = q.iter().filter(|w| doc.contains(w)).count() as f64;
            // Different scales on purpose: similarity in [0, 0.9] vs dot products.
            // `fake_dense_score` pins a record's dense similarity.
            let pinned = r.fields.get("fake_dense_score").and_then(Value::as_f64);
            let score = if sparse {
                matched * 3.0
            } else {
                pinned.unwrap_or(0.1 + 0.8 * matched / (q.len().max(1) as f64))
            };
            (score, r)
        })
        .filter(|(score, _)| !sparse || *score > 0.0)
        .collect();
    hits.sort_by(|a, b| b.0.total_cmp(&a.0));
    hits.truncate(top_k);
    let hits: Vec<Value> = hits
        .into_iter()
        .map(|(score, r)| {
            let all = r
                .fields
                .into_iter()
                .filter(|(k, _)| !k.starts_with("fake_"));
            let shown: Map<String, Value> = match &fields {
                Some(f) => all.filter(|(k, _)| f.contains(k)).collect(),
                None => all.collect(),
            };
            json!({"_id": r.id, "_score": score, "fields": shown})
        })
        .collect();
    axum::Json(json!({"result": {"hits": hits}, "usage": {"read_units": 1}})).into_response()
}

async fn query(
    State(state): State<Arc<FakeState>>,
    Path(index): Path<String>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    if let Err(r) = enter(&state, &format!("query:{index}"), &headers, body.clone()).await {
        return r;
    }
    let ns = body["namespace"].as_str().unwrap_or("");
    let top_k = body["topK"].as_u64().unwrap_or(5) as usize;
    let matches: Vec<Value> = state
        .records
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.index == index && r.namespace == ns)
        .take(top_k)
        .map(|r| json!({"id": r.id, "score": 0.0, "metadata": r.fields}))
        .collect();
    axum::Json(json!({"matches": matches, "namespace": ns})).into_response()
}

async fn rerank(
    State(state): State<Arc<FakeState>>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    if let Err(r) = enter(&state, "rerank", &headers, body.clone()).await {
        return r;
    }
    let q = words(body["query"].as_str().unwrap_or(""));
    let docs = body["documents"].as_array().cloned().unwrap_or_default();
    let top_n = body["top_n"].as_u64().map_or(docs.len(), |n| n as usize);
    let mut scored: Vec<(usize, f64)> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let doc = words(d["chunk_text"].as_str().unwrap_or(""));
            let matched = q.iter().filter(|w| doc.contains(w)).count() as f64;
            (i, matched / (q.len().max(1) as f64 + 1.0))
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored.truncate(top_n);
    let data: Vec<Value> = scored
        .into_iter()
        .map(|(i, s)| json!({"index": i, "score": s}))
        .collect();
    axum::Json(json!({"model": body["model"], "data": data, "usage": {"rerank_units": 1}}))
        .into_response()
}

async fn fetch(
    State(state): State<Arc<FakeState>>,
    Path(index): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let query = query.unwrap_or_default();
    let params: Vec<(String, String)> = query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    if let Err(r) = enter(
        &state,
        &format!("fetch:{index}"),
        &headers,
        json!({"query": query}),
    )
    .await
    {
        return r;
    }
    let ns = params
        .iter()
        .find(|(k, _)| k == "namespace")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let ids: Vec<&String> = params
        .iter()
        .filter(|(k, _)| k == "ids")
        .map(|(_, v)| v)
        .collect();
    let mut vectors = Map::new();
    for r in state
        .records
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.index == index && r.namespace == ns && ids.contains(&&r.id))
    {
        vectors.insert(
            r.id.clone(),
            json!({"id": r.id, "values": [0.0, 0.0, 0.0, 0.0], "metadata": r.fields}),
        );
    }
    axum::Json(json!({"vectors": vectors, "namespace": ns})).into_response()
}
