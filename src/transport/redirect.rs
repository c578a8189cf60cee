//! Redirects never carry credentials to another origin.
//!
//! Every request of a [`Client`](crate::Client) carries its credentials
//! (`X-Pinecone-Api-Key`, `Authorization`, or the key in `POST /auth/login`).
//! reqwest's default policy drops `Authorization` on a cross-host redirect but
//! keeps custom headers such as `X-Pinecone-Api-Key`, and it follows
//! `https` to `http`. The rule here: a redirect is followed only when its
//! target has the same scheme, host and port as the URL the request started
//! at (so never from `https` to `http`), at most [`MAX_REDIRECTS`] times. Any
//! other redirect fails with [`Error::Redirect`](crate::Error::Redirect),
//! which names the target without its user info, query or fragment; nothing
//! is sent there. A 307 or 308 (which re-send the method and body) is never
//! followed for `POST /query`: sending it again could start a second turn.

use std::fmt;

use url::Url;

/// The most redirects one request follows.
pub const MAX_REDIRECTS: usize = 10;

/// The redirect policy of the client's built-in `reqwest::Client`: same-origin
/// redirects only.
///
/// Give it to a `reqwest::Client` of your own before passing that client to
/// [`ClientBuilder::http_client`](crate::ClientBuilder::http_client):
///
/// ```
/// let http = reqwest::Client::builder()
///     .redirect(nexus_knowql::client::redirect_policy())
///     .build()
///     .unwrap();
/// let client = nexus_knowql::Client::builder()
///     .base_url("https://nexus.example.com/api")
///     .http_client(http)
///     .build()
///     .unwrap();
/// # let _ = client;
/// ```
pub fn redirect_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        // reqwest lists every URL visited so far, the original one first.
        let Some(origin) = attempt.previous().first() else {
            return attempt.follow();
        };
        if !same_origin(origin, attempt.url()) {
            let location = redacted(attempt.url());
            return attempt.error(RedirectRefused {
                location,
                reason: Reason::OtherOrigin,
            });
        }
        if matches!(attempt.status().as_u16(), 307 | 308) {
            // These re-send the method and body: the client decides per
            // operation (never for the request that starts a turn).
            return attempt.stop();
        }
        if attempt.previous().len() > MAX_REDIRECTS {
            let location = redacted(attempt.url());
            return attempt.error(RedirectRefused {
                location,
                reason: Reason::TooMany,
            });
        }
        attempt.follow()
    })
}

/// Whether two URLs share scheme, host and port (the port a scheme implies
/// counts as given).
pub(crate) fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme().eq_ignore_ascii_case(b.scheme())
        && a.host() == b.host()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// A URL fit for an error message: no user info, query or fragment.
pub(crate) fn redacted(url: &Url) -> String {
    let mut url = url.clone();
    // Both fail only for URLs that cannot have user info (no host); then
    // there is nothing to strip.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    OtherOrigin,
    TooMany,
    Followed,
    StartsTurn,
}

/// The error the policy hands to reqwest; [`super::map_reqwest`]
/// turns it into [`Error::Redirect`](crate::Error::Redirect).
#[derive(Debug, Clone)]
pub(crate) struct RedirectRefused {
    pub(crate) location: String,
    reason: Reason,
}

impl RedirectRefused {
    /// A redirect reqwest already followed to another origin (a custom
    /// `reqwest::Client` with its own policy).
    pub(crate) fn followed(url: &Url) -> Self {
        RedirectRefused {
            location: redacted(url),
            reason: Reason::Followed,
        }
    }

    /// A redirect answer to another origin that reached the crate unfollowed.
    pub(crate) fn refused(url: &Url) -> Self {
        RedirectRefused {
            location: redacted(url),
            reason: Reason::OtherOrigin,
        }
    }

    /// One redirect more than [`MAX_REDIRECTS`].
    pub(crate) fn too_many(url: &Url) -> Self {
        RedirectRefused {
            location: redacted(url),
            reason: Reason::TooMany,
        }
    }

