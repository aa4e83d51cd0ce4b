//! `tollgate serve`: resolve the settings (file, then flags), bind the listeners, serve
//! until SIGTERM or Ctrl-C, then drain.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tollgate::keyed::KeyedOptions;

use tollgate_runtime::config::store::{StoreConfig, StoreKind};
use tollgate_runtime::config::{MainConfig, DEFAULT_GRPC, DEFAULT_HTTP};
use tollgate_runtime::connections::{BodyTimeout, Slots};
use tollgate_runtime::lifecycle::shutdown_signal;
use tollgate_runtime::tls::{ServerTls, HTTP_ALPN};
use tollgate_service::counters::Counters;
use tollgate_service::descriptors::DescriptorRules;
use tollgate_service::statsd_mapping::StatsdMapping;
use tollgate_service::DecisionService;

/// The metrics listener's address, path and TLS.
pub type MetricsListener = (SocketAddr, String, Option<ServerTls>);

/// The statsd mapping envoyproxy/ratelimit's names go through, if they are asked for:
/// the file named, else the built-in one. A file that cannot be read or parsed is an
/// error naming it, except under `--envoy-env`, where it is a warning and the built-in
/// mapping stands in.
fn envoy_mapping(
    service: &tollgate_runtime::config::ServiceSettings,
) -> anyhow::Result<Option<StatsdMapping>> {
    use tollgate_service::envoy_metrics::default_mapping;
    let env = service.envoy_env_metrics;
    let built_in = || default_mapping(env.is_some_and(|e| e.response_time_ms));
    let Some(file) = &service.envoy_metrics_mapping else {
        return Ok(service.envoy_metrics.then(built_in));
    };
    let read = std::fs::read_to_string(file)
        .map_err(|e| e.to_string())
        .and_then(|text| StatsdMapping::parse(&text));
    match (read, env) {
        (Ok(mapping), _) => Ok(Some(mapping)),
        (Err(e), None) => anyhow::bail!("service.envoy_metrics_mapping {}: {e}", file.display()),
        (Err(e), Some(_)) => {
            tracing::warn!(
                "--envoy-env: PROMETHEUS_MAPPER_YAML={}: {e}; envoyproxy/ratelimit's built-in mappings stand in",
                file.display()
            );
            Ok(Some(built_in()))
        }
    }
}

/// What `serve` runs with, after flags are applied to the file.
pub struct Settings {
    /// The HTTP address.
    pub http: SocketAddr,
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// Counter bounds.
    pub options: KeyedOptions,
    /// Request bounds.
    pub requests: tollgate_runtime::config::Requests,
    /// Bounds on RLQS streams.
    pub quota: tollgate_runtime::config::QuotaLimits,
    /// How long to serve with failing health checks after a stop signal.
    pub drain_delay: Duration,
    /// How many worker threads serve connections.
    pub workers: usize,
    /// How connections are shared among the workers.
    pub balance: tollgate_runtime::config::Balance,
    /// Connection bounds, per listener.
    pub connections: tollgate_runtime::config::Connections,
    /// The descriptor rules of every domain, loaded and validated (counting in
    /// memory; [`Settings::counters`] loads them again for Redis).
    pub rules: DescriptorRules,
    /// Where the rules came from.
    pub rules_source: String,
    /// Whether the rules are the built-in example (the banner's `curl` hint is for it).
    pub builtin_rules: bool,
    /// The rule files (empty: built-in), for reloads.
    pub rule_paths: Vec<PathBuf>,
    /// The bearer token that guards admin endpoints, if any.
    pub admin_token: Option<String>,
    /// Where counters live.
    pub store: StoreConfig,
    /// How the service answers beyond its rules.
    pub service: tollgate_runtime::config::ServiceSettings,
    /// TLS on the HTTP listener, its files read.
    pub http_tls: Option<ServerTls>,
    /// TLS on the gRPC listener, its files read.
    pub grpc_tls: Option<ServerTls>,
    /// The metrics listener's address, path and TLS, when it has one.
    pub metrics: Option<MetricsListener>,
    /// Rules from this xDS server instead of files.
    pub xds: Option<tollgate_runtime::config::xds::XdsConfig>,
    /// TLS to the xDS server, when it is TLS: its files read, followed on rotation.
    pub xds_tls: Option<tollgate_runtime::tls::ClientTls>,
    /// envoyproxy/ratelimit's metric names through this mapping
    /// (`service.envoy_metrics`), its file read.
    pub envoy_mapping: Option<tollgate_service::statsd_mapping::StatsdMapping>,
    /// Traces (`traces:` and the `OTEL_*` variables), when on.
    pub traces: Option<tollgate_runtime::config::traces::TraceSettings>,
    /// The console, when on: its settings and which listener serves it.
    pub console: Option<(
        tollgate_runtime::config::ConsoleConfig,
        tollgate_runtime::config::ConsoleListener,
    )>,
}

