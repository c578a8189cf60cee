//! `Host` and `Origin` checks for every path (the MCP endpoint and the
//! operator endpoints alike), counted as refusals, and CORS for the origins
//! allowed: browser clients get `Access-Control-Allow-Origin` and may read
//! `Mcp-Session-Id`; preflights are answered without a key.

use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};

/// The request headers a browser client may send.
const ALLOW_HEADERS: &str = "content-type, accept, authorization, last-event-id, mcp-session-id, \
     mcp-protocol-version, mcp-method, mcp-name, x-pinecone-api-key, x-request-id";
/// The response headers a browser client may read.
const EXPOSE_HEADERS: &str = "mcp-session-id, mcp-protocol-version, x-request-id, www-authenticate";
/// The methods of the MCP endpoint.
const ALLOW_METHODS: &str = "GET, POST, DELETE, OPTIONS";

/// One allowed origin: scheme, host and port (`None`: any port).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    scheme: String,
    host: String,
    port: Option<u16>,
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// `scheme://host[:port]` split; `*` as the port is any port.
fn split_origin(text: &str) -> Option<(String, String, Option<Option<u16>>)> {
    let (scheme, rest) = text.trim().split_once("://")?;
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') {
        return None;
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        (format!("[{host}]"), after.strip_prefix(':'))
    } else {
        match rest.rsplit_once(':') {
            Some((host, port)) => (host.to_owned(), Some(port)),
            None => (rest.to_owned(), None),
        }
    };
    let port = match port {
        None => None,
        Some("*") => Some(None),
        Some(p) => Some(Some(p.parse().ok()?)),
    };
    Some((scheme.to_ascii_lowercase(), host.to_ascii_lowercase(), port))
}

/// The `Host` and `Origin` values allowed.
#[derive(Debug, Clone)]
pub(super) struct HostOrigin {
    hosts: Vec<String>,
    origins: Vec<Pattern>,
}

/// Why a request was refused: its `Host` or its `Origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    Host,
    Origin,
}

impl HostOrigin {
    pub(super) fn new(
        hosts: impl IntoIterator<Item = String>,
        origins: impl IntoIterator<Item = String>,
    ) -> Self {
        let origins = origins
            .into_iter()
            .filter_map(|o| {
                let (scheme, host, port) = split_origin(&o)?;
                // No port: the scheme's own (as `:*` must be asked for).
                let port = match port {
                    Some(port) => port,
                    None => default_port(&scheme),
                };
                Some(Pattern { scheme, host, port })
            })
            .collect();
        HostOrigin {
            hosts: hosts
                .into_iter()
                .map(|h| {
                    h.trim_matches(|c| c == '[' || c == ']')
                        .to_ascii_lowercase()
                })
                .collect(),
            origins,
        }
    }

    fn host_allowed(&self, headers: &HeaderMap) -> bool {
        let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
            // HTTP/2 carries `:authority` instead; hyper maps it to the URI.
            return true;
        };
        let host = host.trim().to_ascii_lowercase();
        let name = if let Some(v6) = host.strip_prefix('[') {
            v6.split(']').next().unwrap_or_default().to_owned()
        } else {
            host.rsplit_once(':')
                .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
                .map_or(host.clone(), |(name, _)| name.to_owned())
        };
        self.hosts.iter().any(|h| *h == name || *h == host)
    }

    /// Whether `Host` is present, parses as an authority and names a host
    /// served, read as rmcp reads it (an allowed host with a port never
    /// matches here: such requests take rmcp's own check).
    pub(super) fn authority_served(&self, headers: &HeaderMap) -> bool {
        let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let Ok(authority) = http::uri::Authority::try_from(host) else {
            return false;
        };
        let name = authority
            .host()
            .trim_matches(|c| c == '[' || c == ']')
            .to_ascii_lowercase();
        self.hosts.contains(&name)
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        let Some((scheme, host, port)) = split_origin(origin) else {
            return false;
        };
        let port = match port {
            Some(Some(p)) => Some(p),
            Some(None) => return false,
            None => default_port(&scheme),
        };
        self.origins
            .iter()
            .any(|p| p.scheme == scheme && p.host == host && (p.port.is_none() || p.port == port))
    }

    /// Checks a request's `Host` and `Origin`: the allowed `Origin` to
    /// answer CORS for, if it has one.
    pub(super) fn check(&self, headers: &HeaderMap) -> Result<Option<HeaderValue>, Refused> {
        if !self.host_allowed(headers) {
            return Err(Refused::Host);
        }
        match headers.get(header::ORIGIN) {
            None => Ok(None),
            Some(origin) => match origin.to_str() {
                Ok(text) if self.origin_allowed(text) => Ok(Some(origin.clone())),
                _ => Err(Refused::Origin),
            },
        }
    }
}

/// Whether a request is a CORS preflight.
pub(super) fn is_preflight(method: &Method, headers: &HeaderMap) -> bool {
    *method == Method::OPTIONS
        && headers.contains_key(header::ORIGIN)
        && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// The answer to a preflight from allowed `origin`.
pub(super) fn preflight(origin: HeaderValue) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(ALLOW_METHODS),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(ALLOW_HEADERS),
    );
    headers.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    response
}

/// Adds the CORS headers for allowed `origin` to `response`.
pub(super) fn allow(response: &mut Response, origin: HeaderValue) {
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSE_HEADERS),
    );
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
}

/// The 403 for a refused `Host` or `Origin`.
pub(super) fn refusal_text(refused: Refused) -> &'static str {
    match refused {
        Refused::Host => "this Host is not served; add it with --allow-host",
        Refused::Origin => "this Origin is not allowed; add it with --allow-origin",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        map
    }

    #[test]
    fn hosts_and_origins_are_matched_by_name_and_port() {
        let checks = HostOrigin::new(
            [
                "localhost".to_owned(),
                "::1".to_owned(),
                "mcp.example".to_owned(),
            ],
            [
                "http://localhost:*".to_owned(),
                "https://app.example".to_owned(),
            ],
        );
        assert!(
            checks
                .check(&headers(&[("host", "localhost:8080")]))
                .is_ok()
        );
        assert!(checks.check(&headers(&[("host", "[::1]:8080")])).is_ok());
        assert!(checks.check(&headers(&[("host", "MCP.example")])).is_ok());
        assert_eq!(
            checks.check(&headers(&[("host", "evil.example:8080")])),
            Err(Refused::Host)
        );
        let ok = headers(&[("host", "localhost"), ("origin", "http://localhost:5173")]);
        assert!(checks.check(&ok).unwrap().is_some());
        let ok = headers(&[("host", "localhost"), ("origin", "https://app.example")]);
        assert!(checks.check(&ok).unwrap().is_some());
        for bad in [
            "https://app.example:8443",
            "http://app.example",
            "https://evil.example",
            "null",
        ] {
            let h = headers(&[("host", "localhost"), ("origin", bad)]);
            assert_eq!(checks.check(&h), Err(Refused::Origin), "{bad}");
        }
    }
}
