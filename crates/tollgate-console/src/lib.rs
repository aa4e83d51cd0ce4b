//! The live console in the browser (`console:` in the config): what every rule, key
//! and quota bucket is doing now, and a page to try a policy before deploying it.
//!
//! One sampler reads `/metrics`' own exposition once a second, whatever the number
//! of consoles open (so a figure on a page and on `/metrics` cannot disagree, and a
//! console costs the decisions nothing); pages are rendered here, whole (usable
//! without JavaScript) and as live parts streamed by server-sent events. Read-only
//! without the admin token; admin forms need a session opened with it and carry
//! its form token back. Every asset is inside the binary.
//!
//! It reads the decision service and the offline tools' engine (the try page); the
//! binary mounts it on `serve` and on the proxy, and nothing below the binary
//! imports it.

#![forbid(unsafe_code)]

pub mod exposition;
pub mod figures;
pub mod pages;
pub mod proxy_pages;
pub mod routes;
pub mod session;
pub mod try_policy;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Form, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::stream::Stream;
use tollgate::clock::Clock;

use exposition::Reading;
use figures::{Figures, RuleInfo, Sampler};
use pages::{esc, Frame};
use session::Sessions;
use tollgate_service::DecisionService;

/// The strictest policy the pages work under: their own scripts and styles only,
/// no frames, forms posting only here.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

static CSS: &str = include_str!("../assets/console/console.css");
static JS: &str = include_str!("../assets/console/console.js");

/// The console's settings (`console:`, resolved).
#[derive(Debug, Clone)]
pub struct ConsoleSettings {
    /// The path prefix (`/console`).
    pub path: String,
    /// Points of history the charts keep (one a second).
    pub history_points: usize,
    /// Rows of each keys table.
    pub top_keys: usize,
    /// The admin token, if any.
    pub admin_token: Option<String>,
    /// Whether the listener is TLS (the session cookie is then `Secure`).
    pub secure: bool,
}

/// What a console shows.
pub enum Source {
    /// A `serve`: its rules, keys and quota buckets, with admin actions.
    Serve(Arc<DecisionService>),
    /// A proxy: its routes, read-only.
    Proxy(ProxySource),
}

/// A proxy, as its console reads it.
pub struct ProxySource {
    /// Its `/metrics` text, as a scrape gets it.
    pub exposition: Box<dyn Fn() -> String + Send + Sync>,
    /// Its store's name (`memory`, `redis`).
    pub store: &'static str,
}

/// A console over one `serve` or proxy.
pub struct Console {
    settings: ConsoleSettings,
    source: Source,
    sessions: Sessions,
    /// The latest figures, and a signal for the streams when new ones are in.
    latest: Mutex<Arc<Figures>>,
    tick: tokio::sync::watch::Sender<u64>,
    clock: tollgate::clock::MonotonicClock,
    /// One simulation at a time (the try page): consoles cannot crowd the CPU.
    simulating: Arc<tokio::sync::Semaphore>,
    /// When the next log-in may be tried (µs, the console's clock): a second after a
    /// wrong token.
    next_login_us: Mutex<u64>,
    /// The last try's query and what it gave, for its chart's request.
    last_try: Mutex<Option<(String, Tried)>>,
}

