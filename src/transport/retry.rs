//! When and how long to wait before sending a request again.
//!
//! A retry is only safe when the server cannot act twice on the same request.
//! GET, HEAD, PUT, DELETE and OPTIONS are idempotent by definition and are
//! retried on 408, 429, 5xx answers and on connection failures. A POST (for
//! example `POST /query`, which starts a turn) is sent again only when
//! nothing was processed: the connection could not be opened, or the server
//! answered 429 with no `Retry-After` longer than the policy's `max_delay`.
//!
//! The delays themselves come from [`Backoff`]: exponential steps capped at
//! a maximum, each shortened by a random fraction ("full jitter" when the
//! fraction is 1), so that clients that failed together do not come back
//! together. The transport's retries, the event stream's reconnections,
//! every polling wait and the Pinecone tools' retries use it.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

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
            jitter: 1.0,
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

    /// Growth factor between delays (default 2.0; values below 1, and
    /// non-numbers, mean 1: the delays do not grow).
    pub fn multiplier(mut self, m: f64) -> Self {
        self.multiplier = m;
        self
    }

    /// The fraction of each delay drawn at random, in `[0, 1]` (default 1,
    /// "full jitter"): a step `d` waits between `d × (1 − jitter)` and `d`,
    /// so a delay never exceeds its exponential step nor `max_delay`. `0`
    /// waits exactly `d`.
    pub fn jitter(mut self, j: f64) -> Self {
        self.jitter = if j.is_nan() { 0.0 } else { j.clamp(0.0, 1.0) };
        self
    }

    /// Total time budget for all attempts of one request (default 60 s).
    pub fn max_elapsed(mut self, d: Duration) -> Self {
        self.max_elapsed = d;
        self
    }

    /// A fresh backoff sequence for one request. The elapsed budget is
    /// tracked by the caller with tokio's clock, so paused-time tests and
    /// real time agree.
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(
            self.initial_delay,
            self.multiplier,
            self.max_delay,
            self.jitter,
        )
    }

    /// The delay before the next attempt: the next backoff step, or the
    /// server's `Retry-After` when it asks for longer (a floor, never a
    /// reason to retry sooner: a past date or `0` keeps the backoff); never
    /// more than `max_delay`.
    pub(crate) fn next_delay(
        &self,
        backoff: &mut Backoff,
        retry_after: Option<Duration>,
    ) -> Duration {
        let step = backoff.next_delay();
        retry_after
            .map_or(step, |floor| floor.max(step))
            .min(self.max_delay)
    }

    /// The wait a `Retry-After` header asks for, clamped to `max_delay`.
    pub(crate) fn retry_after(&self, headers: &HeaderMap) -> Option<Duration> {
        retry_after(headers).map(|d| d.min(self.max_delay))
    }
}

/// A sequence of jittered exponential delays: the `n`-th un-jittered step is
/// `initial × multiplier^n`, capped at `max`; each delay is that step less a
/// random fraction of at most `jitter` of it.
///
/// The randomness is a SplitMix64 generator seeded from the standard
/// library's per-process random hasher keys (no dependency); tests seed it
/// with [`Backoff::seeded`] to get the same delays every time.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    step: Duration,
    multiplier: f64,
    max: Duration,
    jitter: f64,
    rng: SplitMix64,
}

impl Backoff {
    /// Delays starting at `initial`, growing by `multiplier` up to `max`,
    /// with `jitter` (in `[0, 1]`; clamped, NaN is 0) of each drawn at random.
    pub(crate) fn new(initial: Duration, multiplier: f64, max: Duration, jitter: f64) -> Self {
        Backoff {
            step: initial.min(max),
            multiplier: if multiplier.is_finite() && multiplier >= 1.0 {
                multiplier
            } else {
                1.0
            },
            max,
            jitter: if jitter.is_nan() {
                0.0
            } else {
                jitter.clamp(0.0, 1.0)
            },
            rng: SplitMix64::from_clock(),
        }
    }

