//! A differential check of `--stateless` calls: every tool-call kind
//! (`list_contexts`, `query_context`, `get_query` waiting) gets the same
//! outcome when its request deadline passes, when its caller cancels it
//! from another connection and when its caller's budget is full, whether
//! or not it carries an allowed `Origin` (which makes it a CORS request). The expected outcome of each scenario
//! is the protocol's (408, `-32800`, 429) and, for `query_context`, a
//! cancel of its Nexus turn.

use std::time::Duration;

use crate::peer_support::{cancelled, post, seen_within};
use crate::support::mcp::{Served, caller_keys, context_json, nexus_client, query_json, serve};
use nexus_knowql::mcp::http::HttpOptions;
use nexus_knowql::mcp::{NexusMcp, NexusServer};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const KEY: &str = "pcsk_differential_key_0123456789abcdef";
/// How long each upstream answer takes once the key is proven: longer
/// than the request deadline of the deadline scenario.
const UPSTREAM_DELAY: Duration = Duration::from_millis(2500);
/// The request deadline of the deadline scenario.
const DEADLINE: Duration = Duration::from_secs(1);

/// A tool-call kind: its name, arguments and the upstream request that
/// shows it is in flight.
#[derive(Clone, Copy, Debug)]
enum Kind {
    ListContexts,
    QueryContext,
    GetQueryWait,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::ListContexts, Kind::QueryContext, Kind::GetQueryWait];

    fn call(self, id: u64) -> Value {
        let (name, arguments) = match self {
            Kind::ListContexts => ("list_contexts", json!({})),
            Kind::QueryContext => (
                "query_context",
                json!({"context": "docs", "question": "Why?"}),
            ),
            Kind::GetQueryWait => ("get_query", json!({"query_id": "q_1", "wait_seconds": 30})),
        };
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": name, "arguments": arguments}})
    }

    fn upstream(self) -> (&'static str, &'static str) {
        match self {
            Kind::ListContexts => ("GET", "/contexts"),
            Kind::QueryContext => ("POST", "/query"),
            Kind::GetQueryWait => ("GET", "/queries/q_1"),
        }
    }
}

/// What one request came to, as a client sees it, and whether Nexus saw
/// its turn cancelled.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    status: u16,
    rpc_error: Option<i64>,
    turn_cancelled: bool,
}

/// The JSON-RPC error code of an answer (JSON or an event stream's last
/// message), if it is an error.
fn rpc_error(body: &str) -> Option<i64> {
    let message = body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or(body);
    serde_json::from_str::<Value>(message.trim())
        .ok()?
        .get("error")?
        .get("code")?
        .as_i64()
}

/// A server for `nexus` with `options`; the caller's key proven while
/// Nexus still answers at once, then the request that shows `kind` in
/// flight answered after [`UPSTREAM_DELAY`] (every other one at once).
async fn served(nexus: &MockServer, kind: Kind, options: HttpOptions) -> Served {
    let server = NexusMcp::new().with_nexus(
        NexusServer::new(nexus_client(&nexus.uri())).with_key_policy(caller_keys(false)),
    );
    let served = serve(server, options).await;
    let ping = json!({"jsonrpc": "2.0", "id": 0, "method": "ping"});
    post(&served.url, KEY, None, &ping).await;
    nexus.reset().await;
    let answers = [
        (("GET", "/contexts"), 200, json!([])),
        (
            ("GET", "/contexts/docs"),
            200,
            context_json("docs", "search", true, false),
        ),
        (
            ("POST", "/query"),
            202,
            query_json("q_1", "in_progress", &[], None),
        ),
        (
            ("GET", "/queries/q_1"),
            200,
            query_json("q_1", "in_progress", &[], None),
        ),
        (
            ("POST", "/queries/q_1/cancel"),
            200,
            query_json("q_1", "cancelled", &[], None),
        ),
    ];
    for ((verb, route), status, answer) in answers {
        let delay = if (verb, route) == kind.upstream() {
            UPSTREAM_DELAY
        } else {
            Duration::ZERO
        };
        Mock::given(method(verb))
            .and(path(route))
            .respond_with(
                ResponseTemplate::new(status)
                    .set_body_json(answer)
                    .set_delay(delay),
            )
            .mount(nexus)
            .await;
    }
    served
}

/// An allowed `Origin`, or none.
fn origin(served: &Served, with_origin: bool) -> Option<String> {
    with_origin.then(|| format!("http://localhost:{}", served.addr.port()))
}

