//! The decision service (`tollgate serve`): descriptors in, a decision per descriptor
//! out (Envoy's ratelimit semantics), over the loaded rules. [`DecisionService`] is
//! transport-free; [`http`] and [`grpc`] wrap it, [`descriptors`] loads the descriptor
//! rules, [`metrics`] counts. It uses the `tollgate` library and the runtime; the
//! binary wires it to its listeners and mounts the console beside it.

#![forbid(unsafe_code)]

pub mod calls;
pub mod counters;
pub mod decision_log;
pub mod descriptors;
pub mod envoy;
pub mod envoy_metrics;
pub mod grpc;
pub mod headers;
pub mod http;
pub mod metrics;
pub mod quota;
pub mod rule_stats;
pub mod spans;
pub mod statsd_mapping;
pub mod top_keys;
pub mod xds;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tollgate::error::CheckError;
use tollgate::{AnyLimiter, Decision, Error, Op, RateLimiter, RuleDecision};

use crate::counters::Counters;
use tollgate_runtime::store_metrics::StoreStats;
use tollgate_runtime::tls_refusals::RefusalMetrics;

use crate::descriptors::{
    counter_key, override_limit, DescriptorLimit, DescriptorRules, Match, Unit,
};
use crate::metrics::{Hits, Metrics, Verdict};

/// One descriptor of a request: its entries, in order, and its own hits (cost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorRequest {
    /// `(key, value)` entries.
    pub entries: Vec<(String, String)>,
    /// This descriptor's hits: `None` = the request's; `Some(0)` = look, don't count.
    pub hits: Option<u64>,
    /// Give the hits back instead of taking them (Envoy's `is_negative_hits`: a
    /// refund of what an earlier request took, never past a full budget); the
    /// status is then the count as it stands after.
    pub give_back: bool,
    /// The request's own limit for this descriptor (Envoy's per-descriptor `limit`),
    /// used instead of the configured one.
    pub limit_override: Option<(Unit, u64)>,
}

/// The API a request came through, which decides one rule of validation: tollgate's
/// own refuses a descriptor without entries (naming the mistake), Envoy's answers it
/// OK, matching nothing, as envoyproxy/ratelimit does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/check`, `/v1/charge`, `/v1/acquire`.
    Tollgate,
    /// gRPC `ShouldRateLimit` and `POST /json`.
    Envoy,
}

/// Envoy's codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Under the limit (or no limit applies).
    Ok,
    /// Over the limit.
    OverLimit,
}

impl Code {
    /// Envoy's name for it (`OK`, `OVER_LIMIT`), as every API writes it.
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::OverLimit => "OVER_LIMIT",
        }
    }
}

/// The outcome for one descriptor.
#[derive(Debug, Clone)]
pub struct DescriptorStatus {
    /// OK or OVER_LIMIT (shadow-mode rejects are OK, flagged).
    pub code: Code,
    /// The descriptor's hits, as counted.
    pub hits: u64,
    /// The limit that applied, if any.
    pub limit: Option<Arc<DescriptorLimit>>,
    /// The counter of the limit that counted the hits (empty when none did): what a
    /// refund gives back to, without matching the descriptor again.
    pub counter: String,
    /// The decision, with every policy's, when a limited (not unlimited) rule applied.
    pub rule_decision: Option<RuleDecision>,
    /// Rejected by a rule in shadow mode: reported, not enforced.
    pub shadow_rejected: bool,
}

/// The outcome of a request.
#[derive(Debug, Clone)]
pub struct CheckResult {
    /// OVER_LIMIT if any descriptor is (a quota-mode descriptor only if every
    /// quota-mode one is), unless the global shadow mode answers OK.
    pub overall: Code,
    /// One status per descriptor, in order.
    pub statuses: Vec<DescriptorStatus>,
}

impl DescriptorStatus {
    /// The overall decision of the rule that applied, if limited.
    pub fn decision(&self) -> Option<&Decision> {
        self.rule_decision.as_ref().map(|r| &r.decision)
    }

    /// How envoyproxy/ratelimit states this descriptor, if a limited rule applied:
    /// the requests per unit (a policy's headline limit for tollgate's `policies:`),
    /// none remaining when not admitted (shadow mode too), and the binding policy's
    /// reset: when a rejected request would pass, or when the policy nearest its limit
    /// is replenished (for an Envoy unit rounded up to whole seconds: the end of the
    /// unit's window). A rule set's other policies (an hour's window beside a
    /// per-second rate) never send a client away for longer than it must wait.
    pub fn envoy_view(&self) -> Option<EnvoyView> {
        let (limit, r) = (self.limit.as_ref()?, self.rule_decision.as_ref()?);
        let d = &r.decision;
        // An admit's reset is the binding policy's. A reject's is when every policy
        // would admit it: the latest retry of those that rejected, and of those left
        // with nothing (Envoy's counting charges them too, so one this very hit
        // spent binds as well); with neither, the whole rule set's reset.
        let until = if d.allowed {
            r.policies.get(r.binding).unwrap_or(d).reset_after_us
        } else {
            let spent = (r.policies.iter())
                .filter(|p| p.remaining == 0)
                .map(|p| p.retry_after_us.unwrap_or(p.reset_after_us));
            (spent.chain(d.retry_after_us).max()).unwrap_or(d.reset_after_us)
        };
        let (unit, per_unit, reset_after_us) = match limit.envoy {
            Some((unit, n)) => (Some(unit), n, until.div_ceil(1_000_000) * 1_000_000),
            None => {
                // A policy states its binding policy's headline limit in the unit
                // that describes its rate.
                let binding = (limit.rules.as_ref()).and_then(|rs| rs.policies().get(r.binding));
                let described = binding.and_then(|p| Unit::describing(p.limit(), p.window_us()));
                match described {
                    Some((unit, n)) => (Some(unit), n, until),
                    None => (None, d.limit, until),
                }
            }
        };
        let remaining = if d.allowed {
            d.remaining.min(u64::from(u32::MAX))
        } else {
            0
        };
        Some(EnvoyView {
            unit,
            per_unit,
            remaining,
            reset_after_us,
        })
    }
}