impl Settings {
    /// Loads everything, binding nothing: errors surface before any port is taken.
    pub fn resolve(
        config: Option<&Path>,
        rules: &[PathBuf],
        http: Option<SocketAddr>,
        grpc: Option<SocketAddr>,
        store: Option<&str>,
        envoy_env: bool,
    ) -> anyhow::Result<Self> {
        let mut main = match config {
            Some(p) => MainConfig::load(p)?,
            None => MainConfig::default(),
        };
        if envoy_env {
            let get = |name: &str| std::env::var(name).ok();
            if let Some(warning) = tollgate_runtime::config::envoy_env::apply(&get, &mut main)? {
                tracing::warn!("{warning}");
            }
            main.validate()?;
        }
        let store = main.store.clone().with_flag(store)?;
        if main.xds.is_some() && !rules.is_empty() {
            anyhow::bail!(
                "--rules: the config's xds section gives the rules (files or xDS, not both)"
            );
        }
        let paths = if rules.is_empty() {
            main.rules.clone()
        } else {
            rules.to_vec()
        };
        let envoy_mapping = envoy_mapping(&main.service)?;
        let traces = main.traces.resolve(&|name| std::env::var(name).ok())?;
        // Read now so that a missing or bad file stops the start; connections read
        // them again when they change (rotation).
        let xds_tls = (main.xds.as_ref())
            .map(tollgate_service::xds::client_tls)
            .transpose()?
            .flatten();
        let options = main.key_options();
        let rules = match &main.xds {
            Some(_) => DescriptorRules::empty(main.service.merge_domains),
            None => load_rules(
                &paths,
                &Counters::Memory(options),
                main.service.merge_domains,
            )?,
        };
        let rules_source = rules_source(&main, &paths);
        let http = http
            .or(main.listen.http)
            .unwrap_or_else(|| DEFAULT_HTTP.parse().expect("valid default"));
        let grpc = grpc
            .or(main.listen.grpc)
            .unwrap_or_else(|| DEFAULT_GRPC.parse().expect("valid default"));
        let http_tls = listener_tls(&main.listen.http_tls, "listen.http_tls", HTTP_ALPN)?;
        let grpc_tls = listener_tls(&main.listen.grpc_tls, "listen.grpc_tls", &[b"h2"])?;
        let metrics = metrics_settings(&main)?;
        let console = console_settings(&main, metrics.as_ref())?;
        let admin_token = std::env::var("TOLLGATE_ADMIN_TOKEN")
            .ok()
            .or(main.admin.token.clone())
            .filter(|t| !t.is_empty());
        Ok(Settings {
            http,
            grpc,
            options,
            requests: main.requests,
            quota: main.quota,
            connections: main.connections,
            drain_delay: Duration::from_micros(main.listen.drain_delay.unwrap_or(0)),
            balance: main.listen.balance,
            workers: main
                .listen
                .workers
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            rules,
            rules_source,
            builtin_rules: paths.is_empty() && main.xds.is_none(),
            rule_paths: paths,
            admin_token,
            store,
            service: main.service,
            http_tls,
            grpc_tls,
            metrics,
            xds: main.xds,
            xds_tls,
            envoy_mapping,
            traces,
            console,
        })
    }
}