/// Whether `kind`'s Nexus turn was cancelled (only `query_context` starts
/// one; the others are never expected to show a cancel).
async fn turn_cancelled(nexus: &MockServer, kind: Kind) -> bool {
    match kind {
        Kind::QueryContext => {
            seen_within(
                nexus,
                ("POST", "/queries/q_1/cancel"),
                Duration::from_secs(5),
            )
            .await
        }
        _ => false,
    }
}

/// `kind` past its request deadline.
async fn deadline(kind: Kind, with_origin: bool) -> Outcome {
    let nexus = MockServer::start().await;
    let served = served(
        &nexus,
        kind,
        HttpOptions::default()
            .stateless(true)
            .request_timeout(DEADLINE),
    )
    .await;
    let origin = origin(&served, with_origin);
    let (status, body) = post(&served.url, KEY, origin.as_deref(), &kind.call(1)).await;
    Outcome {
        status,
        rpc_error: rpc_error(&body),
        turn_cancelled: turn_cancelled(&nexus, kind).await,
    }
}

/// `kind` cancelled by its caller from another connection once Nexus has
/// its request.
async fn cancel(kind: Kind, with_origin: bool) -> Outcome {
    let nexus = MockServer::start().await;
    let served = served(&nexus, kind, HttpOptions::default().stateless(true)).await;
    let origin = origin(&served, with_origin);
    let call = {
        let (url, origin) = (served.url.clone(), origin.clone());
        tokio::spawn(async move { post(&url, KEY, origin.as_deref(), &kind.call(7)).await })
    };
    assert!(
        seen_within(&nexus, kind.upstream(), Duration::from_secs(10)).await,
        "{kind:?}: the call reaches Nexus"
    );
    let (sent, _) = post(&served.url, KEY, origin.as_deref(), &cancelled(7)).await;
    assert!(sent < 300, "{kind:?}: {sent}");
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the cancelled call ends")
        .unwrap();
    Outcome {
        status,
        rpc_error: rpc_error(&body),
        turn_cancelled: turn_cancelled(&nexus, kind).await,
    }
}

/// A second `kind` while the caller's budget of one request is held by
/// the first.
async fn budget(kind: Kind, with_origin: bool) -> Outcome {
    let nexus = MockServer::start().await;
    let options = HttpOptions::default()
        .stateless(true)
        .max_requests_per_caller(1);
    let served = served(&nexus, kind, options).await;
    let origin = origin(&served, with_origin);
    let first = {
        let (url, origin) = (served.url.clone(), origin.clone());
        tokio::spawn(async move { post(&url, KEY, origin.as_deref(), &kind.call(1)).await })
    };
    assert!(
        seen_within(&nexus, kind.upstream(), Duration::from_secs(10)).await,
        "{kind:?}: the first call holds the budget"
    );
    let (status, body) = post(&served.url, KEY, origin.as_deref(), &kind.call(2)).await;
    first.abort();
    Outcome {
        status,
        rpc_error: rpc_error(&body),
        turn_cancelled: false,
    }
}

/// Runs `scenario` for every kind with and without an `Origin`: the outcomes agree, and
/// are `expected(kind)`.
async fn same_with_or_without_an_origin<F, Fut>(
    name: &str,
    scenario: F,
    expected: impl Fn(Kind) -> Outcome,
) where
    F: Fn(Kind, bool) -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    for kind in Kind::ALL {
        let (without, with_origin) = tokio::join!(scenario(kind, false), scenario(kind, true));
        assert_eq!(
            without, with_origin,
            "{name}, {kind:?}: without vs with an Origin"
        );
        assert_eq!(without, expected(kind), "{name}, {kind:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_past_its_deadline_ends_the_same_with_or_without_an_origin() {
    same_with_or_without_an_origin("deadline", deadline, |kind| Outcome {
        status: 408,
        rpc_error: None,
        turn_cancelled: matches!(kind, Kind::QueryContext),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_cancelled_by_its_caller_ends_the_same_with_or_without_an_origin() {
    same_with_or_without_an_origin("cancel", cancel, |kind| Outcome {
        status: 200,
        rpc_error: Some(-32800),
        turn_cancelled: matches!(kind, Kind::QueryContext),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_over_its_callers_budget_is_refused_the_same_with_or_without_an_origin() {
    same_with_or_without_an_origin("budget", budget, |_| Outcome {
        status: 429,
        rpc_error: None,
        turn_cancelled: false,
    })
    .await;
}
