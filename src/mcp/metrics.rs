//! [`Metrics`]: what `nexus-mcp` counts for its operator, served at
//! `GET /metrics` in the Prometheus text format.
//!
//! Labels only ever carry names from a fixed set (tool names the server
//! serves, outcome codes, HTTP methods and statuses, refusal reasons):
//! never a key, a digest of one, an address or anything else a caller
//! chooses, so no caller can add series or be told apart.

use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Latency buckets in seconds, from a cached answer to a long `get_query`.
const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 120.0,
];

type Labels2 = [(&'static str, &'static str); 2];
type Labels1 = [(&'static str, &'static str); 1];

/// A tool (one the server serves) and how its call ended.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
    outcome: &'static str,
}

/// A tool the server serves.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolName {
    tool: String,
}

/// An HTTP method (one of a fixed set) and a response status.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: &'static str,
    status: u16,
}

/// An HTTP method as a label: one of a fixed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HttpMethod {
    Get,
    Post,
    Delete,
    Head,
    Options,
    Put,
    Other,
}

impl HttpMethod {
    const COUNT: usize = 7;

    /// The label value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Post => "POST",
            HttpMethod::Delete => "DELETE",
            HttpMethod::Head => "HEAD",
            HttpMethod::Options => "OPTIONS",
            HttpMethod::Put => "PUT",
            HttpMethod::Other => "other",
        }
    }
}

/// The series a successful request of one method updates, looked up in
/// their families once (on first use, so unused series stay absent).
#[derive(Default)]
struct OkHandles {
    answered: OnceLock<Counter>,
    seconds: OnceLock<Histogram>,
}

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The server's counters, gauges and histograms. Cheap to share; each
/// update is a few atomic operations.
pub struct Metrics {
    registry: Registry,
    tool_calls: Family<ToolLabels, Counter>,
    tool_seconds: Family<ToolName, Histogram, fn() -> Histogram>,
    upstream_errors: Family<Labels2, Counter>,
    requests: Family<RequestLabels, Counter>,
    request_seconds: Family<Labels1, Histogram, fn() -> Histogram>,
    refusals: Family<Labels1, Counter>,
    rpc_requests: Family<Labels1, Counter>,
    connections: Gauge,
    sessions: Gauge,
    /// Per [`HttpMethod`], its `http_requests` series for status 200 and
    /// its `http_request_duration_seconds` series.
    by_method: [OkHandles; HttpMethod::COUNT],
    /// Per tool called so far, its `ok` and duration series.
    tools: RwLock<Vec<ToolMetrics>>,
}

/// The series one tool's calls update, with the tool's name.
#[derive(Debug, Clone)]
pub(crate) struct ToolMetrics {
    name: Arc<str>,
    ok: Counter,
    seconds: Histogram,
}