    /// The same sequence with a fixed random seed.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn seeded(mut self, seed: u64) -> Self {
        self.rng = SplitMix64(seed);
        self
    }

    /// The next delay; the sequence never ends (it stays at `max`).
    pub(crate) fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = Duration::try_from_secs_f64(step.as_secs_f64() * self.multiplier)
            .unwrap_or(self.max)
            .min(self.max);
        if self.jitter == 0.0 {
            return step;
        }
        // `1 − jitter × u` is in `(0, 1]`: never above the step (a float
        // that rounds past `Duration::MAX` keeps the step).
        let factor = 1.0 - self.jitter * self.rng.unit();
        Duration::try_from_secs_f64(step.as_secs_f64() * factor)
            .unwrap_or(step)
            .min(step)
    }
}

/// SplitMix64: a tiny, well-mixed generator; enough to spread retries,
/// not for anything secret.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    /// Seeded from the process's random hasher keys and the clock.
    fn from_clock() -> Self {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        SplitMix64(h.finish())
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
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
    fn backoff_grows_to_cap_and_retry_after_is_its_floor() {
        let policy = RetryPolicy::default()
            .jitter(0.0)
            .initial_delay(Duration::from_millis(100))
            .max_delay(Duration::from_millis(350));
        let mut b = policy.backoff();
        let d: Vec<_> = (0..4).map(|_| policy.next_delay(&mut b, None)).collect();
        assert_eq!(d, [100, 200, 350, 350].map(Duration::from_millis).to_vec());
        let mut b = policy.backoff();
        assert_eq!(
            policy.next_delay(&mut b, Some(Duration::from_millis(120))),
            Duration::from_millis(120),
            "a longer Retry-After wins"
        );
        assert_eq!(
            policy.next_delay(&mut b, Some(Duration::ZERO)),
            Duration::from_millis(200),
            "a past date or 0 never retries sooner than the backoff"
        );
        assert_eq!(
            policy.next_delay(&mut b, Some(Duration::from_secs(2))),
            Duration::from_millis(350),
            "clamped to max_delay"
        );
    }

    #[test]
    fn full_jitter_stays_under_each_step_and_a_seed_repeats() {
        let policy = RetryPolicy::default()
            .initial_delay(Duration::from_millis(100))
            .max_delay(Duration::from_millis(800));
        let steps = [100u64, 200, 400, 800, 800, 800];
        let draw = |seed| {
            let mut b = policy.backoff().seeded(seed);
            steps.map(|_| b.next_delay())
        };
        let first = draw(7);
        assert_eq!(first, draw(7), "the same seed gives the same delays");
        assert_ne!(first, draw(8), "another seed gives other delays");
        for (d, step) in first.iter().zip(steps) {
            assert!(*d <= Duration::from_millis(step), "{d:?} > {step} ms");
        }
        // Over many draws, full jitter spreads delays across the whole step.
        let mut b =
            Backoff::new(Duration::from_secs(1), 1.0, Duration::from_secs(1), 1.0).seeded(1);
        let draws: Vec<_> = (0..1000).map(|_| b.next_delay().as_secs_f64()).collect();
        assert!(draws.iter().any(|d| *d < 0.1) && draws.iter().any(|d| *d > 0.9));
        let mean = draws.iter().sum::<f64>() / 1000.0;
        assert!((0.45..0.55).contains(&mean), "mean {mean}");
    }

    #[test]
    fn odd_settings_never_panic_nor_pass_the_cap() {
        for (m, j) in [
            (f64::NAN, f64::NAN),
            (f64::INFINITY, 2.0),
            (-3.0, -1.0),
            (1e300, 0.5),
        ] {
            let mut b = Backoff::new(Duration::from_millis(5), m, Duration::from_secs(1), j);
            for _ in 0..100 {
                assert!(b.next_delay() <= Duration::from_secs(1));
            }
        }
        let mut b = Backoff::new(Duration::MAX, 2.0, Duration::MAX, 1.0);
        let _ = b.next_delay();
        let _ = b.next_delay();
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
