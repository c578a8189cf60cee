//! Browser and DNS-rebinding protection for a server on a developer's
//! machine: which `Host` and `Origin` values it answers.
//!
//! The rule is the MCP server's: the `Host` must name a loopback host, the
//! bound address or an allowed host (entries without a port match any port);
//! an `Origin`, when present, must be a local page (`localhost`,
//! `127.0.0.1`, `[::1]` on any port, http or https) or an allowed origin
//! (`scheme://host:port`, `:*` for any port). Requests without `Origin`
//! (non-browser clients) pass. Everything here is a pure function over the
//! header values and an allow-list, so any HTTP server can share it.

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
    /// The `Host` is malformed or not allowed.
    ForeignHost(String),
    /// The `Origin` is malformed or not allowed.
    ForeignOrigin(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::MissingHost => write!(f, "the request names no Host"),
            Refusal::ForeignHost(h) => write!(
                f,
                "Host {h:?} is not allowed (possible DNS rebinding); start the server with --allow-host to accept it"
            ),
            Refusal::ForeignOrigin(o) => write!(
                f,
                "Origin {o:?} is not allowed (cross-site request); start the server with --allow-origin to accept it"
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
        let hosts = raw_hosts
            .iter()
            .filter_map(|h| {
                let parsed = parse_allowed_host(h);
                if parsed.is_none() {
                    tracing::warn!(host = %h, "ignoring an unparsable allowed host");
                }
                parsed
            })
            .collect();
        let origins = LOCAL_ORIGINS
            .iter()
            .map(|o| (*o).to_owned())
            .chain(extra_origins.iter().cloned())
            .filter_map(|o| {
                let parsed = parse_allowed_origin(&o);
                if parsed.is_none() {
                    tracing::warn!(origin = %o, "ignoring an unparsable allowed origin");
                }
                parsed
            })
            .collect();
        HostPolicy { hosts, origins }
    }

    /// Checks a request's `Host` (or HTTP/2 authority) and `Origin` values.
    pub(crate) fn check(&self, host: Option<&[u8]>, origin: Option<&[u8]>) -> Result<(), Refusal> {
        let host = host.ok_or(Refusal::MissingHost)?;
        let shown = || String::from_utf8_lossy(host).chars().take(200).collect();
        let parsed = std::str::from_utf8(host)
            .ok()
            .and_then(parse_authority)
            .ok_or_else(|| Refusal::ForeignHost(shown()))?;
        if !self.host_allowed(&parsed) {
            return Err(Refusal::ForeignHost(shown()));
        }
        if let Some(origin) = origin {
            let shown = || String::from_utf8_lossy(origin).chars().take(200).collect();
            let parsed = std::str::from_utf8(origin)
                .ok()
                .and_then(parse_origin)
                .ok_or_else(|| Refusal::ForeignOrigin(shown()))?;
            if !self.origin_allowed(&parsed) {
                return Err(Refusal::ForeignOrigin(shown()));
            }
        }
        Ok(())
    }

    fn host_allowed(&self, host: &Authority) -> bool {
        self.hosts
            .iter()
            .any(|a| a.host == host.host && a.port.is_none_or(|p| host.port == Some(p)))
    }

    fn origin_allowed(&self, origin: &Origin) -> bool {
        self.origins.iter().any(|a| {
            a.scheme == origin.scheme
                && a.host == origin.host
                && match a.port {
                    Port::Any => true,
                    Port::Exact(p) => {
                        origin.port.or_else(|| default_port(&origin.scheme)) == Some(p)
                    }
                }
        })
    }
}

fn normalize_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
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
