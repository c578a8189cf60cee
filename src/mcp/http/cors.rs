//! The crate's `Host` and `Origin` rule (`crate::host_origin`) for every
//! path (the MCP endpoint and the operator endpoints alike), and CORS for
//! the origins allowed: browser clients get `Access-Control-Allow-Origin` and may read
//! `Mcp-Session-Id`; preflights are answered without a key.

use std::net::SocketAddr;

use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};

use crate::host_origin::{HostPolicy, Refusal};

/// The request headers a browser client may send.
const ALLOW_HEADERS: &str = "content-type, accept, authorization, last-event-id, mcp-session-id, \
     mcp-protocol-version, mcp-method, mcp-name, x-pinecone-api-key, x-request-id";
/// The response headers a browser client may read.
const EXPOSE_HEADERS: &str = "mcp-session-id, mcp-protocol-version, x-request-id, www-authenticate";
/// The methods of the MCP endpoint.
const ALLOW_METHODS: &str = "GET, POST, DELETE, OPTIONS";

/// The `Host` and `Origin` values served: the crate's one rule
/// ([`HostPolicy`]), with the allowed `Origin` handed back for CORS.
#[derive(Debug, Clone)]
pub(super) struct HostOrigin(HostPolicy);

impl HostOrigin {
    /// Loopback names, `bound` (when specific) and `hosts`; local pages and
    /// `origins`.
    pub(super) fn new(bound: SocketAddr, hosts: &[String], origins: &[String]) -> Self {
        HostOrigin(HostPolicy::new(bound, hosts, origins))
    }

    /// Checks a request's authorities (`Host`, HTTP/2 `:authority`) and
    /// `Origin`: the allowed `Origin` to answer CORS for, if it has one.
    pub(super) fn check(
        &self,
        uri: &http::Uri,
        headers: &HeaderMap,
    ) -> Result<Option<HeaderValue>, Refusal> {
        self.0.check_request(uri, headers)?;
        Ok(headers.get(header::ORIGIN).cloned())
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
    fn the_allowed_origin_is_handed_back_for_cors() {
        let checks = HostOrigin::new(
            SocketAddr::from(([127, 0, 0, 1], 8080)),
            &["mcp.example".to_owned()],
            &["https://app.example".to_owned()],
        );
        let uri = http::Uri::from_static("/mcp");
        let ok = headers(&[("host", "mcp.example"), ("origin", "https://app.example")]);
        assert_eq!(
            checks
                .check(&uri, &ok)
                .unwrap()
                .as_ref()
                .map(HeaderValue::as_bytes),
            Some(&b"https://app.example"[..])
        );
        assert_eq!(
            checks.check(&uri, &headers(&[("host", "localhost")])),
            Ok(None)
        );
        assert!(checks.check(&uri, &headers(&[])).is_err());
    }
}