impl Console {
    /// A console over `source`; its sampler runs from now on (on the runtime this
    /// is called on).
    pub fn start(settings: ConsoleSettings, source: Source) -> Arc<Console> {
        let console = Arc::new(Console {
            sessions: Sessions::new(settings.admin_token.clone()),
            settings,
            source,
            latest: Mutex::new(Arc::new(Figures::default())),
            tick: tokio::sync::watch::channel(0).0,
            clock: tollgate::clock::MonotonicClock::new(),
            simulating: Arc::new(tokio::sync::Semaphore::new(1)),
            last_try: Mutex::new(None),
            next_login_us: Mutex::new(0),
        });
        let weak = Arc::downgrade(&console);
        tokio::spawn(async move {
            let mut sampler = None;
            let mut every = tokio::time::interval(Duration::from_secs(1));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = 0u64;
            loop {
                every.tick().await;
                let Some(console) = weak.upgrade() else {
                    return;
                };
                let mut s = (sampler.take())
                    .unwrap_or_else(|| Sampler::new(console.settings.history_points));
                // A render of /metrics and its figures: blocking work, off the
                // threads that serve.
                let c = console.clone();
                let Ok(s) = tokio::task::spawn_blocking(move || {
                    c.sample(&mut s);
                    s
                })
                .await
                else {
                    tracing::error!("console: a reading failed; the next starts afresh");
                    continue;
                };
                sampler = Some(s);
                n += 1;
                if n % 60 == 0 {
                    if let Some(top) = console.service().and_then(|s| s.top_keys()) {
                        top.age();
                    }
                }
                console.tick.send_replace(n);
            }
        });
        console
    }

    /// Reads `/metrics` once and keeps the figures made of it.
    fn sample(&self, sampler: &mut Sampler) {
        let text = match &self.source {
            Source::Serve(service) => service.render_metrics(),
            Source::Proxy(proxy) => (proxy.exposition)(),
        };
        let reading = Reading {
            time: wall_seconds(),
            seconds: self.clock.now_us() as f64 / 1e6,
            samples: exposition::parse(&text),
        };
        let figures = match &self.source {
            Source::Serve(service) => {
                let mut figures = sampler.next(reading, service.store_name(), &self.rule_infos());
                budgets(service, &mut figures.quota);
                if let Some(top) = service.top_keys() {
                    figures.top = top.top(self.settings.top_keys);
                }
                figures
            }
            Source::Proxy(proxy) => sampler.next_proxy(reading, proxy.store),
        };
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(figures);
    }

    /// The decision service, for a `serve`'s console.
    fn service(&self) -> Option<&Arc<DecisionService>> {
        match &self.source {
            Source::Serve(s) => Some(s),
            Source::Proxy(_) => None,
        }
    }

    fn rule_infos(&self) -> Vec<RuleInfo> {
        let Some(service) = self.service() else {
            return Vec::new();
        };
        let rules = service.rules();
        let xds = service.xds_version();
        let mut out = Vec::new();
        let mut domains: Vec<_> = rules.domains().collect();
        domains.sort();
        for (domain, source) in domains {
            let source = match &xds {
                Some((server, v)) => format!(
                    "xDS {server} version {}",
                    v.as_deref().unwrap_or("(none yet)")
                ),
                None => source.to_string(),
            };
            for l in rules.limits(domain) {
                out.push(RuleInfo {
                    domain: domain.to_string(),
                    rule: l.path.clone(),
                    name: l.name.clone(),
                    policies: (l.rules.as_ref())
                        .map(|r| r.policies().iter().map(|p| p.to_string()).collect())
                        .unwrap_or_default(),
                    source: source.clone(),
                    shadow: l.shadow,
                    unlimited: l.limiter.is_none() && !l.deny,
                    banned: l.deny,
                });
            }
        }
        out
    }

