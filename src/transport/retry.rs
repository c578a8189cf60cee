//! When and how long to wait before sending a request again.
//!
//! A retry is only safe when the server cannot act twice on the same request.
//! GET, HEAD, PUT, DELETE and OPTIONS are idempotent by definition and are
//! retried on 408, 429, 5xx answers and on connection failures. A POST (for
//! example `POST /query`, which starts a turn) is sent again only when
//! nothing was processed: the connection could not be opened, or the server
//! answered 429 with no `Retry-After` longer than the policy's `max_delay`.

use std::time::{Duration, SystemTime};

use backoff::backoff::Backoff;
use reqwest::header::{HeaderMap, RETRY_AFTER};

/// How the client retries failed requests.
///
/// ```
/// use std::time::Duration;
/// use nexus_knowql::RetryPolicy;
/// let policy = RetryPolicy::default()
///     .max_retries(5)
///     .initial_delay(Duration::from_millis(100))
///     .max_elapsed(Duration::from_secs(30));
/// let never = RetryPolicy::never();
/// ```
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub struct RetryPolicy {
    pub(crate) max_retries: u32,
    initial_delay: Duration,
    pub(crate) max_delay: Duration,
    multiplier: f64,
    jitter: f64,
    pub(crate) max_elapsed: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 3,
            initial_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(10),
            multiplier: 2.0,
            jitter: 0.5,
            max_elapsed: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub fn never() -> Self {
        RetryPolicy {
            max_retries: 0,
            ..RetryPolicy::default()
        }
    }

    /// Retries after the first attempt (default 3).
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }

    /// The first backoff delay (default 250 ms); later ones grow exponentially.
    pub fn initial_delay(mut self, d: Duration) -> Self {
        self.initial_delay = d;
        self
    }

    /// The largest delay between two attempts (default 10 s). A server's
    /// `Retry-After` is honoured up to this bound: a longer (or absurd) value
    /// waits `max_delay`, and the retry still counts against
    /// [`RetryPolicy::max_retries`] and [`RetryPolicy::max_elapsed`].
    pub fn max_delay(mut self, d: Duration) -> Self {
        self.max_delay = d;
        self
    }

    /// Growth factor between delays (default 2.0).
    pub fn multiplier(mut self, m: f64) -> Self {
        self.multiplier = m;
        self
    }

    /// Randomization factor in `[0, 1]` applied to each delay (default 0.5).
    pub fn jitter(mut self, j: f64) -> Self {
        self.jitter = j.clamp(0.0, 1.0);
        self
    }

    /// Total time budget for all attempts of one request (default 60 s).
    pub fn max_elapsed(mut self, d: Duration) -> Self {
        self.max_elapsed = d;
        self
    }

    /// A fresh backoff sequence for one request.
    pub(crate) fn backoff(&self) -> backoff::ExponentialBackoff {
        backoff::ExponentialBackoff {
            current_interval: self.initial_delay,
            initial_interval: self.initial_delay,
            randomization_factor: self.jitter,
            multiplier: self.multiplier,
            max_interval: self.max_delay,
            // The elapsed budget is tracked by the caller with tokio's clock,
            // so paused-time tests and real time agree.
            max_elapsed_time: None,
            ..backoff::ExponentialBackoff::default()
        }
    }

    /// The delay before the next attempt: the server's `Retry-After` if it
    /// gave one, else the next backoff step; never more than `max_delay`.
    pub(crate) fn next_delay(
        &self,
        backoff: &mut backoff::ExponentialBackoff,
        retry_after: Option<Duration>,
    ) -> Duration {
        let step = backoff.next_backoff().unwrap_or(self.max_delay);
        retry_after.unwrap_or(step).min(self.max_delay)
    }

    /// The wait a `Retry-After` header asks for, clamped to `max_delay`.
    pub(crate) fn retry_after(&self, headers: &HeaderMap) -> Option<Duration> {
        retry_after(headers).map(|d| d.min(self.max_delay))
    }
}

/// Whether a method may be sent twice without changing the outcome.
pub(crate) fn is_idempotent(method: &reqwest::Method) -> bool {
    use reqwest::Method;
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS
    )
}

/// Parses `Retry-After` as delta-seconds or an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    parse_retry_after(value, SystemTime::now())
}

