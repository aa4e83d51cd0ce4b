//! A route's limits and how a request meets them: the rate counters (`policies:`,
//! per tier) with nginx `limit_req` semantics, the `limit_conn` permits, the
//! rate-limit headers, and what a reject, a delay or a failed store answers.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use tollgate::concurrency::{ConcurrencyError, KeyedConcurrencyLimiter, KeyedConcurrencyPermit};
use tollgate::keyed::KeyedOptions;
use tollgate::redis::{
    PermitError, RedisConcurrencyLimiter, RedisConcurrencyOptions, RedisPermit, RedisStore,
};
use tollgate::{AnyLimiter, Decision, KeyedLimiter, Op, RateLimiter, RuleDecision, RuleSet};

use super::adaptive::AdaptiveHold;
use super::cost::{Pending, RouteCost};
use super::problem::{
    openai_budget_headers, openai_reject, problem, problem_body, problem_response,
    store_unavailable, OpenAiReject, Problem,
};
use tollgate::headers::{HeaderStyle, PolicyHeader};
use tollgate_runtime::config::proxy::{RejectFormat, RouteConfig};
use tollgate_runtime::config::store::StoreConfig;
use tollgate_runtime::store_metrics::StoreStats;

/// Counters in Redis: the connection and the `store:` settings (failure policy, ...).
pub(super) type RedisBackend = (RedisStore, StoreConfig);

/// One set of rate counters: a route's `policies:` or one tier's.
struct RateCounters {
    /// The counters, in memory or in Redis.
    counter: AnyLimiter,
    /// Their rules.
    rules: RuleSet,
    /// The most their enforced policies can admit at once (the smallest headline
    /// limit; a shadow policy's never caps a reservation).
    most: u64,
    /// What their headers say whatever the decision (formatted once), named
    /// "default" or after the tier.
    policy_header: PolicyHeader,
    /// What they count: `tokens` (a `cost:` route's policies) or `requests`.
    unit: &'static str,
}

/// Where a route's `limit_conn` permits live.
enum Conns {
    Memory(KeyedConcurrencyLimiter<String>),
    Redis(RedisConcurrencyLimiter),
}

