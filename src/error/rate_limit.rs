//! The `x-ratelimit-*` headers of one answer, kept on success
//! ([`ResponseMeta`](crate::ResponseMeta)) and on failure ([`ApiError`](super::ApiError)).

use http::HeaderMap;

/// The most `x-ratelimit-*` headers one answer keeps.
pub const MAX_RATE_LIMIT_HEADERS: usize = 16;

/// The longest rate-limit value kept, in bytes.
const MAX_VALUE_LEN: usize = 64;

/// The `x-ratelimit-*` headers of one answer, as `(name without the
/// prefix, value)`: names lowercase, values as sent.
///
/// Values that are not visible ASCII are left out, a value is cut at 64
/// bytes and at most [`MAX_RATE_LIMIT_HEADERS`] are kept.
///
/// ```
/// # fn check(e: &nexus_knowql::Error) {
/// if e.is_rate_limited() {
///     let left = e.rate_limits().get("remaining-requests");
///     eprintln!("rate limited ({left:?} left), retry after {:?}", e.retry_after());
/// }
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimits(pub(super) Vec<(String, String)>);

impl RateLimits {
    /// The rate-limit headers among `headers`.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let kept = headers
            .iter()
            .filter_map(|(name, value)| {
                let rest = name.as_str().strip_prefix("x-ratelimit-")?;
                let value = value.to_str().ok()?;
                // `to_str` let only visible ASCII through: any byte is a boundary.
                let value = &value[..value.len().min(MAX_VALUE_LEN)];
                Some((rest.to_owned(), value.to_owned()))
            })
            .take(MAX_RATE_LIMIT_HEADERS)
            .collect();
        RateLimits(kept)
    }

    /// The value of `x-ratelimit-{name}` (for example
    /// `get("remaining-requests")`), when the answer carried it.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every header, as `(name without the prefix, value)`.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Whether the answer carried none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
