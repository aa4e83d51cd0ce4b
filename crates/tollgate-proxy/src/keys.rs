//! A route's limiting key: its parts as configured (`client_ip`, `header:NAME`,
//! `cookie:NAME`, `path`, joined with `+`), the client's address behind trusted
//! proxies, and the key of one request.

use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderName};
use ipnet::IpNet;

/// One part of a route's key.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyPart {
    /// The client's address ([`client_ip`]).
    ClientIp,
    /// A request header's value.
    Header(HeaderName),
    /// A cookie's value.
    Cookie(String),
    /// The request path.
    Path,
}

/// Parses a route's `key:` (`at` names the route, for errors).
pub fn parse(spec: &str, at: &str) -> anyhow::Result<Vec<KeyPart>> {
    spec.split('+')
        .map(|part| {
            let part = part.trim();
            Ok(match part.split_once(':') {
                None if part == "client_ip" => KeyPart::ClientIp,
                None if part == "path" => KeyPart::Path,
                Some(("header", name)) => KeyPart::Header(
                    HeaderName::from_bytes(name.trim().as_bytes())
                        .map_err(|_| anyhow::anyhow!("{at}.key: '{name}' is not a header name"))?,
                ),
                Some(("cookie", name)) if !name.trim().is_empty() => {
                    KeyPart::Cookie(name.trim().to_string())
                }
                _ => anyhow::bail!(
                    "{at}.key: unknown part '{part}' (expected client_ip, header:NAME, \
                     cookie:NAME or path, joined with +)"
                ),
            })
        })
        .collect()
}

/// A request's headers as keys read them: hyper's `HeaderMap`, or the header list the
/// HTTP/1.1 fast path parsed (no map built).
pub trait HeaderSource {
    /// Every value of the header `name` (lower-case), in order.
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a;

    /// Every header's name, in order (a name repeated as often as it is).
    fn names(&self) -> impl Iterator<Item = &str>;

    /// The first value of `name`, when it is text (visible ASCII, as
    /// `HeaderValue::to_str` accepts).
    fn first<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        self.values(name).next().and_then(text)
    }
}

impl HeaderSource for HeaderMap {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.get_all(name).into_iter().map(|v| v.as_bytes())
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.keys().map(|k| k.as_str())
    }
}

impl HeaderSource for [httparse::Header<'_>] {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.iter().map(|h| h.name)
    }
}

/// A header value as text: visible ASCII, spaces and tabs only.
pub fn text(value: &[u8]) -> Option<&str> {
    value
        .iter()
        .all(|&b| b == b'\t' || (b' '..=b'~').contains(&b))
        .then(|| std::str::from_utf8(value).ok())
        .flatten()
}

/// The client's address: the peer, or the rightmost `X-Forwarded-For` hop that is not
/// a trusted proxy when the peer is one (nginx's `real_ip_recursive`). An untrusted
/// peer's header is ignored, so a client cannot choose its own key.
pub fn client_ip(
    trusted: &[IpNet],
    peer: IpAddr,
    headers: &(impl HeaderSource + ?Sized),
) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops: Vec<IpAddr> = headers
        .values("x-forwarded-for")
        .filter_map(text)
        .flat_map(|v| v.split(','))
        .filter_map(|h| h.trim().parse().ok())
        .collect();
    hops.into_iter()
        .rev()
        .find(|ip| !is_trusted(ip))
        .unwrap_or(peer)
}

/// The key of a request: its parts' values joined with `+`, or empty when any part is
/// empty (as nginx, a request whose key is empty is not limited).
pub fn key(
    parts: &[KeyPart],
    trusted: &[IpNet],
    peer: IpAddr,
    path: &str,
    headers: &(impl HeaderSource + ?Sized),
) -> String {
    let mut values = Vec::with_capacity(parts.len());
    for part in parts {
        let v = match part {
            KeyPart::ClientIp => client_ip(trusted, peer, headers).to_string(),
            KeyPart::Path => path.to_string(),
            KeyPart::Header(h) => headers.first(h.as_str()).unwrap_or("").to_string(),
            KeyPart::Cookie(name) => headers
                .values("cookie")
                .filter_map(text)
                .flat_map(|v| v.split(';'))
                .filter_map(|c| c.trim().split_once('='))
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.to_string())
                .unwrap_or_default(),
        };
        if v.is_empty() {
            return String::new();
        }
        values.push(v);
    }
    if values.len() == 1 {
        return values.pop().unwrap_or_default();
    }
    values.join("+")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parts_parse_and_bad_parts_are_named() {
        assert_eq!(
            parse("client_ip + header:X-Api-Key+cookie:sid+path", "routes[0]").unwrap(),
            vec![
                KeyPart::ClientIp,
                KeyPart::Header(HeaderName::from_static("x-api-key")),
                KeyPart::Cookie("sid".into()),
                KeyPart::Path
            ]
        );
        let e = parse("client_ip+query:x", "routes[2]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("routes[2].key: unknown part 'query:x'"), "{e}");
        let e = parse("header:bad header", "r").unwrap_err().to_string();
        assert!(e.contains("'bad header' is not a header name"), "{e}");
        assert!(parse("cookie:", "r").is_err());
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_peers() {
        let trusted: Vec<IpNet> = vec![
            "127.0.0.1/32".parse().unwrap(),
            "10.0.0.0/8".parse().unwrap(),
        ];
        let xff = headers(&[("x-forwarded-for", "203.0.113.7, 198.51.100.2, 10.1.2.3")]);
        // An untrusted peer's header is ignored.
        assert_eq!(client_ip(&trusted, ip("192.0.2.1"), &xff), ip("192.0.2.1"));
        // From a trusted peer: the rightmost hop that is not a trusted proxy.
        assert_eq!(
            client_ip(&trusted, ip("127.0.0.1"), &xff),
            ip("198.51.100.2")
        );
        // Several headers are one list; garbage hops are skipped.
        let two = headers(&[
            ("x-forwarded-for", "203.0.113.7"),
            ("x-forwarded-for", "not-an-ip, 10.9.9.9"),
        ]);
        assert_eq!(client_ip(&trusted, ip("10.0.0.1"), &two), ip("203.0.113.7"));
        // Every hop trusted, or none: the peer.
        let inner = headers(&[("x-forwarded-for", "10.0.0.5")]);
        assert_eq!(client_ip(&trusted, ip("10.0.0.1"), &inner), ip("10.0.0.1"));
        assert_eq!(
            client_ip(&trusted, ip("10.0.0.1"), &HeaderMap::new()),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn a_key_joins_its_parts_and_an_empty_part_means_no_limit() {
        let parts = parse("header:x-api-key+cookie:sid+path", "r").unwrap();
        let h = headers(&[("x-api-key", "k1"), ("cookie", "a=1; sid=s9; b=2")]);
        assert_eq!(
            key(&parts, &[], ip("192.0.2.1"), "/api/x", &h),
            "k1+s9+/api/x"
        );
        let no_cookie = headers(&[("x-api-key", "k1"), ("cookie", "a=1")]);
        assert_eq!(key(&parts, &[], ip("192.0.2.1"), "/api/x", &no_cookie), "");
        let by_ip = parse("client_ip", "r").unwrap();
        assert_eq!(key(&by_ip, &[], ip("192.0.2.1"), "/", &h), "192.0.2.1");
    }
}