/// What the banner says the rules come from.
fn rules_source(main: &MainConfig, paths: &[PathBuf]) -> String {
    if let Some(x) = &main.xds {
        format!(
            "rules from the xDS server {} (node {})",
            x.server, x.node_id
        )
    } else if paths.is_empty() {
        "the built-in example rules".to_string()
    } else {
        (paths.iter())
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A listener's TLS, its files read now (`setting` names it in errors).
fn listener_tls(
    tls: &Option<tollgate_runtime::tls::ListenerTls>,
    setting: &str,
    alpn: &[&[u8]],
) -> anyhow::Result<Option<ServerTls>> {
    (tls.as_ref())
        .map(|t| ServerTls::load(t, setting, alpn))
        .transpose()
}

/// The metrics listener, when `listen.metrics` names one: its address, path and TLS.
fn metrics_settings(main: &MainConfig) -> anyhow::Result<Option<MetricsListener>> {
    let Some(addr) = main.listen.metrics else {
        if main.listen.metrics_tls.is_some() {
            anyhow::bail!(
                "listen.metrics_tls: needs listen.metrics (the metrics listener's address)"
            )
        }
        return Ok(None);
    };
    let path = (main.listen.metrics_path.clone()).unwrap_or("/metrics".into());
    if !path.starts_with('/') {
        anyhow::bail!("listen.metrics_path {path:?}: must start with /");
    }
    let tls = listener_tls(&main.listen.metrics_tls, "listen.metrics_tls", HTTP_ALPN)?;
    Ok(Some((addr, path, tls)))
}

/// The console, when `console:` turns it on, and the listener that serves it (one
/// that exists; its paths clear of the metrics').
fn console_settings(
    main: &MainConfig,
    metrics: Option<&MetricsListener>,
) -> anyhow::Result<
    Option<(
        tollgate_runtime::config::ConsoleConfig,
        tollgate_runtime::config::ConsoleListener,
    )>,
> {
    let Some(c) = main.console.clone() else {
        return Ok(None);
    };
    let listener = c
        .listener
        .unwrap_or(tollgate_runtime::config::ConsoleListener::Http);
    if listener == tollgate_runtime::config::ConsoleListener::Metrics && metrics.is_none() {
        anyhow::bail!(
            "console.listener: metrics needs listen.metrics (the metrics listener's address)"
        );
    }
    if let Some((_, path, _)) = metrics {
        if let Some(taken) = c.clashes_with(&[path.as_str()]) {
            anyhow::bail!(
                "console.path {:?}: the metrics answer at {taken}; choose another path",
                c.path
            );
        }
    }
    Ok(Some((c, listener)))
}

/// The rules of `paths` (none: the built-in example), counting in `counters`.
fn load_rules(
    paths: &[PathBuf],
    counters: &Counters,
    merge_domains: bool,
) -> Result<DescriptorRules, tollgate_service::descriptors::RulesError> {
    if paths.is_empty() {
        return DescriptorRules::built_in(counters);
    }
    DescriptorRules::load(paths, counters, merge_domains)
}

/// The sockets `serve` answers on, bound apart from the app: `serve` binds the
/// settings' addresses; a test or an embedding program binds its own (port 0) and
/// passes them to [`serve_on`].
pub struct Listeners {
    /// The HTTP/JSON API's.
    pub http: tokio::net::TcpListener,
    /// The Envoy RLS gRPC API's.
    pub grpc: tokio::net::TcpListener,
    /// The metrics listener's, when the settings name one.
    pub metrics: Option<tokio::net::TcpListener>,
}

impl Listeners {
    /// Binds the addresses `settings` name.
    pub async fn bind(settings: &Settings) -> anyhow::Result<Listeners> {
        let http = tokio::net::TcpListener::bind(settings.http)
            .await
            .with_context(|| format!("cannot listen on {} (HTTP)", settings.http))?;
        let grpc = tokio::net::TcpListener::bind(settings.grpc)
            .await
            .with_context(|| format!("cannot listen on {} (gRPC)", settings.grpc))?;
        let metrics = match &settings.metrics {
            Some((addr, _, _)) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr} (metrics)"))?,
            ),
            None => None,
        };
        Ok(Listeners {
            http,
            grpc,
            metrics,
        })
    }
}

/// Serves until a shutdown signal (SIGTERM, Ctrl-C), then drains.
pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    let listeners = Listeners::bind(&settings).await?;
    serve_on(settings, listeners, shutdown_signal()).await
}

