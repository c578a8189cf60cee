//! The one `Host` and `Origin` rule of every HTTP server in the crate
//! (`nexus-mcp` and `nexus-local`): browser and DNS-rebinding protection,
//! on every route and every HTTP version.
//!
//! - Every authority a request names must be served: its `Host` header
//!   and, when present, the authority of its target (HTTP/2 `:authority`,
//!   or an HTTP/1.1 absolute-form target). A request that names none
//!   (HTTP/1.0 without `Host`, HTTP/2 without `:authority`) or repeats
//!   `Host` is refused: without a name it cannot show which site it is for.
//! - Served hosts: loopback names, the bound address (when specific) and
//!   the allowed hosts; an entry without a port matches any port. Names
//!   compare without case and without one trailing dot (`localhost.` is
//!   `localhost`: the same name, fully qualified).
//! - An `Origin`, when present, must be a local page (`localhost`,
//!   `127.0.0.1`, `[::1]` on any port, http or https) or an allowed origin
//!   (`scheme://host:port`, `:*` for any port); `null` never passes.
//!   Requests without `Origin` (non-browser clients) pass.
//!
//! A request that changes state may be held to more
//! ([`HostPolicy::check_write`]): a browser that says it is
//! `Sec-Fetch-Site: cross-site` is refused, and an `Origin` must be the
//! server's own or one allowed explicitly — other local pages (another
//! `localhost` port) may read, not write.
//!
//! Everything here is a pure function over header values and an
//! allow-list; it imports nothing else of the crate, so any layer may use it.

use std::net::SocketAddr;

/// Origins allowed by default: local pages on any port.
pub(crate) const LOCAL_ORIGINS: &[&str] = &[
    "http://localhost:*",
    "https://localhost:*",
    "http://127.0.0.1:*",
    "https://127.0.0.1:*",
    "http://[::1]:*",
    "https://[::1]:*",
];