    fn figures(&self) -> Arc<Figures> {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn now(&self) -> u64 {
        self.clock.now_us() / 1_000_000
    }

    /// The router of every console path, under the prefix.
    pub fn router(self: &Arc<Self>) -> Router {
        let p = self.base().to_string();
        let mut r = Router::new()
            .route(&p, get(overview))
            .route(&format!("{p}/"), get(overview))
            .route(&format!("{p}/try"), get(try_page))
            .route(&format!("{p}/try/chart.svg"), get(try_chart))
            .route(&format!("{p}/events"), get(events))
            .route(&format!("{p}/api/snapshot"), get(snapshot))
            .route(
                &format!("{p}/static/console.css"),
                get(|| async { asset("text/css; charset=utf-8", CSS) }),
            )
            .route(
                &format!("{p}/static/console.js"),
                get(|| async { asset("text/javascript; charset=utf-8", JS) }),
            )
            .route(&format!("{p}/{{*rest}}"), get(not_found));
        r = match &self.source {
            Source::Serve(_) => r
                .route(&format!("{p}/rules"), get(rules))
                .route(&format!("{p}/keys"), get(keys))
                .route(&format!("{p}/keys/reset"), post(reset))
                .route(&format!("{p}/quota"), get(quota))
                .route(&format!("{p}/login"), get(login_page).post(login))
                .route(&format!("{p}/logout"), post(logout))
                .route(&format!("{p}/reload"), post(reload)),
            Source::Proxy(_) => r
                .route(&format!("{p}/routes"), get(routes_page))
                .route(&format!("{p}/adaptive"), get(adaptive_page)),
        };
        // Every answer carries the headers, axum's own (a 405) too.
        r.layer(axum::middleware::map_response(|r: Response| async move {
            secured(r)
        }))
        .with_state(self.clone())
    }

    /// The pages of the navigation: path under the console, title.
    fn nav(&self) -> &'static [(&'static str, &'static str)] {
        match &self.source {
            Source::Serve(_) => &pages::SERVE_PAGES,
            Source::Proxy(_) => &pages::PROXY_PAGES,
        }
    }

    fn frame<'a>(&'a self, page: &'a str, form_token: Option<&'a str>) -> Frame<'a> {
        Frame {
            base: self.settings.path.trim_end_matches('/'),
            page,
            form_token,
            nav: self.nav(),
            admin: matches!(self.source, Source::Serve(_)),
        }
    }

    fn base(&self) -> &str {
        self.settings.path.trim_end_matches('/')
    }

    /// The live part of `page` now, if this console has it; key values shown only
    /// when `reveal` (an admin session).
    fn live_part(&self, page: &str, reveal: bool) -> Option<String> {
        let fig = self.figures();
        let serve = matches!(self.source, Source::Serve(_));
        Some(match (page, serve) {
            ("overview", true) => pages::overview(&fig),
            ("overview", false) => proxy_pages::overview_page(&fig),
            ("rules", true) => pages::rules(&fig),
            ("quota", true) => pages::quota(&fig),
            ("keys", true) => pages::keys(self.base(), &fig.top.0, &fig.top.1, reveal),
            ("routes", false) => proxy_pages::routes_page(&fig.routes),
            ("adaptive", false) => proxy_pages::adaptive_page(&fig.routes),
            _ => return None,
        })
    }
}

/// Each bucket's rule and budget, from the rules in force.
fn budgets(service: &DecisionService, rows: &mut [figures::BucketRow]) {
    use tollgate_service::descriptors::QuotaStrategy;
    let views = service.quota().views();
    for row in rows {
        let view = (views.iter()).find(|v| v.domain == row.domain && v.bucket == row.bucket);
        if let Some(v) = view {
            row.rule = v.rule.clone();
            row.budget = match &v.strategy {
                QuotaStrategy::Budget { policy, .. } => policy.to_string(),
                QuotaStrategy::Blanket(b) => b.name().to_string(),
            };
        }
    }
}

