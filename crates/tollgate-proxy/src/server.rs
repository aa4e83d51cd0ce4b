//! The proxy as a server: the request handler (route, key, limits, forward), the
//! worker threads (one single-threaded runtime per CPU, as nginx's workers), reloads,
//! and the `tollgate proxy` command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use arc_swap::ArcSwap;
use axum::extract::Request;
use axum::http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, HOST, TRANSFER_ENCODING};
use axum::http::{HeaderValue, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use clap::Parser;
use tokio::io::{AsyncRead, AsyncWrite};
use tollgate::keyed::KeyedOptions;

use super::admission::admit;
use super::forwarding::{forward, Peer};
use super::h1;
use super::limits::{Passed, RedisBackend};
use super::observe::RequestObserver;
use super::problem::{no_route, problem};
use super::routes::RouteTable;
use super::worker::Proxy;
use tollgate_runtime::config::proxy::ProxyConfig;
use tollgate_runtime::config::store::{StoreConfig, StoreKind};
use tollgate_runtime::config::Connections;
use tollgate_runtime::connections::{BodyTimeout, Drain, HyperConns, Rewind, Slots};

/// Every request hyper serves: its route, its key, its limits, then the upstream.
async fn handle(proxy: &Proxy, peer: &Peer, req: Request) -> Response {
    let table = proxy.table.load_full();
    // An HTTP/2 client names the host in its URI (`:authority`).
    let host = (req.headers().get(HOST).and_then(|h| h.to_str().ok()))
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    // hyper closes an HTTP/1 connection after an answer that left the request body
    // unread, and one from an HTTP/1.0 client that did not ask to keep it, without
    // saying so: the answer says it (RFC 9112 §9.6), as nginx's does, so that a
    // client keeping its connections does not send its next request into a close.
    let http1 = req.version() <= Version::HTTP_11;
    let unread = http1
        && (req.headers().contains_key(TRANSFER_ENCODING) || {
            let length = req.headers().get(CONTENT_LENGTH);
            length.is_some_and(|v| v.as_bytes() != b"0")
        });
    let ends = req.version() < Version::HTTP_11
        && !(req.headers().get_all(CONNECTION).iter())
            .any(|v| h1::has_token(v.as_bytes(), "keep-alive"));
    // Forwarded: the body went upstream (the proxy's own answers may have left it).
    let (mut answer, forwarded) = match table.route_for(host, req.uri().path()) {
        None => (no_route().into_response(), false),
        Some(route) => {
            let (mut req, body) = match route.limits.reads_body() {
                Some(max) => match read_body(req, max).await {
                    Ok(read) => read,
                    Err(answer) => return answer,
                },
                None => (req, None),
            };
            let path = req.uri().path();
            let method = req.method().as_str();
            let mut observed =
                RequestObserver::start(proxy.tracing.as_ref(), req.headers(), method, path, route);
            match admit(&table, route, peer, path, req.headers(), body.as_deref()).await {
                Ok(mut passed) => {
                    ask_for_usage(&mut req, &mut passed, body.as_deref());
                    if let Some(trace) = observed.upstream() {
                        let headers = req.headers_mut();
                        let theirs: Vec<_> = (headers.keys())
                            .filter(|n| trace.replaces(n.as_str()))
                            .cloned()
                            .collect();
                        for name in theirs {
                            headers.remove(name);
                        }
                        for (name, value) in trace.headers {
                            if let Ok(value) = HeaderValue::try_from(value) {
                                headers.insert(name, value);
                            }
                        }
                    }
                    let forwarded =
                        forward(&proxy.upstreams, &table, route, peer, req, passed).await;
                    observed.upstream_answered(match &forwarded {
                        Ok(answer) => Ok(answer.status().as_u16()),
                        Err(own) => Err(own.status().as_u16()),
                    });
                    match forwarded {
                        Ok(answer) => (answer, true),
                        Err(own) => (own, false),
                    }
                }
                Err(answer) => {
                    observed.refused(answer.status.as_u16());
                    (answer.into_response(), false)
                }
            }
        }
    };
    if ends || (unread && !forwarded) {
        (answer.headers_mut()).insert(CONNECTION, HeaderValue::from_static("close"));
    }
    answer
}

/// Under `cost:` with `ask_usage: openai`: an admitted OpenAI-shaped stream that does
/// not ask for its usage goes upstream asking (`body`: its bytes, as read), and its
/// response is marked for the usage to be taken out of what its client receives.
fn ask_for_usage(req: &mut Request, passed: &mut Passed, body: Option<&[u8]>) {
    let (Some(pending), Some(body)) = (passed.pending.as_mut(), body) else {
        return;
    };
    let Some(asked) = pending.cost().ask_for_usage(req.uri().path(), body) else {
        return;
    };
    pending.usage_asked = true;
    req.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(asked.len()));
    *req.body_mut() = axum::body::Body::from(asked);
}