/// A limited descriptor as envoyproxy/ratelimit states it ([`DescriptorStatus::envoy_view`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvoyView {
    /// The unit: Envoy's own, or for a policy the one that describes its rate
    /// ([`Unit::describing`]); `None` only for `concurrency`, which has no time.
    pub unit: Option<Unit>,
    /// The requests per unit.
    pub per_unit: u64,
    /// The requests remaining (0 when not admitted; at most `u32::MAX`).
    pub remaining: u64,
    /// Until the window resets, in µs (whole seconds for an Envoy unit).
    pub reset_after_us: u64,
}

impl CheckResult {
    /// The decision that binds the response: the rejected one with the longest
    /// retry, or the admitted one with the least remaining.
    pub fn binding(&self) -> Option<(&Arc<DescriptorLimit>, &RuleDecision)> {
        let limited = self
            .statuses
            .iter()
            .filter_map(|s| Some((s.limit.as_ref()?, s.rule_decision.as_ref()?)));
        match self.overall {
            Code::OverLimit => limited
                .filter(|(_, d)| !d.decision.allowed)
                .max_by_key(|(_, d)| d.decision.retry_after_us.unwrap_or(u64::MAX)),
            Code::Ok => limited.min_by_key(|(_, d)| d.decision.remaining),
        }
    }

    /// The longest wait among admitted decisions (acquire).
    pub fn wait_us(&self) -> u64 {
        self.statuses
            .iter()
            .filter_map(|s| s.decision())
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
    /// The request carried no descriptor.
    #[error("descriptors: must not be empty")]
    NoDescriptors,
    /// A descriptor has no entries (refused by tollgate's own API; Envoy's answers
    /// such a descriptor OK, matching nothing).
    #[error("descriptors[{0}].entries: must not be empty")]
    EmptyDescriptor(usize),
    /// More descriptors than `requests.max_descriptors`.
    #[error("descriptors: {0} of them, at most {1} (requests.max_descriptors)")]
    TooManyDescriptors(usize, usize),
    /// A descriptor's key longer than `requests.max_key_bytes`.
    #[error("descriptors[{0}]: its key is {1} bytes, at most {2} (requests.max_key_bytes)")]
    KeyTooLong(usize, usize, usize),
    /// The store cannot decide now (Redis unreachable and `on_error: error`).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// No rules are in force yet: the xDS server has not sent its first version.
    #[error(
        "no rate limit configuration loaded yet: waiting for the first version from the xDS server"
    )]
    NoRules,
    /// A descriptor's limit cannot take what the request asks: a charge of a limit
    /// that cannot be charged (`shaper`, `concurrency`), an acquire of a limit kept as
    /// Redis window counters (`store.window_counters`).
    #[error("descriptors[{0}]: {1}")]
    Refused(usize, String),
}

/// At most this many distinct limit overrides keep counters.
pub const MAX_OVERRIDES: usize = 1024;

/// How the service answers beyond the rules (the main config's `service:`).
#[derive(Debug, Clone, Default)]
pub struct Answers {
    /// The rate-limit headers in responses.
    pub headers: tollgate_runtime::config::Headers,
    /// Global shadow mode: the overall code is always OK (descriptors still report
    /// their own codes), as envoyproxy/ratelimit's `SHADOW_MODE`.
    pub shadow_mode: bool,
    /// Whether rejected hits count where a descriptor with Envoy's `rate_limit` does
    /// not say (see [`tollgate_runtime::config::ServiceSettings::rejected_hits`]).
    pub rejected_hits: tollgate_runtime::config::RejectedHits,
    /// envoyproxy/ratelimit's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`.
    pub stop_increment_when_over_limit: bool,
}