impl ToolMetrics {
    /// The tool's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // Plain handles; a poisoned list is still consistent.
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Empty metrics, registered under the `nexus_mcp` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nexus_mcp");
        let tool_calls = Family::<ToolLabels, Counter>::default();
        let tool_seconds =
            Family::<ToolName, Histogram, fn() -> Histogram>::new_with_constructor(histogram);
        let upstream_errors = Family::<Labels2, Counter>::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let request_seconds =
            Family::<Labels1, Histogram, fn() -> Histogram>::new_with_constructor(histogram);
        let refusals = Family::<Labels1, Counter>::default();
        let rpc_requests = Family::<Labels1, Counter>::default();
        let connections = Gauge::default();
        let sessions = Gauge::default();
        registry.register(
            "tool_calls",
            "Tool calls by tool and outcome (ok, or the tool error code)",
            tool_calls.clone(),
        );
        registry.register(
            "tool_call_duration_seconds",
            "Time from a tool call's start to its result, by tool",
            tool_seconds.clone(),
        );
        registry.register(
            "upstream_errors",
            "Tool calls that failed at Nexus or Pinecone, by tool family and error code",
            upstream_errors.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests answered, by method and status",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Time from a request's head to its response's head, by method",
            request_seconds.clone(),
        );
        registry.register(
            "refusals",
            "Connections and requests refused or closed early, by reason",
            refusals.clone(),
        );
        registry.register(
            "rpc_requests",
            "JSON-RPC messages received over HTTP, by method (a fixed set; `other` for the rest)",
            rpc_requests.clone(),
        );
        registry.register(
            "open_connections",
            "Open HTTP connections",
            connections.clone(),
        );
        registry.register("open_sessions", "Live MCP sessions", sessions.clone());
        Metrics {
            registry,
            tool_calls,
            tool_seconds,
            upstream_errors,
            requests,
            request_seconds,
            refusals,
            rpc_requests,
            connections,
            sessions,
            by_method: Default::default(),
            tools: RwLock::new(Vec::new()),
        }
    }

    /// The metrics in the Prometheus (OpenMetrics) text format.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }

    /// The series of calls to `tool`, which must be a name the server
    /// serves (or `"unknown"`): looked up in their families on the tool's
    /// first call and kept (one entry per tool served).
    pub(crate) fn tool(&self, tool: &str) -> ToolMetrics {
        if let Some(found) = read(&self.tools).iter().find(|t| &*t.name == tool) {
            return found.clone();
        }
        let mut tools = self.tools.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = tools.iter().find(|t| &*t.name == tool) {
            return found.clone();
        }
        let handles = ToolMetrics {
            name: Arc::from(tool),
            ok: self
                .tool_calls
                .get_or_create(&ToolLabels {
                    tool: tool.to_owned(),
                    outcome: "ok",
                })
                .clone(),
            seconds: self
                .tool_seconds
                .get_or_create(&ToolName {
                    tool: tool.to_owned(),
                })
                .clone(),
        };
        tools.push(handles.clone());
        handles
    }

    /// Records one call to `tool`; `outcome` is `"ok"` or an error code.
    pub(crate) fn tool_call(&self, tool: &ToolMetrics, outcome: &'static str, seconds: f64) {
        if outcome == "ok" {
            tool.ok.inc();
        } else {
            self.tool_calls
                .get_or_create(&ToolLabels {
                    tool: tool.name.to_string(),
                    outcome,
                })
                .inc();
        }
        tool.seconds.observe(seconds);
    }

    /// Records a tool call that failed upstream.
    pub(crate) fn upstream_error(&self, family: &'static str, code: &'static str) {
        self.upstream_errors
            .get_or_create(&[("family", family), ("code", code)])
            .inc();
    }

    /// Records one answered HTTP request.
    pub(crate) fn request(&self, method: HttpMethod, status: u16, seconds: f64) {
        let label = method.label();
        let handles = &self.by_method[method as usize];
        if status == 200 {
            handles
                .answered
                .get_or_init(|| {
                    self.requests
                        .get_or_create(&RequestLabels {
                            method: label,
                            status,
                        })
                        .clone()
                })
                .inc();
        } else {
            self.requests
                .get_or_create(&RequestLabels {
                    method: label,
                    status,
                })
                .inc();
        }
        handles
            .seconds
            .get_or_init(|| {
                self.request_seconds
                    .get_or_create(&[("method", label)])
                    .clone()
            })
            .observe(seconds);
    }

    /// Counts one JSON-RPC message of `method` (a label from a fixed set).
    pub(crate) fn rpc_request(&self, method: &'static str) {
        self.rpc_requests.get_or_create(&[("method", method)]).inc();
    }

    /// Records one refusal.
    pub(crate) fn refusal(&self, reason: &'static str) {
        self.refusals.get_or_create(&[("reason", reason)]).inc();
    }

    /// The open-connections gauge.
    pub(crate) fn connections(&self) -> &Gauge {
        &self.connections
    }

    /// The live-sessions gauge.
    pub(crate) fn sessions(&self) -> &Gauge {
        &self.sessions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_count_through_the_kept_handles() {
        let metrics = Metrics::new();
        assert!(!metrics.render().contains("method=\"POST\""));
        metrics.request(HttpMethod::Post, 200, 0.002);
        metrics.request(HttpMethod::Post, 200, 0.002);
        metrics.request(HttpMethod::Post, 404, 0.002);
        let text = metrics.render();
        assert!(
            text.contains("nexus_mcp_http_requests_total{method=\"POST\",status=\"200\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("nexus_mcp_http_requests_total{method=\"POST\",status=\"404\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("nexus_mcp_http_request_duration_seconds_count{method=\"POST\"} 3"),
            "{text}"
        );
    }

    #[test]
    fn tool_calls_count_through_the_kept_handles_by_outcome() {
        let metrics = Metrics::new();
        let query = metrics.tool("query");
        metrics.tool_call(&query, "ok", 0.002);
        metrics.tool_call(&metrics.tool("query"), "ok", 0.002);
        metrics.tool_call(&metrics.tool("query"), "TIMEOUT", 0.002);
        metrics.tool_call(&metrics.tool("count"), "ok", 0.002);
        let text = metrics.render();
        for line in [
            "nexus_mcp_tool_calls_total{tool=\"query\",outcome=\"ok\"} 2",
            "nexus_mcp_tool_calls_total{tool=\"query\",outcome=\"TIMEOUT\"} 1",
            "nexus_mcp_tool_calls_total{tool=\"count\",outcome=\"ok\"} 1",
            "nexus_mcp_tool_call_duration_seconds_count{tool=\"query\"} 3",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert_eq!(read(&metrics.tools).len(), 2);
    }
}
