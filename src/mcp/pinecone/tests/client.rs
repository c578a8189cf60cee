//! The Pinecone client: redaction, retries, redirects, plain http and
//! namespaces that would change the request path.

use std::time::Duration;

use serde_json::json;

use super::{args, env_of};
use crate::mcp::pinecone::PineconeError;
use crate::mcp::pinecone::client::PineconeClient;

/// The API key the client under test sends.
const KEY: &str = "pcsk_unit_test_key_0123456789abcdefghijklmnopqrstuvwxyz";

/// Requests per route of a [`one_index`] listener.
#[derive(Clone, Default)]
struct Counts(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<&'static str, usize>>>);

impl Counts {
    /// Counts a request on `route`; returns how many it has had.
    fn hit(&self, route: &'static str) -> usize {
        let mut counts = self.0.lock().unwrap();
        let n = counts.entry(route).or_default();
        *n += 1;
        *n
    }

    fn get(&self, route: &str) -> usize {
        self.0.lock().unwrap().get(route).copied().unwrap_or(0)
    }
}

/// A loopback Pinecone with one dense index, `kb`, whose data-plane host is
/// the same listener: describe-index, describe-index-stats (the first
/// `failing_stats` answers are 403s that echo the key, as careless upstream
/// errors do) and records search. (The full fake, for the tools, is in the
/// integration tests.)
async fn one_index(failing_stats: usize) -> (String, Counts) {
    use axum::routing::{get, post};
    let counts = Counts::default();
    let own = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (c1, c2, c3, host) = (counts.clone(), counts.clone(), counts.clone(), own.clone());
    let app = axum::Router::new()
        .route(
            "/indexes/kb",
            get(move || async move {
                c1.hit("describe_index");
                let host = format!("{}/idx", host.lock().unwrap());
                axum::Json(json!({"name": "kb", "host": host, "dimension": 4, "metric": "cosine"}))
            }),
        )
        .route(
            "/idx/describe_index_stats",
            post(move |headers: axum::http::HeaderMap| async move {
                if c2.hit("stats") <= failing_stats {
                    let key = headers
                        .get("api-key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    let body = json!({"code": 7, "message": format!("denied for Api-Key {key}")});
                    return (axum::http::StatusCode::FORBIDDEN, axum::Json(body));
                }
                let body = json!({"dimension": 4, "namespaces": {"ns": {"vectorCount": 1}}});
                (axum::http::StatusCode::OK, axum::Json(body))
            }),
        )
        .route(
            "/idx/records/namespaces/{ns}/search",
            post(move || async move {
                c3.hit("search");
                axum::Json(json!({"result": {"hits": []}}))
            }),
        );
    let url = serve(app).await;
    *own.lock().unwrap() = url.clone();
    (url, counts)
}

fn client_of(url: &str) -> PineconeClient {
    PineconeClient::new(
        reqwest::Client::new(),
        url.to_owned(),
        KEY.to_owned().into(),
        Duration::from_secs(5),
    )
}

#[tokio::test]
async fn client_errors_are_redacted_and_4xx_is_not_retried() {
    let (url, counts) = one_index(1).await;
    let client = client_of(&url);
    let e = client.describe_index_stats("kb").await.unwrap_err();
    assert_eq!(e.status(), Some(403));
    let text = format!("{e} {e:?}");
    assert!(!text.contains(KEY), "{text}");
    assert_eq!(counts.get("stats"), 1);
    let stats = client.describe_index_stats("kb").await.unwrap();
    assert_eq!(stats.dimension, Some(4));
    assert_eq!(counts.get("describe_index"), 1, "the host is resolved once");
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
        super::super::client::http_client().unwrap(),
        controller.to_owned(),
        KEY.to_owned().into(),
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
        assert!(!text.contains(KEY), "{text}");
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
    assert_eq!(seen[0].1, KEY);
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
    assert!(matches!(e, PineconeError::Refused { .. }), "{e:?}");
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
    assert!(matches!(e, PineconeError::Refused { .. }), "{e:?}");

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
    let (url, counts) = one_index(0).await;
    let client = client_of(&url);
    let request: super::super::client::SearchRequest = super::super::client::SearchRequest {
        query: super::super::client::SearchQuery {
            top_k: 1,
            inputs: super::super::client::SearchInputs { text: "x".into() },
            filter: None,
        },
        fields: None,
    };
    for bad in ["", ".", "..", "a/b", "../kb"] {
        let e = client
            .search_records("kb", bad, &request)
            .await
            .unwrap_err();
        assert!(matches!(e, PineconeError::Refused { .. }), "{bad:?}: {e:?}");
    }
    assert_eq!(counts.get("search"), 0);
    client
        .search_records("kb", "wg21-papers", &request)
        .await
        .unwrap();
    assert_eq!(counts.get("search"), 1);
}
