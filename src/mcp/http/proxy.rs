//! Trusted reverse proxies: the real client of a request that a trusted
//! proxy forwarded, from its `Forwarded` or `X-Forwarded-For` header.
//!
//! Headers are read only when the connection comes from a trusted proxy;
//! from anyone else they are ignored (anyone can write them). The list is
//! read from the right: each hop that is itself a trusted proxy is passed,
//! and the first one that is not is the client. A hop that is not an
//! address (`unknown`, an obfuscated name, garbage) ends the walk at the
//! last trusted hop, so a client cannot name itself someone else by
//! writing the header: the proxies append what they saw.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use http::HeaderMap;

/// A trusted proxy's network: an address and a prefix length
/// (`10.0.0.0/8`, `2001:db8::/32`, or one address).
///
/// ```
/// use nexus_knowql::mcp::http::TrustedProxy;
/// let nginx: TrustedProxy = "10.0.0.0/8".parse().unwrap();
/// assert!(nginx.contains("10.1.2.3".parse().unwrap()));
/// assert!(!nginx.contains("192.168.0.1".parse().unwrap()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrustedProxy {
    network: IpAddr,
    prefix: u8,
}

/// Why a `--trusted-proxy` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an address or CIDR network (like 10.0.0.0/8 or 2001:db8::/32): {0}")]
pub struct TrustedProxyError(String);

impl FromStr for TrustedProxy {
    type Err = TrustedProxyError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let refused = || TrustedProxyError(text.to_owned());
        let (address, prefix) = match text.trim().split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text.trim(), None),
        };
        let network: IpAddr = address.parse().map_err(|_| refused())?;
        let bits = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(prefix) => prefix.parse::<u8>().map_err(|_| refused())?,
            None => bits,
        };
        if prefix > bits {
            return Err(refused());
        }
        Ok(TrustedProxy { network, prefix })
    }
}

impl TrustedProxy {
    /// Whether `ip` is in this network (an IPv4-mapped IPv6 address as its
    /// IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => same_prefix(
                u128::from(u32::from(net)),
                u128::from(u32::from(ip)),
                32,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                same_prefix(u128::from(net), u128::from(ip), 128, self.prefix)
            }
            _ => false,
        }
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `a` and `b`, numbers of `bits` bits, agree on their first
/// `prefix` bits.
fn same_prefix(a: u128, b: u128, bits: u32, prefix: u8) -> bool {
    let host_bits = bits.saturating_sub(u32::from(prefix));
    a.checked_shr(host_bits).unwrap_or(0) == b.checked_shr(host_bits).unwrap_or(0)
}

/// The client a request comes from: `peer`, or, when `peer` is a trusted
/// proxy, the client its forwarding headers name (see the module docs).
pub(super) fn real_client(
    peer: Option<SocketAddr>,
    headers: &HeaderMap,
    trusted: &[TrustedProxy],
) -> Option<SocketAddr> {
    let peer = peer?;
    let is_trusted = |ip: IpAddr| trusted.iter().any(|t| t.contains(ip));
    if trusted.is_empty() || !is_trusted(peer.ip()) {
        return Some(peer);
    }
    let hops = forwarded_for(headers);
    let mut client = peer.ip();
    for hop in hops.iter().rev() {
        let Some(ip) = hop else {
            break;
        };
        client = *ip;
        if !is_trusted(*ip) {
            break;
        }
    }
    Some(SocketAddr::new(canonical(client), 0))
}

/// The hops of `Forwarded` (RFC 7239 `for=`), or else of
/// `X-Forwarded-For`, in order; `None` for a hop that is not an address.
fn forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let values = |name: http::header::HeaderName| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().map(str::to_owned).unwrap_or_default())
            .collect()
    };
    let forwarded = values(http::header::FORWARDED);
    if !forwarded.is_empty() {
        return forwarded
            .iter()
            .flat_map(|v| v.split(','))
            .map(|element| {
                element
                    .split(';')
                    .filter_map(|pair| pair.trim().split_once('='))
                    .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
                    .and_then(|(_, value)| node_address(value))
            })
            .collect();
    }
    values(http::header::HeaderName::from_static("x-forwarded-for"))
        .iter()
        .flat_map(|v| v.split(','))
        .map(node_address)
        .collect()
}