/// Serves on `listeners` until `shutdown` completes, then drains (health checks fail
/// for `listen.drain_delay`, requests in flight finish): the whole app, in-process.
/// Sets up (workers, the decision service, the console), says so in the banner,
/// starts what runs beside the listeners, serves, and tears down.
pub async fn serve_on(
    mut settings: Settings,
    listeners: Listeners,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let http = listeners.http.local_addr()?;
    // Before the banner: whoever waits for it finds every thread and file in place.
    let workers = tollgate_runtime::workers::Workers::start(settings.workers, settings.balance)?;
    let service = build_service(&mut settings, &workers).await?;
    let console = start_console(&settings, &service);
    // Caught before the banner: a SIGHUP right after it must reload, not kill.
    let hup = tollgate_runtime::lifecycle::hangups();
    // What a rule file's change is seen against, taken before the banner.
    let rule_files = tollgate_runtime::lifecycle::Watched::now(service.sources().to_vec());
    print_banner(&settings, &service, &listeners, console.as_ref())?;
    let stop_rx = start_beside(&settings, &service, shutdown, rule_files, hup);
    let admin = tollgate_service::http::AdminAccess {
        token: settings.admin_token.clone(),
        loopback: http.ip().is_loopback(),
    };
    serve_listeners(
        settings, listeners, &service, admin, console, &workers, stop_rx,
    )
    .await;
    drop(workers);
    if let Some(t) = service.tracing() {
        // The last calls' spans, if the collector takes them soon.
        t.flush(Duration::from_secs(2)).await;
    }
    // Whoever read the banner may be gone (`| head -1`): not a reason to panic.
    let _ = writeln!(std::io::stdout(), "tollgate serve: stopped");
    Ok(())
}

/// The decision service of `settings`: its rules (read from Redis's store when it
/// counts there), counters, bounds, answers, metrics, TLS files, xDS, top keys and
/// traces. Takes the settings' rules.
async fn build_service(
    settings: &mut Settings,
    workers: &tollgate_runtime::workers::Workers,
) -> anyhow::Result<Arc<DecisionService>> {
    let merge = settings.service.merge_domains;
    let (rules, counters) = match settings.store.kind {
        StoreKind::Redis if settings.xds.is_some() => (
            DescriptorRules::empty(merge),
            Counters::redis(&settings.store).await?,
        ),
        StoreKind::Redis => {
            let counters = Counters::redis(&settings.store).await?;
            (
                load_rules(&settings.rule_paths, &counters, merge)?,
                counters,
            )
        }
        _ => (
            std::mem::replace(&mut settings.rules, DescriptorRules::empty(merge)),
            Counters::Memory(settings.options),
        ),
    };
    let metrics_tls = settings.metrics.as_ref().and_then(|(_, _, t)| t.clone());
    let service = DecisionService::new(rules, settings.rule_paths.clone(), counters)
        .with_request_limits(settings.requests)
        .with_quota_limits(settings.quota)
        .with_answers(&settings.service)
        .with_envoy_metrics(settings.envoy_mapping.take(), settings.xds.is_none())
        .with_workers(workers.stats())
        .with_tls(
            [
                ("http", settings.http_tls.clone()),
                ("grpc", settings.grpc_tls.clone()),
                ("metrics", metrics_tls),
            ]
            .into_iter()
            .filter_map(|(name, tls)| tls.map(|t| (name, t)))
            .collect(),
        );
    let service = match &settings.xds {
        Some(x) => service.with_xds(x),
        None => service,
    };
    let service = match &settings.console {
        Some(_) => service.with_top_keys(Arc::default()),
        None => service,
    };
    Ok(Arc::new(match &settings.traces {
        Some(t) => service.with_tracing(Arc::new(tollgate_runtime::traces::Tracing::start(t)?)),
        None => service,
    }))
}

/// The console, when on: its routes, the listener that serves them and their path.
type MountedConsole = (
    axum::Router,
    tollgate_runtime::config::ConsoleListener,
    String,
);

/// Starts the console over `service`, when the settings turn it on.
fn start_console(settings: &Settings, service: &Arc<DecisionService>) -> Option<MountedConsole> {
    let (c, listener) = settings.console.as_ref()?;
    let secure = match listener {
        tollgate_runtime::config::ConsoleListener::Http => settings.http_tls.is_some(),
        tollgate_runtime::config::ConsoleListener::Metrics => settings
            .metrics
            .as_ref()
            .is_some_and(|(_, _, t)| t.is_some()),
    };
    let console = tollgate_console::Console::start(
        tollgate_console::ConsoleSettings {
            path: c.path.clone(),
            history_points: (c.history / 1_000_000) as usize,
            top_keys: c.top_keys,
            admin_token: settings.admin_token.clone(),
            secure,
        },
        tollgate_console::Source::Serve(service.clone()),
    );
    Some((console.router(), *listener, c.path.clone()))
}

