//! API version negotiation: what the client sends and what the server echoes.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// The `X-Pinecone-Api-Version` header name.
pub const API_VERSION_HEADER: &str = "X-Pinecone-Api-Version";

/// The API version this crate is generated from and sends by default.
pub const DEFAULT_API_VERSION: &str = "2026-07";

/// The API version a client asks for on every request.
///
/// ```
/// use nexus_knowql::ApiVersion;
/// assert_eq!(ApiVersion::default().as_str(), "2026-07");
/// assert_eq!(ApiVersion::Unstable.as_str(), "unstable");
/// assert_eq!(ApiVersion::from("2027-01").as_str(), "2027-01");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ApiVersion {
    /// `2026-07`, the version this crate was generated from.
    #[default]
    V2026_07,
    /// `unstable`, the in-development surface.
    Unstable,
    /// Any other version string, sent as given.
    Custom(String),
}

impl ApiVersion {
    /// The header value sent for this version.
    pub fn as_str(&self) -> &str {
        match self {
            ApiVersion::V2026_07 => DEFAULT_API_VERSION,
            ApiVersion::Unstable => "unstable",
            ApiVersion::Custom(s) => s,
        }
    }
}

impl From<&str> for ApiVersion {
    fn from(s: &str) -> Self {
        match s {
            DEFAULT_API_VERSION => ApiVersion::V2026_07,
            "unstable" => ApiVersion::Unstable,
            other => ApiVersion::Custom(other.to_owned()),
        }
    }
}

impl From<String> for ApiVersion {
    fn from(s: String) -> Self {
        ApiVersion::from(s.as_str())
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the client has learnt of the server's version from echoed headers.
#[derive(Debug, Default)]
pub(crate) struct VersionTracker {
    last_seen: Mutex<Option<String>>,
    mismatch_warned: AtomicBool,
}

impl VersionTracker {
    /// Records an echoed version; warns once if it differs from the one sent.
    pub(crate) fn observe(&self, sent: &str, echoed: &str) {
        {
            let mut last = self.last_seen.lock().unwrap_or_else(|p| p.into_inner());
            if last.as_deref() != Some(echoed) {
                *last = Some(echoed.to_owned());
            }
        }
        if echoed != sent && !self.mismatch_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                sent,
                echoed,
                "the server answered with a different API version than the one requested"
            );
        }
    }

    pub(crate) fn last_seen(&self) -> Option<String> {
        self.last_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