/// Under `cost:` (`reserve: declared`, or `ask_usage: openai`): the body of a request with a length up to
/// `max` (not waiting for `100 Continue`), read whole for admission to see; the
/// request keeps it. Others go on as they are.
async fn read_body(req: Request, max: usize) -> Result<(Request, Option<Bytes>), Response> {
    let length = (req.headers().get(CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok()?.trim().parse::<usize>().ok());
    let expects = req.headers().contains_key(EXPECT);
    match length {
        Some(n) if n > 0 && n <= max && !expects => {}
        _ => return Ok((req, None)),
    }
    let (parts, body) = req.into_parts();
    match axum::body::to_bytes(body, max).await {
        Ok(bytes) => Ok((
            Request::from_parts(parts, axum::body::Body::from(bytes.clone())),
            Some(bytes),
        )),
        Err(e) => {
            // A body that stalls is the client's delay (408, as the HTTP/1.1 path
            // answers); anything else, a body that could not be read (400).
            let stalled = tollgate_runtime::connections::is_body_timeout(&e);
            let mut answer = match stalled {
                true => super::forwarding::body_stalled().into_response(),
                false => {
                    let detail = format!("the request body could not be read: {e}");
                    problem(StatusCode::BAD_REQUEST, &detail, None).into_response()
                }
            };
            (answer.headers_mut()).insert(CONNECTION, HeaderValue::from_static("close"));
            Err(answer)
        }
    }
}

/// What the proxy takes from a main config.
pub struct ProxySettings {
    /// The `proxy:` section.
    pub proxy: ProxyConfig,
    /// Counter bounds (`keys:`).
    pub options: KeyedOptions,
    /// Where counters live (`store:`).
    pub store: StoreConfig,
    /// Client connection bounds (`connections:`).
    pub connections: Connections,
    /// Traces (`traces:` and the `OTEL_*` variables), when on.
    pub traces: Option<tollgate_runtime::config::traces::TraceSettings>,
    /// The console (`console:`), on the metrics listener.
    pub console: Option<tollgate_runtime::config::ConsoleConfig>,
}

/// The proxy for `config` on the memory store as one worker serves it, without a
/// listener: for tests and fuzzing, which bring their own connections.
pub struct ProxyApp {
    proxy: Arc<Proxy>,
    hyper: HyperConns,
}

impl ProxyApp {
    /// Builds the routes of `config` (the errors name the field, as at start).
    pub fn new(config: ProxyConfig, options: KeyedOptions) -> anyhow::Result<ProxyApp> {
        let connect_timeout = config.connect_timeout();
        let table = RouteTable::new(config, options, None, None)?;
        let bounds = Connections::default();
        let proxy = Proxy::new(
            Arc::new(ArcSwap::from_pointee(table)),
            connect_timeout,
            bounds,
            None,
        );
        let body = BodyTimeout::BetweenReads(Duration::from_micros(bounds.body_timeout));
        Ok(ProxyApp {
            proxy,
            hyper: HyperConns::new(&bounds, body),
        })
    }

    /// Serves the client connection `io` from `peer` until it ends, as a worker does.
    pub async fn serve<I>(&self, io: I, peer: SocketAddr)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (proxy, hyper) = (self.proxy.clone(), self.hyper.clone());
        let peer = Arc::new(Peer::new(peer, false));
        serve_connection(proxy, hyper, peer, io, Drain::never()).await;
    }
}

/// Serves one client connection: HTTP/1.1 requests on the fast path; the rest of the
/// connection through hyper from the first request the fast path does not take.
async fn serve_connection<I>(
    proxy: Arc<Proxy>,
    hyper: HyperConns,
    peer: Arc<Peer>,
    io: I,
    mut drain: Drain,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Some((io, read)) = h1::serve(&proxy, &peer, io, &mut drain).await else {
        return;
    };
    let addr = peer.addr;
    let handler = move |req| {
        let (proxy, peer) = (proxy.clone(), peer.clone());
        async move { Ok(handle(&proxy, &peer, req).await) }
    };
    hyper
        .serve(Rewind::new(read, io), addr, handler, drain)
        .await;
}