/// The banner: where each API, the metrics and the console answer, what decides,
/// the domains, and how to try it.
fn print_banner(
    settings: &Settings,
    service: &DecisionService,
    listeners: &Listeners,
    console: Option<&MountedConsole>,
) -> anyhow::Result<()> {
    let (http, grpc) = (listeners.http.local_addr()?, listeners.grpc.local_addr()?);
    let http_scheme = if settings.http_tls.is_some() {
        "https"
    } else {
        "http"
    };
    let grpc_tls = if settings.grpc_tls.is_some() {
        " over TLS"
    } else {
        ""
    };
    println!(
        "tollgate serve: HTTP on {http_scheme}://{http} and Envoy RLS + RLQS gRPC on {grpc}{grpc_tls} ({}, {} worker(s), {}) with {}",
        settings.store.describe(),
        settings.workers,
        settings.balance.describe(),
        settings.rules_source
    );
    if let Some(code) = service.redis_decided_by() {
        println!("  redis: decided by {code}");
    }
    if let (Some(l), Some((_, path, tls))) = (&listeners.metrics, &settings.metrics) {
        let scheme = if tls.is_some() { "https" } else { "http" };
        println!("  metrics: {scheme}://{}{path}", l.local_addr()?);
    }
    if let Some((_, listener, path)) = console {
        let at = match (listener, &listeners.metrics, &settings.metrics) {
            (tollgate_runtime::config::ConsoleListener::Metrics, Some(l), Some((_, _, tls))) => {
                let scheme = if tls.is_some() { "https" } else { "http" };
                format!("{scheme}://{}", l.local_addr()?)
            }
            _ => format!("{http_scheme}://{http}"),
        };
        println!("  console: {at}{path}/");
    }
    let mut domains: Vec<String> = (service.rules().domains())
        .map(|(d, _)| d.to_string())
        .collect();
    domains.sort();
    match &settings.xds {
        Some(_) if domains.is_empty() => {
            println!("  domains: none yet (they come from the xDS server)")
        }
        _ => println!("  domains: {}", domains.join(", ")),
    }
    if settings.builtin_rules {
        println!("  try: curl -s {http_scheme}://{http}/v1/check -H 'content-type: application/json' -d '{{\"domain\":\"example\",\"descriptors\":[{{\"entries\":[{{\"key\":\"api_key\",\"value\":\"k1\"}}]}}]}}'");
    }
    println!("  rules in force: curl -s {http_scheme}://{http}/v1/config");
    if let Some(t) = service.tracing() {
        println!("  traces: {}", t.summary());
    }
    Ok(())
}

/// Starts what runs beside the listeners: the drain on `shutdown`, the xDS client,
/// the rules' reloads, the quota buckets' ticks, the TLS files' watch. The receiver
/// turns true when the listeners are to stop.
fn start_beside(
    settings: &Settings,
    service: &Arc<DecisionService>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    rule_files: tollgate_runtime::lifecycle::Watched,
    hup: tollgate_runtime::lifecycle::Hangups,
) -> tokio::sync::watch::Receiver<bool> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (draining, drain_delay) = (service.clone(), settings.drain_delay);
    tokio::spawn(async move {
        shutdown.await;
        draining.start_draining();
        if !drain_delay.is_zero() {
            tracing::info!(
                "tollgate serve: draining: health checks fail, serving for {drain_delay:?} more"
            );
            tokio::time::sleep(drain_delay).await;
        }
        let _ = stop_tx.send(true);
    });
    if let Some(x) = settings.xds.clone() {
        tokio::spawn(tollgate_service::xds::run(
            x,
            settings.xds_tls.clone(),
            service.clone(),
            stopped(stop_rx.clone()),
        ));
    }
    // With xDS, a SIGHUP has nothing to read again: said, not fatal.
    tokio::spawn(watch_rules(
        service.clone(),
        rule_files,
        hup,
        stop_rx.clone(),
    ));
    // RLQS: reports applied as they come, renewals and freed shares as they fall due.
    let quota = service.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(tollgate_service::quota::TICK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let quota = quota.clone();
            // A pass that panics is reported and the next one runs.
            if let Err(e) = tokio::spawn(async move { quota.quota().flush().await }).await {
                tracing::error!(error = %e, "quota buckets: a pass failed");
            }
        }
    });
    for tls in [&settings.http_tls, &settings.grpc_tls]
        .into_iter()
        .flatten()
    {
        tls.watch();
    }
    stop_rx
}