/// The address of one hop: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`,
/// `[2001:db8::1]:80`, each perhaps quoted.
fn node_address(value: &str) -> Option<IpAddr> {
    let value = value.trim().trim_matches('"');
    if let Ok(ip) = value.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(socket) = value.parse::<SocketAddr>() {
        return Some(socket.ip());
    }
    let bracketed = value.strip_prefix('[')?;
    bracketed.split(']').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    fn trusted() -> Vec<TrustedProxy> {
        vec!["10.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()]
    }

    fn client(peer: &str, pairs: &[(&'static str, &str)]) -> IpAddr {
        real_client(Some(peer.parse().unwrap()), &headers(pairs), &trusted())
            .unwrap()
            .ip()
    }

    /// Asserts the client seen from `peer` through `pairs` is `expected`.
    #[track_caller]
    fn assert_client(peer: &str, pairs: &[(&'static str, &str)], expected: &str) {
        assert_eq!(client(peer, pairs), expected.parse::<IpAddr>().unwrap());
    }

    #[test]
    fn cidrs_parse_and_match() {
        let v4: TrustedProxy = "192.168.1.0/24".parse().unwrap();
        assert!(v4.contains("192.168.1.200".parse().unwrap()));
        assert!(!v4.contains("192.168.2.1".parse().unwrap()));
        assert!(v4.contains("::ffff:192.168.1.7".parse().unwrap()));
        let v6: TrustedProxy = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains("2001:db8:ffff::1".parse().unwrap()));
        assert!(!v6.contains("2001:db9::1".parse().unwrap()));
        let all: TrustedProxy = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        for bad in ["10.0.0.0/33", "::/129", "nginx", "10.0.0.0/x", ""] {
            assert!(bad.parse::<TrustedProxy>().is_err(), "{bad}");
        }
    }

    #[test]
    fn headers_count_only_from_a_trusted_peer() {
        let xff = [("x-forwarded-for", "203.0.113.9")];
        assert_client("198.51.100.1:5000", &xff, "198.51.100.1");
        assert_client("10.0.0.2:5000", &xff, "203.0.113.9");
        assert_client("[::1]:5000", &xff, "203.0.113.9");
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client() {
        // A client that writes its own header cannot pick its address:
        // the trusted proxy appended what it saw.
        let spoofed = [("x-forwarded-for", "1.1.1.1, 203.0.113.9, 10.0.0.5")];
        assert_client("10.0.0.2:1", &spoofed, "203.0.113.9");
        let lines = [
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "203.0.113.9"),
        ];
        assert_client("10.0.0.2:1", &lines, "203.0.113.9");
        let forwarded = [(
            "forwarded",
            r#"for=1.1.1.1;proto=https, for="[2001:db8::7]:4711";by=10.0.0.2"#,
        )];
        assert_client("10.0.0.2:1", &forwarded, "2001:db8::7");
        // Forwarded wins over X-Forwarded-For.
        let both = [
            ("forwarded", "for=203.0.113.1"),
            ("x-forwarded-for", "203.0.113.2"),
        ];
        assert_client("10.0.0.2:1", &both, "203.0.113.1");
    }

    #[test]
    fn a_hop_that_is_not_an_address_ends_the_walk() {
        let unknown = [("forwarded", "for=203.0.113.1, for=unknown")];
        assert_client("10.0.0.2:1", &unknown, "10.0.0.2");
        let garbage = [("x-forwarded-for", "203.0.113.1, nonsense, 10.0.0.9")];
        assert_client("10.0.0.2:1", &garbage, "10.0.0.9");
        assert_client("10.0.0.2:1", &[], "10.0.0.2");
    }
}