/// Loads the `proxy:` section of a main config, with the sections it uses.
pub fn load(path: &std::path::Path) -> anyhow::Result<ProxySettings> {
    let mut main = tollgate_runtime::config::MainConfig::load(path)?;
    let options = main.key_options();
    let proxy = main.proxy.take().ok_or_else(|| {
        anyhow::anyhow!(
            "{}: no proxy: section (listen, trusted_proxies, routes: [...])",
            path.display()
        )
    })?;
    if let Some(c) = &main.console {
        if c.listener == Some(tollgate_runtime::config::ConsoleListener::Http) {
            anyhow::bail!("console.listener: the proxy serves its console on its metrics listener (listener: metrics)");
        }
        if proxy.metrics.is_none() {
            anyhow::bail!(
                "console: the proxy serves it on its metrics listener: set proxy.metrics"
            );
        }
    }
    Ok(ProxySettings {
        proxy,
        options,
        store: main.store,
        connections: main.connections,
        traces: main.traces.resolve(&|name| std::env::var(name).ok())?,
        console: main.console,
    })
}

/// The proxy's listeners' TLS (`proxy.tls`, `proxy.metrics_tls`), its files read.
pub struct ListenersTls {
    /// HTTPS on the proxy's listener.
    pub tls: Option<tollgate_runtime::tls::ServerTls>,
    /// HTTPS on the metrics listener.
    pub metrics_tls: Option<tollgate_runtime::tls::ServerTls>,
}

impl ListenersTls {
    /// Reads the files as `tollgate proxy` does at start; an error names the setting
    /// and the file.
    pub fn load(config: &ProxyConfig) -> anyhow::Result<ListenersTls> {
        let load = |tls: &Option<tollgate_runtime::tls::ListenerTls>, setting| {
            (tls.as_ref())
                .map(|t| {
                    tollgate_runtime::tls::ServerTls::load(
                        t,
                        setting,
                        tollgate_runtime::tls::HTTP_ALPN,
                    )
                })
                .transpose()
        };
        if config.metrics_tls.is_some() && config.metrics.is_none() {
            anyhow::bail!("proxy.metrics_tls: needs proxy.metrics (the metrics listener's address)")
        }
        Ok(ListenersTls {
            tls: load(&config.tls, "proxy.tls")?,
            metrics_tls: load(&config.metrics_tls, "proxy.metrics_tls")?,
        })
    }
}

/// What a console over the proxy is made of: `console:` as configured, whether the
/// metrics listener that serves it is TLS, the store's kind, and the proxy's
/// `/metrics` text as a scrape would get it now.
pub struct ConsoleSource {
    /// `console:` (its path, history and top keys).
    pub config: tollgate_runtime::config::ConsoleConfig,
    /// The metrics listener is TLS (the console's session cookie is `Secure`).
    pub secure: bool,
    /// The store's kind (`memory`, `redis`).
    pub store: &'static str,
    /// The proxy's `/metrics` text, now.
    pub exposition: Box<dyn Fn() -> String + Send + Sync>,
}

/// What mounts the console on the metrics listener: its routes, made of a
/// [`ConsoleSource`]. The binary gives it (the console sits above the proxy); without
/// it, `console:` is refused.
pub type ConsoleMount = fn(ConsoleSource) -> axum::Router;

