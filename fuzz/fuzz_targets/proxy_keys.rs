//! The proxy's key extraction: any key spec parses or is refused; any headers
//! (X-Forwarded-For, Forwarded, cookies) give a key without panicking, and a peer
//! that is not a trusted proxy is never replaced by an address it forwards.
#![no_main]

use std::net::IpAddr;

use arbitrary::Arbitrary;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;
use tollgate_proxy::keys;

#[derive(Debug, Arbitrary)]
struct Input {
    spec: String,
    trusted: Vec<String>,
    peer: [u8; 4],
    path: String,
    headers: Vec<(u8, Vec<u8>)>,
}

const NAMES: [&str; 5] = [
    "x-forwarded-for",
    "forwarded",
    "cookie",
    "x-api-key",
    "host",
];

fuzz_target!(|input: Input| {
    let parts = keys::parse(&input.spec, "proxy.routes[0]");
    let trusted: Vec<IpNet> = input
        .trusted
        .iter()
        .filter_map(|t| t.parse().ok())
        .collect();
    let peer = IpAddr::from(input.peer);
    let mut headers = HeaderMap::new();
    for (name, value) in &input.headers {
        let name = HeaderName::from_static(NAMES[usize::from(*name) % NAMES.len()]);
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(name, value);
        }
    }
    let client = keys::client_ip(&trusted, peer, &headers);
    if !trusted.iter().any(|n| n.contains(&peer)) {
        assert_eq!(
            client, peer,
            "an untrusted peer's forwarded address was believed"
        );
    }
    if let Ok(parts) = parts {
        let _ = keys::key(&parts, &trusted, peer, &input.path, &headers);
    }
});