/// Resolves when `rx` says stop.
async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Serves HTTP (with the console when it is mounted there), gRPC and the metrics
/// (with the console when it is mounted there) until `stop_rx` says stop.
async fn serve_listeners(
    settings: Settings,
    listeners: Listeners,
    service: &Arc<DecisionService>,
    admin: tollgate_service::http::AdminAccess,
    console: Option<MountedConsole>,
    workers: &tollgate_runtime::workers::Workers,
    stop_rx: tokio::sync::watch::Receiver<bool>,
) {
    let bounds = settings.connections;
    tollgate_runtime::connections::warn_if_fd_limit_below(2 * bounds.max);
    let (mut http_console, mut metrics_console) = (None, None);
    if let Some((router, listener, _)) = console {
        match listener {
            tollgate_runtime::config::ConsoleListener::Http => http_console = Some(router),
            tollgate_runtime::config::ConsoleListener::Metrics => metrics_console = Some(router),
        }
    }
    let app = tollgate_service::http::router(service.clone(), admin);
    let app = match http_console {
        Some(c) => app.merge(c),
        None => app,
    };
    let counting = service.clone();
    let http_server = tollgate_runtime::connections::serve_http_with(
        listeners.http,
        Slots::new(bounds),
        move |_| {
            let (app, service) = (app.clone(), counting.clone());
            move |request| {
                tollgate_service::http::counted_call(service.clone(), app.clone(), request)
            }
        },
        BodyTimeout::Whole(Duration::from_micros(bounds.body_timeout)),
        stopped(stop_rx.clone()),
        Some(workers),
        settings.http_tls,
    );
    let metrics_server = async {
        if let (Some(listener), Some((_, path, tls))) = (listeners.metrics, settings.metrics) {
            let metrics = tollgate_service::http::metrics_router(service.clone(), &path);
            tollgate_runtime::connections::serve_http(
                listener,
                Slots::new(bounds),
                match metrics_console {
                    Some(c) => metrics.merge(c),
                    None => metrics,
                },
                BodyTimeout::Whole(Duration::from_micros(bounds.body_timeout)),
                stopped(stop_rx.clone()),
                None,
                tls,
            )
            .await
        }
    };
    let grpc_server = tollgate_service::grpc::serve(
        listeners.grpc,
        Slots::new(bounds),
        service.clone(),
        stopped(stop_rx.clone()),
        Some(workers),
        settings.grpc_tls,
    );
    tokio::join!(http_server, grpc_server, metrics_server);
}

/// Reloads the rules on SIGHUP and when a rule file changes (checked every second).
async fn watch_rules(
    service: Arc<DecisionService>,
    files: tollgate_runtime::lifecycle::Watched,
    hup: tollgate_runtime::lifecycle::Hangups,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    // Logged and counted by the service.
    let reload = |reason: &str| {
        let _ = service.reload(reason);
    };
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    tollgate_runtime::lifecycle::watch(files, hup, reload, stopped).await;
}