/// Runs the proxy until SIGTERM or Ctrl-C: one single-threaded runtime per CPU, each
/// accepting on its own `SO_REUSEPORT` socket with its own upstream pool (as nginx's
/// workers), sharing the routes and their limiters; the console, when configured,
/// mounted by `mount`.
pub fn run(
    path: &std::path::Path,
    listen: Option<SocketAddr>,
    store_flag: Option<&str>,
    mount: Option<ConsoleMount>,
) -> anyhow::Result<()> {
    let ProxySettings {
        proxy: config,
        options,
        store,
        connections,
        traces,
        console,
    } = load(path)?;
    if console.is_some() && mount.is_none() {
        anyhow::bail!("console: this build of the proxy has no console to mount");
    }
    let store = store.with_flag(store_flag)?;
    tollgate_runtime::connections::warn_if_fd_limit_below(connections.max);
    let slots = Slots::new(connections);
    let connect_timeout = config.connect_timeout();
    let metrics_addr = config.metrics;
    let at_start = AtStart::of(&config);
    let ListenersTls { tls, metrics_tls } = ListenersTls::load(&config)?;
    let addr = listen
        .or(config.listen)
        .unwrap_or_else(|| "127.0.0.1:8000".parse().expect("valid"));
    let (redis_runtime, redis) = connect(&store)?;
    let tracing = traces.as_ref().map(start_tracing).transpose()?;
    let table = Arc::new(ArcSwap::from_pointee(RouteTable::new(
        config,
        options,
        None,
        redis.as_ref(),
    )?));
    let reloads = Arc::new(super::metrics::Reloads::default());
    let reloader = start_reloader(path, &table, redis.clone(), at_start, reloads.clone());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The first worker binds (resolving port 0) and reports the address.
    let (bound_tx, bound_rx) = std::sync::mpsc::channel::<anyhow::Result<SocketAddr>>();
    let worker = |addr, report| {
        let listener = Listener {
            slots: slots.clone(),
            tls: tls.clone(),
        };
        spawn_worker(
            addr,
            report,
            table.clone(),
            listener,
            connect_timeout,
            tracing.as_ref().map(|(_, t)| t.clone()),
        )
    };
    let mut threads = vec![worker(addr, Some(bound_tx))];
    let bound = bound_rx
        .recv()
        .map_err(|_| anyhow::anyhow!("the proxy's first worker died"))??;
    for _ in 1..workers {
        threads.push(worker(bound, None));
    }
    let listeners = [("proxy", tls.clone()), ("metrics", metrics_tls.clone())];
    let about = super::metrics::About::new(listeners, redis.as_ref().map(|r| &r.0), reloads);
    let console = (console.as_ref()).zip(mount);
    let console = console.map(|(c, m)| (c.clone(), store.kind.name(), m));
    let metrics = |addr| {
        spawn_metrics(
            addr,
            table.clone(),
            slots.clone(),
            metrics_tls,
            about,
            console,
        )
    };
    let (metrics, console_at) = metrics_addr.map(metrics).transpose()?.unwrap_or_default();
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!(
        "tollgate proxy: listening on {scheme}://{bound} ({} route(s), {workers} worker(s), {}{metrics})",
        table.load().len(),
        store.describe()
    );
    if let Some(at) = console_at {
        println!("  console: {at}");
    }
    if let Some((_, t)) = &tracing {
        println!("  traces: {}", t.summary());
    }
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a proxy worker panicked"))??;
    }
    if let Some((runtime, t)) = &tracing {
        // The last requests' spans, if the collector takes them soon.
        runtime.block_on(t.flush(Duration::from_secs(2)));
    }
    drop(reloader); // it ends with the process
    drop(redis_runtime);
    Ok(())
}

/// Traces' export task on a runtime of its own (the workers' are single-threaded).
fn start_tracing(
    t: &tollgate_runtime::config::traces::TraceSettings,
) -> anyhow::Result<(
    tokio::runtime::Runtime,
    Arc<tollgate_runtime::traces::Tracing>,
)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("tollgate-traces")
        .enable_all()
        .build()?;
    let tracing = runtime.block_on(async { tollgate_runtime::traces::Tracing::start(t) })?;
    Ok((runtime, Arc::new(tracing)))
}

/// The thread that reloads the routes on SIGHUP and when the file changes, counting
/// each reload in `reloads`; returns once SIGHUP is caught (before the proxy says it
/// is up, else a SIGHUP would end the process).
fn start_reloader(
    path: &std::path::Path,
    table: &Arc<ArcSwap<RouteTable>>,
    redis: Option<RedisBackend>,
    at_start: AtStart,
    reloads: Arc<super::metrics::Reloads>,
) -> std::thread::JoinHandle<()> {
    let (catching_tx, catching) = std::sync::mpsc::channel::<()>();
    let (table, path) = (table.clone(), path.to_path_buf());
    let reloader = std::thread::spawn(move || {
        watch(
            &path,
            &table,
            redis.as_ref(),
            at_start,
            catching_tx,
            move |ok| reloads.count(ok),
        )
    });
    let _ = catching.recv();
    reloader
}

