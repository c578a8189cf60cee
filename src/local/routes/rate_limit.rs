//! What every answer of the server carries besides its body: an
//! `x-request-id`, and, when rate limiting is simulated
//! ([`LocalNexusBuilder::rate_limit`](crate::local::LocalNexusBuilder::rate_limit)),
//! the `x-ratelimit-*` headers, with 429 and `Retry-After` past the limit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::super::error::LocalError;

/// The request id header.
const REQUEST_ID: &str = "x-request-id";

/// At most `requests` requests in each window of `window`, counted from the
/// first request of the window.
#[derive(Debug)]
pub(crate) struct Limiter {
    requests: u32,
    window: Duration,
    /// The start of the current window and the requests it admitted.
    used: Mutex<(Instant, u32)>,
}

/// One request's place in its window.
struct Admission {
    admitted: bool,
    remaining: u32,
    /// Whole seconds (at least 1) until the window starts again.
    reset_secs: u64,
}

impl Limiter {
    pub(crate) fn new(requests: u32, window: Duration) -> Self {
        Limiter {
            requests,
            window,
            used: Mutex::new((Instant::now(), 0)),
        }
    }

    fn admit(&self, now: Instant) -> Admission {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let (start, count) = &mut *used;
        if now.saturating_duration_since(*start) >= self.window {
            *start = now;
            *count = 0;
        }
        let admitted = *count < self.requests;
        if admitted {
            *count += 1;
        }
        let left = self
            .window
            .saturating_sub(now.saturating_duration_since(*start));
        Admission {
            admitted,
            remaining: self.requests - *count,
            reset_secs: left.as_secs_f64().ceil().max(1.0) as u64,
        }
    }
}

impl Admission {
    fn write(&self, limit: u32, headers: &mut HeaderMap) {
        headers.insert("x-ratelimit-limit-requests", HeaderValue::from(limit));
        headers.insert(
            "x-ratelimit-remaining-requests",
            HeaderValue::from(self.remaining),
        );
        if let Ok(reset) = HeaderValue::from_str(&format!("{}s", self.reset_secs)) {
            headers.insert("x-ratelimit-reset-requests", reset);
        }
    }
}

/// Middleware: past the limit, 429 `rate_limited` with `Retry-After`;
/// every answer carries the limit, what is left and when it resets.
pub(crate) async fn simulate(
    State(limiter): State<Arc<Limiter>>,
    req: Request,
    next: Next,
) -> Response {
    let admission = limiter.admit(Instant::now());
    let mut resp = if admission.admitted {
        next.run(req).await
    } else {
        LocalError {
            code: Some("rate_limited"),
            retry_after: Some(admission.reset_secs),
            ..LocalError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "rate limited: at most {} requests per {} s",
                    limiter.requests,
                    limiter.window.as_secs()
                ),
            )
        }
        .into_response()
    };
    admission.write(limiter.requests, resp.headers_mut());
    resp
}

/// Middleware: a fresh `x-request-id` on every answer.
pub(crate) async fn request_id(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    if let Ok(id) = HeaderValue::from_str(&next_request_id()) {
        resp.headers_mut().insert(REQUEST_ID, id);
    }
    resp
}

/// `req_` and 16 hex digits: a per-process random prefix and a counter.
fn next_request_id() -> String {
    static PREFIX: OnceLock<u32> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        let mut bytes = [0u8; 4];
        // Without the OS random source ids are still unique within a run.
        let _ = getrandom::fill(&mut bytes);
        u32::from_le_bytes(bytes)
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("req_{prefix:08x}{:08x}", n as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_admits_its_requests_then_refuses_until_it_resets() {
        let limiter = Limiter::new(2, Duration::from_secs(10));
        let start = Instant::now();
        let first = limiter.admit(start);
        assert!(first.admitted && first.remaining == 1);
        let second = limiter.admit(start + Duration::from_secs(1));
        assert!(second.admitted && second.remaining == 0);
        let third = limiter.admit(start + Duration::from_millis(2500));
        assert!(!third.admitted);
        assert_eq!((third.remaining, third.reset_secs), (0, 8));
        let later = limiter.admit(start + Duration::from_secs(10));
        assert!(later.admitted && later.remaining == 1);
    }

    #[test]
    fn request_ids_differ() {
        assert_ne!(next_request_id(), next_request_id());
    }
}