/// The rules in force, swappable at run time.
pub struct DecisionService {
    rules: ArcSwap<DescriptorRules>,
    overrides: Mutex<HashMap<(String, Unit, u64), Arc<DescriptorLimit>>>,
    answers: Answers,
    /// The debug line of each decision, and its budget.
    decision_log: decision_log::DecisionLog,
    merge_domains: bool,
    counters: Counters,
    /// The counts of Redis limiters a reload replaced (the metrics' totals go on).
    retired: Mutex<StoreStats>,
    requests: tollgate_runtime::config::Requests,
    metrics: Metrics,
    clock: tollgate::clock::MonotonicClock,
    /// The rule files a reload reads again (none for the built-in rules).
    sources: Vec<std::path::PathBuf>,
    /// Set when the server starts to stop: health checks fail from then on, so a
    /// load balancer moves traffic away while requests still in flight finish.
    draining: std::sync::atomic::AtomicBool,
    /// The order `/v1/acquire`'s waiters come back in.
    turns: tollgate::wait::Turns,
    /// The workers serving its connections, reported at `/metrics`.
    workers: Option<tollgate_runtime::workers::WorkerStats>,
    /// Envoy's quota buckets (RLQS) and the streams reporting on them.
    quota: crate::quota::QuotaBuckets,
    /// The listeners' TLS, by listener, for the certificates' days left.
    tls: Vec<(&'static str, tollgate_runtime::tls::ServerTls)>,
    /// Set when the rules come from an xDS server.
    xds: Option<XdsState>,
    /// Traces, when on: each decision records on the caller's span.
    tracing: Option<Arc<tollgate_runtime::traces::Tracing>>,
    /// The keys used and rejected most, kept for the console when it is on.
    top_keys: Option<Arc<top_keys::TopKeys>>,
}

/// Where the rules stand when an xDS server sends them.
struct XdsState {
    /// The server, for `/v1/config`.
    server: String,
    /// The version in force; none before the first.
    version: Mutex<Option<String>>,
    /// Whether a version is in force (read by every decision, without the lock).
    has_version: std::sync::atomic::AtomicBool,
    /// `/healthcheck` passes before the first version (`xds.start_without_rules`).
    healthy_before_rules: bool,
    /// `/healthcheck` fails while no domain is in force (`xds.healthy_only_with_rules`).
    healthy_only_with_rules: bool,
    /// The stream is open now.
    stream_up: std::sync::atomic::AtomicBool,
    /// Streams opened, versions put in force, versions refused, since start.
    streams: std::sync::atomic::AtomicU64,
    acked: std::sync::atomic::AtomicU64,
    nacked: std::sync::atomic::AtomicU64,
}

impl DecisionService {
    /// A service over `rules` (loaded from `sources`, which a reload reads again)
    /// whose limits count in `counters` (the store the rules were loaded for).
    pub fn new(
        rules: DescriptorRules,
        sources: Vec<std::path::PathBuf>,
        counters: Counters,
    ) -> Self {
        DecisionService {
            sources,
            rules: ArcSwap::from_pointee(rules),
            overrides: Mutex::new(HashMap::new()),
            answers: Answers::default(),
            decision_log: decision_log::DecisionLog::new(&Default::default()),
            merge_domains: false,
            retired: Mutex::default(),
            requests: tollgate_runtime::config::Requests::default(),
            metrics: Metrics::default(),
            clock: tollgate::clock::MonotonicClock::new(),
            draining: std::sync::atomic::AtomicBool::new(false),
            turns: Default::default(),
            workers: None,
            tls: Vec::new(),
            xds: None,
            tracing: None,
            top_keys: None,
            quota: crate::quota::QuotaBuckets::new(
                counters.quota_ledger(),
                crate::quota::LedgerFailure::of(counters.store_config()),
            ),
            counters,
        }
    }

    /// A service over the built-in example rules, counting in memory with default
    /// bounds (what `tollgate serve` runs with no flags; for tests and fuzzing).
    pub fn example() -> Self {
        let counters = Counters::default();
        let rules = DescriptorRules::built_in(&counters).expect("the example rules load in memory");
        DecisionService::new(rules, vec![], counters)
    }

    /// Keeps the keys used and rejected most in `top` (for the console).
    pub fn with_top_keys(mut self, top: Arc<top_keys::TopKeys>) -> Self {
        self.top_keys = Some(top);
        self
    }

    /// The keys used and rejected most, when kept.
    pub fn top_keys(&self) -> Option<&Arc<top_keys::TopKeys>> {
        self.top_keys.as_ref()
    }

    /// The store's name: `memory` or `redis`.
    pub fn store_name(&self) -> &'static str {
        self.counters.store_name()
    }

    /// Reports `workers` at `/metrics` (connections, busy share, moves, per worker).
    pub fn with_workers(mut self, workers: tollgate_runtime::workers::WorkerStats) -> Self {
        self.workers = Some(workers);
        self
    }

