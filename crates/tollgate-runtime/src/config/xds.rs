//! `xds:` rules from an xDS management server (an ADS stream, State of the World, of
//! envoyproxy/ratelimit's `RateLimitConfig` resources) instead of rule files.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// `xds:`. Rules come from the server named here, never from files as well.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XdsConfig {
    /// The server: `host:port`, `http://host:port` or `https://host:port` (`https`,
    /// or a `tls:` section, is TLS).
    pub server: String,
    /// The node id the server keys its snapshots by (default `default`, as
    /// envoyproxy/ratelimit's; Envoy Gateway uses `envoy-ratelimit`).
    #[serde(default = "default_node_id")]
    pub node_id: String,
    /// Node metadata (string values) sent with every request.
    #[serde(default)]
    pub node_metadata: BTreeMap<String, String>,
    /// gRPC metadata added to the stream (for a server behind an authenticating
    /// proxy).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// TLS to the server.
    #[serde(default)]
    pub tls: Option<XdsTls>,
    /// How long a connection attempt may take (default 3s).
    #[serde(
        default = "default_connect_timeout",
        deserialize_with = "super::duration_us"
    )]
    pub connect_timeout: u64,
    /// The first wait before connecting again once the stream ends (default 1s); it
    /// doubles up to `backoff_max`, with up to half of it random, and starts over
    /// once a version arrives.
    #[serde(
        default = "default_backoff_initial",
        deserialize_with = "super::duration_us"
    )]
    pub backoff_initial: u64,
    /// The longest wait between attempts (default 30s).
    #[serde(
        default = "default_backoff_max",
        deserialize_with = "super::duration_us"
    )]
    pub backoff_max: u64,
    /// The largest message taken from the server (default 4 MiB, gRPC's).
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// Serve before the first version arrives (envoyproxy/ratelimit's
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`): decisions fail as unavailable until then,
    /// and `/healthcheck` says OK unless `healthy_only_with_rules`. Without it,
    /// `/healthcheck` fails until the first version is in force.
    #[serde(default)]
    pub start_without_rules: bool,
    /// `/healthcheck` fails while no version with at least one domain is in force
    /// (envoyproxy/ratelimit's `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    #[serde(default)]
    pub healthy_only_with_rules: bool,
}

/// `xds.tls:` TLS to the xDS server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XdsTls {
    /// CA certificates (PEM) the server's certificate must chain to (default: the
    /// system's).
    pub ca_file: Option<PathBuf>,
    /// A client certificate chain (PEM), for a server that asks for one.
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    pub key_file: Option<PathBuf>,
    /// The name the server's certificate must carry (default: the host of
    /// `server`); envoyproxy/ratelimit's `CONFIG_GRPC_XDS_SERVER_TLS_SAN`.
    pub server_name: Option<String>,
}

fn default_node_id() -> String {
    "default".into()
}
fn default_connect_timeout() -> u64 {
    3_000_000
}
fn default_backoff_initial() -> u64 {
    1_000_000
}
fn default_backoff_max() -> u64 {
    30_000_000
}
fn default_max_message_bytes() -> usize {
    4 << 20
}

impl XdsConfig {
    /// A config for `server` with every default.
    pub fn new(server: impl Into<String>) -> Self {
        XdsConfig {
            server: server.into(),
            node_id: default_node_id(),
            node_metadata: BTreeMap::new(),
            headers: BTreeMap::new(),
            tls: None,
            connect_timeout: default_connect_timeout(),
            backoff_initial: default_backoff_initial(),
            backoff_max: default_backoff_max(),
            max_message_bytes: default_max_message_bytes(),
            start_without_rules: false,
            healthy_only_with_rules: false,
        }
    }

    /// The server's address split: (TLS, host, port). Errors name `xds.server`.
    pub fn endpoint(&self) -> anyhow::Result<(bool, String, u16)> {
        let s = self.server.trim();
        let bad = |why: &str| anyhow::anyhow!("xds.server {s:?}: {why}");
        let (scheme_tls, rest) = match s.split_once("://") {
            Some(("http", rest)) => (false, rest),
            Some(("https", rest)) => (true, rest),
            Some((scheme, _)) => {
                return Err(bad(&format!("unknown scheme {scheme:?} (http or https)")))
            }
            None => (false, s),
        };
        let rest = rest.trim_end_matches('/');
        if rest.contains('/') {
            return Err(bad("a path is not allowed (host:port)"));
        }
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| bad("needs host:port"))?;
        let host = host.trim_matches(['[', ']']);
        if host.is_empty() {
            return Err(bad("the host is empty"));
        }
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad(&format!("{port:?} is not a port")))?;
        Ok((scheme_tls || self.tls.is_some(), host.to_string(), port))
    }

    /// Checks what can be checked before connecting: the address, the backoff, the
    /// TLS files' pairing (their contents are read at each connection, so that a
    /// rotated certificate is used at the next one).
    pub fn validate(&self) -> anyhow::Result<()> {
        self.endpoint()?;
        if self.node_id.is_empty() {
            anyhow::bail!("xds.node_id: must not be empty");
        }
        if self.backoff_max < self.backoff_initial {
            anyhow::bail!("xds.backoff_max: shorter than xds.backoff_initial");
        }
        if self.max_message_bytes < 1024 {
            anyhow::bail!("xds.max_message_bytes: at least 1024");
        }
        for (name, value) in &self.headers {
            let reserved = name.starts_with("grpc-")
                || name.starts_with(':')
                || matches!(name.as_str(), "te" | "content-type" | "user-agent" | "host");
            let ascii =
                tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(name.as_bytes());
            // The value is not printed: it may be a credential.
            if reserved
                || ascii.is_err()
                || value
                    .parse::<tonic::metadata::AsciiMetadataValue>()
                    .is_err()
            {
                anyhow::bail!(
                    "xds.headers: {name:?} cannot be sent (a reserved or binary name, or a value that is not printable ASCII)"
                );
            }
        }
        if let Some(tls) = &self.tls {
            if tls.cert_file.is_some() != tls.key_file.is_some() {
                anyhow::bail!("xds.tls: cert_file and key_file go together (a client certificate and its key)");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses_parse_and_bad_ones_are_named() {
        let ok = |s: &str| XdsConfig::new(s).endpoint().unwrap();
        assert_eq!(
            ok("envoy-gateway:18001"),
            (false, "envoy-gateway".into(), 18001)
        );
        assert_eq!(ok("https://10.0.0.1:443/"), (true, "10.0.0.1".into(), 443));
        assert_eq!(ok("http://[::1]:18000"), (false, "::1".into(), 18000));
        for (bad, why) in [
            ("envoy-gateway", "needs host:port"),
            ("grpc://h:1", "unknown scheme"),
            (":18000", "the host is empty"),
            ("h:port", "is not a port"),
            ("h:0", "is not a port"),
            ("h:1/x", "a path"),
        ] {
            let e = XdsConfig::new(bad).validate().unwrap_err().to_string();
            assert!(e.contains("xds.server") && e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn tls_and_backoff_are_checked() {
        let mut c = XdsConfig::new("h:1");
        c.tls = Some(XdsTls {
            cert_file: Some("c.pem".into()),
            ..Default::default()
        });
        assert!(c.endpoint().unwrap().0, "a tls section is TLS");
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("cert_file and key_file"), "{e}");
        let mut c = XdsConfig::new("h:1");
        c.backoff_max = 1;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("backoff_max"));
    }
}
