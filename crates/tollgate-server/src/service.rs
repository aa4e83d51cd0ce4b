//! The decision service: descriptors in, a decision per descriptor out (Envoy's
//! ratelimit semantics), over the loaded rules. Transport-free: HTTP and gRPC wrap it.

use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tollgate::{CheckError, Decision, KeyedError, Op};

use crate::rules::{Limit, Rules};

/// One descriptor of a request: its entries, in order, and its own hits (cost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRequest {
    /// `(key, value)` entries.
    pub entries: Vec<(String, String)>,
    /// This descriptor's hits: `None` = the request's; `Some(0)` = look, don't count.
    pub hits: Option<u64>,
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

/// The rules in force, swappable at run time.
pub struct DecisionService {
    rules: ArcSwap<Rules>,
}

impl DecisionService {
    /// A service over `rules`.
    pub fn new(rules: Rules) -> Self {
        DecisionService {
            rules: ArcSwap::from_pointee(rules),
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
        let rules = self.rules.load();
        let found: Vec<_> = descriptors
            .iter()
            .map(|d| rules.find(domain, &d.entries))
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
        let overall = if statuses.iter().any(|s| s.code == Code::OverLimit) {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(CheckResult { overall, statuses })
    }

    /// Gives back what a request counted (an acquire whose caller went away).
    pub fn refund(&self, domain: &str, descriptors: &[DescriptorRequest], hits: u64) {
        let rules = self.rules.load();
        for d in descriptors {
            if let Some((limit, key)) = rules.find(domain, &d.entries) {
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