/// A held `limit_conn` permit: released when dropped (with the response body).
pub(super) enum ConnPermit {
    Memory(#[allow(dead_code)] KeyedConcurrencyPermit<String>),
    Redis(#[allow(dead_code)] RedisPermit),
}

/// Everything a route limits with, and how it answers.
pub(super) struct RouteLimits {
    default: Option<RateCounters>,
    /// `cost.requests`: counters of requests, beside `default`'s of their cost.
    requests: Option<RateCounters>,
    /// Key values with their own limits (`None`: the route's), checked before
    /// `default`.
    tiers: Vec<(Vec<String>, Option<RateCounters>)>,
    conns: Option<Conns>,
    status: StatusCode,
    /// The problem+json body of a rate-limit reject, built once.
    reject_body: bytes::Bytes,
    /// How a reject's body is shaped.
    format: RejectFormat,
    /// `limit_conn`'s value, for what its reject says.
    limit_conn: Option<u32>,
    headers: HeaderStyle,
    dry_run: bool,
    /// `cost:`: requests are charged what their responses report.
    pub cost: Option<Arc<RouteCost>>,
    /// The route's name, for the cost's log lines.
    route: Arc<str>,
}

/// What a request that passed its limits carries on: the rate-limit headers for its
/// response and the `limit_conn` permit held until the response ends.
#[derive(Default)]
pub(super) struct Passed {
    pub headers: HeaderMap,
    pub permit: Option<ConnPermit>,
    /// The route's adaptive permit, taken after the rate limits and `limit_conn`.
    pub adaptive: Option<AdaptiveHold>,
    /// Under `cost:`, the units the admission took, settled against the response.
    pub pending: Option<Pending>,
    /// Whether `cost.requests` counted the request.
    pub counted: bool,
}

/// The Redis name of a route's counters: `proxy.ROUTE.PART` (no braces: they would
/// move the hash tag).
fn redis_name(route: &str, part: &str) -> String {
    format!("proxy.{route}.{part}").replace(['{', '}'], "_")
}

impl RouteLimits {
    /// Adds what the route's Redis counters saw to `stats`: their calls' outcomes,
    /// and whether Redis is failing now, summed and by node (nothing on the memory
    /// store).
    pub fn add_redis_stats(&self, stats: &mut StoreStats) {
        let tiers = self.tiers.iter().filter_map(|(_, c)| c.as_ref());
        for counters in self.default.iter().chain(&self.requests).chain(tiers) {
            stats.add(&counters.counter);
        }
        if let Some(Conns::Redis(conns)) = &self.conns {
            stats.add_redis(conns.stats(), conns.node_stats());
        }
    }

    /// Builds route `r`'s limits (`at` names it in errors), on Redis when `redis`.
    pub fn build(
        r: &RouteConfig,
        at: &str,
        options: KeyedOptions,
        redis: Option<&RedisBackend>,
    ) -> anyhow::Result<RouteLimits> {
        let status = StatusCode::from_u16(r.status)
            .ok()
            .filter(|s| s.is_client_error() || s.is_server_error())
            .ok_or_else(|| {
                anyhow::anyhow!("{at}.status: {} is not a 4xx or 5xx status", r.status)
            })?;
        // What the policies count: a `cost:` route's, its cost (tokens).
        let unit = if r.cost.is_some() {
            "tokens"
        } else {
            "requests"
        };
        let tiers: Vec<(Vec<String>, Option<RateCounters>)> = r
            .tiers
            .iter()
            .enumerate()
            .map(|(t, tier)| {
                let at = format!("{at}.tiers[{t}]");
                if tier.policies.is_empty() && tier.priority.is_none() {
                    anyhow::bail!("{at}: needs policies, a priority, or both");
                }
                let l = RateCounters::build(
                    (&r.name, &tier.name, unit),
                    &tier.policies,
                    &format!("{at}.policies"),
                    options,
                    redis,
                )?;
                Ok((tier.values.clone(), l))
            })
            .collect::<anyhow::Result<_>>()?;
        let default = RateCounters::build(
            (&r.name, "default", unit),
            &r.policies,
            &format!("{at}.policies"),
            options,
            redis,
        )?;
        let requests = match &r.cost {
            Some(c) => RateCounters::build(
                (&r.name, "requests", "requests"),
                &c.requests,
                &format!("{at}.cost.requests"),
                options,
                redis,
            )?,
            None => None,
        };
        // Counted requests are given back when refused: a policy must take that.
        for p in requests.iter().flat_map(|l| l.rules.policies()) {
            if let Err(e) = p.chargeable() {
                anyhow::bail!("{at}.cost.requests: {p}: {e}");
            }
        }
        if let Some(c) = &r.cost {
            check_cost(
                c,
                at,
                default
                    .iter()
                    .chain(tiers.iter().filter_map(|(_, l)| l.as_ref())),
            )?;
        }
        Ok(RouteLimits {
            default,
            requests,
            tiers,
            conns: r
                .limit_conn
                .map(|n| Conns::build(&r.name, n, options, redis))
                .transpose()
                .map_err(|e| anyhow::anyhow!("{at}.limit_conn: {e:#}"))?,
            status,
            reject_body: problem_body(status, "rate limit exceeded"),
            format: r.reject_format,
            limit_conn: r.limit_conn,
            headers: r.headers,
            dry_run: r.dry_run,
            cost: r
                .cost
                .as_ref()
                .map(|c| RouteCost::build(c, at).map(Arc::new))
                .transpose()?,
            route: Arc::from(r.name.as_str()),
        })
    }

    /// The tier whose values hold `key` (its index in the route's `tiers`): looked up
    /// once per request, for the rate limits and the adaptive priority alike.
    pub fn tier_of(&self, key: &str) -> Option<usize> {
        self.tiers
            .iter()
            .position(|(values, _)| values.iter().any(|v| v == key))
    }

    /// Whether admission reads a request body (under `cost:` with `reserve:
    /// declared`), and the most of one it reads.
    pub fn reads_body(&self) -> Option<usize> {
        (self.cost.as_ref()).and_then(|c| c.reads_request().then_some(c.max_body))
    }

    /// The body a request to `path` with `body` goes upstream with instead, asking
    /// for its usage (see `cost.ask_usage`).
    pub fn ask_for_usage(&self, path: &str, body: &[u8]) -> Option<Vec<u8>> {
        (self.cost.as_ref()).and_then(|c| c.ask_for_usage(path, body))
    }

    /// Meets `key`'s limits (of its `tier`, from [`Self::tier_of`]): the rate
    /// counters first (a delay of `limit-req` without `nodelay` is slept here), then
    /// a `limit_conn` permit. `Err` is the response to send instead of forwarding (a
    /// dry run forwards everything).
    pub async fn pass(
        &self,
        key: &str,
        tier: Option<usize>,
        body: Option<&[u8]>,
    ) -> Result<Passed, Problem> {
        let mut headers = HeaderMap::new();
        let mut pending = None;
        // `cost.requests` first: a request its count refuses takes no tokens.
        // limit_req without nodelay holds a request, not rejects it: for the longest
        // delay of its limits.
        let mut wait_us = 0;
        let counted = match &self.requests {
            Some(r) => {
                let d = self.check_rate(r, key, 1, &mut headers).await?;
                if d.allowed {
                    wait_us = d.wait_us;
                }
                d.allowed
            }
            None => false,
        };
        if let Some(l) = self.limits_of(tier) {
            // Under `cost:`, the admission takes what the request reserves (`body`:
            // its bytes, when read); the rest is settled when the response ends. A
            // bound past what the policies can ever admit at once reserves all of it.
            let take = (self.cost.as_ref()).map_or(1, |c| c.reservation(body).min(l.most));
            let d = match self.check_rate(l, key, take, &mut headers).await {
                Ok(d) => d,
                Err(reject) => {
                    self.give_back(key, None, counted).await;
                    return Err(reject);
                }
            };
            if d.allowed {
                wait_us = wait_us.max(d.wait_us);
            }
            // A shadow policy's reject still lets the others take the estimate.
            if let (Some(cost), true) = (&self.cost, d.allowed) {
                let counter = l.counter.clone();
                pending = Some(Pending::new(
                    counter,
                    key,
                    take,
                    cost.clone(),
                    self.route.clone(),
                ));
            }
        }
        if wait_us > 0 && !self.dry_run {
            tokio::time::sleep(Duration::from_micros(wait_us)).await;
        }
        let permit = match self.take_conn(key).await {
            Ok(permit) => permit,
            Err(reject) => {
                self.give_back(key, pending, counted).await;
                return Err(reject);
            }
        };
        Ok(Passed {
            headers,
            permit,
            adaptive: None,
            pending,
            counted,
        })
    }

    /// A request of `key` that passed the rate counters was refused after all (by
    /// `limit_conn`, by the adaptive limit): what it took is given back (`pending`,
    /// its reservation; `counted`, its count under `cost.requests`). Nothing used,
    /// nothing counted.
    pub async fn give_back(&self, key: &str, pending: Option<Pending>, counted: bool) {
        if let Some(pending) = pending {
            pending.give_back();
        }
        if let (Some(r), true) = (&self.requests, counted) {
            if let Err(e) = r.counter.refund(key, 1).await {
                tracing::warn!(key, error = %e, "tollgate: proxy: a request count could not be given back (the store failed)");
            }
        }
    }

    /// The tier's own limits, else the route's.
    fn limits_of(&self, tier: Option<usize>) -> Option<&RateCounters> {
        tier.and_then(|t| self.tiers[t].1.as_ref())
            .or(self.default.as_ref())
    }

    /// One rate check of `key`; writes the headers; `Err` is the reject to send.
    async fn check_rate(
        &self,
        l: &RateCounters,
        key: &str,
        cost: u64,
        headers: &mut HeaderMap,
    ) -> Result<Decision, Problem> {
        let rd = match l.counter.check_rules(key, cost, Op::Try).await {
            Ok(d) => d,
            Err(e) => match e.rejection() {
                // A full limiter refusing new keys.
                Some(d) => RuleDecision::from(d),
                // Redis failed under `on_error: error`: say so (a dry run forwards).
                None if self.dry_run => RuleDecision::from(Decision::admitted(0, 0, 0, 0)),
                None => return Err(store_unavailable(&e)),
            },
        };
        rate_headers(headers, self.headers, &rd, l);
        let d = rd.decision;
        if self.format == RejectFormat::Openai && d.allowed {
            // As OpenAI answers every request: each budget's standing (a reject
            // writes its own).
            let budget = (d.limit, d.remaining);
            openai_budget_headers(headers, l.unit, budget, d.reset_after_us);
        }
        if !d.allowed && !self.dry_run {
            let mut r = match self.format {
                RejectFormat::Problem => {
                    problem_response(self.status, self.reject_body.clone(), d.retry_after_us)
                }
                RejectFormat::Openai => self.openai_rate_reject(&rd, l, cost),
            };
            r.headers.extend(std::mem::take(headers));
            return Err(r);
        }
        Ok(d)
    }

    /// A rate reject in OpenAI's shape: the binding policy named, with its limit,
    /// what is left and when the request would pass.
    fn openai_rate_reject(&self, rd: &RuleDecision, l: &RateCounters, cost: u64) -> Problem {
        let d = &rd.decision;
        let policy = l.rules.policies().get(rd.binding);
        let what = match policy {
            Some(p) => format!("route {}: {p}", self.route),
            None => format!("route {}", self.route),
        };
        let unit = l.unit;
        openai_reject(
            self.status,
            &OpenAiReject {
                unit,
                what: &what,
                budget: Some((d.limit, d.remaining)),
                requested: cost,
                retry_after_us: d.retry_after_us.unwrap_or(d.reset_after_us),
                reset_after_us: d.reset_after_us,
            },
        )
    }

    /// A `limit_conn` permit for `key` (none without `limit_conn`, or when a dry run
    /// finds none free); `Err` is the reject to send.
    async fn take_conn(&self, key: &str) -> Result<Option<ConnPermit>, Problem> {
        // When a permit frees is when some request ends, which the proxy cannot know:
        // a second is the hint (nginx's limit_conn gives none).
        let busy = || match self.format {
            RejectFormat::Problem => {
                problem(self.status, "too many concurrent requests", Some(1_000_000))
            }
            RejectFormat::Openai => openai_reject(
                self.status,
                &OpenAiReject {
                    unit: "requests",
                    what: &format!(
                        "route {}: limit_conn {} (requests in flight per key)",
                        self.route,
                        self.limit_conn.unwrap_or(0)
                    ),
                    budget: None,
                    requested: 1,
                    retry_after_us: 1_000_000,
                    reset_after_us: 1_000_000,
                },
            ),
        };
        match &self.conns {
            None => Ok(None),
            Some(Conns::Memory(conns)) => match conns.try_acquire(key, 1) {
                Ok(p) => Ok(Some(ConnPermit::Memory(p))),
                Err(ConcurrencyError::Busy { .. }) | Err(ConcurrencyError::TooManyKeys { .. })
                    if !self.dry_run =>
                {
                    Err(busy())
                }
                Err(_) => Ok(None),
            },
            Some(Conns::Redis(conns)) => match conns.try_acquire(key, 1).await {
                Ok(p) => Ok(Some(ConnPermit::Redis(p))),
                Err(_) if self.dry_run => Ok(None),
                Err(PermitError::Denied(_)) => Err(busy()),
                Err(PermitError::Store(e)) => Err(store_unavailable(&e)),
            },
        }
    }
}

/// `cost:` needs rate policies it can charge, each able to admit the estimate.
fn check_cost<'a>(
    c: &tollgate_runtime::config::proxy::CostConfig,
    at: &str,
    limits: impl Iterator<Item = &'a RateCounters>,
) -> anyhow::Result<()> {
    let mut any = false;
    for l in limits {
        any = true;
        for p in l.rules.policies() {
            if let Err(e) = p.chargeable() {
                anyhow::bail!("{at}.cost: {p}: {e}");
            }
            if !p.keeps_debt() {
                anyhow::bail!(
                    "{at}.cost: {p}: forgets a charge's debt when its window moves on, so \
                     usage past the budget would be forgiven; use fixed-window (which \
                     carries the debt into the windows after it), token-bucket or gcra"
                );
            }
            if let Err(e) = p.check(&mut p.init(0), 0, c.estimate.max(1), Op::Try) {
                anyhow::bail!("{at}.cost.estimate: {p}: {e}");
            }
        }
    }
    if !any {
        anyhow::bail!("{at}.cost: needs policies to charge (the route has none)");
    }
    Ok(())
}

impl RateCounters {
    /// The counters of `specs` (the field `at`) for route `route`'s part `name`
    /// (`default`, a tier, or `requests`), counting `unit`; `None` without specs.
    fn build(
        (route, name, unit): (&str, &str, &'static str),
        specs: &[String],
        at: &str,
        options: KeyedOptions,
        redis: Option<&RedisBackend>,
    ) -> anyhow::Result<Option<RateCounters>> {
        if specs.is_empty() {
            return Ok(None);
        }
        let rules = RuleSet::parse(specs).map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
        let counter = match redis {
            None => AnyLimiter::Memory(KeyedLimiter::with_options(
                rules.clone(),
                options,
                tollgate::clock::MonotonicClock::new(),
            )),
            Some((store, config)) => config
                // The proxy may hold a request for a later window (max-wait): no window
                // counters.
                .limiter(store, &redis_name(route, name), rules.clone(), false)
                .map_err(|e| anyhow::anyhow!("{at} (store redis): {e}"))?,
        };
        Ok(Some(RateCounters {
            unit,
            counter,
            policy_header: PolicyHeader::new(name, &rules),
            most: (rules.policies().iter())
                .filter(|p| !p.shadow())
                .map(|p| p.limit())
                .min()
                .unwrap_or(u64::MAX),
            rules,
        }))
    }
}

impl Conns {
    /// `limit_conn: limit` for route `route`, in memory or in Redis.
    fn build(
        route: &str,
        limit: u32,
        options: KeyedOptions,
        redis: Option<&RedisBackend>,
    ) -> anyhow::Result<Conns> {
        let Some((store, config)) = redis else {
            return Ok(Conns::Memory(KeyedConcurrencyLimiter::new(
                limit,
                options.max_keys,
            )));
        };
        let rules = RuleSet::parse(&[format!("concurrency:limit={limit}")])
            .map_err(|e| anyhow::anyhow!("limit_conn: {e}"))?;
        let opts = RedisConcurrencyOptions {
            on_error: config.on_error(&rules)?,
            ..Default::default()
        };
        Ok(Conns::Redis(RedisConcurrencyLimiter::with_options(
            store.clone(),
            &redis_name(route, "conn"),
            limit,
            opts,
        )?))
    }
}

/// The route's rate-limit headers in its style ([`tollgate::headers`], their one
/// writer; the limit is named after the tier, or `default`).
fn rate_headers(headers: &mut HeaderMap, style: HeaderStyle, d: &RuleDecision, l: &RateCounters) {
    if style == HeaderStyle::None {
        return;
    }
    let h = tollgate::headers::RateLimitHeaders::of(&l.policy_header, d);
    tollgate::headers::insert_all(headers, h.fields(style, false));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A route of `json` (a `RouteConfig`) on the memory store.
    fn limits(json: &str) -> RouteLimits {
        let r: RouteConfig = serde_json::from_str(json).unwrap();
        RouteLimits::build(&r, "r", KeyedOptions::default(), None).unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_refused_by_one_limit_counts_against_none() {
        // 25 tokens (10 taken at admission), 2 requests, 1 in flight.
        let l = limits(
            r#"{"name": "llm", "upstream": "http://127.0.0.1:9", "limit_conn": 1,
                "policies": ["fixed-window:limit=25,window=1h"],
                "cost": {"from": "json:usage.total_tokens", "estimate": 10,
                         "requests": ["fixed-window:limit=2,window=1h"]}}"#,
        );
        let first = l.pass("k", None, None).await.unwrap();
        assert!(first.counted);
        // Refused by limit_conn, twice: their 10 tokens and their counts go back (the
        // tokens in a task of their own, run while this one sleeps).
        for _ in 0..2 {
            let refused = l.pass("k", None, None).await.err().unwrap();
            assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        first
            .pending
            .unwrap()
            .settle(super::super::cost::Outcome::Reported(10))
            .await;
        drop(first.permit);
        // Had they counted, the tokens (30 of 25) or the requests (3 of 2) would refuse.
        let second = l.pass("k", None, None).await.unwrap();
        second
            .pending
            .unwrap()
            .settle(super::super::cost::Outcome::Reported(1))
            .await;
        drop(second.permit);
        // The third request: over the requests per hour, and it takes no tokens.
        let third = l.pass("k", None, None).await.err().unwrap();
        assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
        // Left: 25 - 10 - 1 tokens, no more.
        let tokens = &l.default.as_ref().unwrap().counter;
        let take = |n| async move { tokens.check_rules("k", n, Op::Try).await.unwrap() };
        assert!(!take(15).await.decision.allowed);
        assert!(take(14).await.decision.allowed);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_delay_of_the_requests_counted_holds_the_request() {
        // 10 requests a second, 5 more held for their turn (limit_req without nodelay).
        let l = limits(
            r#"{"name": "llm", "upstream": "http://127.0.0.1:9",
                "policies": ["token-bucket:rate=1000/s,capacity=1000"],
                "cost": {"from": "json:usage.total_tokens",
                         "requests": ["limit-req:rate=10/s,burst=5"]}}"#,
        );
        let start = tokio::time::Instant::now();
        assert!(l.pass("k", None, None).await.unwrap().counted);
        // The second is held for its turn, 100 ms after the first (no sooner: a sleep
        // never ends early).
        assert!(l.pass("k", None, None).await.unwrap().counted);
        assert!(
            start.elapsed() >= Duration::from_millis(95),
            "{:?}",
            start.elapsed()
        );
    }
}