/// The metrics listener (with the console when one is mounted) on a thread of its
/// own, within the `connections:` bounds, over TLS when `tls`; returns what the
/// banner says of it, and where the console answers.
fn spawn_metrics(
    addr: SocketAddr,
    table: Arc<ArcSwap<RouteTable>>,
    slots: Slots,
    tls: Option<tollgate_runtime::tls::ServerTls>,
    about: super::metrics::About,
    console: Option<(
        tollgate_runtime::config::ConsoleConfig,
        &'static str,
        ConsoleMount,
    )>,
) -> anyhow::Result<(String, Option<String>)> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let path = console.as_ref().map(|(c, _, _)| c.path.clone());
    let std_listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("proxy.metrics: cannot listen on {addr}"))?;
    std_listener.set_nonblocking(true)?;
    let bound = std_listener.local_addr()?;
    std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async move {
            if let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) {
                if let Some(tls) = &tls {
                    tls.watch();
                }
                let about = Arc::new(about);
                let console = console.map(|(config, store, mount)| {
                    let (table, about) = (table.clone(), about.clone());
                    mount(ConsoleSource {
                        config,
                        secure: tls.is_some(),
                        store,
                        exposition: Box::new(move || super::metrics::render(&table.load(), &about)),
                    })
                });
                super::metrics::serve(listener, table, slots, tls, about, console).await;
            }
        });
    });
    Ok((
        format!(", metrics on {scheme}://{bound}/metrics"),
        path.map(|p| format!("{scheme}://{bound}{p}/")),
    ))
}

/// The Redis connection when the store is Redis, on a runtime of its own that lives
/// as long as the proxy (a Cluster connection's driver task runs there).
fn connect(
    store: &StoreConfig,
) -> anyhow::Result<(Option<tokio::runtime::Runtime>, Option<RedisBackend>)> {
    if store.per_second.is_some() {
        anyhow::bail!(
            "store.per_second: serve only (envoyproxy/ratelimit's per-second Redis); the proxy keeps every limit in store.url"
        );
    }
    match store.kind {
        StoreKind::Memory => Ok((None, None)),
        StoreKind::Redis => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("tollgate-redis")
                .enable_all()
                .build()?;
            let connected = runtime.block_on(store.connect())?;
            Ok((Some(runtime), Some((connected, store.clone()))))
        }
    }
}

/// What a worker's listener serves with: its connection bounds and its TLS.
struct Listener {
    slots: Slots,
    tls: Option<tollgate_runtime::tls::ServerTls>,
}

/// One worker thread: binds `addr` (reporting the bound address or the error on
/// `report`), then serves until the shutdown signal.
fn spawn_worker(
    addr: SocketAddr,
    report: Option<std::sync::mpsc::Sender<anyhow::Result<SocketAddr>>>,
    table: Arc<ArcSwap<RouteTable>>,
    Listener { slots, tls }: Listener,
    connect_timeout: Duration,
    tracing: Option<Arc<tollgate_runtime::traces::Tracing>>,
) -> std::thread::JoinHandle<anyhow::Result<()>> {
    std::thread::spawn(move || -> anyhow::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let listener = match bind(addr) {
                Ok(l) => l,
                Err(e) => {
                    if let Some(r) = &report {
                        let _ = r.send(Err(anyhow::anyhow!("{e:#}")));
                    }
                    return Err(e);
                }
            };
            if let Some(r) = report {
                let _ = r.send(Ok(listener.local_addr()?));
                // One watcher of the certificate files, on the first worker.
                if let Some(tls) = &tls {
                    tls.watch();
                }
            }
            let proxy = Proxy::new(table, connect_timeout, *slots.bounds(), tracing);
            let body =
                BodyTimeout::BetweenReads(Duration::from_micros(slots.bounds().body_timeout));
            let hyper = HyperConns::new(slots.bounds(), body);
            let handshake = Duration::from_micros(slots.bounds().header_timeout);
            // The peer's forwarding headers are written once per connection.
            let serve_one = move |addr| {
                let (proxy, hyper) = (proxy.clone(), hyper.clone());
                let tls = tls.as_ref().map(tollgate_runtime::tls::ServerTls::acceptor);
                move |io, drain| async move {
                    let peer = Arc::new(Peer::new(addr, tls.is_some()));
                    match tls {
                        None => serve_connection(proxy, hyper, peer, io, drain).await,
                        Some(tls) => {
                            let handshake = tollgate_runtime::connections::handshake_within(
                                handshake, tls, io, addr,
                            );
                            if let Some(io) = handshake.await {
                                serve_connection(proxy, hyper, peer, io, drain).await
                            }
                        }
                    }
                }
            };
            let stop = tollgate_runtime::lifecycle::shutdown_signal();
            tollgate_runtime::connections::serve_accepted(listener, slots, serve_one, stop, None)
                .await;
            Ok(())
        })
    })
}