/// Seconds since the Unix epoch: what the figures are stamped with (for people and
/// tools reading them; no limit reads it).
fn wall_seconds() -> f64 {
    #[allow(clippy::disallowed_methods)]
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

type Shared = State<Arc<Console>>;

/// Headers every console answer carries.
fn secured(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    // Not `no-referrer`: under it browsers send `Origin: null` with a form, and the
    // admin forms check their origin.
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn html(status: StatusCode, body: String) -> Response {
    let content_type = [(header::CONTENT_TYPE, "text/html; charset=utf-8")];
    (status, content_type, body).into_response()
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// A redirect to the console's first page, setting `cookie`.
fn home(c: &Console, cookie: &str) -> Response {
    let mut r = (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, format!("{}/", c.base()))],
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(cookie) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::COOKIE).and_then(|v| v.to_str().ok())
}

impl Console {
    fn session(&self, headers: &HeaderMap) -> Option<session::Session> {
        self.sessions.of(cookie(headers), self.now())
    }

    /// A whole page with a live part.
    fn live_page(
        &self,
        headers: &HeaderMap,
        page: &str,
        nav: &str,
        title: &str,
        intro: &str,
    ) -> Response {
        let session = self.session(headers);
        let inner = self.live_part(page, session.is_some()).unwrap_or_default();
        let body = format!("{intro}{}", pages::live(self.base(), page, &inner));
        let frame = self.frame(nav, session.as_ref().map(|s| s.form_token.as_str()));
        html(StatusCode::OK, pages::page(&frame, title, &body))
    }
}

async fn overview(State(c): Shared, headers: HeaderMap) -> Response {
    let session = c.session(&headers);
    let reload = match &session {
        Some(s) => format!(
            "<form method=\"post\" action=\"{}/reload\"><input type=\"hidden\" name=\"form_token\" value=\"{}\"><button type=\"submit\">Reload the rules</button></form>",
            esc(c.base()),
            esc(&s.form_token)
        ),
        None => String::new(),
    };
    c.live_page(&headers, "overview", "", "Overview", &reload)
}

async fn rules(State(c): Shared, headers: HeaderMap) -> Response {
    c.live_page(&headers, "rules", "rules", "Rules", "")
}

async fn routes_page(State(c): Shared, headers: HeaderMap) -> Response {
    c.live_page(&headers, "routes", "routes", "Routes", "")
}

async fn adaptive_page(State(c): Shared, headers: HeaderMap) -> Response {
    c.live_page(&headers, "adaptive", "adaptive", "Adaptive limits", "")
}

async fn quota(State(c): Shared, headers: HeaderMap) -> Response {
    c.live_page(&headers, "quota", "quota", "Quota buckets", "")
}

async fn not_found(State(c): Shared, headers: HeaderMap) -> Response {
    let session = c.session(&headers);
    let frame = c.frame("-", session.as_ref().map(|s| s.form_token.as_str()));
    let body = pages::message(
        "error",
        "No such page in the console; the navigation above lists them.",
    );
    html(
        StatusCode::NOT_FOUND,
        pages::page(&frame, "Not found", &body),
    )
}

/// Query or form pairs, as given.
type Pairs = Vec<(String, String)>;

/// A try's summaries and chart (SVG).
type Tried = Arc<(Vec<tollgate_offline::run::Summary>, String)>;

/// Pairs as one text (what a try is remembered by).
fn query_text(pairs: &Pairs) -> String {
    (pairs.iter())
        .map(|(k, v)| format!("{}={}", pages::url_encode(k), pages::url_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn field<'a>(pairs: &'a Pairs, name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// `key=value, key=value` (commas or new lines between entries).
fn parse_entries(text: &str) -> Result<Vec<(String, String)>, String> {
    let entries: Vec<(String, String)> = text
        .split([',', '\n'])
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(format!("entry {e:?}: expected key=value")),
        })
        .collect::<Result<_, _>>()?;
    if entries.is_empty() {
        return Err("no entries: give at least one key=value".into());
    }
    Ok(entries)
}

async fn keys(
    State(c): Shared,
    headers: HeaderMap,
    query: Result<Query<Pairs>, QueryRejection>,
) -> Response {
    let session = c.session(&headers);
    let pairs = query.map(|q| q.0).unwrap_or_default();
    let domain = field(&pairs, "domain").unwrap_or("");
    let entries = field(&pairs, "entries").unwrap_or("");
    let mut result = String::new();
    if !domain.is_empty() || !entries.is_empty() {
        result = lookup(&c, session.as_ref(), domain, entries).await;
    }
    let base = esc(c.base());
    let form = format!(
        "<section id=\"lookup\" aria-labelledby=\"lookup-h\"><h2 id=\"lookup-h\">Look up a key</h2>\
<form method=\"get\" action=\"{base}/keys#lookup\" class=\"grid\"><label for=\"domain\">Domain</label><input id=\"domain\" name=\"domain\" value=\"{}\" required>\
<label for=\"entries\">Entries</label><input id=\"entries\" name=\"entries\" value=\"{}\" placeholder=\"api_key=k1, path=/login\" required>\
<button type=\"submit\">Look up</button></form>{result}</section><h2>Keys now</h2>",
        esc(domain),
        esc(entries)
    );
    let inner = c.live_part("keys", session.is_some()).unwrap_or_default();
    let body = format!("{form}{}", pages::live(c.base(), "keys", &inner));
    let frame = c.frame("keys", session.as_ref().map(|s| s.form_token.as_str()));
    html(StatusCode::OK, pages::page(&frame, "Keys", &body))
}

/// The look-up's answer: what one more request would be told, and a reset for admins.
async fn lookup(
    c: &Console,
    session: Option<&session::Session>,
    domain: &str,
    entries: &str,
) -> String {
    let parsed = match parse_entries(entries) {
        Ok(p) => p,
        Err(e) => return pages::message("error", &format!("Entries: {e}")),
    };
    if domain.trim().is_empty() {
        return pages::message("error", "Domain: give the domain of the rules to look in.");
    }
    let Some(service) = c.service() else {
        return String::new();
    };
    let (path, decision) = match service.look(domain.trim(), &parsed).await {
        Ok(Some(found)) => found,
        Ok(None) => {
            return pages::message(
                "error",
                &format!("No rule of domain {domain:?} matches {entries:?}: nothing limits it."),
            )
        }
        Err(e) => return pages::message("error", &format!("The store could not answer: {e}")),
    };
    let state = match decision {
        None => "<p>Unlimited: this rule never counts.</p>".to_string(),
        Some(d) => {
            let mut rows = String::new();
            let policies = (service.rules().find(domain.trim(), &parsed))
                .and_then(|m| {
                    m.limit.rules.as_ref().map(|r| {
                        r.policies()
                            .iter()
                            .map(|p| p.to_string())
                            .collect::<Vec<_>>()
                    })
                })
                .unwrap_or_default();
            for (i, p) in d.policies.iter().enumerate() {
                let retry = p
                    .retry_after_us
                    .map_or("–".to_string(), |us| format!("{:.3} s", us as f64 / 1e6));
                rows.push_str(&format!(
                    "<tr><th scope=\"row\"><code>{}</code></th><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.3} s</td><td class=\"n\">{retry}</td></tr>",
                    esc(policies.get(i).map_or("", String::as_str)),
                    if p.allowed { "allowed" } else { "rejected" },
                    p.limit,
                    p.remaining,
                    p.reset_after_us as f64 / 1e6,
                ));
            }
            format!(
                "<table id=\"state\"><caption>What one more request would be told now (counting nothing)</caption><thead><tr><th scope=\"col\">Policy</th><th scope=\"col\">Next request</th><th scope=\"col\">Limit</th><th scope=\"col\">Remaining</th><th scope=\"col\">Reset after</th><th scope=\"col\">Retry after</th></tr></thead><tbody>{rows}</tbody></table>"
            )
        }
    };
    let reset = match session {
        Some(s) => format!(
            "<form method=\"post\" action=\"{}/keys/reset\"><input type=\"hidden\" name=\"form_token\" value=\"{}\"><input type=\"hidden\" name=\"domain\" value=\"{}\"><input type=\"hidden\" name=\"entries\" value=\"{}\"><button type=\"submit\" class=\"danger\">Reset this key</button></form>",
            esc(c.base()),
            esc(&s.form_token),
            esc(domain),
            esc(entries)
        ),
        None if c.sessions.enabled() => format!("<p class=\"note\"><a href=\"{}/login\">Log in</a> with the admin token to reset it.</p>", esc(c.base())),
        None => "<p class=\"note\">Resetting needs <code>admin.token</code> in the config (admin actions are off without it).</p>".into(),
    };
    format!("<p>Rule <code>{}</code></p>{state}{reset}", esc(&path))
}

/// Whether a form comes from this console's own pages: no `Origin` (a client that
/// is not a browser), or one naming the host it was sent to.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = (headers.get(header::HOST))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    origin.split_once("://").map_or("", |(_, h)| h) == host
}

/// An admin form that passed its checks: the session's cookie, its form token, and
/// a post from this console's own origin. Its pairs, and the headers.
struct AdminForm {
    pairs: Pairs,
    headers: HeaderMap,
}

impl axum::extract::FromRequest<Arc<Console>> for AdminForm {
    type Rejection = Response;

    async fn from_request(req: axum::extract::Request, c: &Arc<Console>) -> Result<Self, Response> {
        let headers = req.headers().clone();
        let refuse = |why: &str| {
            let frame = c.frame("-", None);
            let body = pages::page(&frame, "Not allowed", &pages::message("error", why));
            html(StatusCode::FORBIDDEN, body)
        };
        if !same_origin(&headers) {
            return Err(refuse(
                "This form was posted from another site; it is refused.",
            ));
        }
        let Some(session) = c.session(&headers) else {
            return Err(refuse(
                "Admin actions need a session: log in with the admin token first.",
            ));
        };
        let pairs = match Form::<Pairs>::from_request(req, c).await {
            Ok(Form(pairs)) => pairs,
            Err(e) => {
                return Err(refuse(&format!(
                    "The form could not be read: {}",
                    e.body_text()
                )))
            }
        };
        let given = field(&pairs, "form_token").unwrap_or("");
        if !session::same(given.as_bytes(), session.form_token.as_bytes()) {
            return Err(refuse(
                "The form's token is missing or stale: reload the page and try again.",
            ));
        }
        Ok(AdminForm { pairs, headers })
    }
}

async fn reset(State(c): Shared, form: AdminForm) -> Response {
    let headers = &form.headers;
    let pairs = &form.pairs;
    let domain = field(pairs, "domain").unwrap_or("").trim().to_string();
    let entries = field(pairs, "entries").unwrap_or("").to_string();
    let outcome = match parse_entries(&entries) {
        Err(e) => pages::message("error", &format!("Entries: {e}")),
        Ok(parsed) => match c.reset(&domain, &parsed).await {
            Ok(true) => {
                // The entries' keys, not their values (an API key is a secret).
                let keys: Vec<&str> = parsed.iter().map(|(k, _)| k.as_str()).collect();
                tracing::info!(domain, keys = ?keys, "console: a key reset");
                pages::message("note", &format!("Reset: {domain} {entries} starts afresh."))
            }
            Ok(false) => pages::message("error", "No rule matches that key: nothing to reset."),
            Err(e) => pages::message("error", &format!("The store could not reset it: {e}")),
        },
    };
    let session = c.session(headers);
    let frame = c.frame("keys", session.as_ref().map(|s| s.form_token.as_str()));
    let back = format!(
        "<p><a href=\"{}/keys?domain={}&amp;entries={}#lookup\">Back to the key</a></p>",
        esc(c.base()),
        esc(&pages::url_encode(&domain)),
        esc(&pages::url_encode(&entries))
    );
    html(
        StatusCode::OK,
        pages::page(&frame, "Reset a key", &(outcome + &back)),
    )
}

async fn reload(State(c): Shared, form: AdminForm) -> Response {
    let headers = &form.headers;
    let reloaded = match c.service() {
        Some(service) if service.xds_version().is_some() => {
            Err("the rules come from the xDS server: each version it sends is the reload".into())
        }
        // Reading the files is blocking work: off the threads that serve.
        Some(service) => {
            let service = service.clone();
            tokio::task::spawn_blocking(move || {
                service.reload("the console").map_err(|e| e.to_string())
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()))
        }
        None => Err("the proxy reloads on SIGHUP or a changed file".into()),
    };
    let (status, text) = match reloaded {
        Ok(()) => (
            StatusCode::OK,
            pages::message("note", "The rules were read again and are in force."),
        ),
        Err(e) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            pages::message(
                "error",
                &format!("Refused (the rules before it stay in force): {e}"),
            ),
        ),
    };
    let session = c.session(headers);
    let frame = c.frame("", session.as_ref().map(|s| s.form_token.as_str()));
    html(status, pages::page(&frame, "Reload", &text))
}

