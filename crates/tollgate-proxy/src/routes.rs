//! The route table: routes built from the `proxy:` section (validated, with their
//! limits), which route a request takes, and what a reload keeps.

use std::sync::Arc;
use std::time::Duration;
use tollgate_runtime::store_metrics::StoreStats;

use axum::http::uri::{Authority, PathAndQuery};
use axum::http::{HeaderValue, Uri};
use ipnet::IpNet;
use tollgate::keyed::KeyedOptions;

use super::adaptive::RouteAdaptive;
use super::keys::{self, KeyPart};
use super::limits::{RedisBackend, RouteLimits};
use super::route_stats::RouteStats;
use tollgate_runtime::config::proxy::{MatchConfig, ProxyConfig, RouteConfig};

/// One route, ready to serve.
pub(super) struct Route {
    /// As configured: a reload keeps a route (and its counters) whose config is equal.
    config: RouteConfig,
    /// The route's name (in errors, logs and Redis key names).
    pub name: String,
    matcher: MatchConfig,
    /// Where requests go: `http://host:port`, maybe with a path prefix.
    target: Target,
    /// What a request's limiting key is made of.
    pub key: Vec<KeyPart>,
    /// Its rate and concurrency limits.
    pub limits: RouteLimits,
    /// Its adaptive concurrency limit (`adaptive:`).
    pub adaptive: Option<RouteAdaptive>,
    /// Its answers by status and its upstream's times (kept across reloads with it).
    pub stats: RouteStats,
}

/// The routes and their limiters: shared by every worker thread, replaced whole on
/// a reload.
pub(super) struct RouteTable {
    routes: Vec<Arc<Route>>,
    /// Whose `X-Forwarded-For` is believed.
    pub trusted: Vec<IpNet>,
    /// The longest an upstream may take to answer.
    pub upstream_timeout: Duration,
    /// The Redis counts of the routes reloads took away, so that the totals never go
    /// back.
    pub retired: StoreStats,
}

impl RouteTable {
    /// Builds the routes; routes whose config equals one of `old`'s are taken over
    /// with their counters (a reload).
    pub fn new(
        config: ProxyConfig,
        options: KeyedOptions,
        old: Option<&RouteTable>,
        redis: Option<&RedisBackend>,
    ) -> anyhow::Result<Self> {
        if config.routes.is_empty() {
            anyhow::bail!("proxy.routes: at least one route is needed");
        }
        let routes = config
            .routes
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let old = old.map_or(&[][..], |o| &o.routes[..]);
                match old.iter().find(|x| x.config == r) {
                    Some(same) => Ok(same.clone()),
                    None => {
                        // A changed route keeps the learned adaptive limit of the
                        // route of its name when the limit's settings are unchanged.
                        let before = old.iter().find(|x| x.name == r.name);
                        let adaptive = before.and_then(|b| b.adaptive.as_ref());
                        let at = format!("proxy.routes[{i}]");
                        Route::build(r, &at, options, redis, adaptive).map(Arc::new)
                    }
                }
            })
            .collect::<anyhow::Result<Vec<Arc<Route>>>>()?;
        // Kept connections are found by the upstream's address (and the reading of
        // the TLS settings): two routes that name one https:// upstream must speak
        // TLS to it the same way.
        for (i, a) in routes.iter().enumerate() {
            let same = routes[..i].iter().find(|b| {
                b.target.https == a.target.https
                    && b.upstream().as_str() == a.upstream().as_str()
                    && b.config.upstream_tls != a.config.upstream_tls
            });
            if let Some(b) = same {
                anyhow::bail!(
                    "proxy.routes[{i}].upstream_tls: differs from route '{}''s for the same upstream {}: \
                     one upstream, one TLS setting",
                    b.name,
                    a.upstream()
                );
            }
        }
        let mut retired = old.map(|o| o.retired.clone()).unwrap_or_default();
        for gone in old.map_or(&[][..], |o| &o.routes[..]) {
            if !routes.iter().any(|r| Arc::ptr_eq(r, gone)) {
                gone.limits.add_redis_stats(&mut retired);
            }
        }
        retired.retired();
        Ok(RouteTable {
            routes,
            retired,
            trusted: config.trusted_proxies,
            upstream_timeout: Duration::from_micros(config.upstream_timeout.unwrap_or(30_000_000)),
        })
    }

    /// The routes, in order.
    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }

    /// How many routes there are.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// The first route that matches a request for `path` with the Host header `host`
    /// (its port is ignored).
    pub fn route_for(&self, host: Option<&str>, path: &str) -> Option<&Arc<Route>> {
        let host = host.map(|h| memchr::memchr(b':', h.as_bytes()).map_or(h, |c| &h[..c]));
        self.routes.iter().find(|r| {
            r.matcher.path.as_deref().is_none_or(|p| p == path)
                && r.matcher
                    .path_prefix
                    .as_deref()
                    .is_none_or(|p| path.starts_with(p))
                && r.matcher.host.as_deref().is_none_or(|h| Some(h) == host)
        })
    }
}