    /// Reports the certificates of `listeners` (name, TLS) and the handshakes they
    /// refused at `/metrics`.
    pub fn with_tls(
        mut self,
        listeners: Vec<(&'static str, tollgate_runtime::tls::ServerTls)>,
    ) -> Self {
        let refusals = (listeners.iter()).map(|(name, tls)| (*name, tls.refusals()));
        let family = RefusalMetrics::new("tollgate", refusals.collect());
        self.metrics.add_collector(Box::new(family));
        self.tls = listeners;
        self
    }

    /// Takes its rules from the xDS server of `config` (see [`xds`]): none are in
    /// force until [`DecisionService::apply_xds`] brings the first version, and
    /// decisions until then fail as unavailable.
    pub fn with_xds(mut self, config: &tollgate_runtime::config::xds::XdsConfig) -> Self {
        self.rules = ArcSwap::from_pointee(DescriptorRules::empty(self.merge_domains));
        self.sources = Vec::new();
        self.xds = Some(XdsState {
            server: config.server.clone(),
            version: Mutex::new(None),
            has_version: Default::default(),
            healthy_before_rules: config.start_without_rules,
            healthy_only_with_rules: config.healthy_only_with_rules,
            stream_up: Default::default(),
            streams: Default::default(),
            acked: Default::default(),
            nacked: Default::default(),
        });
        self
    }

    /// Notes a version ACKed (`true`) or NACKed (for `/metrics`).
    pub fn xds_answered(&self, acked: bool) {
        if let Some(x) = &self.xds {
            let counter = if acked { &x.acked } else { &x.nacked };
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Notes that the xDS stream opened (`true`) or ended (for `/metrics`).
    pub fn xds_stream(&self, up: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if let Some(x) = &self.xds {
            x.stream_up.store(up, Relaxed);
            if up {
                x.streams.fetch_add(1, Relaxed);
            }
        }
    }

    /// The xDS server and the version in force, when the rules come from xDS.
    pub fn xds_version(&self) -> Option<(String, Option<String>)> {
        let x = self.xds.as_ref()?;
        let version = x.version.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Some((x.server.clone(), version))
    }

    /// Whether no rules are in force yet (an xDS server has not sent its first).
    fn awaiting_rules(&self) -> bool {
        (self.xds.as_ref())
            .is_some_and(|x| !x.has_version.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Whether `/healthcheck` passes, and if not why: not while draining, nor (with
    /// xDS) before the first version unless told to start without one, nor without a
    /// domain when told to want one.
    pub fn health(&self) -> Result<(), &'static str> {
        if self.draining() {
            return Err("draining");
        }
        if let Some(x) = &self.xds {
            if self.awaiting_rules() && !x.healthy_before_rules {
                return Err("no rules yet: waiting for the first version from the xDS server");
            }
            if x.healthy_only_with_rules && self.rules.load().domains().next().is_none() {
                return Err("no rules with a domain are in force");
            }
        }
        Ok(())
    }

    /// Applies one version of the xDS server's `RateLimitConfig` resources: the same
    /// validation and reload as a rule file's ([`DecisionService::reload`]), every
    /// resource a document. A version that does not load changes nothing and its error
    /// is returned (for the NACK).
    pub fn apply_xds(
        &self,
        configs: Vec<xds::rls_conf::RateLimitConfig>,
        version: &str,
    ) -> Result<(), String> {
        let Some(x) = &self.xds else {
            return Err("the rules of this server come from files, not xDS".into());
        };
        let mut rules = DescriptorRules::empty(self.merge_domains);
        let mut loaded = Ok(());
        for c in configs {
            let source = format!("xDS resource '{}' (version {version})", c.name);
            loaded = c
                .into_document()
                .map_err(|message| crate::descriptors::RulesError::Invalid {
                    path: source.clone(),
                    message,
                })
                .and_then(|doc| rules.add_document(doc, &source, &self.counters));
            if loaded.is_err() {
                break;
            }
        }
        let reason = format!("xDS version {version}");
        self.install(loaded.map(|()| rules), &reason)
            .map_err(|e| e.to_string())?;
        *x.version.lock().unwrap_or_else(|e| e.into_inner()) = Some(version.to_string());
        x.has_version
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Marks the service as stopping: [`DecisionService::draining`] is true from now on.
    pub fn start_draining(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the service is stopping (its health check fails).
    pub fn draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Answers as `service` says (headers, global shadow mode, near-limit ratio, and
    /// whether a reload merges documents of one domain).
    pub fn with_answers(mut self, service: &tollgate_runtime::config::ServiceSettings) -> Self {
        self.answers = Answers {
            headers: service.headers.clone(),
            shadow_mode: service.shadow_mode,
            rejected_hits: service.rejected_hits,
            stop_increment_when_over_limit: service.stop_increment_when_over_limit,
        };
        self.merge_domains = service.merge_domains;
        self.decision_log = decision_log::DecisionLog::new(&service.decision_log);
        self.metrics = Metrics::new(service.near_limit_ratio);
        self
    }

    /// envoyproxy/ratelimit's metric names beside tollgate's, named through `mapping`
    /// (none: not exported); `loaded` says the rules in force came from a load (files),
    /// which counts as its first `config_load_success`.
    pub fn with_envoy_metrics(
        mut self,
        mapping: Option<crate::statsd_mapping::StatsdMapping>,
        loaded: bool,
    ) -> Self {
        if let Some(mapping) = mapping {
            let envoy = crate::envoy_metrics::EnvoyMetrics::new(mapping);
            if loaded {
                envoy.load(true);
            }
            self.metrics.set_envoy(envoy);
        }
        self
    }

    /// Traces each call (see [`tollgate_runtime::traces`]); its export counts at `/metrics`.
    pub fn with_tracing(mut self, tracing: Arc<tollgate_runtime::traces::Tracing>) -> Self {
        (self.metrics).add_collector(tollgate_runtime::traces::SpanCounts::of(&tracing));
        self.tracing = Some(tracing);
        self
    }

    /// The tracer, when traces are on.
    pub fn tracing(&self) -> Option<&Arc<tollgate_runtime::traces::Tracing>> {
        self.tracing.as_ref()
    }

    /// How the service answers.
    pub fn answers(&self) -> &Answers {
        &self.answers
    }

    /// The order `/v1/acquire`'s waiters come back in (one at a time, by admission).
    pub fn turns(&self) -> &tollgate::wait::Turns {
        &self.turns
    }

    /// Bounds the RLQS streams as `limits` says (default:
    /// [`tollgate_runtime::config::QuotaLimits`]).
    pub fn with_quota_limits(mut self, limits: tollgate_runtime::config::QuotaLimits) -> Self {
        self.quota.limits = limits;
        self
    }

    /// Bounds every request as `requests` says (default: [`tollgate_runtime::config::Requests`]).
    pub fn with_request_limits(mut self, requests: tollgate_runtime::config::Requests) -> Self {
        self.requests = requests;
        self
    }

    /// Whether the service can decide: with Redis, whether its nodes answer (and the
    /// per-second Redis's, when there is one). `Err` says why not, for an operator:
    /// no rules from xDS in force yet, or none of a store's nodes answering;
    /// `Ok(Some(the nodes away))` when some of a Cluster's do not.
    pub async fn ready(&self) -> Result<Option<String>, String> {
        if self.awaiting_rules() {
            // It could only answer 503: not ready, whatever the health check says.
            return Err(RequestError::NoRules.to_string());
        }
        let mut away = Vec::new();
        for (store, which) in [
            (self.counters.store(), ""),
            (self.counters.per_second_store(), "the per-second Redis: "),
        ] {
            let Some(store) = store else { continue };
            let pings = store.ping_nodes().await;
            let down: Vec<String> = (pings.iter())
                .filter_map(|(node, r)| {
                    let why = match r.as_ref().err()? {
                        tollgate::Error::Unavailable(why) => why.clone(),
                        e => e.to_string(),
                    };
                    Some(format!("{which}node {node}: {why}"))
                })
                .collect();
            if down.len() == pings.len() {
                return Err(format!("store unavailable: {}", down.join("; ")));
            }
            away.extend(down);
        }
        Ok((!away.is_empty()).then(|| away.join("; ")))
    }

    /// With Redis, which code decides on the main store's nodes (see
    /// `RedisStore::decided_by`), for the banner.
    pub fn redis_decided_by(&self) -> Option<String> {
        self.counters.store().map(|s| s.decided_by())
    }

    /// The rule files a reload reads.
    pub fn sources(&self) -> &[std::path::PathBuf] {
        &self.sources
    }

    /// Reads the rule files again, for `reason` (SIGHUP, a file changed, `POST
    /// /v1/reload`). A bad file changes nothing (the old rules stay in force); limits
    /// whose definition did not change keep their counters. Logged with its reason,
    /// and counted in the metrics either way.
    pub fn reload(&self, reason: &str) -> Result<(), crate::descriptors::RulesError> {
        if self.xds.is_some() {
            tracing::info!(
                reason,
                "tollgate serve: the rules come from the xDS server: nothing to reload"
            );
            return Ok(());
        }
        if self.sources.is_empty() {
            tracing::info!(
                reason,
                "tollgate serve: the built-in rules are in force: nothing to reload"
            );
            return Ok(());
        }
        let loaded = DescriptorRules::load(&self.sources, &self.counters, self.merge_domains);
        self.install(loaded, reason)
    }

    /// Puts `loaded` in force (keeping the counters of unchanged limits), or keeps the
    /// rules in force when it failed; logged with `reason` and counted either way.
    fn install(
        &self,
        loaded: Result<DescriptorRules, crate::descriptors::RulesError>,
        reason: &str,
    ) -> Result<(), crate::descriptors::RulesError> {
        match &loaded {
            Ok(_) => tracing::info!(reason, "tollgate serve: rules reloaded"),
            Err(e) => tracing::error!(
                reason,
                error = %e,
                "tollgate serve: reload rejected, the previous rules stay in force"
            ),
        }
        match loaded {
            Ok(mut rules) => {
                let old = self.rules.load_full();
                rules.adopt(&old);
                // The counts of the limiters going away stay in the metrics' totals.
                let kept: std::collections::HashSet<*const DescriptorLimit> =
                    rules.all_limits().iter().map(Arc::as_ptr).collect();
                let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
                for l in old.all_limits() {
                    if !kept.contains(&Arc::as_ptr(&l)) {
                        l.limiter.iter().for_each(|l| retired.retire(l));
                    }
                }
                self.quota.reload(&rules);
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

    /// The service's metrics, for the servers in front of it to count their calls.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Now on the service's clock, in ns (for timing calls).
    pub fn now_ns(&self) -> u64 {
        tollgate::clock::Clock::now_ns(&self.clock)
    }

    /// The metrics text, with the current counter counts.
    pub fn render_metrics(&self) -> String {
        // One scrape at a time: each sets the figures it then encodes (the rule limits
        // are cleared and set again), so two at once (Prometheus in pairs) could see
        // the other's half-set ones.
        let _scrape = self.metrics.scrape();
        let rules = self.rules.load();
        let mut stats = (self.retired.lock().unwrap_or_else(|e| e.into_inner())).clone();
        let limits: Vec<_> = (rules.domains())
            .flat_map(|(domain, _)| rules.limits(domain).into_iter().map(move |l| (domain, l)))
            .collect();
        self.metrics
            .rule_limits(limits.iter().filter_map(|(domain, l)| {
                let rules = l.rules.as_ref()?;
                Some((*domain, l.path.as_str(), rules.policies()))
            }));
        for (domain, limit) in &limits {
            match &limit.limiter {
                Some(AnyLimiter::Memory(l)) => self.metrics.keys(domain, &limit.path, l.len()),
                Some(l) => stats.add(l),
                None => {}
            }
        }
        let overrides = self.overrides.lock().unwrap_or_else(|e| e.into_inner());
        overrides
            .values()
            .flat_map(|l| &l.limiter)
            .for_each(|l| stats.add(l));
        drop(overrides);
        if let Counters::Redis(_) = self.counters {
            stats.add_nodes(self.quota.ledger_nodes());
            let stores = [
                ("main", self.counters.store()),
                ("per_second", self.counters.per_second_store()),
            ];
            self.metrics.redis_calls(
                (stores.into_iter())
                    .filter_map(|(name, store)| Some((name, store?.call_stats())))
                    .collect(),
            );
            self.metrics
                .redis(&stats.redis, self.counters.tls_insecure());
            self.metrics.redis_nodes(&stats.nodes);
            self.metrics.leases(&stats.leases);
            self.metrics.quota_events(&self.quota.events());
        }
        if let Some(w) = &self.workers {
            self.metrics.workers(&w.read());
        }
        if let Some(x) = &self.xds {
            use std::sync::atomic::Ordering::Relaxed;
            self.metrics.xds(&[
                ("stream_up", u64::from(x.stream_up.load(Relaxed))),
                ("streams_opened", x.streams.load(Relaxed)),
                ("versions_acked", x.acked.load(Relaxed)),
                ("versions_nacked", x.nacked.load(Relaxed)),
            ]);
        }
        for (listener, tls) in &self.tls {
            (self.metrics)
                .certificate_days_left(listener, tollgate_runtime::tls::days_left(tls.not_after()));
        }
        let buckets = self.quota.views();
        let figures = buckets.iter().map(|b| {
            (
                b.domain.as_str(),
                b.bucket.as_str(),
                b.count,
                &b.figures[..],
                b.reported,
            )
        });
        self.metrics.quota(figures, self.quota.streams());
        self.metrics.render()
    }

    /// The limit for a request's own override in `domain`, created on first use.
    fn override_for(&self, domain: &str, unit: Unit, n: u64) -> Option<Arc<DescriptorLimit>> {
        let mut map = self.overrides.lock().unwrap_or_else(|e| e.into_inner());
        let key = (domain.to_string(), unit, n);
        if let Some(l) = map.get(&key) {
            return Some(l.clone());
        }
        if map.len() >= MAX_OVERRIDES {
            return None;
        }
        let limit = override_limit(domain, unit, n, &self.counters).ok()?;
        map.insert(key, limit.clone());
        Some(limit)
    }

    /// The limit and counter that apply to a descriptor: its own override when it
    /// carries one (in a known domain, as Envoy), else the rule it matches.
    fn limit_for(
        &self,
        rules: &DescriptorRules,
        domain: &str,
        d: &DescriptorRequest,
    ) -> Option<Match> {
        match d.limit_override {
            Some((unit, n)) if rules.has_domain(domain) => Some(Match {
                limit: self.override_for(domain, unit, n)?,
                counter: counter_key(domain, &d.entries),
                stat_name: None,
            }),
            _ => rules.find(domain, &d.entries),
        }
    }

    /// Envoy's quota buckets (RLQS) and the streams reporting on them.
    pub fn quota(&self) -> &crate::quota::QuotaBuckets {
        &self.quota
    }

    /// The rules in force (a reload replaces them whole).
    pub fn rules(&self) -> Arc<DescriptorRules> {
        self.rules.load_full()
    }

    /// Decides every descriptor of a request for `domain`. `hits` is the request's
    /// cost (Envoy's `hits_addend`: unset or 0 means 1); a descriptor's own `Some(0)`
    /// checks without counting. Each descriptor is counted on its own, as Envoy does;
    /// a descriptor whose limit another matched limit `replaces` is skipped, and one
    /// without entries matches nothing. Under a try, a descriptor whose limit counts
    /// rejected hits ([`DescriptorLimit::counts_rejected`]) is charged them even when over its
    /// limit (and a look, hits 0, finds it over while it is in debt).
    pub async fn check(
        &self,
        api: Api,
        domain: &str,
        descriptors: &[DescriptorRequest],
        hits: u64,
        op: Op,
    ) -> Result<CheckResult, RequestError> {
        self.validate(api, domain, descriptors)?;
        let started = tollgate::clock::Clock::now_ns(&self.clock);
        let rules = self.rules.load_full();
        let found: Vec<_> = descriptors
            .iter()
            .map(|d| self.limit_for(&rules, domain, d))
            .collect();
        let replaced: HashSet<&str> = found
            .iter()
            .flatten()
            .flat_map(|m| m.limit.replaces.iter().map(String::as_str))
            .collect();
        // Envoy's request hits_addend: unset or 0 means 1; a charge of 0 is a look.
        let request_hits = if op == Op::Charge { hits } else { hits.max(1) };
        let applies = |m: &Match| {
            !m.limit
                .name
                .as_deref()
                .is_some_and(|n| replaced.contains(n))
        };
        // envoyproxy's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: a first look at every
        // descriptor; if one would go over, only those over count their hits.
        let mut over = vec![false; descriptors.len()];
        if self.answers.stop_increment_when_over_limit && op == Op::Try {
            for (i, (d, f)) in descriptors.iter().zip(&found).enumerate() {
                if let Some(m) = f.as_ref().filter(|m| applies(m) && !d.give_back) {
                    let cost = d.hits.unwrap_or(request_hits);
                    over[i] = cost > 0 && self.would_be_over(&m.limit, &m.counter, cost).await?;
                }
            }
        }
        if op == Op::Acquire {
            refuse_window_counters(&found, &applies)?;
        }
        let any_over = over.contains(&true);
        let mut statuses: Vec<DescriptorStatus> = Vec::with_capacity(descriptors.len());
        for (i, (d, f)) in descriptors.iter().zip(&found).enumerate() {
            let status = match f {
                Some(m) if applies(m) => {
                    let cost = d.hits.unwrap_or(request_hits);
                    if d.give_back && cost > 0 {
                        self.give_back(&m.limit, &m.counter, cost).await;
                    }
                    let counted =
                        op == Op::Try && m.limit.counts_rejected(self.answers.rejected_hits);
                    let (cost, op) = match () {
                        _ if d.give_back => (0, op),
                        // Another descriptor is over: this one is only looked at.
                        _ if any_over && !over[i] && cost > 0 => (0, Op::Try),
                        _ if counted => (cost, Op::Count),
                        _ => (cost, op),
                    };
                    let status = self
                        .decide_one(&m.limit, &m.counter, cost, op)
                        .await
                        .map_err(|e| match e {
                            RequestError::Refused(_, why) => RequestError::Refused(i, why),
                            e => e,
                        })?;
                    self.count(domain, m, &status);
                    status
                }
                // No limit, or one another matched limit replaces.
                _ => ok(None),
            };
            statuses.push(status);
        }
        let overall = self.overall(&statuses);
        let now = tollgate::clock::Clock::now_ns(&self.clock);
        self.metrics
            .latency(now.saturating_sub(started) as f64 / 1e9);
        let result = CheckResult { overall, statuses };
        if decision_log::DecisionLog::enabled() {
            (self.decision_log).record(now, domain, descriptors, &result);
        }
        if self.tracing.is_some() {
            crate::spans::record_decision(domain, &result, self.counters.store_name());
        }
        Ok(result)
    }

    /// The request's code: OVER_LIMIT when a descriptor outside quota mode is, or
    /// when every quota-mode descriptor is (Envoy's `quota_mode`); then OK anyway
    /// under the global shadow mode (counted).
    fn overall(&self, statuses: &[DescriptorStatus]) -> Code {
        let quota = |s: &&DescriptorStatus| s.limit.as_ref().is_some_and(|l| l.quota_mode);
        let over = |s: &&DescriptorStatus| s.code == Code::OverLimit;
        let quotas = statuses.iter().filter(quota).count();
        let over_limit = statuses.iter().any(|s| over(&s) && !quota(&s))
            || (quotas > 0 && statuses.iter().filter(quota).all(|s| over(&s)));
        if !over_limit {
            return Code::Ok;
        }
        if self.answers.shadow_mode {
            self.metrics.global_shadow_mode();
            return Code::Ok;
        }
        Code::OverLimit
    }

    /// Whether `cost` more hits would take `key` over `limit` (a look that counts
    /// nothing).
    async fn would_be_over(
        &self,
        limit: &DescriptorLimit,
        key: &str,
        cost: u64,
    ) -> Result<bool, RequestError> {
        if limit.deny {
            return Ok(true);
        }
        let looked = match &limit.limiter {
            Some(AnyLimiter::Memory(l)) => l.peek(key, cost),
            // Boxed: the Redis call's state would make every decision's future,
            // memory ones too, kilobytes larger (copied as a task is spawned).
            Some(l) => Box::pin(l.peek(key, cost)).await,
            None => return Ok(false),
        };
        match looked {
            Ok(d) => Ok(!d.decision.allowed || d.decision.shadow_rejected),
            Err(e) if e.rejection().is_some() => Ok(true),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// The one validation of a request, whatever its transport: a domain and
    /// descriptors (each with entries, through tollgate's API), within `requests:`
    /// bounds.
    fn validate(
        &self,
        api: Api,
        domain: &str,
        descriptors: &[DescriptorRequest],
    ) -> Result<(), RequestError> {
        if self.awaiting_rules() {
            return Err(RequestError::NoRules);
        }
        if domain.is_empty() {
            return Err(RequestError::NoDomain);
        }
        if descriptors.is_empty() {
            return Err(RequestError::NoDescriptors);
        }
        if api == Api::Tollgate {
            if let Some(i) = descriptors.iter().position(|d| d.entries.is_empty()) {
                return Err(RequestError::EmptyDescriptor(i));
            }
        }
        let max = self.requests.max_descriptors;
        if descriptors.len() > max {
            return Err(RequestError::TooManyDescriptors(descriptors.len(), max));
        }
        for (i, d) in descriptors.iter().enumerate() {
            let bytes = domain.len()
                + (d.entries.iter())
                    .map(|(k, v)| k.len() + v.len() + 2)
                    .sum::<usize>();
            if bytes > self.requests.max_key_bytes {
                return Err(RequestError::KeyTooLong(
                    i,
                    bytes,
                    self.requests.max_key_bytes,
                ));
            }
        }
        Ok(())
    }

    /// One descriptor's status under `limit`, counting `cost` on `key`.
    async fn decide_one(
        &self,
        limit: &Arc<DescriptorLimit>,
        key: &str,
        cost: u64,
        op: Op,
    ) -> Result<DescriptorStatus, RequestError> {
        let decision = if limit.deny {
            // Nothing is ever admitted; a look (hits 0) finds nothing counted.
            let reset = limit.envoy.map_or(0, |(unit, _)| {
                unit.reset_after_us(tollgate::clock::Clock::now_us(&self.clock))
            });
            if cost == 0 {
                RuleDecision::from(Decision::admitted(0, 0, reset, 0))
            } else {
                RuleDecision::from(Decision::rejected(0, 0, reset, None))
            }
        } else {
            match &limit.limiter {
                Some(AnyLimiter::Memory(l)) => decide(l, key, cost, op).await?,
                // Boxed: see `would_be_over`.
                Some(l) => {
                    let span = (self.tracing.as_ref()).and_then(|t| t.store_span());
                    let decided = Box::pin(decide(l, key, cost, op)).await;
                    tollgate_runtime::traces::end_store_span(span, decided.as_ref().err());
                    decided?
                }
                None => return Ok(ok(Some(limit.clone()))),
            }
        };
        let d = &decision.decision;
        let shadow_rejected = d.shadow_rejected || (!d.allowed && limit.shadow);
        let code = if d.allowed || shadow_rejected {
            Code::Ok
        } else {
            Code::OverLimit
        };
        Ok(DescriptorStatus {
            code,
            hits: cost,
            limit: Some(limit.clone()),
            counter: key.to_string(),
            rule_decision: Some(decision),
            shadow_rejected,
        })
    }

    /// Counts a decided descriptor in its rule's statistics (or its value's, for a
    /// rule with `detailed_metric` or `value_to_metric`).
    fn count(&self, domain: &str, m: &Match, s: &DescriptorStatus) {
        let Some(d) = s.decision() else {
            return;
        };
        let verdict = match (s.shadow_rejected, d.allowed) {
            (true, _) => Verdict::ShadowRejected,
            (false, true) => Verdict::Allowed,
            (false, false) => Verdict::Rejected,
        };
        if let Some(top) = &self.top_keys {
            top.record(&s.counter, !matches!(verdict, Verdict::Allowed));
        }
        let hits = Hits {
            hits: s.hits,
            verdict,
            limit: d.limit,
            remaining: d.remaining,
        };
        match &m.stat_name {
            None => {
                let stats = (m.limit.stats).get_or_init(|| {
                    self.metrics
                        .rule_stats(domain, &m.limit.path, &m.limit.full_key)
                });
                self.metrics.count(stats, hits);
            }
            Some(name) => self
                .metrics
                .count(&self.metrics.rule_stats(domain, &name.0, &name.1), hits),
        }
    }

    /// Gives back what a request counted (an acquire whose caller went away), to
    /// the counters its check counted on.
    pub async fn refund(&self, result: &CheckResult) {
        for s in &result.statuses {
            // Only what was taken: a reject (shadow mode's too) took nothing.
            let took = s
                .decision()
                .is_some_and(|d| d.allowed && !d.shadow_rejected);
            if let (Some(limit), true) = (&s.limit, took && s.hits > 0) {
                self.give_back(limit, &s.counter, s.hits).await;
            }
        }
    }

    /// Gives `cost` back to `counter` of `limit` (best effort: a store that cannot
    /// answer keeps what it counted).
    async fn give_back(&self, limit: &DescriptorLimit, counter: &str, cost: u64) {
        if let Some(l) = &limit.limiter {
            let _ = Box::pin(l.refund(counter, cost)).await;
        }
    }

    /// What one more request for `entries` in `domain` would be told now, counting
    /// nothing: the rule it matches (its path) and the decision (`None` for an
    /// unlimited rule); `Ok(None)` when no rule matches.
    pub async fn look(
        &self,
        domain: &str,
        entries: &[(String, String)],
    ) -> Result<Option<(String, Option<RuleDecision>)>, String> {
        let Some(Match { limit, counter, .. }) = self.rules.load().find(domain, entries) else {
            return Ok(None);
        };
        let decision = match &limit.limiter {
            Some(l) => match Box::pin(l.peek(&counter, 1)).await {
                Ok(d) => Some(d),
                Err(e) => match e.rejection() {
                    Some(d) => Some(RuleDecision::from(d)),
                    None => return Err(e.to_string()),
                },
            },
            None => None,
        };
        Ok(Some((limit.path.clone(), decision)))
    }

    /// Forgets the counters of one descriptor.
    pub async fn reset(&self, domain: &str, entries: &[(String, String)]) -> Result<bool, String> {
        let Some(Match {
            limit,
            counter: key,
            ..
        }) = self.rules.load().find(domain, entries)
        else {
            return Ok(false);
        };
        if let Some(l) = &limit.limiter {
            l.reset(&key).await.map_err(|e| e.to_string())?;
        }
        Ok(true)
    }
}

/// One descriptor's decision from any store (hits 0: a look that counts nothing;
/// under Envoy's counting, a look that finds a key in debt over its limit). A request
/// that can never fit is a reject; a store that cannot answer (Redis down under
/// `on_error: error`) fails the request.
async fn decide(
    limiter: &impl RateLimiter,
    key: &str,
    cost: u64,
    op: Op,
) -> Result<RuleDecision, RequestError> {
    let outcome = match (cost, op) {
        (0, Op::Try | Op::Acquire) => limiter.peek(key, 0).await,
        (n, op) => limiter.check_rules(key, n, op).await,
    };
    match outcome {
        Ok(r) => Ok(r),
        Err(Error::Check(e @ CheckError::NotChargeable { .. })) => {
            Err(RequestError::Refused(0, e.to_string()))
        }
        Err(e) => match e.rejection() {
            Some(d) => Ok(RuleDecision::from(d)),
            None => Err(unavailable(e)),
        },
    }
}

/// An acquire reserves a later window, which a limit kept as Redis window counters
/// does not keep: refused before any descriptor is decided (none is left reserved).
fn refuse_window_counters(
    found: &[Option<Match>],
    applies: &impl Fn(&Match) -> bool,
) -> Result<(), RequestError> {
    for (i, m) in found.iter().enumerate() {
        let Some(m) = m.as_ref().filter(|m| applies(m)) else {
            continue;
        };
        if let Some(AnyLimiter::Redis(l)) = &m.limit.limiter {
            if l.keeps_window_counters() {
                return Err(RequestError::Refused(
                    i,
                    format!(
                        "acquire: the limit {} is kept as Redis window counters, which \
                         reserve no later window (store.window_counters: false keeps it \
                         otherwise)",
                        m.limit.path
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn ok(limit: Option<Arc<DescriptorLimit>>) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok,
        hits: 0,
        limit,
        counter: String::new(),
        rule_decision: None,
        shadow_rejected: false,
    }
}

/// The store's failure as a request's error, its cause said once ("store
/// unavailable: redis: ...", not the store's own "store unavailable: " again).
fn unavailable(e: Error) -> RequestError {
    match e {
        Error::Unavailable(why) => RequestError::Unavailable(why),
        other => RequestError::Unavailable(other.to_string()),
    }
}