async fn login_page(State(c): Shared, headers: HeaderMap) -> Response {
    let session = c.session(&headers);
    let frame = c.frame("login", session.as_ref().map(|s| s.form_token.as_str()));
    html(
        StatusCode::OK,
        pages::page(&frame, "Admin log-in", &login_form(&c, "")),
    )
}

fn login_form(c: &Console, message: &str) -> String {
    if !c.sessions.enabled() {
        return pages::message("note", "Admin actions are off: set admin.token (or TOLLGATE_ADMIN_TOKEN) to turn them on. Everything else here is read-only and open.");
    }
    format!(
        "{message}<form method=\"post\" action=\"{}/login\" class=\"grid\"><label for=\"token\">Admin token</label><input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required><button type=\"submit\">Log in</button></form>",
        esc(c.base())
    )
}

async fn login(
    State(c): Shared,
    headers: HeaderMap,
    form: Result<Form<Pairs>, FormRejection>,
) -> Response {
    let given = form
        .as_ref()
        .ok()
        .and_then(|f| field(&f.0, "token"))
        .unwrap_or("")
        .to_string();
    let frame = c.frame("login", None);
    let refuse = |status, why: &str| {
        let body = login_form(&c, &pages::message("error", why));
        html(status, pages::page(&frame, "Admin log-in", &body))
    };
    if !same_origin(&headers) {
        return refuse(
            StatusCode::FORBIDDEN,
            "This form was posted from another site; it is refused.",
        );
    }
    // One guess a second after a wrong one, whoever makes it: a token cannot be
    // guessed at the speed of the network.
    let now_us = c.clock.now_us();
    let mut next = c.next_login_us.lock().unwrap_or_else(|e| e.into_inner());
    if now_us < *next {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many attempts: wait a second and try again.",
        );
    }
    let opened = c.sessions.open(&given, c.now());
    if opened.is_none() {
        *next = now_us + 1_000_000;
    }
    drop(next);
    match opened {
        Some((id, _)) => {
            let secure = if c.settings.secure { "; Secure" } else { "" };
            let cookie = format!(
                "{}={id}; Path={}; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
                session::COOKIE,
                c.base(),
                session::SESSION_SECONDS
            );
            tracing::info!("console: an admin session opened");
            home(&c, &cookie)
        }
        None => {
            let why = if c.sessions.enabled() {
                pages::message("error", "Wrong token.")
            } else {
                String::new()
            };
            html(
                StatusCode::UNAUTHORIZED,
                pages::page(&frame, "Admin log-in", &login_form(&c, &why)),
            )
        }
    }
}

