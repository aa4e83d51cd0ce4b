//! `tollgate serve --envoy-env`: envoyproxy/ratelimit's environment settings, so that a
//! deployment written for it (its Kubernetes manifest, its docker-compose file) runs
//! tollgate unchanged. Each setting with a tollgate equivalent is applied to the main
//! config with the meaning docs/envoy.md gives it (after the file, before the flags);
//! one that would change what is served in a way tollgate cannot follow (unix
//! sockets, xDS, memcached) is an error naming it; the rest are listed in a
//! warning and ignored. Only variables that are set count: Envoy's defaults for unset
//! ones are tollgate's where it matters (ports 8080/8081, the near-limit ratio 0.8,
//! the header names).

use std::path::PathBuf;

use anyhow::bail;

use super::store::StoreKind;
use super::{HeaderStyle, MainConfig};
use crate::logging::LogFormat;

/// Settings read and ignored (named in one warning when set): they tune parts
/// tollgate does differently (statistics sinks, pools, jitter).
const IGNORED: &[&str] = &[
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "EXTRA_TAGS",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "REDIS_POOL_SIZE",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    "RESPONSE_DYNAMIC_METADATA",
];

/// Ignored settings whose value asks for what tollgate does anyway (Envoy Gateway
/// sets `USE_STATSD=false`): not worth a warning at every start.
const ALREADY_SO: &[(&str, &str)] = &[("USE_STATSD", "false"), ("USE_DOG_STATSD", "false")];

/// Settings tollgate cannot honour: serving without them would not be what the
/// deployment asked for, so they are refused when set to anything but their default.
const REFUSED: &[(&str, &str, &str)] = &[
    ("GRPC_UDS", "", "gRPC on a unix socket"),
    ("BACKEND_TYPE", "redis", "the memcached backend"),
    (
        "QUOTA_MODE",
        "false",
        "global quota mode (quota_mode per descriptor is kept)",
    ),
];