    /// A redirect that would send the request starting a turn again.
    pub(crate) fn starts_turn(url: &Url) -> Self {
        RedirectRefused {
            location: redacted(url),
            reason: Reason::StartsTurn,
        }
    }

    /// The value of the marker header of a rewritten answer.
    pub(crate) fn to_marker(&self) -> String {
        let code = match self.reason {
            Reason::OtherOrigin => "refused",
            Reason::TooMany => "too-many",
            Reason::Followed => "followed",
            Reason::StartsTurn => "starts-turn",
        };
        format!("{code} {}", self.location)
    }

    /// Reads [`RedirectRefused::to_marker`] back.
    pub(crate) fn from_marker(value: &str) -> Option<Self> {
        let (code, location) = value.split_once(' ')?;
        let reason = match code {
            "refused" => Reason::OtherOrigin,
            "too-many" => Reason::TooMany,
            "followed" => Reason::Followed,
            "starts-turn" => Reason::StartsTurn,
            _ => return None,
        };
        Some(RedirectRefused {
            location: location.to_owned(),
            reason,
        })
    }

    /// The error the crate reports for it.
    pub(crate) fn to_error(&self, operation: &'static str) -> crate::Error {
        crate::Error::Redirect {
            operation,
            location: self.location.clone(),
            reason: self.reason(),
        }
    }

    /// The sentence [`Error::Redirect`](crate::Error::Redirect) carries.
    pub(crate) fn reason(&self) -> &'static str {
        match self.reason {
            Reason::OtherOrigin => {
                "another origin (scheme, host or port) than the configured base URL"
            }
            Reason::TooMany => "too many redirects",
            Reason::StartsTurn => "the request that starts a turn is never sent twice",
            Reason::Followed => {
                "the custom HTTP client followed a redirect to another origin \
                 (build it with `client::redirect_policy()`); its answer was discarded"
            }
        }
    }
}

impl fmt::Display for RedirectRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "redirect to {} refused: {}",
            self.location,
            self.reason()
        )
    }
}

impl std::error::Error for RedirectRefused {}

/// The refused redirect behind a reqwest error, if that is what it is.
pub(crate) fn refused(err: &reqwest::Error) -> Option<&RedirectRefused> {
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<RedirectRefused>() {
            return Some(r);
        }
        source = s.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn origins() {
        for (a, b, same) in [
            ("https://a.example/x", "https://a.example:443/y?q", true),
            ("http://127.0.0.1:8080/a", "http://127.0.0.1:8080/b", true),
            ("https://a.example/", "http://a.example/", false),
            ("http://127.0.0.1:8080/", "http://127.0.0.1:8081/", false),
            ("http://127.0.0.1:8080/", "http://localhost:8080/", false),
            ("https://a.example/", "https://b.example/", false),
        ] {
            assert_eq!(same_origin(&u(a), &u(b)), same, "{a} ~ {b}");
        }
    }

    #[test]
    fn redaction_drops_secrets() {
        let r = redacted(&u(
            "https://user:pw@evil.example:8443/p?api_key=pcsk_x#frag",
        ));
        assert_eq!(r, "https://evil.example:8443/p");
    }

    #[test]
    fn every_marker_reads_back_and_the_message_names_place_and_reason() {
        let url = u("https://other.example/next");
        for r in [
            RedirectRefused::refused(&url),
            RedirectRefused::followed(&url),
            RedirectRefused::starts_turn(&url),
            RedirectRefused::too_many(&url),
        ] {
            let back = RedirectRefused::from_marker(&r.to_marker()).expect("read back");
            assert_eq!(back.location, r.location);
            assert_eq!(back.reason(), r.reason());
            assert_eq!(
                r.to_string(),
                format!("redirect to {} refused: {}", r.location, r.reason())
            );
        }
        assert!(RedirectRefused::from_marker("bogus https://x/").is_none());
    }
}