/// `delta-seconds` (any number of digits: beyond `u64::MAX` saturates) or an
/// HTTP date (a past one is zero). Anything else is `None`.
pub(crate) fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::is_retryable_status;
    use proptest::prelude::*;

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(parse_retry_after("3", now), Some(Duration::from_secs(3)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        assert_eq!(parse_retry_after(&later, now), Some(Duration::from_secs(7)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(7));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn retry_after_extremes_saturate_and_clamp() {
        let now = SystemTime::now();
        let max = Duration::from_secs(u64::MAX);
        assert_eq!(parse_retry_after("18446744073709551615", now), Some(max));
        assert_eq!(
            parse_retry_after("99999999999999999999999999", now),
            Some(max)
        );
        assert_eq!(parse_retry_after("+5", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
        let far = parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now).unwrap();
        assert!(far > Duration::from_secs(200 * 365 * 86_400));

        let policy = RetryPolicy::default().max_delay(Duration::from_millis(300));
        let mut headers = HeaderMap::new();
        for v in ["18446744073709551615", "Fri, 31 Dec 9999 23:59:59 GMT"] {
            headers.insert(RETRY_AFTER, v.parse().unwrap());
            assert_eq!(
                policy.retry_after(&headers),
                Some(Duration::from_millis(300))
            );
            let mut b = policy.backoff();
            let huge = policy.retry_after(&headers);
            assert_eq!(policy.next_delay(&mut b, huge), Duration::from_millis(300));
        }
        let mut b = policy.backoff();
        assert_eq!(
            policy.next_delay(&mut b, Some(max)),
            Duration::from_millis(300)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(2048)
        ))]

        /// Any header value a server may send: no panic, and the wait stays
        /// within the policy's bound.
        #[test]
        fn retry_after_never_panics_and_stays_in_bounds(
            raw in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..80),
                "[0-9]{1,60}".prop_map(String::into_bytes),
                (0u64..253_402_300_800).prop_map(|s| httpdate::fmt_http_date(
                    SystemTime::UNIX_EPOCH + Duration::from_secs(s)).into_bytes()),
                "[A-Za-z]{3}, [0-9]{1,3} [A-Za-z]{3} [0-9]{1,6} [0-9]{1,3}:[0-9]{1,3}:[0-9]{1,3} GMT"
                    .prop_map(String::into_bytes),
            ],
            max_ms in 0u64..100_000,
        ) {
            let policy = RetryPolicy::default().max_delay(Duration::from_millis(max_ms));
            if let Ok(value) = reqwest::header::HeaderValue::from_bytes(&raw) {
                let mut headers = HeaderMap::new();
                headers.insert(RETRY_AFTER, value);
                let got = policy.retry_after(&headers);
                prop_assert!(got.is_none_or(|d| d <= Duration::from_millis(max_ms)));
                let mut b = policy.backoff();
                prop_assert!(policy.next_delay(&mut b, got) <= Duration::from_millis(max_ms));
            }
            if let Ok(text) = std::str::from_utf8(&raw) {
                let _ = parse_retry_after(text.trim(), SystemTime::now());
                let _ = parse_retry_after(text.trim(), SystemTime::UNIX_EPOCH);
            }
        }
    }

    #[test]
    fn classification() {
        for s in [408, 429, 500, 502, 503, 504] {
            assert!(is_retryable_status(s), "{s}");
        }
        for s in [200, 400, 401, 403, 404, 409, 413] {
            assert!(!is_retryable_status(s), "{s}");
        }
        assert!(is_idempotent(&reqwest::Method::GET));
        assert!(is_idempotent(&reqwest::Method::DELETE));
        assert!(!is_idempotent(&reqwest::Method::POST));
    }

    #[test]
    fn backoff_grows_to_cap_and_retry_after_wins() {
        let policy = RetryPolicy::default()
            .jitter(0.0)
            .initial_delay(Duration::from_millis(100))
            .max_delay(Duration::from_millis(350));
        let mut b = policy.backoff();
        let d: Vec<_> = (0..4).map(|_| policy.next_delay(&mut b, None)).collect();
        assert_eq!(d, [100, 200, 350, 350].map(Duration::from_millis).to_vec());
        assert_eq!(
            policy.next_delay(&mut b, Some(Duration::from_millis(120))),
            Duration::from_millis(120)
        );
        assert_eq!(
            policy.next_delay(&mut b, Some(Duration::from_secs(2))),
            Duration::from_millis(350),
            "clamped to max_delay"
        );
    }

    #[test]
    fn every_setting_is_kept_and_used() {
        let p = RetryPolicy::default()
            .max_retries(7)
            .initial_delay(Duration::from_millis(10))
            .max_delay(Duration::from_secs(3))
            .multiplier(3.0)
            .jitter(0.0)
            .max_elapsed(Duration::from_secs(9));
        assert_eq!(p.max_retries, 7);
        assert_eq!(p.max_delay, Duration::from_secs(3));
        assert_eq!(p.max_elapsed, Duration::from_secs(9));
        // Without jitter the delays are 10 ms, then 3 times more each time.
        let mut b = p.backoff();
        let near =
            |d: Duration, ms: u64| d.abs_diff(Duration::from_millis(ms)) < Duration::from_millis(1);
        let first = p.next_delay(&mut b, None);
        let second = p.next_delay(&mut b, None);
        assert!(near(first, 10) && near(second, 30), "{first:?}, {second:?}");
    }
}
