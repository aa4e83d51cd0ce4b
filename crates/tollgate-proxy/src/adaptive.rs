//! A route's adaptive concurrency limit (`adaptive:`): one limit in front of the
//! route's upstream, a priority per tier, fair shares by the route's key, and what an
//! upstream answer tells the limit.

use axum::http::StatusCode;
use tollgate::adaptive::{
    AdaptiveLimiter, AdaptivePermit, AdaptiveSpec, AdaptiveStats, Outcome, Priority, Request,
};

use super::problem::{problem_body, problem_response, Problem};
use tollgate_runtime::config::proxy::RouteConfig;

/// The adaptive limit of one route.
pub(super) struct RouteAdaptive {
    /// Shared with the route that replaces this one on a reload, when the limit's
    /// settings are unchanged: the learned limit and baseline carry over.
    limiter: AdaptiveLimiter,
    /// What the limiter was built from: (upstream, spec as written, fair_share).
    settings: (String, String, bool),
    /// The route's priority, and each tier's own (by the route's tier index).
    priority: Priority,
    tiers: Vec<Option<Priority>>,
    fair: bool,
    /// The 503 problem+json body of a shed request, built once.
    shed_body: bytes::Bytes,
    dry_run: bool,
}

/// A permit held for one forwarded request: reported when its response ends.
pub(super) struct AdaptiveHold {
    /// Taken when the hold ends.
    permit: Option<AdaptivePermit>,
    outcome: Outcome,
}

impl AdaptiveHold {
    /// Classifies the upstream's answer: 429, 502, 503 and 504 say it is overloaded
    /// (dropped), other 4xx say nothing about capacity (ignored), anything else is a
    /// success whose latency is the time to the response head.
    pub fn answered(&mut self, status: StatusCode) {
        self.outcome = match status.as_u16() {
            429 | 502 | 503 | 504 => Outcome::Dropped,
            400..=499 => Outcome::Ignored,
            _ => Outcome::Success {
                latency_us: self.permit.as_ref().map_or(0, |p| {
                    u64::try_from(p.elapsed().as_micros()).unwrap_or(u64::MAX)
                }),
            },
        };
    }

    /// The upstream failed to answer (unreachable, timed out): dropped.
    pub fn failed(mut self) {
        self.outcome = Outcome::Dropped;
    }
}

impl Drop for AdaptiveHold {
    fn drop(&mut self) {
        // The permit ends with the response (body included); without an answer the
        // outcome stays Ignored (the client went away).
        if let Some(permit) = self.permit.take() {
            permit.finish(self.outcome);
        }
    }
}

impl RouteAdaptive {
    /// Route `r`'s adaptive limit (`at` names it in errors), or `None` without
    /// `adaptive:`. `old` is the route this one replaces on a reload.
    pub fn build(
        r: &RouteConfig,
        at: &str,
        old: Option<&RouteAdaptive>,
    ) -> anyhow::Result<Option<RouteAdaptive>> {
        let parse_priority = |p: &Option<String>, at: String| -> anyhow::Result<Option<Priority>> {
            p.as_deref()
                .map(|p| {
                    p.parse::<Priority>()
                        .map_err(|e| anyhow::anyhow!("{at}: {e}"))
                })
                .transpose()
        };
        let priority = parse_priority(&r.priority, format!("{at}.priority"))?;
        let tiers = r
            .tiers
            .iter()
            .enumerate()
            .map(|(t, tier)| parse_priority(&tier.priority, format!("{at}.tiers[{t}].priority")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let Some(spec_text) = &r.adaptive else {
            let set = if r.priority.is_some() {
                Some(format!("{at}.priority"))
            } else if r.fair_share {
                Some(format!("{at}.fair_share"))
            } else {
                r.tiers
                    .iter()
                    .position(|t| t.priority.is_some())
                    .map(|t| format!("{at}.tiers[{t}].priority"))
            };
            if let Some(field) = set {
                anyhow::bail!(
                    "{field}: applies to the route's adaptive limit, and {at} has none (add e.g. adaptive: gradient)"
                );
            }
            return Ok(None);
        };
        let spec: AdaptiveSpec = spec_text
            .parse()
            .map_err(|e| anyhow::anyhow!("{at}.adaptive: {e}"))?;
        let settings = (r.upstream.clone(), spec_text.clone(), r.fair_share);
        let limiter = match old.filter(|o| o.settings == settings) {
            Some(o) => o.limiter.clone(),
            None if r.fair_share => AdaptiveLimiter::fair(spec),
            None => AdaptiveLimiter::new(spec),
        };
        Ok(Some(RouteAdaptive {
            limiter,
            settings,
            priority: priority.unwrap_or_default(),
            tiers,
            fair: r.fair_share,
            shed_body: problem_body(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded: the upstream is at its adaptive concurrency limit",
            ),
            dry_run: r.dry_run,
        }))
    }

    /// A permit for a request of `key` in `tier` (the tier's priority, else the
    /// route's; its share under `fair_share`), waiting by priority up to the
    /// queueing-delay target; `Err` is the 503 to send. A dry run forwards a shed
    /// request without a permit.
    pub async fn admit(
        &self,
        key: &str,
        tier: Option<usize>,
    ) -> Result<Option<AdaptiveHold>, Problem> {
        let priority = tier.and_then(|t| self.tiers[t]).unwrap_or(self.priority);
        let mut req = Request::new(priority);
        if self.fair && !key.is_empty() {
            req = req.caller(key);
        }
        match self.limiter.acquire_with(req, None).await {
            Ok(permit) => Ok(Some(AdaptiveHold {
                permit: Some(permit),
                outcome: Outcome::Ignored,
            })),
            Err(_) if self.dry_run => Ok(None),
            Err(_) => Err(problem_response(
                StatusCode::SERVICE_UNAVAILABLE,
                self.shed_body.clone(),
                Some(1_000_000),
            )),
        }
    }

    /// The limit's state, for metrics.
    pub fn stats(&self) -> AdaptiveStats {
        self.limiter.stats()
    }
}