#[derive(Debug, Parser)]
/// `tollgate serve` arguments.
pub struct ServeArgs {
    /// The main configuration file (YAML).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A rule file or directory (Envoy ratelimit config documents); repeatable.
    /// Overrides the config file's `rules`.
    #[arg(long = "rules")]
    pub rules: Vec<PathBuf>,
    /// The HTTP listen address [default: 127.0.0.1:8080].
    #[arg(long)]
    pub http: Option<std::net::SocketAddr>,
    /// The gRPC listen address (Envoy RLS and RLQS) [default: 127.0.0.1:8081].
    #[arg(long)]
    pub grpc: Option<std::net::SocketAddr>,
    /// Where counters live: memory, redis://host:port/db or
    /// redis+cluster://host:port,host:port. Overrides the config file's store.
    #[arg(long)]
    pub store: Option<String>,
    /// Also read envoyproxy/ratelimit's environment settings (PORT, GRPC_PORT,
    /// RUNTIME_ROOT, REDIS_URL, SHADOW_MODE, LOG_FORMAT, ...), mapped as docs/envoy.md
    /// says: after the config file, before these flags.
    #[arg(long)]
    pub envoy_env: bool,
    /// How many threads serve connections [default: the config's listen.workers, else
    /// one per CPU].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub workers: Option<u64>,
    /// How connections are shared among the workers: `pack` (as few workers as the
    /// load needs) or `spread` (each new one to the next worker) [default: the
    /// config's listen.balance, else pack].
    #[arg(long, value_enum)]
    pub balance: Option<tollgate_runtime::config::Balance>,
    /// Serve the live console at /console/ on the HTTP listener (the config's
    /// `console:` section says more: path, listener, history).
    #[arg(long)]
    pub console: bool,
}

/// `tollgate serve`: settings resolved before any port is bound, then [`serve`] on a
/// multi-threaded runtime.
pub fn command(args: ServeArgs) -> anyhow::Result<()> {
    let mut settings = Settings::resolve(
        args.config.as_deref(),
        &args.rules,
        args.http,
        args.grpc,
        args.store.as_deref(),
        args.envoy_env,
    )?;
    if let Some(n) = args.workers {
        settings.workers = usize::try_from(n)?;
    }
    if let Some(balance) = args.balance {
        settings.balance = balance;
    }
    if args.console && settings.console.is_none() {
        let http = tollgate_runtime::config::ConsoleListener::Http;
        settings.console = Some((tollgate_runtime::config::ConsoleConfig::default(), http));
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(settings))
}

#[derive(Debug, Parser)]
/// `tollgate check-config` arguments.
pub struct CheckConfigArgs {
    /// Rule files or directories to validate.
    #[arg(long = "rules")]
    pub rules: Vec<PathBuf>,
    /// A main configuration file to validate (with the rule files it names).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Also read envoyproxy/ratelimit's environment settings, as `serve --envoy-env`.
    #[arg(long)]
    pub envoy_env: bool,
}

/// `tollgate check-config`: loads the config and rules as `serve` would, binding nothing.
pub fn check_config(args: CheckConfigArgs) -> anyhow::Result<()> {
    if args.config.is_none() && args.rules.is_empty() && !args.envoy_env {
        anyhow::bail!("check-config needs --config FILE, --rules PATH or --envoy-env");
    }
    let settings = Settings::resolve(
        args.config.as_deref(),
        &args.rules,
        None,
        None,
        None,
        args.envoy_env,
    )?;
    let mut domains: Vec<_> = settings
        .rules
        .domains()
        .map(|(d, s)| format!("{d} ({s})"))
        .collect();
    domains.sort();
    // The proxy's section too, as `tollgate proxy` would build its routes (their
    // counters in memory: a Redis store is not connected here).
    let routes = match args.config.as_deref() {
        Some(path) => match tollgate_runtime::config::MainConfig::load(path)?.proxy {
            Some(_) => {
                let loaded = tollgate_proxy::load(path)?;
                let n = loaded.proxy.routes.len();
                // Its TLS files, as `tollgate proxy` reads them at start.
                tollgate_proxy::server::ListenersTls::load(&loaded.proxy)?;
                let _routes = tollgate_proxy::ProxyApp::new(loaded.proxy, loaded.options)?;
                format!("; proxy: {n} route(s)")
            }
            None => String::new(),
        },
        None => String::new(),
    };
    let quota = match settings.rules.quota_rules().count() {
        0 => String::new(),
        n => format!("; quota_buckets: {n} rule(s)"),
    };
    if let Some(x) = &settings.xds {
        // Nothing to load: the rules come when serve connects.
        println!(
            "ok: the rules come from the xDS server {} (node {}), not checked here{routes}",
            x.server, x.node_id
        );
        return Ok(());
    }
    if settings.builtin_rules && !routes.is_empty() {
        // A proxy's config: serve's built-in example rules are not what it checks.
        println!("ok: {}", routes.trim_start_matches("; "));
        return Ok(());
    }
    println!(
        "ok: {} domain(s): {}{quota}{routes}",
        domains.len(),
        domains.join(", ")
    );
    Ok(())
}
