//! The decision service: descriptors in, a decision per descriptor out (Envoy's
//! ratelimit semantics), over the loaded rules. Transport-free: HTTP and gRPC wrap it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tollgate::{CheckError, Decision, KeyedError, Op};

use crate::metrics::{Metrics, Outcome};
use crate::rules::{counter_key, override_limit, Limit, Rules, Unit};

/// One descriptor of a request: its entries, in order, and its own hits (cost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRequest {
    /// `(key, value)` entries.
    pub entries: Vec<(String, String)>,
    /// This descriptor's hits: `None` = the request's; `Some(0)` = look, don't count.
    pub hits: Option<u64>,
    /// The request's own limit for this descriptor (Envoy's per-descriptor `limit`),
    /// used instead of the configured one.
    pub limit_override: Option<(Unit, u64)>,
}

/// Envoy's codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Under the limit (or no limit applies).
    Ok,
    /// Over the limit.
    OverLimit,
}

/// The outcome for one descriptor.
#[derive(Debug, Clone)]
pub struct DescriptorStatus {
    /// OK or OVER_LIMIT (shadow-mode rejects are OK, flagged).
    pub code: Code,
    /// The limit that applied, if any.
    pub limit: Option<Arc<Limit>>,
    /// The decision, when a limited (not unlimited) rule applied.
    pub decision: Option<Decision>,
    /// Rejected by a rule in shadow mode: reported, not enforced.
    pub shadow_rejected: bool,
}

/// The outcome of a request.
#[derive(Debug, Clone)]
pub struct CheckResult {
    /// OVER_LIMIT if any descriptor is.
    pub overall: Code,
    /// One status per descriptor, in order.
    pub statuses: Vec<DescriptorStatus>,
}

impl CheckResult {
    /// The decision that binds the response: the rejected one with the longest
    /// retry, or the admitted one with the least remaining.
    pub fn binding(&self) -> Option<(&Arc<Limit>, &Decision)> {
        let limited = self
            .statuses
            .iter()
            .filter_map(|s| Some((s.limit.as_ref()?, s.decision.as_ref()?)));
        match self.overall {
            Code::OverLimit => limited
                .filter(|(_, d)| !d.allowed)
                .max_by_key(|(_, d)| d.retry_after_us.unwrap_or(u64::MAX)),
            Code::Ok => limited.min_by_key(|(_, d)| d.remaining),
        }
    }

    /// The longest wait among admitted decisions (acquire).
    pub fn wait_us(&self) -> u64 {
        self.statuses
            .iter()
            .filter_map(|s| s.decision)
            .filter(|d| d.allowed)
            .map(|d| d.wait_us)
            .max()
            .unwrap_or(0)
    }
}

/// A request the service cannot decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The request named no domain.
    #[error("domain: must not be empty")]
    NoDomain,
    /// A descriptor has no entries.
    #[error("descriptors[{0}].entries: must not be empty")]
    EmptyDescriptor(usize),
}

/// At most this many distinct limit overrides keep counters.
pub const MAX_OVERRIDES: usize = 1024;

/// The rules in force, swappable at run time.
pub struct DecisionService {
    rules: ArcSwap<Rules>,
    overrides: Mutex<HashMap<(Unit, u64), Arc<Limit>>>,
    options: tollgate::KeyedOptions,
    metrics: Metrics,
    clock: tollgate::MonotonicClock,
    /// The rule files a reload reads again (none for the built-in rules).
    sources: Vec<std::path::PathBuf>,
}

impl DecisionService {
    /// A service over `rules` (loaded from `sources`, which a reload reads again);
    /// `options` bound every rule's counters.
    pub fn new(
        rules: Rules,
        sources: Vec<std::path::PathBuf>,
        options: tollgate::KeyedOptions,
    ) -> Self {
        DecisionService {
            sources,
            rules: ArcSwap::from_pointee(rules),
            overrides: Mutex::new(HashMap::new()),
            options,
            metrics: Metrics::default(),
            clock: tollgate::MonotonicClock::new(),
        }
    }

    /// The rule files a reload reads.
    pub fn sources(&self) -> &[std::path::PathBuf] {
        &self.sources
    }

    /// Reads the rule files again. A bad file changes nothing (the old rules stay in
    /// force); limits whose definition did not change keep their counters. Counted in
    /// the metrics either way.
    pub fn reload(&self) -> Result<(), crate::rules::RulesError> {
        if self.sources.is_empty() {
            return Ok(());
        }
        match Rules::load(&self.sources, self.options) {
            Ok(mut rules) => {
                rules.adopt(&self.rules.load());
                self.rules.store(Arc::new(rules));
                self.metrics.reload(true);
                Ok(())
            }
            Err(e) => {
                self.metrics.reload(false);
                Err(e)
            }
        }
    }

    /// The metrics text, with the current counter counts.
    pub fn render_metrics(&self) -> String {
        let rules = self.rules.load();
        for (domain, _) in rules.domains() {
            for limit in rules.limits(domain) {
                if let Some(l) = &limit.limiter {
                    self.metrics.keys(domain, &limit.path, l.len());
                }
            }
        }
        self.metrics.render()
    }

