//! The main configuration file (`--config FILE`, YAML) that `serve` and `proxy` read:
//! its types, defaults and validation. Nothing here binds a port; the `store:`
//! section also knows how to connect ([`store::StoreConfig::connect`]).

pub mod proxy;
pub mod store;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;
use tollgate::{KeyedOptions, OnFull};

/// The default HTTP listener (Envoy's ratelimit service uses 8080 too).
pub const DEFAULT_HTTP: &str = "127.0.0.1:8080";
/// The default gRPC listener (Envoy's ratelimit service uses 8081 too).
pub const DEFAULT_GRPC: &str = "127.0.0.1:8081";

/// The main configuration file (YAML). Every field is optional; flags override it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MainConfig {
    /// Listeners.
    #[serde(default)]
    pub listen: Listen,
    /// Rule files or directories.
    #[serde(default)]
    pub rules: Vec<PathBuf>,
    /// Where counters live.
    #[serde(default)]
    pub store: store::StoreConfig,
    /// Memory bounds.
    #[serde(default)]
    pub keys: Keys,
    /// Bounds on one decision request.
    #[serde(default)]
    pub requests: Requests,
    /// Admin endpoints.
    #[serde(default)]
    pub admin: Admin,
    /// The limiting reverse proxy (`tollgate proxy`).
    #[serde(default)]
    pub proxy: Option<proxy::ProxyConfig>,
}

/// `admin:`. Admin endpoints (`/v1/reset`, `/v1/reload`) need `Authorization: Bearer
/// TOKEN` when a token is set (here or in `TOLLGATE_ADMIN_TOKEN`); without one they
/// answer only on a loopback listener.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    /// The bearer token.
    pub token: Option<String>,
}

/// `listen:` addresses.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listen {
    /// The HTTP/JSON API address.
    pub http: Option<SocketAddr>,
    /// The Envoy RLS gRPC address.
    pub grpc: Option<SocketAddr>,
}

/// `keys:` memory bounds per rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Keys {
    /// The most counters one rule keeps (default 1,000,000).
    #[serde(default = "default_max_keys")]
    pub max: usize,
    /// `evict` (least recently active, the default) or `refuse` new keys when full.
    #[serde(default)]
    pub on_full: OnFullDoc,
}

impl Default for Keys {
    fn default() -> Self {
        Keys {
            max: default_max_keys(),
            on_full: OnFullDoc::Evict,
        }
    }
}

fn default_max_keys() -> usize {
    1_000_000
}

/// `requests:` bounds on one decision request (HTTP or gRPC), so that a hostile client
/// cannot make a request cost more than a few ordinary ones or store huge keys.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requests {
    /// The most descriptors one request may carry (default 256; Envoy sends a few).
    #[serde(default = "default_max_descriptors")]
    pub max_descriptors: usize,
    /// The longest key one descriptor may make, in bytes: its domain and entries'
    /// keys and values together (default 1024). Counters are kept per key, so this
    /// bounds the memory a key can take.
    #[serde(default = "default_max_key_bytes")]
    pub max_key_bytes: usize,
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            max_descriptors: default_max_descriptors(),
            max_key_bytes: default_max_key_bytes(),
        }
    }
}

fn default_max_descriptors() -> usize {
    256
}

fn default_max_key_bytes() -> usize {
    1024
}

/// `keys.on_full`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFullDoc {
    /// Evict the least recently active keys.
    #[default]
    Evict,
    /// Refuse new keys (their requests are over the limit).
    Refuse,
}

impl MainConfig {
    /// Reads and validates a main configuration file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        // Rule paths are relative to the config file.
        let base = path.parent().unwrap_or(Path::new("."));
        MainConfig::parse(&text, base).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Parses and validates a main configuration's text; rule paths are taken
    /// relative to `base`.
    pub fn parse(text: &str, base: &Path) -> anyhow::Result<Self> {
        let config: MainConfig = serde_yaml_ng::from_str(text)?;
        Ok(MainConfig {
            rules: config.rules.iter().map(|r| base.join(r)).collect(),
            ..config
        })
    }

    /// The keyed-limiter options.
    pub fn key_options(&self) -> KeyedOptions {
        KeyedOptions {
            max_keys: self.keys.max,
            on_full: match self.keys.on_full {
                OnFullDoc::Evict => OnFull::EvictLeastRecent,
                OnFullDoc::Refuse => OnFull::RefuseNew,
            },
        }
    }
}

/// A duration (`250ms`, `5s`, ...) in microseconds.
pub(crate) fn duration_opt<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u64>, D::Error> {
    let s = String::deserialize(d)?;
    tollgate::parse_duration(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// A duration on the command line (`250ms`, `10s`; the policy spec's syntax).
pub fn duration_arg(s: &str) -> Result<std::time::Duration, String> {
    tollgate::parse_duration(s).map(std::time::Duration::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_and_bad_values_are_named() {
        let e = serde_yaml_ng::from_str::<MainConfig>("store:\n  kind: redis\n  batchh: 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("batchh"), "{e}");
        let e = serde_yaml_ng::from_str::<MainConfig>("store:\n  timeout: soon\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("soon") || e.contains("duration"), "{e}");
        let e = serde_yaml_ng::from_str::<MainConfig>("keys:\n  on_full: drop\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("drop"), "{e}");
    }

    #[test]
    fn rule_paths_are_relative_to_the_config_file() {
        let dir = std::env::temp_dir().join(format!("tollgate-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("main.yaml");
        std::fs::write(
            &path,
            "rules: [rules/a.yaml]\nkeys: {max: 5, on_full: refuse}\n",
        )
        .unwrap();
        let config = MainConfig::load(&path).unwrap();
        assert_eq!(config.rules, vec![dir.join("rules/a.yaml")]);
        assert_eq!(config.key_options().max_keys, 5);
        assert_eq!(config.key_options().on_full, OnFull::RefuseNew);
        let missing = MainConfig::load(&dir.join("absent.yaml")).unwrap_err();
        assert!(missing.to_string().contains("absent.yaml"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