/// The settings a reload cannot change (the listeners and the upstream connector are
/// built once).
#[derive(Debug, Clone, PartialEq)]
struct AtStart {
    listen: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
    connect_timeout: Option<u64>,
    tls: Option<tollgate_runtime::tls::ListenerTls>,
    metrics_tls: Option<tollgate_runtime::tls::ListenerTls>,
}

impl AtStart {
    fn of(config: &ProxyConfig) -> Self {
        AtStart {
            listen: config.listen,
            metrics: config.metrics,
            connect_timeout: config.connect_timeout,
            tls: config.tls.clone(),
            metrics_tls: config.metrics_tls.clone(),
        }
    }
}

/// Reloads the `proxy:` section on SIGHUP and when the file changes (checked every
/// second). A bad file is rejected with a logged error and the old routes stay;
/// unchanged routes keep their counters. The store stays the one the proxy started
/// with (a changed `store:` section takes a restart). Says on `catching` once SIGHUP
/// is caught, and on `counted` whether each reload was put in force.
fn watch(
    path: &std::path::Path,
    table: &ArcSwap<RouteTable>,
    redis: Option<&RedisBackend>,
    at_start: AtStart,
    catching: std::sync::mpsc::Sender<()>,
    counted: impl Fn(bool),
) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let reload = |reason: &str| {
        let result = load(path).and_then(|loaded| {
            if AtStart::of(&loaded.proxy) != at_start {
                tracing::warn!(
                    "tollgate proxy: listen, metrics, connect_timeout and tls take a restart \
                     (the certificate files themselves are reloaded when they change); \
                     the ones the proxy started with stay in force"
                );
            }
            RouteTable::new(loaded.proxy, loaded.options, Some(&table.load()), redis)
        });
        counted(result.is_ok());
        match result {
            Ok(new) => {
                table.store(Arc::new(new));
                tracing::info!(reason, "tollgate proxy: configuration reloaded ({reason})");
            }
            Err(e) => tracing::error!(
                reason,
                error = %format!("{e:#}"),
                "tollgate proxy: reload rejected, the previous routes stay in force: {e:#}"
            ),
        }
    };
    let hup = runtime.block_on(async { tollgate_runtime::lifecycle::hangups() });
    // Before the proxy says it is up: a change right after is seen.
    let file = tollgate_runtime::lifecycle::Watched::now(vec![path.to_path_buf()]);
    let _ = catching.send(());
    runtime.block_on(tollgate_runtime::lifecycle::watch(
        file,
        hup,
        reload,
        std::future::pending::<()>(),
    ));
}

fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    socket.set_reuseport(true)?;
    socket
        .bind(addr)
        .with_context(|| format!("cannot listen on {addr}"))?;
    Ok(socket.listen(1024)?)
}

#[derive(Debug, Parser)]
/// `tollgate proxy` arguments.
pub struct ProxyArgs {
    /// The main configuration file with a `proxy:` section.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The listen address [default: the config's, else 127.0.0.1:8000].
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// Where counters live: memory, redis://host:port/db or
    /// redis+cluster://host:port,host:port (proxies on one Redis share their limits).
    /// Overrides the config file's store.
    #[arg(long)]
    pub store: Option<String>,
}

/// `tollgate proxy`: needs a config file with a `proxy:` section; `mount` mounts the
/// console when `console:` asks for one.
pub fn command(args: ProxyArgs, mount: Option<ConsoleMount>) -> anyhow::Result<()> {
    let Some(path) = args.config else {
        anyhow::bail!(
            "tollgate proxy needs --config FILE with a proxy: section, e.g.\n\
             proxy:\n  listen: 127.0.0.1:8000\n  routes:\n    - name: api\n      match: {{ path_prefix: /api/ }}\n      upstream: http://127.0.0.1:9000\n      key: client_ip\n      policies: [\"limit-req:rate=10/s,burst=5,nodelay\"]"
        );
    };
    run(&path, args.listen, args.store.as_deref(), mount)
}