/// Host names always allowed in the `Host` header.
pub(crate) const LOOPBACK_HOSTS: &[&str] = &["localhost", "127.0.0.1", "::1"];

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No `Host` header (nor an HTTP/2 authority).
    MissingHost,
    /// More than one `Host` header.
    RepeatedHost,
    /// The `Host` is malformed or not allowed.
    ForeignHost(String),
    /// The `Origin` is malformed or not allowed.
    ForeignOrigin(String),
    /// A request that changes state came from another site or another
    /// local page (its `Origin`, or `Sec-Fetch-Site: cross-site`).
    #[cfg_attr(not(feature = "local"), allow(dead_code))]
    CrossSiteWrite(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::MissingHost => write!(
                f,
                "the request names no Host (send a Host header naming this server)"
            ),
            Refusal::RepeatedHost => write!(f, "the request names more than one Host"),
            Refusal::ForeignHost(h) => write!(
                f,
                "Host {h:?} is not allowed (possible DNS rebinding); start the server with --allow-host to accept it"
            ),
            Refusal::ForeignOrigin(o) => write!(
                f,
                "Origin {o:?} is not allowed (cross-site request); start the server with --allow-origin to accept it"
            ),
            Refusal::CrossSiteWrite(o) => write!(
                f,
                "a request from {o} may not change anything here (only this server's own pages may); start the server with --allow-origin to accept it"
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Authority {
    host: String,
    port: Option<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Port {
    Any,
    Exact(u16),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: String,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct AllowedOrigin {
    scheme: String,
    host: String,
    port: Port,
}

/// The hosts and origins one server accepts.
#[derive(Debug, Clone)]
pub(crate) struct HostPolicy {
    hosts: Vec<Authority>,
    origins: Vec<AllowedOrigin>,
    /// The origins allowed explicitly (not the local pages): they may write.
    #[cfg_attr(not(feature = "local"), allow(dead_code))]
    explicit: Vec<AllowedOrigin>,
}

impl HostPolicy {
    /// Loopback names, the bound address (when specific) and `extra_hosts`;
    /// local origins and `extra_origins`. Unparsable entries are ignored
    /// (with a warning), so they never widen the policy.
    pub(crate) fn new(bound: SocketAddr, extra_hosts: &[String], extra_origins: &[String]) -> Self {
        let mut raw_hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| (*h).to_owned()).collect();
        if !bound.ip().is_unspecified() {
            raw_hosts.push(bound.ip().to_string());
        }
        raw_hosts.extend(extra_hosts.iter().cloned());
        let hosts = parse_each(&raw_hosts, "host", parse_allowed_host);
        let explicit = parse_each(extra_origins, "origin", parse_allowed_origin);
        let origins = LOCAL_ORIGINS
            .iter()
            .filter_map(|o| parse_allowed_origin(o))
            .chain(explicit.iter().cloned())
            .collect();
        HostPolicy {
            hosts,
            origins,
            explicit,
        }
    }

    /// Checks a request that changes state (after [`HostPolicy::check`]
    /// passed): refused when the browser calls it `cross-site`, or when
    /// its `Origin` is neither this server (the `Host` it was sent to) nor
    /// allowed explicitly. Without `Origin` and `Sec-Fetch-Site` (not a
    /// browser) it passes.
    #[cfg_attr(not(feature = "local"), allow(dead_code))]
    pub(crate) fn check_write(
        &self,
        host: &[u8],
        origin: Option<&[u8]>,
        fetch_site: Option<&[u8]>,
    ) -> Result<(), Refusal> {
        let shown = |v: &[u8]| {
            String::from_utf8_lossy(v)
                .chars()
                .take(200)
                .collect::<String>()
        };
        let parsed = origin.map(|o| std::str::from_utf8(o).ok().and_then(parse_origin));
        if let Some(Some(o)) = &parsed
            && allowed(&self.explicit, o)
        {
            return Ok(());
        }
        if fetch_site.is_some_and(|v| v.trim_ascii().eq_ignore_ascii_case(b"cross-site")) {
            return Err(Refusal::CrossSiteWrite(match origin {
                Some(o) => format!("Origin {:?}", shown(o)),
                None => "another site".to_owned(),
            }));
        }
        let Some(origin) = origin else {
            return Ok(());
        };
        let own = std::str::from_utf8(host).ok().and_then(parse_authority);
        let same = match (parsed.flatten(), own) {
            (Some(o), Some(h)) => {
                let port = |scheme: &str, p: Option<u16>| p.or_else(|| default_port(scheme));
                // This server speaks plain HTTP.
                o.scheme == "http"
                    && o.host == h.host
                    && port(&o.scheme, o.port).is_some()
                    && port(&o.scheme, o.port) == port(&o.scheme, h.port)
            }
            _ => false,
        };
        if same {
            Ok(())
        } else {
            Err(Refusal::CrossSiteWrite(format!(
                "Origin {:?}",
                shown(origin)
            )))
        }
    }

    /// Checks a request's `Host` (or HTTP/2 authority) and `Origin` values.
    pub(crate) fn check(&self, host: Option<&[u8]>, origin: Option<&[u8]>) -> Result<(), Refusal> {
        let host = host.ok_or(Refusal::MissingHost)?;
        check_value(
            host,
            parse_authority,
            |h| self.host_allowed(h),
            Refusal::ForeignHost,
        )?;
        match origin {
            Some(origin) => check_value(
                origin,
                parse_origin,
                |o| self.origin_allowed(o),
                Refusal::ForeignOrigin,
            ),
            None => Ok(()),
        }
    }

    /// Checks a whole request: every authority it names (its `Host`
    /// header and its target's authority, HTTP/2 `:authority` included),
    /// at least one, and its `Origin` (see the module docs).
    pub(crate) fn check_request(
        &self,
        uri: &http::Uri,
        headers: &http::HeaderMap,
    ) -> Result<(), Refusal> {
        let mut hosts = headers.get_all(http::header::HOST).iter();
        let host = hosts.next().map(http::HeaderValue::as_bytes);
        if hosts.next().is_some() {
            return Err(Refusal::RepeatedHost);
        }
        let origin = headers
            .get(http::header::ORIGIN)
            .map(http::HeaderValue::as_bytes);
        let target = uri.authority().map(|a| a.as_str().as_bytes());
        match (host, target) {
            (Some(host), Some(target)) => {
                self.check(Some(target), None)?;
                self.check(Some(host), origin)
            }
            (host, target) => self.check(host.or(target), origin),
        }
    }

    /// The host a request is addressed to, as [`HostPolicy::check_request`]
    /// reads it: its `Host` header, else its target's authority.
    #[cfg_attr(not(feature = "local"), allow(dead_code))]
    pub(crate) fn request_host<'a>(
        uri: &'a http::Uri,
        headers: &'a http::HeaderMap,
    ) -> Option<&'a [u8]> {
        headers
            .get(http::header::HOST)
            .map(http::HeaderValue::as_bytes)
            .or_else(|| uri.authority().map(|a| a.as_str().as_bytes()))
    }

    fn host_allowed(&self, host: &Authority) -> bool {
        self.hosts
            .iter()
            .any(|a| a.host == host.host && a.port.is_none_or(|p| host.port == Some(p)))
    }

    fn origin_allowed(&self, origin: &Origin) -> bool {
        allowed(&self.origins, origin)
    }
}

/// Whether `origin` is one of `list`.
fn allowed(list: &[AllowedOrigin], origin: &Origin) -> bool {
    list.iter().any(|a| {
        a.scheme == origin.scheme
            && a.host == origin.host
            && match a.port {
                Port::Any => true,
                Port::Exact(p) => origin.port.or_else(|| default_port(&origin.scheme)) == Some(p),
            }
    })
}

/// A host name as compared: without brackets, case, or one trailing dot.
fn normalize_host(host: &str) -> String {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// Checks one header value: it must parse and be allowed; otherwise it is
/// `refused`, naming what was sent (its first 200 characters).
fn check_value<T>(
    value: &[u8],
    parse: impl FnOnce(&str) -> Option<T>,
    is_allowed: impl FnOnce(&T) -> bool,
    refused: fn(String) -> Refusal,
) -> Result<(), Refusal> {
    match std::str::from_utf8(value).ok().and_then(parse) {
        Some(parsed) if is_allowed(&parsed) => Ok(()),
        _ => Err(refused(
            String::from_utf8_lossy(value).chars().take(200).collect(),
        )),
    }
}

/// `host[:port]` as sent in a `Host` header.
fn parse_authority(value: &str) -> Option<Authority> {
    let value = value.trim();
    if value.is_empty() || value.contains('@') {
        return None;
    }
    let authority = http::uri::Authority::try_from(value).ok()?;
    Some(Authority {
        host: normalize_host(authority.host()),
        port: authority.port_u16(),
    })
}

/// The entries of `values` that `parse` reads; each other one is left out
/// with a warning naming it as an allowed `what` (host or origin).
fn parse_each<T>(values: &[String], what: &str, parse: impl Fn(&str) -> Option<T>) -> Vec<T> {
    values
        .iter()
        .filter_map(|value| {
            let parsed = parse(value);
            if parsed.is_none() {
                tracing::warn!(%value, "ignoring an unparsable allowed {what}");
            }
            parsed
        })
        .collect()
}

/// An allowed host: `name`, `name:port`, an IP, or a bare IPv6 address.
fn parse_allowed_host(value: &str) -> Option<Authority> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if let Ok(ip) = value.parse::<std::net::IpAddr>() {
        return Some(Authority {
            host: normalize_host(&ip.to_string()),
            port: None,
        });
    }
    parse_authority(value)
}

/// `scheme://host[:port]` as sent in an `Origin` header (`null` is never allowed).
fn parse_origin(value: &str) -> Option<Origin> {
    let uri = http::Uri::try_from(value.trim()).ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = uri.authority()?;
    if authority.as_str().contains('@') {
        return None;
    }
    Some(Origin {
        scheme,
        host: normalize_host(authority.host()),
        port: authority.port_u16(),
    })
}

/// `scheme://host:port`, or `scheme://host:*` for any port; without a port,
/// the scheme's default port.
fn parse_allowed_origin(value: &str) -> Option<AllowedOrigin> {
    let value = value.trim().trim_end_matches('/');
    if let Some(base) = value.strip_suffix(":*") {
        let o = parse_origin(base)?;
        if o.port.is_some() {
            return None;
        }
        return Some(AllowedOrigin {
            scheme: o.scheme,
            host: o.host,
            port: Port::Any,
        });
    }
    let o = parse_origin(value)?;
    let port = o.port.or_else(|| default_port(&o.scheme))?;
    Some(AllowedOrigin {
        scheme: o.scheme,
        host: o.host,
        port: Port::Exact(port),
    })
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(hosts: &[&str], origins: &[&str]) -> HostPolicy {
        let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        HostPolicy::new(
            SocketAddr::from(([127, 0, 0, 1], 8808)),
            &own(hosts),
            &own(origins),
        )
    }

    fn check(p: &HostPolicy, host: Option<&str>, origin: Option<&str>) -> Result<(), Refusal> {
        p.check(host.map(str::as_bytes), origin.map(str::as_bytes))
    }

    #[test]
    fn loopback_hosts_pass_and_foreign_ones_are_refused() {
        let p = policy(&[], &[]);
        for ok in [
            "127.0.0.1:8808",
            "localhost",
            "LOCALHOST:1",
            "[::1]:8808",
            "localhost.",
        ] {
            assert_eq!(check(&p, Some(ok), None), Ok(()), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8808",
            "127.0.0.1.evil.example",
            "user@127.0.0.1",
            "",
            "10.0.0.1",
        ] {
            assert!(
                matches!(check(&p, Some(bad), None), Err(Refusal::ForeignHost(_))),
                "{bad}"
            );
        }
        assert_eq!(check(&p, None, None), Err(Refusal::MissingHost));
    }

    fn request(target: &str, hosts: &[&str], origin: Option<&str>) -> (http::Uri, http::HeaderMap) {
        let mut headers = http::HeaderMap::new();
        for host in hosts {
            headers.append(http::header::HOST, host.parse().unwrap());
        }
        if let Some(origin) = origin {
            headers.insert(http::header::ORIGIN, origin.parse().unwrap());
        }
        (target.parse().unwrap(), headers)
    }

    /// Catches a request that escapes the rule by naming no `Host` (HTTP/1.0,
    /// or HTTP/2 where only `:authority` is sent) or by naming two.
    #[test]
    fn every_authority_a_request_names_is_checked_and_one_is_needed() {
        let p = policy(&[], &[]);
        let check = |target: &str, hosts: &[&str], origin: Option<&str>| {
            let (uri, headers) = request(target, hosts, origin);
            p.check_request(&uri, &headers)
        };
        // HTTP/1.1: the Host header.
        assert_eq!(check("/mcp", &["localhost:8808"], None), Ok(()));
        // HTTP/2: the authority of the target, with no Host header.
        assert_eq!(check("http://127.0.0.1:8808/metrics", &[], None), Ok(()));
        assert!(matches!(
            check("http://evil.example/metrics", &[], None),
            Err(Refusal::ForeignHost(_))
        ));
        // Neither (HTTP/1.0 without Host): refused.
        assert_eq!(check("/readyz", &[], None), Err(Refusal::MissingHost));
        // Both: each must be served.
        assert!(check("http://evil.example/mcp", &["localhost"], None).is_err());
        assert!(check("http://localhost/mcp", &["evil.example"], None).is_err());
        assert_eq!(
            check("/mcp", &["localhost", "evil.example"], None),
            Err(Refusal::RepeatedHost)
        );
        // The origin is checked on every version.
        assert!(matches!(
            check("http://localhost/mcp", &[], Some("https://evil.example")),
            Err(Refusal::ForeignOrigin(_))
        ));
        assert_eq!(
            check("http://localhost/mcp", &[], Some("http://localhost:3000")),
            Ok(())
        );
    }

    #[test]
    fn a_trailing_dot_names_the_same_host() {
        let p = policy(&["mcp.example"], &["https://app.example"]);
        for host in ["localhost.", "mcp.example.", "MCP.Example.:9"] {
            assert_eq!(check(&p, Some(host), None), Ok(()), "{host}");
        }
        assert_eq!(
            check(&p, Some("localhost"), Some("https://app.example.")),
            Ok(())
        );
        assert!(check(&p, Some("evil.example."), None).is_err());
        assert!(check(&p, Some("localhost.."), None).is_err());
    }

    #[test]
    fn the_bound_address_and_allowed_hosts_pass() {
        let p = HostPolicy::new(
            SocketAddr::from(([192, 168, 1, 5], 80)),
            &["nexus.lan:8808".to_owned(), "box".to_owned()],
            &[],
        );
        assert_eq!(check(&p, Some("192.168.1.5"), None), Ok(()));
        assert_eq!(check(&p, Some("nexus.lan:8808"), None), Ok(()));
        assert!(check(&p, Some("nexus.lan:9"), None).is_err());
        assert_eq!(check(&p, Some("box:1234"), None), Ok(()));
        let any = HostPolicy::new(SocketAddr::from(([0, 0, 0, 0], 80)), &[], &[]);
        assert!(check(&any, Some("0.0.0.0"), None).is_err());
    }

    #[test]
    fn origins_must_be_local_or_allowed() {
        let p = policy(&[], &["https://app.example:443", "http://tool.example:*"]);
        for ok in [
            "http://localhost:3000",
            "https://127.0.0.1",
            "http://[::1]:9",
            "https://app.example",
            "https://app.example:443",
            "http://tool.example:1",
        ] {
            assert_eq!(check(&p, Some("localhost"), Some(ok)), Ok(()), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "null",
            "https://app.example:8443",
            "http://app.example",
            "http://localhost.evil.example",
            "file://",
            "",
        ] {
            assert!(
                matches!(
                    check(&p, Some("localhost"), Some(bad)),
                    Err(Refusal::ForeignOrigin(_))
                ),
                "{bad}"
            );
        }
    }

    /// Catches writes trusted from any local page or from a browser that
    /// says the request is cross-site.
    #[test]
    fn writes_come_only_from_this_server_or_allowed_origins() {
        let p = policy(&[], &["https://app.example:443"]);
        let write = |host: &str, origin: Option<&str>, site: Option<&str>| {
            p.check_write(
                host.as_bytes(),
                origin.map(str::as_bytes),
                site.map(str::as_bytes),
            )
        };
        assert_eq!(write("127.0.0.1:8808", None, None), Ok(()));
        assert_eq!(
            write("127.0.0.1:8808", Some("http://127.0.0.1:8808"), None),
            Ok(())
        );
        assert_eq!(
            write("localhost", Some("http://localhost"), Some("same-origin")),
            Ok(())
        );
        assert_eq!(
            write(
                "127.0.0.1:8808",
                Some("https://app.example"),
                Some("cross-site")
            ),
            Ok(())
        );
        for (origin, site) in [
            (Some("http://localhost:3000"), None),
            (Some("http://127.0.0.1:3000"), Some("same-site")),
            (Some("http://localhost:8808"), None),
            (Some("https://127.0.0.1:8808"), None),
            (Some("null"), None),
            (None, Some("cross-site")),
            (Some("http://127.0.0.1:8808"), Some("cross-site")),
        ] {
            assert!(
                matches!(
                    write("127.0.0.1:8808", origin, site),
                    Err(Refusal::CrossSiteWrite(_))
                ),
                "{origin:?} {site:?}"
            );
        }
    }

    #[test]
    fn refusals_name_the_flag_that_allows_more() {
        assert!(
            Refusal::ForeignHost("x".into())
                .to_string()
                .contains("--allow-host")
        );
        assert!(
            Refusal::ForeignOrigin("x".into())
                .to_string()
                .contains("--allow-origin")
        );
    }
}