/// Applies the Envoy settings `get` finds to `main`; returns the warning to print
/// (settings set but ignored), if any.
pub fn apply(
    get: &dyn Fn(&str) -> Option<String>,
    main: &mut MainConfig,
) -> anyhow::Result<Option<String>> {
    for &(name, default, what) in REFUSED {
        if let Some(v) = get(name).filter(|v| !v.eq_ignore_ascii_case(default)) {
            bail!("--envoy-env: {name}={v}: {what} is not supported by tollgate");
        }
    }
    listeners_and_rules(get, main)?;
    xds(get, main)?;
    store(get, &mut main.store)?;
    answers(get, &mut main.service)?;
    traces(get, &mut main.traces)?;
    // These two speak of xDS rules only.
    let xds_only: &[&str] = match main.xds {
        Some(_) => &[],
        None => &[
            "FORCE_START_WITHOUT_INITIAL_CONFIG",
            "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        ],
    };
    let already_so = |n: &str, v: &str| {
        (ALREADY_SO.iter()).any(|(name, value)| *name == n && v.eq_ignore_ascii_case(value))
    };
    let ignored: Vec<&str> = (IGNORED.iter().chain(xds_only))
        .copied()
        .filter(|n| get(n).is_some_and(|v| !already_so(n, &v)))
        .collect();
    Ok((!ignored.is_empty()).then(|| {
        format!(
            "--envoy-env: ignored (tollgate does this its own way; see docs/envoy.md): {}",
            ignored.join(", ")
        )
    }))
}

/// `TRACING_*`: traces as envoyproxy/ratelimit exports them. Off unless
/// `TRACING_ENABLED` (an `OTEL_*` endpoint alone does not turn them on, as there; a
/// config file's `traces.enabled` still does); on, the service name (default
/// `RateLimit`), namespace and instance id (default a random one) are the
/// resource's, the protocol is `http` (OTLP/HTTP protobuf) or `grpc`, and
/// `TRACING_SAMPLING_RATE` (default 1) is a parent-based trace-id ratio. The
/// collector is named by `OTEL_EXPORTER_OTLP_ENDPOINT`, as there.
fn traces(
    get: &dyn Fn(&str) -> Option<String>,
    traces: &mut crate::config::traces::TracesConfig,
) -> anyhow::Result<()> {
    use crate::config::traces::{Protocol, SamplerKind};
    let set = |name: &str| get(name).filter(|v| !v.trim().is_empty());
    match flag(get, "TRACING_ENABLED")? {
        Some(true) => traces.enabled = Some(true),
        Some(false) => {
            traces.enabled = Some(false);
            return Ok(());
        }
        None => {
            traces.enabled.get_or_insert(false);
            return Ok(());
        }
    }
    traces.service_name = Some(set("TRACING_SERVICE_NAME").unwrap_or_else(|| "RateLimit".into()));
    if let Some(namespace) = set("TRACING_SERVICE_NAMESPACE") {
        traces
            .resource
            .insert("service.namespace".into(), namespace);
    }
    let instance = set("TRACING_SERVICE_INSTANCE_ID").unwrap_or_else(random_id);
    traces
        .resource
        .insert("service.instance.id".into(), instance);
    traces.protocol = Some(match set("TRACING_EXPORTER_PROTOCOL").as_deref() {
        None | Some("http") => Protocol::HttpProtobuf,
        Some("grpc") => Protocol::Grpc,
        Some(other) => bail!("--envoy-env: TRACING_EXPORTER_PROTOCOL={other}: http or grpc"),
    });
    let rate = match set("TRACING_SAMPLING_RATE") {
        None => 1.0,
        Some(v) => (v.trim().parse::<f64>().ok().filter(|r| r.is_finite())).ok_or_else(|| {
            anyhow::anyhow!("--envoy-env: TRACING_SAMPLING_RATE={v}: not a number")
        })?,
    };
    // As there: 1 or more samples every trace, 0 or less none.
    traces.sampler = Some(SamplerKind::ParentbasedTraceIdRatio);
    traces.ratio = Some(rate.clamp(0.0, 1.0));
    Ok(())
}

/// A random id in a UUID's form (envoyproxy/ratelimit's default instance id).
fn random_id() -> String {
    use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
    let hex = RandomIdGenerator::default().new_trace_id().to_string();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// `HOST`/`PORT`, `GRPC_HOST`/`GRPC_PORT`, TLS on the gRPC listener, the Prometheus
/// listener and the runtime directory of rule files.
fn listeners_and_rules(
    get: &dyn Fn(&str) -> Option<String>,
    main: &mut MainConfig,
) -> anyhow::Result<()> {
    // An unset or empty host is every interface and an unset port Envoy's, as
    // envoyproxy/ratelimit reads them; an IPv6 host needs no brackets.
    let addr = |host: &str, port: &str, default_port: &str| {
        let set = |name: &str| get(name).filter(|v| !v.is_empty());
        let (h, p) = (set(host), set(port));
        if h.is_none() && p.is_none() {
            return Ok(None);
        }
        let h = h.unwrap_or_else(|| "0.0.0.0".into());
        let p = p.unwrap_or_else(|| default_port.into());
        let ip: std::net::IpAddr = h
            .trim_matches(['[', ']'])
            .parse()
            .map_err(|_| anyhow::anyhow!("--envoy-env: {host}={h}: not an IP address"))?;
        let p: u16 = p
            .parse()
            .map_err(|_| anyhow::anyhow!("--envoy-env: {port}={p}: not a port"))?;
        anyhow::Ok(Some(std::net::SocketAddr::new(ip, p)))
    };
    if let Some(a) = addr("HOST", "PORT", "8080")? {
        main.listen.http = Some(a);
    }
    if let Some(a) = addr("GRPC_HOST", "GRPC_PORT", "8081")? {
        main.listen.grpc = Some(a);
    }
    if flag(get, "GRPC_SERVER_USE_TLS")?.unwrap_or(false) {
        let path = |name: &str| get(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let (Some(cert_file), Some(key_file)) =
            (path("GRPC_SERVER_TLS_CERT"), path("GRPC_SERVER_TLS_KEY"))
        else {
            bail!("--envoy-env: GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY");
        };
        // envoyproxy/ratelimit asks for client certificates with GRPC_CLIENT_TLS_CACERT
        // and ignores Envoy Gateway's GRPC_SERVER_TLS_CA_CERT; tollgate takes either:
        // Envoy Gateway's Envoys present a certificate from that very CA, and without
        // it any pod that reaches the port can spend everyone's limits.
        let client_ca_file =
            path("GRPC_CLIENT_TLS_CACERT").or_else(|| path("GRPC_SERVER_TLS_CA_CERT"));
        let client_san = get("GRPC_CLIENT_TLS_SAN").filter(|v| !v.is_empty());
        if client_san.is_some() && client_ca_file.is_none() {
            bail!("--envoy-env: GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT (the CA of the client certificates)");
        }
        main.listen.grpc_tls = Some(crate::tls::ListenerTls {
            cert_file,
            key_file,
            client_ca_file,
            client_san,
            certificates: Vec::new(),
        });
    }
    // Prometheus on a listener of its own, as envoyproxy/ratelimit serves it
    // (`:19001` is every interface, as Go reads it).
    if flag(get, "USE_PROMETHEUS")?.unwrap_or(false) {
        let addr = get("PROMETHEUS_ADDR").unwrap_or_else(|| ":9090".into());
        let full = match addr.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => addr.clone(),
        };
        main.listen.metrics =
            Some(full.parse().map_err(|_| {
                anyhow::anyhow!("--envoy-env: PROMETHEUS_ADDR={addr}: not [IP]:port")
            })?);
        if let Some(path) = get("PROMETHEUS_PATH").filter(|p| !p.is_empty()) {
            main.listen.metrics_path = Some(path);
        }
        // Its own metric names too, through the mapping file it would read.
        main.service.envoy_metrics = true;
        main.service.envoy_env_metrics = Some(crate::config::EnvoyEnvMetrics {
            response_time_ms: flag(get, "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")?
                .unwrap_or(false),
        });
        if let Some(file) = get("PROMETHEUS_MAPPER_YAML").filter(|p| !p.is_empty()) {
            main.service.envoy_metrics_mapping = Some(file.into());
        }
    }
    if let Some(root) = get("RUNTIME_ROOT") {
        let mut dir = PathBuf::from(root);
        dir.push(get("RUNTIME_SUBDIRECTORY").unwrap_or_default());
        dir.push(get("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));
        main.rules = vec![dir];
    }
    Ok(())
}

/// `CONFIG_TYPE=GRPC_XDS_SOTW` and the `CONFIG_GRPC_XDS_*` settings: rules from an xDS
/// server, in place of the runtime directory's files (whose `RUNTIME_*` settings,
/// which Envoy Gateway sets anyway, then go unused, as in envoyproxy/ratelimit).
/// `FORCE_START_WITHOUT_INITIAL_CONFIG` and `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`
/// apply to xDS only: rule files are read before serving, or the start fails.
fn xds(get: &dyn Fn(&str) -> Option<String>, main: &mut MainConfig) -> anyhow::Result<()> {
    let kind = get("CONFIG_TYPE").unwrap_or_else(|| "FILE".into());
    if kind.eq_ignore_ascii_case("FILE") {
        return Ok(());
    }
    if !kind.eq_ignore_ascii_case("GRPC_XDS_SOTW") {
        bail!("--envoy-env: CONFIG_TYPE={kind}: expected FILE or GRPC_XDS_SOTW");
    }
    let set = |name: &str| get(name).filter(|v| !v.is_empty());
    let mut x = crate::config::xds::XdsConfig::new(
        set("CONFIG_GRPC_XDS_SERVER_URL").unwrap_or_else(|| "localhost:18000".into()),
    );
    if let Some(id) = set("CONFIG_GRPC_XDS_NODE_ID") {
        x.node_id = id;
    }
    // `key=value,...` (pairs without `=` are skipped, as envoyproxy/ratelimit does).
    for pair in set("CONFIG_GRPC_XDS_NODE_METADATA")
        .iter()
        .flat_map(|m| m.split(','))
    {
        if let Some((k, v)) = pair.split_once('=') {
            x.node_metadata.insert(k.to_string(), v.to_string());
        }
    }
    // `name:value,...`, envconfig's map syntax.
    if let Some(headers) = set("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS") {
        for (i, pair) in headers.split(',').enumerate() {
            // Not printed: a value may be a credential.
            let Some((k, v)) = pair.split_once(':') else {
                bail!("--envoy-env: CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: entry {} is not name:value", i + 1);
            };
            x.headers
                .insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    if flag(get, "CONFIG_GRPC_XDS_SERVER_USE_TLS")?.unwrap_or(false) {
        let path = |name: &str| set(name).map(PathBuf::from);
        x.tls = Some(crate::config::xds::XdsTls {
            ca_file: path("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
            cert_file: path("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
            key_file: path("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
            server_name: set("CONFIG_GRPC_XDS_SERVER_TLS_SAN"),
        });
    }
    if let Some(us) = duration(get, "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")? {
        x.backoff_initial = us.max(1);
    }
    if let Some(us) = duration(get, "XDS_CLIENT_BACKOFF_MAX_INTERVAL")? {
        x.backoff_max = us.max(x.backoff_initial);
    }
    if let Some(n) = set("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
        x.max_message_bytes = n.parse().map_err(|_| {
            anyhow::anyhow!(
                "--envoy-env: XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES={n}: not a number of bytes"
            )
        })?;
    }
    x.start_without_rules = flag(get, "FORCE_START_WITHOUT_INITIAL_CONFIG")?.unwrap_or(false);
    x.healthy_only_with_rules =
        flag(get, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")?.unwrap_or(false);
    main.rules.clear();
    main.xds = Some(x);
    Ok(())
}

/// The `REDIS_*` settings (and `REDIS_PERSECOND_*`), the local cache and the key
/// prefix.
fn store(
    get: &dyn Fn(&str) -> Option<String>,
    store: &mut crate::config::store::StoreConfig,
) -> anyhow::Result<()> {
    // One set of TLS files for both Redis, as envoyproxy/ratelimit reads them.
    let path = |name: &str| get(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let tls = crate::config::store::RedisTlsDoc {
        ca_file: path("REDIS_TLS_CACERT"),
        cert_file: path("REDIS_TLS_CLIENT_CERT"),
        key_file: path("REDIS_TLS_CLIENT_KEY"),
        insecure_skip_hostname_verification: flag(get, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")?
            .unwrap_or(false),
        insecure_skip_verify: false,
    };
    if let Some(r) = redis(get, "REDIS")? {
        store.url = Some(r.url);
        // Only what is set replaces the file's settings.
        if r.login.1.is_some() {
            (store.username, store.password) = r.login;
        }
        if r.sentinel_login.1.is_some() {
            (store.sentinel_username, store.sentinel_password) = r.sentinel_login;
        }
        store.tls = r.tls.then(|| tls.clone());
        store.kind = StoreKind::Redis;
    }
    if let Some(t) = duration(get, "REDIS_TIMEOUT")? {
        store.timeout = Some(t);
    }
    if flag(get, "REDIS_PERSECOND")?.unwrap_or(false) {
        let Some(r) = redis(get, "REDIS_PERSECOND")? else {
            bail!("--envoy-env: REDIS_PERSECOND=true needs REDIS_PERSECOND_URL");
        };
        let ((username, password), (sentinel_username, sentinel_password)) =
            (r.login, r.sentinel_login);
        store.per_second = Some(crate::config::store::PerSecondStore {
            url: r.url,
            username,
            password,
            sentinel_username,
            sentinel_password,
            tls: r.tls.then(|| tls.clone()),
            timeout: duration(get, "REDIS_PERSECOND_TIMEOUT")?,
            ..Default::default()
        });
    }
    if get("LOCAL_CACHE_SIZE_IN_BYTES").is_some_and(|v| v != "0") {
        store.negative_cache = true;
    }
    if let Some(p) = get("CACHE_KEY_PREFIX").filter(|p| !p.is_empty()) {
        store.prefix = Some(p);
    }
    Ok(())
}

/// One Redis as `{p}_URL`, `{p}_TYPE`, `{p}_SOCKET_TYPE`, `{p}_AUTH`,
/// `{p}_SENTINEL_AUTH` and `{p}_TLS` describe it (`p`: `REDIS` or `REDIS_PERSECOND`).
struct Redis {
    url: String,
    /// The user and password (`{p}_AUTH`).
    login: Login,
    /// The Sentinels' (`{p}_SENTINEL_AUTH`).
    sentinel_login: Login,
    tls: bool,
}

type Login = (Option<String>, Option<tollgate::redis::Password>);

fn redis(get: &dyn Fn(&str) -> Option<String>, p: &str) -> anyhow::Result<Option<Redis>> {
    let Some(url) = get(&format!("{p}_URL")) else {
        return Ok(None);
    };
    match get(&format!("{p}_SOCKET_TYPE")) {
        Some(socket) if socket.eq_ignore_ascii_case("tcp") => {}
        Some(socket) => bail!("--envoy-env: {p}_SOCKET_TYPE={socket}: tollgate reaches Redis over tcp only (set {p}_SOCKET_TYPE=tcp)"),
        None => bail!("--envoy-env: {p}_URL is set without {p}_SOCKET_TYPE, which envoyproxy/ratelimit then takes as unix (a socket path); tollgate reaches Redis over tcp only: set {p}_SOCKET_TYPE=tcp"),
    }
    let tls = flag(get, &format!("{p}_TLS"))?.unwrap_or(false);
    let s = if tls { "s" } else { "" };
    let kind = get(&format!("{p}_TYPE")).unwrap_or_else(|| "SINGLE".into());
    let url = match kind.to_ascii_uppercase().as_str() {
        "SINGLE" => format!("redis{s}://{url}"),
        "CLUSTER" => format!("redis{s}+cluster://{url}"),
        // `master-name,host:port,...`: the master's name, then the Sentinels.
        "SENTINEL" => match url.split_once(',') {
            Some((name, sentinels)) if !name.is_empty() && !sentinels.is_empty() => {
                format!("redis{s}+sentinel://{sentinels}/{name}")
            }
            _ => bail!("--envoy-env: {p}_URL={url}: with {p}_TYPE=SENTINEL, expected the master name and the Sentinels: name,host:port[,host:port...]"),
        },
        _ => bail!("--envoy-env: {p}_TYPE={kind}: expected SINGLE, CLUSTER or SENTINEL"),
    };
    // Kept out of the URL, so no character of a password needs encoding.
    Ok(Some(Redis {
        url,
        login: auth(get, &format!("{p}_AUTH")),
        sentinel_login: auth(get, &format!("{p}_SENTINEL_AUTH")),
        tls,
    }))
}

/// A Go duration setting (`250ms`, `1m30s`) in microseconds.
fn duration(get: &dyn Fn(&str) -> Option<String>, name: &str) -> anyhow::Result<Option<u64>> {
    get(name)
        .map(|t| {
            go_duration_us(&t).ok_or_else(|| {
                anyhow::anyhow!("--envoy-env: {name}={t}: not a duration (e.g. 250ms, 10s)")
            })
        })
        .transpose()
}

/// `user:password` or a password alone, as envoyproxy/ratelimit reads `REDIS_AUTH` and
/// `REDIS_SENTINEL_AUTH` (unset or empty: no login): the user and the password.
fn auth(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Login {
    let Some(auth) = get(name).filter(|a| !a.is_empty()) else {
        return (None, None);
    };
    let (user, password) = match auth.split_once(':') {
        Some((user, password)) => (Some(user.to_string()), password.to_string()),
        None => (None, auth),
    };
    (
        user.filter(|u| !u.is_empty()),
        Some(tollgate::redis::Password::new(password)),
    )
}

/// A boolean setting as envoyproxy/ratelimit reads it (Go's `strconv.ParseBool`).
fn flag(get: &dyn Fn(&str) -> Option<String>, name: &str) -> anyhow::Result<Option<bool>> {
    get(name)
        .map(|v| match v.to_ascii_lowercase().as_str() {
            "true" | "1" | "t" => Ok(true),
            "false" | "0" | "f" | "" => Ok(false),
            _ => bail!("--envoy-env: {name}={v}: expected true or false"),
        })
        .transpose()
}

/// How the service answers: shadow mode, merged domains, the over-limit switch, the
/// near-limit ratio and the response headers.
fn answers(
    get: &dyn Fn(&str) -> Option<String>,
    service: &mut crate::config::ServiceSettings,
) -> anyhow::Result<()> {
    let flag = |name: &str| flag(get, name);
    if let Some(on) = flag("SHADOW_MODE")? {
        service.shadow_mode = on;
    }
    if let Some(on) = flag("MERGE_DOMAIN_CONFIG")? {
        service.merge_domains = on;
    }
    if let Some(on) = flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")? {
        service.stop_increment_when_over_limit = on;
    }
    if let Some(r) = get("NEAR_LIMIT_RATIO") {
        service.near_limit_ratio = r
            .parse()
            .map_err(|_| anyhow::anyhow!("--envoy-env: NEAR_LIMIT_RATIO={r}: not a number"))?;
    }
    // Envoy's service adds no rate-limit headers unless asked.
    service.headers.style = match flag("LIMIT_RESPONSE_HEADERS_ENABLED")? {
        Some(true) => HeaderStyle::Legacy,
        _ => HeaderStyle::None,
    };
    for (name, field) in [
        ("LIMIT_LIMIT_HEADER", &mut service.headers.limit),
        ("LIMIT_REMAINING_HEADER", &mut service.headers.remaining),
        ("LIMIT_RESET_HEADER", &mut service.headers.reset),
    ] {
        if let Some(v) = get(name) {
            *field = v;
        }
    }
    Ok(())
}

/// The log settings of Envoy's `LOG_FORMAT` (`json` or `text`) and `LOG_LEVEL` (as a
/// `RUST_LOG` filter for tollgate's own events), when set.
pub fn log_settings(get: &dyn Fn(&str) -> Option<String>) -> (Option<LogFormat>, Option<String>) {
    let format = get("LOG_FORMAT").map(|f| match f.to_ascii_lowercase().as_str() {
        "json" => LogFormat::Json,
        _ => LogFormat::Text,
    });
    let level = get("LOG_LEVEL").map(|l| {
        let level = match l.to_ascii_lowercase().as_str() {
            "trace" => "trace",
            "debug" => "debug",
            "info" => "info",
            "error" | "fatal" | "panic" => "error",
            _ => "warn",
        };
        format!("warn,tollgate={level},tollgate_server={level}")
    });
    (format, level)
}

/// A Go duration (`10s`, `250ms`, `1m30s`, `1.5s`) in microseconds.
fn go_duration_us(s: &str) -> Option<u64> {
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let us = match &rest[..unit_len] {
            "ns" => 0.001,
            "us" | "µs" => 1.0,
            "ms" => 1e3,
            "s" => 1e6,
            "m" => 60e6,
            "h" => 3600e6,
            _ => return None,
        };
        total += n * us;
        rest = &rest[unit_len..];
    }
    Some(total.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn envoy_settings_map_onto_the_main_config() {
        let mut main = MainConfig::default();
        let get = env(&[
            ("PORT", "9080"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "9081"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "r1:7000,r2:7000"),
            ("REDIS_AUTH", "user:secret"),
            ("REDIS_TIMEOUT", "1m30s"),
            ("SHADOW_MODE", "true"),
            ("NEAR_LIMIT_RATIO", "0.9"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_RESET_HEADER", "X-Reset"),
            ("USE_STATSD", "true"),
        ]);
        let warning = apply(&get, &mut main).unwrap();
        assert_eq!(main.listen.http, Some("0.0.0.0:9080".parse().unwrap()));
        assert_eq!(main.listen.grpc, Some("127.0.0.1:9081".parse().unwrap()));
        assert_eq!(main.rules, vec![PathBuf::from("/data/ratelimit/config")]);
        assert_eq!(main.store.kind, StoreKind::Redis);
        assert_eq!(
            main.store.url.as_deref(),
            Some("redis+cluster://r1:7000,r2:7000")
        );
        assert_eq!(main.store.username.as_deref(), Some("user"));
        assert_eq!(
            main.store.password.as_ref().map(|p| p.expose()),
            Some("secret")
        );
        assert_eq!(main.store.timeout, Some(90_000_000));
        assert!(main.service.shadow_mode);
        assert_eq!(main.service.near_limit_ratio, 0.9);
        assert_eq!(main.service.headers.style, HeaderStyle::Legacy);
        assert_eq!(main.service.headers.reset, "X-Reset");
        assert!(warning.unwrap().contains("USE_STATSD"));
        // Without LIMIT_RESPONSE_HEADERS_ENABLED: no headers, as Envoy's default.
        let mut main = MainConfig::default();
        assert_eq!(apply(&env(&[]), &mut main).unwrap(), None);
        assert_eq!(main.service.headers.style, HeaderStyle::None);
        // What Envoy Gateway sets, asking for what tollgate does anyway: no warning.
        let quiet = env(&[("USE_STATSD", "false"), ("USE_DOG_STATSD", "False")]);
        let mut main = MainConfig::default();
        assert_eq!(apply(&quiet, &mut main).unwrap(), None);
    }

    #[test]
    fn a_sentinel_url_names_the_master_first_and_the_sentinels_log_in_apart() {
        let mut main = MainConfig::default();
        let get = env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "p/+=w"),
            ("REDIS_SENTINEL_AUTH", "watcher:s3cret"),
        ]);
        apply(&get, &mut main).unwrap();
        assert_eq!(
            main.store.url.as_deref(),
            Some("rediss+sentinel://s1:26379,s2:26379/mymaster")
        );
        assert_eq!(main.store.username, None);
        assert_eq!(
            main.store.password.as_ref().map(|p| p.expose()),
            Some("p/+=w")
        );
        assert_eq!(main.store.sentinel_username.as_deref(), Some("watcher"));
        assert_eq!(
            main.store.sentinel_password.as_ref().map(|p| p.expose()),
            Some("s3cret")
        );
    }

    #[test]
    fn a_per_second_redis_is_described_as_the_main_one() {
        let mut main = MainConfig::default();
        let get = env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "main:6379"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", "/ca.pem"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_TYPE", "cluster"),
            ("REDIS_PERSECOND_URL", "s1:7000,s2:7000"),
            ("REDIS_PERSECOND_AUTH", "fast:p/+="),
            ("REDIS_PERSECOND_TLS", "true"),
            ("REDIS_PERSECOND_TIMEOUT", "50ms"),
            ("REDIS_PERSECOND_POOL_SIZE", "4"),
        ]);
        let warning = apply(&get, &mut main).unwrap();
        assert!(warning.unwrap().contains("REDIS_PERSECOND_POOL_SIZE"));
        assert_eq!(main.store.url.as_deref(), Some("rediss://main:6379"));
        let second = main.store.per_second.as_ref().unwrap();
        assert_eq!(second.url, "rediss+cluster://s1:7000,s2:7000");
        assert_eq!(second.username.as_deref(), Some("fast"));
        assert_eq!(second.password.as_ref().unwrap().expose(), "p/+=");
        assert_eq!(
            second.tls.as_ref().unwrap().ca_file.as_deref(),
            Some(std::path::Path::new("/ca.pem"))
        );
        assert_eq!(second.timeout, Some(50_000));
        let per_second = main.store.per_second_config().unwrap();
        assert_eq!(
            per_second.url.as_deref(),
            Some("rediss+cluster://s1:7000,s2:7000")
        );
        // Without a URL: refused by name.
        let e = apply(
            &env(&[("REDIS_PERSECOND", "true")]),
            &mut MainConfig::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("REDIS_PERSECOND_URL"), "{e}");
    }

    #[test]
    fn listen_addresses_are_read_as_envoy_reads_them() {
        let mut main = MainConfig::default();
        let get = env(&[("HOST", "::"), ("GRPC_HOST", ""), ("GRPC_PORT", "9000")]);
        apply(&get, &mut main).unwrap();
        assert_eq!(main.listen.http, Some("[::]:8080".parse().unwrap()));
        assert_eq!(main.listen.grpc, Some("0.0.0.0:9000".parse().unwrap()));
        let e = apply(&env(&[("PORT", "http")]), &mut MainConfig::default()).unwrap_err();
        assert!(e.to_string().contains("PORT=http: not a port"), "{e}");
    }

    #[test]
    fn prometheus_gets_a_listener_of_its_own() {
        let mut main = MainConfig::default();
        let get = env(&[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ]);
        let warning = apply(&get, &mut main).unwrap();
        assert_eq!(main.listen.metrics, Some("0.0.0.0:19001".parse().unwrap()));
        assert_eq!(main.listen.metrics_path, None);
        // Read, not ignored: envoyproxy/ratelimit's names through that mapping file.
        assert!(
            warning.as_ref().is_none_or(|w| !w.contains("PROMETHEUS")),
            "{warning:?}"
        );
        assert!(main.service.envoy_metrics);
        assert_eq!(
            main.service.envoy_metrics_mapping,
            Some("/etc/statsd-exporter/conf.yaml".into())
        );
        let e = apply(
            &env(&[("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", "metrics:9")]),
            &mut MainConfig::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("PROMETHEUS_ADDR=metrics:9"), "{e}");
    }

    #[test]
    fn envoy_gateways_xds_settings_become_the_xds_section() {
        // As Envoy Gateway's generated Deployment sets them.
        let mut main = MainConfig::default();
        let get = env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,bad,team=x=y"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "X-Token: t1"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "500ms"),
        ]);
        assert_eq!(apply(&get, &mut main).unwrap(), None);
        main.validate().unwrap();
        assert!(main.rules.is_empty(), "no rule files beside xDS");
        let x = main.xds.unwrap();
        assert_eq!(
            (x.server.as_str(), x.node_id.as_str()),
            ("envoy-gateway:18001", "envoy-ratelimit")
        );
        let tls = x.tls.unwrap();
        assert_eq!(tls.ca_file, Some(PathBuf::from("/certs/ca.crt")));
        assert_eq!(tls.cert_file, Some(PathBuf::from("/certs/tls.crt")));
        assert!(x.start_without_rules && !x.healthy_only_with_rules);
        assert_eq!(x.node_metadata.len(), 2);
        assert_eq!(x.node_metadata["team"], "x=y");
        assert_eq!(x.headers["x-token"], "t1");
        assert_eq!(x.backoff_initial, 500_000);
        // Without CONFIG_TYPE the xDS-only settings are named as ignored.
        let w = apply(
            &env(&[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")]),
            &mut MainConfig::default(),
        );
        assert!(w
            .unwrap()
            .unwrap()
            .contains("FORCE_START_WITHOUT_INITIAL_CONFIG"));
        let e = apply(
            &env(&[("CONFIG_TYPE", "GRPC_XDS_DELTA")]),
            &mut MainConfig::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("CONFIG_TYPE=GRPC_XDS_DELTA"), "{e}");
    }

    #[test]
    fn envoy_gateways_tracing_settings_become_the_traces_section() {
        use crate::config::traces::{Protocol, SamplerKind};
        // Envoy Gateway's deployment with tracing on (its testdata enable-tracing.yaml).
        let endpoint = "http://trace-collector.envoy-gateway-system.svc.cluster.local:4318";
        let pairs = [
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-7d9f-abcde"),
            ("TRACING_SAMPLING_RATE", "1.0"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ];
        let mut main = MainConfig::default();
        assert_eq!(
            apply(&env(&pairs), &mut main).unwrap(),
            None,
            "nothing ignored"
        );
        let t = main.traces.resolve(&env(&pairs)).unwrap().unwrap();
        assert_eq!(t.endpoint, format!("{endpoint}/v1/traces"));
        assert_eq!(t.protocol, Protocol::HttpProtobuf);
        assert_eq!(t.service_name, "envoy-ratelimit");
        assert_eq!(
            (t.sampler, t.ratio),
            (SamplerKind::ParentbasedTraceIdRatio, 1.0)
        );
        let resource: HashMap<_, _> = t.resource.into_iter().collect();
        assert_eq!(resource["service.namespace"], "envoy-gateway-system");
        assert_eq!(
            resource["service.instance.id"],
            "envoy-ratelimit-7d9f-abcde"
        );

        // Off without TRACING_ENABLED, even with an endpoint, as envoyproxy/ratelimit.
        let mut main = MainConfig::default();
        let only_endpoint = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)];
        apply(&env(&only_endpoint), &mut main).unwrap();
        assert!(main.traces.resolve(&env(&only_endpoint)).unwrap().is_none());
        // Its defaults: service RateLimit, a random instance id, rate 1; grpc asked.
        let mut main = MainConfig::default();
        let get = env(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("TRACING_SAMPLING_RATE", "7"),
        ]);
        apply(&get, &mut main).unwrap();
        let t = main.traces.resolve(&get).unwrap().unwrap();
        assert_eq!(
            (t.protocol, t.endpoint.as_str()),
            (Protocol::Grpc, "http://localhost:4317")
        );
        assert_eq!((t.service_name.as_str(), t.ratio), ("RateLimit", 1.0));
        let id = &t
            .resource
            .iter()
            .find(|(k, _)| k == "service.instance.id")
            .unwrap()
            .1;
        assert_eq!(id.len(), 36, "{id}");
        for (name, value) in [
            ("TRACING_EXPORTER_PROTOCOL", "thrift"),
            ("TRACING_SAMPLING_RATE", "most"),
            ("TRACING_ENABLED", "sure"),
        ] {
            let bad = env(&[("TRACING_ENABLED", "true"), (name, value)]);
            let e = apply(&bad, &mut MainConfig::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(name), "{e}");
        }
    }

    #[test]
    fn envoy_gateways_grpc_tls_settings_ask_for_client_certificates() {
        let mut main = MainConfig::default();
        let get = env(&[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
        ]);
        apply(&get, &mut main).unwrap();
        let tls = main.listen.grpc_tls.unwrap();
        assert_eq!(tls.cert_file, PathBuf::from("/certs/tls.crt"));
        assert_eq!(tls.client_ca_file, Some(PathBuf::from("/certs/ca.crt")));
        assert_eq!(tls.client_san, None);
    }

    #[test]
    fn settings_tollgate_cannot_follow_are_refused_by_name() {
        for (pairs, expect) in [
            (
                vec![("GRPC_SERVER_USE_TLS", "true")],
                "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY",
            ),
            (
                vec![
                    ("GRPC_SERVER_USE_TLS", "true"),
                    ("GRPC_SERVER_TLS_CERT", "/c.pem"),
                    ("GRPC_SERVER_TLS_KEY", "/c.key"),
                    ("GRPC_CLIENT_TLS_SAN", "envoy"),
                ],
                "GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT",
            ),
            (vec![("BACKEND_TYPE", "memcache")], "BACKEND_TYPE=memcache"),
            (
                vec![("REDIS_URL", "/var/run/r.sock")],
                "REDIS_URL is set without REDIS_SOCKET_TYPE, which envoyproxy/ratelimit then takes as unix",
            ),
            (
                vec![("REDIS_URL", "/var/run/r.sock"), ("REDIS_SOCKET_TYPE", "unix")],
                "REDIS_SOCKET_TYPE=unix: tollgate reaches Redis over tcp only",
            ),
            (
                vec![
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_URL", "r:1"),
                    ("REDIS_TYPE", "SENTINEL"),
                ],
                "with REDIS_TYPE=SENTINEL, expected the master name",
            ),
            (vec![("NEAR_LIMIT_RATIO", "most")], "NEAR_LIMIT_RATIO=most"),
        ] {
            let e = apply(&env(&pairs), &mut MainConfig::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(expect), "{expect} not in {e}");
        }
        // Their defaults, written out, are fine.
        apply(
            &env(&[("BACKEND_TYPE", "redis"), ("CONFIG_TYPE", "FILE")]),
            &mut MainConfig::default(),
        )
        .unwrap();
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(go_duration_us("10s"), Some(10_000_000));
        assert_eq!(go_duration_us("250ms"), Some(250_000));
        assert_eq!(go_duration_us("1.5s"), Some(1_500_000));
        assert_eq!(go_duration_us("1h2m"), Some(3_720_000_000));
        assert_eq!(go_duration_us("soon"), None);
        assert_eq!(go_duration_us(""), None);
    }
}