impl Route {
    /// Validates and builds route `r` (`at` names it in errors).
    fn build(
        r: RouteConfig,
        at: &str,
        options: KeyedOptions,
        redis: Option<&RedisBackend>,
        old_adaptive: Option<&RouteAdaptive>,
    ) -> anyhow::Result<Route> {
        let target = r
            .upstream
            .parse()
            .ok()
            .and_then(|u: Uri| Target::of(&u))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "{at}.upstream: '{}' is not an http://host:port or https://host:port URL",
                    r.upstream
                )
            })?;
        let target = target.with_tls(r.upstream_tls.as_ref(), at)?;
        Ok(Route {
            key: keys::parse(&r.key, at)?,
            limits: RouteLimits::build(&r, at, options, redis)?,
            adaptive: RouteAdaptive::build(&r, at, old_adaptive)?,
            stats: RouteStats::default(),
            name: r.name.clone(),
            matcher: r.matcher.clone(),
            target,
            config: r,
        })
    }
}

/// A route's upstream, split once: a request goes to its authority, with the
/// request's path and query after the upstream's path prefix.
struct Target {
    authority: Authority,
    /// `https://`: how to speak TLS to it (else `None`, plaintext).
    tls: Option<UpstreamTls>,
    /// Whether the URL said `https`.
    https: bool,
    /// `host[:port]`: the Host a request without one is sent with.
    host: HeaderValue,
    /// The upstream's path without its trailing `/`; `None` when that leaves nothing.
    prefix: Option<String>,
}

impl Target {
    /// The target of an `http://host:port[/prefix]` or `https://...` URL (its TLS
    /// still to be set: [`Target::with_tls`]); `None` for any other.
    fn of(uri: &Uri) -> Option<Target> {
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return None,
        };
        let prefix = uri.path().trim_end_matches('/');
        let authority = uri.authority()?;
        let host = match authority.port() {
            Some(port) => format!("{}:{port}", authority.host()),
            None => authority.host().to_string(),
        };
        Some(Target {
            host: HeaderValue::try_from(host).ok()?,
            authority: authority.clone(),
            prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
            tls: None,
            https,
        })
    }

    /// Reads the TLS files of an `https://` target (`upstream_tls`, else the system's
    /// CAs); `upstream_tls` beside `http://` is an error.
    fn with_tls(
        mut self,
        config: Option<&tollgate_runtime::config::proxy::UpstreamTlsConfig>,
        at: &str,
    ) -> anyhow::Result<Target> {
        if !self.https {
            if config.is_some() {
                anyhow::bail!("{at}.upstream_tls: the upstream is http://; TLS needs https://");
            }
            return Ok(self);
        }
        let files = config.cloned().unwrap_or_default();
        let setting = format!("{at}.upstream_tls");
        let identity = match (&files.cert_file, &files.key_file) {
            (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
            (None, None) => None,
            _ => anyhow::bail!("{setting}: cert_file and key_file go together"),
        };
        let config = tollgate_runtime::tls::ClientTls::load(
            &setting,
            files.ca_file.as_deref(),
            identity,
            &[b"http/1.1"],
        )?;
        let host = self.authority.host().trim_matches(['[', ']']).to_string();
        let name = files.server_name.unwrap_or(host);
        let server_name = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|_| {
            anyhow::anyhow!("{setting}.server_name {name:?}: not a DNS name or IP address")
        })?;
        static BUILT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        self.tls = Some(UpstreamTls {
            config,
            server_name,
            id: BUILT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        });
        Ok(self)
    }
}

/// How a route speaks TLS to its upstream.
#[derive(Clone)]
pub(super) struct UpstreamTls {
    /// rustls with the route's CAs and client certificate (the files followed).
    pub config: tollgate_runtime::tls::ClientTls,
    /// The name verified and sent as SNI.
    pub server_name: rustls::pki_types::ServerName<'static>,
    /// Which reading of the settings this is: kept connections are reused only by
    /// the same (a reload that changes a route's TLS starts new connections).
    pub id: u64,
}

impl Route {
    /// TLS to the upstream, for an `https://` one.
    pub fn upstream_tls(&self) -> Option<&UpstreamTls> {
        self.target.tls.as_ref()
    }

    /// The upstream's `host:port`.
    pub fn upstream(&self) -> &Authority {
        &self.target.authority
    }

    /// The Host header for a request that has none: the upstream's `host[:port]`.
    pub fn upstream_host(&self) -> &HeaderValue {
        &self.target.host
    }

    /// The upstream's path prefix (without its trailing `/`), written before a
    /// request's own path.
    pub fn upstream_prefix(&self) -> &str {
        self.target.prefix.as_deref().unwrap_or("")
    }

    /// The origin-form URI a request for `uri` is sent upstream with; `None` when the
    /// joined path is not a valid one.
    pub fn upstream_path(&self, uri: &Uri) -> Option<Uri> {
        let path_and_query = match (&self.target.prefix, uri.path_and_query()) {
            (None, Some(p)) => p.clone(),
            (None, None) => PathAndQuery::from_static("/"),
            (Some(prefix), p) => {
                let path = p.map_or("/", |p| p.as_str());
                format!("{prefix}{path}").parse().ok()?
            }
        };
        Some(Uri::from(path_and_query))
    }
}
