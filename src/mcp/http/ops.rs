//! Operator endpoints, served without a key and outside the MCP guard:
//! `GET /healthz` (the process answers), `GET /readyz` (the upstreams
//! answered a recent probe) and `GET /metrics` (Prometheus text).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::StatusCode;
use tokio::time::Instant;

use crate::mcp::metrics::Metrics;

/// Liveness path.
pub const HEALTH_PATH: &str = "/healthz";
/// Readiness path.
pub const READY_PATH: &str = "/readyz";
/// Metrics path.
pub const METRICS_PATH: &str = "/metrics";

/// How long a readiness probe's result is reused.
const READY_TTL: Duration = Duration::from_secs(10);
/// Deadline of one upstream probe; the upstreams are probed at the same
/// time, so a `/readyz` waits at most about this long.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The last readiness probe: when, and what was unreachable.
#[derive(Debug)]
struct Probe {
    at: Instant,
    unreachable: Vec<&'static str>,
}

/// Readiness: "can serve now". Each upstream answered HTTP at all (any
/// status: a 401 or 404 still shows it is reachable) in a probe at most
/// [`READY_TTL`] old. Probes run only when a request asks and the last
/// result is older than that, all upstreams at once under
/// [`PROBE_TIMEOUT`]; requests meanwhile share that one probe, so however
/// often `/readyz` is asked, upstreams see at most one probe per TTL and
/// no answer waits longer than one probe.
#[derive(Debug)]
pub(super) struct Readiness {
    upstreams: Vec<(&'static str, String)>,
    http: Option<reqwest::Client>,
    ttl: Duration,
    last: tokio::sync::Mutex<Option<Probe>>,
}

impl Readiness {
    pub(super) fn new(upstreams: Vec<(&'static str, String)>) -> Self {
        Self::with_limits(upstreams, READY_TTL, PROBE_TIMEOUT)
    }

    fn with_limits(
        upstreams: Vec<(&'static str, String)>,
        ttl: Duration,
        probe_timeout: Duration,
    ) -> Self {
        let http = reqwest::Client::builder()
            .timeout(probe_timeout)
            .connect_timeout(probe_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .ok();
        Readiness {
            upstreams,
            http,
            ttl,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// The upstreams that did not answer, probing when the last result is
    /// old (callers at the same time share one probe).
    async fn unreachable(&self) -> Vec<&'static str> {
        let mut last = self.last.lock().await;
        if let Some(probe) = last.as_ref()
            && probe.at.elapsed() < self.ttl
        {
            return probe.unreachable.clone();
        }
        let probes = self.upstreams.iter().map(|(name, url)| async move {
            let answered = match &self.http {
                Some(http) => http.get(url).send().await.is_ok(),
                None => false,
            };
            (!answered).then_some(*name)
        });
        let unreachable: Vec<&'static str> = futures::future::join_all(probes)
            .await
            .into_iter()
            .flatten()
            .collect();
        *last = Some(Probe {
            at: Instant::now(),
            unreachable: unreachable.clone(),
        });
        unreachable
    }
}

/// What the operator endpoints read.
#[derive(Debug)]
pub(super) struct Ops {
    pub(super) metrics: Arc<Metrics>,
    pub(super) readiness: Readiness,
    /// The live sessions (`None` when stateless): pruned of expired ones
    /// before each scrape, so that `open_sessions` is true.
    pub(super) sessions: Option<Arc<super::sessions::Sessions>>,
    /// The `Host` and `Origin` checks of the MCP endpoint, applied here too.
    pub(super) host_origin: super::cors::HostOrigin,
    pub(super) refusals: Arc<super::refusals::Refusals>,
}

impl Ops {
    /// The 403 for a request whose `Host` or `Origin` is not served.
    fn refused(&self, uri: &http::Uri, headers: &http::HeaderMap) -> Option<Response> {
        let refused = self.host_origin.check(uri, headers).err()?;
        Some(self.refusals.refuse(
            super::refusals::Reason::HostOrigin,
            StatusCode::FORBIDDEN,
            None,
            &http::Method::GET,
            &refused.to_string(),
        ))
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(ops): State<Arc<Ops>>, uri: http::Uri, headers: http::HeaderMap) -> Response {
    if let Some(refused) = ops.refused(&uri, &headers) {
        return refused;
    }
    let unreachable = ops.readiness.unreachable().await;
    if unreachable.is_empty() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        let text = format!("not ready: no answer from {}\n", unreachable.join(", "));
        (StatusCode::SERVICE_UNAVAILABLE, text).into_response()
    }
}

async fn metrics(
    State(ops): State<Arc<Ops>>,
    uri: http::Uri,
    headers: http::HeaderMap,
) -> Response {
    if let Some(refused) = ops.refused(&uri, &headers) {
        return refused;
    }
    if let Some(sessions) = &ops.sessions {
        sessions.refresh().await;
    }
    (
        [(
            http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        ops.metrics.render(),
    )
        .into_response()
}

/// The operator routes.
pub(super) fn routes(ops: Arc<Ops>) -> axum::Router {
    axum::Router::new()
        .route(HEALTH_PATH, get(healthz))
        .route(READY_PATH, get(readyz))
        .route(METRICS_PATH, get(metrics))
        .with_state(ops)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A TCP listener that accepts connections, counts them and never
    /// answers; returns its URL and the count.
    async fn silent_upstream() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        (url, accepted)
    }

    #[tokio::test]
    async fn silent_upstreams_are_probed_together_within_one_deadline_and_cached() {
        let (nexus, nexus_probes) = silent_upstream().await;
        let (pinecone, _) = silent_upstream().await;
        let deadline = Duration::from_millis(800);
        let readiness = Readiness::with_limits(
            vec![("nexus", nexus), ("pinecone", pinecone)],
            Duration::from_secs(60),
            deadline,
        );
        let start = std::time::Instant::now();
        assert_eq!(readiness.unreachable().await, ["nexus", "pinecone"]);
        let took = start.elapsed();
        // Both deadlines run at once: well under two of them.
        assert!(took >= deadline, "{took:?}");
        assert!(took < deadline * 2 - Duration::from_millis(200), "{took:?}");
        // Within the TTL the result is reused: no new probe, no wait.
        let start = std::time::Instant::now();
        assert_eq!(readiness.unreachable().await, ["nexus", "pinecone"]);
        assert!(start.elapsed() < deadline / 2, "{:?}", start.elapsed());
        assert_eq!(nexus_probes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answering_upstream_is_ready_and_is_probed_again_after_the_ttl() {
        let upstream = wiremock::MockServer::start().await;
        // Any status shows the upstream is reachable.
        wiremock::Mock::given(wiremock::matchers::any())
            .respond_with(wiremock::ResponseTemplate::new(401))
            .mount(&upstream)
            .await;
        let ttl = Duration::from_millis(300);
        let readiness =
            Readiness::with_limits(vec![("nexus", upstream.uri())], ttl, Duration::from_secs(3));
        assert!(readiness.unreachable().await.is_empty());
        assert!(readiness.unreachable().await.is_empty());
        assert_eq!(upstream.received_requests().await.unwrap().len(), 1);
        tokio::time::sleep(ttl).await;
        assert!(readiness.unreachable().await.is_empty());
        assert_eq!(upstream.received_requests().await.unwrap().len(), 2);
    }
}