async fn logout(State(c): Shared, form: AdminForm) -> Response {
    let headers = &form.headers;
    c.sessions.close(cookie(headers));
    let expired = format!(
        "{}=; Path={}; HttpOnly; SameSite=Strict; Max-Age=0",
        session::COOKIE,
        c.base()
    );
    home(&c, &expired)
}

/// The figures as JSON (documented in docs/console.md): what the pages show.
async fn snapshot(State(c): Shared, headers: HeaderMap) -> Response {
    let fig = c.figures();
    // Key values (API keys, user ids) only to an admin session.
    let reveal = c.session(&headers).is_some();
    let shown = |list: &[tollgate_service::top_keys::KeyCount]| -> Vec<_> {
        (list.iter())
            .map(|k| tollgate_service::top_keys::KeyCount {
                key: if reveal {
                    k.key.clone()
                } else {
                    pages::masked(&k.key)
                },
                ..k.clone()
            })
            .collect()
    };
    let body = serde_json::json!({
        "figures": &*fig,
        "keys": { "used": shown(&fig.top.0), "rejected": shown(&fig.top.1), "values_shown": reveal },
    });
    axum::Json(body).into_response()
}

/// Server-sent events: the live part of `page` once a second (event `live`, data
/// `{"html": ...}`).
async fn events(
    State(c): Shared,
    headers: HeaderMap,
    query: Result<Query<Pairs>, QueryRejection>,
) -> Response {
    let pairs = query.map(|q| q.0).unwrap_or_default();
    let page = field(&pairs, "page").unwrap_or("").to_string();
    let reveal = c.session(&headers).is_some();
    if c.live_part(&page, reveal).is_none() {
        let why = format!("no live page {page:?} (overview, rules, keys, quota)\n");
        return (StatusCode::NOT_FOUND, why).into_response();
    }
    let rx = c.tick.subscribe();
    let stream = live_stream(c.clone(), page, reveal, rx);
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn live_stream(
    c: Arc<Console>,
    page: String,
    reveal: bool,
    rx: tokio::sync::watch::Receiver<u64>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold((c, page, rx), move |(c, page, mut rx)| async move {
        rx.changed().await.ok()?;
        let html = c.live_part(&page, reveal)?;
        let data = serde_json::json!({ "html": html }).to_string();
        Some((Ok(Event::default().event("live").data(data)), (c, page, rx)))
    })
}

async fn try_page(
    State(c): Shared,
    headers: HeaderMap,
    query: Result<Query<Pairs>, QueryRejection>,
) -> Response {
    let session = c.session(&headers);
    let frame = c.frame("try", session.as_ref().map(|s| s.form_token.as_str()));
    let (pairs, bad_query) = match query {
        Ok(q) => (q.0, None),
        Err(e) => (Vec::new(), Some(e.body_text())),
    };
    let form = try_policy::Form::from_pairs(&pairs);
    let mut body = try_policy::form_html(c.base(), &form);
    if let Some(e) = bad_query {
        body.push_str(&pages::message(
            "error",
            &format!("The query could not be read: {e}"),
        ));
    } else if !pairs.is_empty() {
        body.push_str(&match c.simulate(&pairs).await {
            Ok(tried) => try_policy::result_html(c.base(), &pairs, &tried.0),
            Err(e) => pages::message("error", &e),
        });
    }
    html(StatusCode::OK, pages::page(&frame, "Try a policy", &body))
}

async fn try_chart(State(c): Shared, query: Result<Query<Pairs>, QueryRejection>) -> Response {
    let pairs = query.map(|q| q.0).unwrap_or_default();
    match c.simulate(&pairs).await {
        Ok(tried) => ([(header::CONTENT_TYPE, "image/svg+xml")], tried.1.clone()).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e).into_response(),
    }
}