    /// The limit for a request's own override, created on first use.
    fn override_for(&self, unit: Unit, n: u64) -> Option<Arc<Limit>> {
        let mut map = self.overrides.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = map.get(&(unit, n)) {
            return Some(l.clone());
        }
        if map.len() >= MAX_OVERRIDES {
            return None;
        }
        let limit = override_limit(unit, n, self.options).ok()?;
        map.insert((unit, n), limit.clone());
        Some(limit)
    }

    /// The limit and counter that apply to a descriptor.
    fn limit_for(
        &self,
        rules: &Rules,
        domain: &str,
        d: &DescriptorRequest,
    ) -> Option<(Arc<Limit>, String)> {
        match d.limit_override {
            Some((unit, n)) if rules.has_domain(domain) => {
                Some((self.override_for(unit, n)?, counter_key(domain, &d.entries)))
            }
            _ => rules.find(domain, &d.entries),
        }
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.load_full()
    }

    /// Decides every descriptor of a request for `domain`. `hits` is the request's
    /// cost (Envoy's `hits_addend`: unset or 0 means 1); a descriptor's own `Some(0)`
    /// checks without counting. Each descriptor is counted on its own, as Envoy does;
    /// a descriptor whose limit another matched limit `replaces` is skipped.
    pub fn check(
        &self,
        domain: &str,
        descriptors: &[DescriptorRequest],
        hits: u64,
        op: Op,
    ) -> Result<CheckResult, RequestError> {
        if domain.is_empty() {
            return Err(RequestError::NoDomain);
        }
        if let Some(i) = descriptors.iter().position(|d| d.entries.is_empty()) {
            return Err(RequestError::EmptyDescriptor(i));
        }
        let started = tollgate::Clock::now_ns(&self.clock);
        let rules = self.rules.load();
        let found: Vec<_> = descriptors
            .iter()
            .map(|d| self.limit_for(&rules, domain, d))
            .collect();
        let replaced: HashSet<&str> = found
            .iter()
            .flatten()
            .flat_map(|(l, _)| l.replaces.iter().map(String::as_str))
            .collect();
        let request_hits = hits.max(1);
        let statuses: Vec<DescriptorStatus> = descriptors
            .iter()
            .zip(&found)
            .map(|(d, f)| {
                let Some((limit, key)) = f else {
                    return ok(None);
                };
                if limit.name.as_deref().is_some_and(|n| replaced.contains(n)) {
                    return ok(None);
                }
                if limit.deny {
                    let decision = Decision::rejected(0, 0, 0, None);
                    return DescriptorStatus {
                        code: if limit.shadow {
                            Code::Ok
                        } else {
                            Code::OverLimit
                        },
                        limit: Some(limit.clone()),
                        decision: Some(decision),
                        shadow_rejected: limit.shadow,
                    };
                }
                let Some(limiter) = &limit.limiter else {
                    return ok(Some(limit.clone()));
                };
                let outcome = match d.hits.unwrap_or(request_hits) {
                    0 => limiter.peek(key.as_str(), 1),
                    n => limiter.check_rules(key.as_str(), n, op).map(|r| r.decision),
                };
                let decision = match outcome {
                    Ok(d) => d,
                    // A cost that can never fit, or a full limiter refusing keys.
                    Err(KeyedError::Check(CheckError::InsufficientCapacity {
                        capacity, ..
                    })) => Decision::rejected(capacity, 0, 0, None),
                    Err(_) => Decision::rejected(0, 0, 0, None),
                };
                let shadow_rejected =
                    decision.shadow_rejected || (!decision.allowed && limit.shadow);
                let code = if decision.allowed || shadow_rejected {
                    Code::Ok
                } else {
                    Code::OverLimit
                };
                DescriptorStatus {
                    code,
                    limit: Some(limit.clone()),
                    decision: Some(decision),
                    shadow_rejected,
                }
            })
            .collect();
        for s in &statuses {
            if let (Some(limit), Some(d)) = (&s.limit, &s.decision) {
                let outcome = match (s.shadow_rejected, d.allowed) {
                    (true, _) => Outcome::ShadowRejected,
                    (false, true) => Outcome::Allowed,
                    (false, false) => Outcome::Rejected,
                };
                self.metrics.decision(domain, &limit.path, outcome);
            }
        }
        let overall = if statuses.iter().any(|s| s.code == Code::OverLimit) {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let elapsed = tollgate::Clock::now_ns(&self.clock).saturating_sub(started);
        self.metrics.latency(elapsed as f64 / 1e9);
        Ok(CheckResult { overall, statuses })
    }

    /// Gives back what a request counted (an acquire whose caller went away).
    pub fn refund(&self, domain: &str, descriptors: &[DescriptorRequest], hits: u64) {
        let rules = self.rules.load();
        for d in descriptors {
            if let Some((limit, key)) = self.limit_for(&rules, domain, d) {
                if let Some(limiter) = &limit.limiter {
                    limiter.refund(key.as_str(), d.hits.unwrap_or(hits.max(1)));
                }
            }
        }
    }

    /// Forgets the counters of one descriptor.
    pub fn reset(&self, domain: &str, entries: &[(String, String)]) -> bool {
        match self.rules.load().find(domain, entries) {
            Some((limit, key)) => {
                if let Some(l) = &limit.limiter {
                    l.reset(key.as_str());
                }
                true
            }
            None => false,
        }
    }
}

fn ok(limit: Option<Arc<Limit>>) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok,
        limit,
        decision: None,
        shadow_rejected: false,
    }
}
