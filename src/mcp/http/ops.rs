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
/// Deadline of one upstream probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The last readiness probe: when, and what was unreachable.
#[derive(Debug)]
struct Probe {
    at: Instant,
    unreachable: Vec<&'static str>,
}

/// Readiness: each upstream answers HTTP at all (any status: a 401 or 404
/// still shows it is reachable), probed at most once per [`READY_TTL`].
#[derive(Debug)]
pub(super) struct Readiness {
    upstreams: Vec<(&'static str, String)>,
    http: Option<reqwest::Client>,
    last: tokio::sync::Mutex<Option<Probe>>,
}

impl Readiness {
    pub(super) fn new(upstreams: Vec<(&'static str, String)>) -> Self {
        let http = reqwest::Client::builder()
            .timeout(PROBE_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .ok();
        Readiness {
            upstreams,
            http,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// The upstreams that did not answer, probing when the last result is
    /// old (callers at the same time share one probe).
    async fn unreachable(&self) -> Vec<&'static str> {
        let mut last = self.last.lock().await;
        if let Some(probe) = last.as_ref()
            && probe.at.elapsed() < READY_TTL
        {
            return probe.unreachable.clone();
        }
        let mut unreachable = Vec::new();
        for (name, url) in &self.upstreams {
            let answered = match &self.http {
                Some(http) => http.get(url).send().await.is_ok(),
                None => false,
            };
            if !answered {
                unreachable.push(*name);
            }
        }
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
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(ops): State<Arc<Ops>>) -> Response {
    let unreachable = ops.readiness.unreachable().await;
    if unreachable.is_empty() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        let text = format!("not ready: no answer from {}\n", unreachable.join(", "));
        (StatusCode::SERVICE_UNAVAILABLE, text).into_response()
    }
}

async fn metrics(State(ops): State<Arc<Ops>>) -> Response {
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