impl Console {
    /// Resets a key of a `serve`'s rules.
    async fn reset(&self, domain: &str, entries: &[(String, String)]) -> Result<bool, String> {
        match self.service() {
            Some(service) => service.reset(domain, entries).await,
            None => Err("the proxy's console has no keys to reset".into()),
        }
    }

    /// Runs the try page's simulation of `pairs` off the async workers, one at a
    /// time (the permit goes with the run, even when its caller leaves); the last
    /// one is kept for its chart's request.
    async fn simulate(&self, pairs: &Pairs) -> Result<Tried, String> {
        let key = query_text(pairs);
        if let Some((k, tried)) = &*self.last_try.lock().unwrap_or_else(|e| e.into_inner()) {
            if *k == key {
                return Ok(tried.clone());
            }
        }
        let scenario = try_policy::Form::from_pairs(pairs).scenario()?;
        let Ok(one) = self.simulating.clone().try_acquire_owned() else {
            return Err("Another try is running; try again in a moment.".into());
        };
        let tried = tokio::task::spawn_blocking(move || {
            let _one = one;
            try_policy::simulate(&scenario).map(Arc::new)
        })
        .await
        .map_err(|e| format!("the simulation failed: {e}"))??;
        *self.last_try.lock().unwrap_or_else(|e| e.into_inner()) = Some((key, tried.clone()));
        Ok(tried)
    }
}
