//! Envoy's rate limit quota service (RLQS, `envoy.service.rate_limit_quota.v3`): the
//! quota buckets the Envoys of a fleet report on, each dividing the budget of its
//! `quota_buckets` rule among them by demand ([`tollgate::quota`]), and the
//! conversions between the protocol's messages and the division's.
//!
//! A stream is one Envoy (a client of every bucket it reports on). Its reports go to
//! their buckets; what a bucket decides goes to whichever of this server's clients it
//! concerns, on that client's stream. The buckets are kept in the store's
//! [`QuotaLedger`]: with Redis, the servers on it share each bucket, and each sends
//! only its own clients' assignments. Reports are recorded as they arrive and applied
//! by [`QuotaBuckets::flush`] every [`TICK`], one ledger change per bucket for every
//! report that came since its last (a bucket with a thousand Envoys is divided twenty
//! times a second, not a thousand), with the renewals and freed shares due.
//! A bucket no rule takes is answered `ALLOW_ALL` (as Envoy's ratelimit service
//! answers a descriptor no rule matches), renewed while reported; a bucket of a
//! `blanket:` rule, its `ALLOW_ALL` or `DENY_ALL` the same way (kept only for its
//! figures: nothing is divided or stored).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tollgate::clock::{Clock, MonotonicClock};
use tollgate::quota::{Assignment, ClientId, QuotaLedger, QuotaStats, ServerId, Share, Usage};
use tonic::Status;

use crate::descriptors::{self, Blanket, DescriptorRules, QuotaRule, QuotaStrategy};
use tollgate_runtime::config::store::{OnErrorDoc, StoreConfig};

/// How often reports are applied (with the others that arrived meanwhile: a bucket
/// with thousands of Envoys reporting every second is divided at most this often, not
/// once per report) and the buckets checked for renewals due and freed shares.
pub const TICK: Duration = Duration::from_millis(50);

/// The most answers waiting for a stream's client to read them; past it the client
/// is not reading, and its stream ends with `RESOURCE_EXHAUSTED`.
pub const MAX_QUEUED: usize = 256;

/// The longest `time_elapsed` a report is read as (longer ones are read as this).
const MAX_ELAPSED_US: u64 = 3_600_000_000;

/// How many buckets one pass changes at once (with Redis, calls in flight).
const TICK_CONCURRENCY: usize = 64;

/// A bucket, named by its domain and bucket id (keys in order).
type BucketKey = (String, BTreeMap<String, String>);

/// What a server sends while its ledger (Redis) fails, from the store's `on_error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerFailure {
    /// Nothing (`error`): assignments are not renewed, and each Envoy falls back to
    /// its `expired_assignment_behavior` when its own ends.
    Nothing,
    /// `DENY_ALL` to each Envoy that reports (`fail-closed`).
    Deny,
    /// `ALLOW_ALL` to each Envoy that reports (`fail-open`).
    Allow,
    /// This server divides `1/n` of each budget among its own Envoys, alone
    /// (`local`, with `local_share: n`).
    Local(u64),
}

impl LedgerFailure {
    /// What `store.on_error` says for quota buckets (`Nothing` for the memory store,
    /// which does not fail).
    pub fn of(store: Option<&StoreConfig>) -> LedgerFailure {
        let Some(config) = store else {
            return LedgerFailure::Nothing;
        };
        match config.on_error {
            OnErrorDoc::Error => LedgerFailure::Nothing,
            OnErrorDoc::FailClosed => LedgerFailure::Deny,
            OnErrorDoc::FailOpen => LedgerFailure::Allow,
            OnErrorDoc::Local => LedgerFailure::Local(config.local_share.unwrap_or(1)),
        }
    }
}

/// Every quota bucket this server's streams report on, and the streams.
pub struct QuotaBuckets {
    /// The bounds on streams (`quota:` in the main config).
    pub limits: tollgate_runtime::config::QuotaLimits,
    state: Mutex<State>,
    ledger: QuotaLedger,
    on_error: LedgerFailure,
    /// For [`LedgerFailure::Local`]: the buckets divided alone while the ledger fails.
    alone: QuotaLedger,
    /// Whether the ledger failed at its last use (a change is logged once).
    failing: AtomicBool,
    /// Whether the last pass had assignments too late to send (logged once).
    late: AtomicBool,
    /// Bucket changes the store failed, and assignments not sent for being decided
    /// too long ago, since start.
    store_errors: AtomicU64,
    late_assignments: AtomicU64,
    /// This server, among those sharing the ledger.
    server: ServerId,
    next_client: AtomicU64,
    clock: MonotonicClock,
}

#[derive(Default)]
struct State {
    buckets: HashMap<BucketKey, Bucket>,
    streams: HashMap<ClientId, Stream>,
    /// The buckets with changes to apply.
    dirty: HashSet<BucketKey>,
}

/// One bucket as this server knows it: its rule, its id as Envoy sent it, its name in
/// the ledger, and its standing as of this server's last change.
struct Bucket {
    rule: Arc<QuotaRule>,
    id: BucketId,
    name: String,
    /// Reports and departures not yet applied.
    pending: Vec<Change>,
    stats: QuotaStats,
    /// When a tick has something to do (this server's clock), if ever.
    due: Option<u64>,
    /// This server's streams reporting on it.
    streams: usize,
    /// Requests the reports to this server counted, allowed and denied.
    allowed: u64,
    denied: u64,
}

impl Bucket {
    fn new(key: &BucketKey, rule: &Arc<QuotaRule>, id: BucketId) -> Bucket {
        Bucket {
            rule: rule.clone(),
            name: ledger_name(key, rule),
            id,
            pending: Vec::new(),
            stats: QuotaStats::default(),
            due: None,
            streams: 0,
            allowed: 0,
            denied: 0,
        }
    }
}

/// One stream: where its answers go (`None` once its client stopped reading them),
/// its domain, the buckets it reported on that a rule takes, and those no rule took
/// (answered `ALLOW_ALL`; kept, up to `max_buckets_per_stream` of them, so that a
/// reload that denies one tells it at once).
struct Stream {
    outbox: Option<mpsc::Sender<RateLimitQuotaResponse>>,
    domain: Option<String>,
    buckets: HashSet<BucketKey>,
    unruled: HashMap<BucketKey, BucketId>,
}

/// A change to a bucket, applied with the next division.
#[derive(Debug, Clone, Copy)]
enum Change {
    Report(ClientId, Usage),
    Leave(ClientId),
    /// The client was answered outside the ledger while it failed.
    Superseded(ClientId),
}

/// What one bucket's division sends, and by when (this server's clock) it must be
/// sent to reach its Envoys within the bucket's grace.
struct Outgoing {
    sends: Vec<(ClientId, BucketAction)>,
    send_by: u64,
}

/// What a change decided: the assignments to send, the bucket's standing, and how
/// long until its next tick for this server.
struct Decided {
    sends: Vec<Assignment>,
    stats: QuotaStats,
    next_in: Option<u64>,
}

/// One bucket's standing, for `/metrics` and `/v1/config`.
#[derive(Debug, Clone)]
pub struct BucketView {
    /// The domain.
    pub domain: String,
    /// The bucket id, `key=value,...`.
    pub bucket: String,
    /// Its rule's name.
    pub rule: String,
    /// Its rule's budget, or blanket rule.
    pub strategy: QuotaStrategy,
    /// `clients`: the Envoys reporting on it or holding a share (on every server
    /// sharing it); for a blanket rule's bucket, `streams`: this server's streams
    /// reporting on it (nothing is shared).
    pub count: (&'static str, u64),
    /// Its demand, assigned and reserved rates, per second (on every server sharing
    /// it), named as reported; none for a blanket rule's bucket.
    pub figures: Vec<(&'static str, f64)>,
    /// The requests allowed and denied in the reports to this server.
    pub reported: [u64; 2],
}

impl QuotaBuckets {
    /// Buckets kept in `ledger`, with `on_error` while it fails.
    pub fn new(ledger: QuotaLedger, on_error: LedgerFailure) -> Self {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        QuotaBuckets {
            limits: tollgate_runtime::config::QuotaLimits::default(),
            state: Mutex::default(),
            ledger,
            on_error,
            alone: QuotaLedger::memory(),
            failing: AtomicBool::new(false),
            late: AtomicBool::new(false),
            store_errors: AtomicU64::new(0),
            late_assignments: AtomicU64::new(0),
            server: h.finish(),
            next_client: AtomicU64::new(1),
            clock: MonotonicClock::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new stream: its client id (unique among the servers sharing the ledger) and
    /// the receiver of what it is sent.
    pub fn open(&self) -> (ClientId, mpsc::Receiver<RateLimitQuotaResponse>) {
        let id = self.server ^ self.next_client.fetch_add(1, Ordering::Relaxed);
        let (outbox, inbox) = mpsc::channel(MAX_QUEUED);
        let stream = Stream {
            outbox: Some(outbox),
            domain: None,
            buckets: HashSet::new(),
            unruled: HashMap::new(),
        };
        self.state().streams.insert(id, stream);
        (id, inbox)
    }

    /// One message of stream `client`: its usage reports, each recorded for its
    /// bucket (found under `rules`) and applied by [`Self::flush`]. `Err` ends the
    /// stream with that status.
    pub fn report(
        &self,
        client: ClientId,
        reports: RateLimitQuotaUsageReports,
        rules: &DescriptorRules,
    ) -> Result<(), Status> {
        let mut state = self.state();
        let State {
            buckets,
            streams,
            dirty,
        } = &mut *state;
        let stream = streams
            .get_mut(&client)
            .ok_or_else(|| Status::internal("the stream is closed"))?;
        // The first message names the domain; later ones may repeat it, not change it.
        let domain = match (&stream.domain, reports.domain.as_str()) {
            (None, "") => {
                return Err(Status::invalid_argument(
                    "the first report must name its domain",
                ))
            }
            (None, d) => d.to_string(),
            (Some(d), "") => d.clone(),
            (Some(d), r) if d == r => d.clone(),
            (Some(d), r) => {
                return Err(Status::invalid_argument(format!(
                    "the domain of a stream cannot change ('{d}', then '{r}'): open another stream"
                )))
            }
        };
        // The whole message is checked before any of it is applied: a bad usage
        // must not leave the good ones before it decided but unsent.
        // Each usage with the rule that takes its bucket, looked up once.
        let usages: Vec<(Reported, Option<&Arc<QuotaRule>>)> = (usages(reports, &domain)?)
            .into_iter()
            .map(|u| {
                let rule = rules.quota_rule(&domain, &u.key.1);
                (u, rule)
            })
            .collect();
        // Each bucket once however often named; only those a rule takes are kept
        // for the server.
        let new_here = (usages.iter())
            .filter(|(u, rule)| rule.is_some() && !stream.buckets.contains(&u.key))
            .map(|(u, _)| &u.key)
            .collect::<HashSet<_>>()
            .len();
        let new_kept = (usages.iter())
            .filter(|(u, rule)| rule.is_some() && !buckets.contains_key(&u.key))
            .map(|(u, _)| &u.key)
            .collect::<HashSet<_>>()
            .len();
        let limits = &self.limits;
        if stream.buckets.len() + new_here > limits.max_buckets_per_stream {
            return Err(Status::resource_exhausted(format!(
                "a stream may report on at most {} buckets (quota.max_buckets_per_stream)",
                limits.max_buckets_per_stream
            )));
        }
        if buckets.len() + new_kept > limits.max_buckets {
            return Err(Status::resource_exhausted(format!(
                "the server keeps at most {} buckets (quota.max_buckets)",
                limits.max_buckets
            )));
        }
        stream.domain = Some(domain.clone());
        // Blanket answers, sent at once.
        let mut blanket = Vec::new();
        for (u, rule) in usages {
            let Some(rule) = rule else {
                // No rule takes it: not limited here.
                let (allow, ttl_us) = (Blanket::AllowAll, descriptors::BLANKET_TTL_US);
                let action = blanket_answer(&u.id, allow, ttl_us, u.usage.elapsed_us);
                blanket.push((client, action));
                // Not limited, so not bounded either: past the bound, a reload that
                // denies one is told at the stream's next report.
                if stream.unruled.len() < limits.max_buckets_per_stream {
                    stream.unruled.insert(u.key, u.id);
                }
                continue;
            };
            let bucket =
                (buckets.entry(u.key.clone())).or_insert_with(|| Bucket::new(&u.key, rule, u.id));
            if stream.buckets.insert(u.key.clone()) {
                bucket.streams += 1;
            }
            bucket.allowed = bucket.allowed.saturating_add(u.usage.allowed);
            bucket.denied = bucket.denied.saturating_add(u.usage.denied);
            if let Some(action) = blanket_action(&bucket.id, rule, u.usage.elapsed_us) {
                blanket.push((client, action));
                continue;
            }
            bucket.pending.push(Change::Report(client, u.usage));
            dirty.insert(u.key);
        }
        deliver(streams, blanket);
        Ok(())
    }

    /// Stream `client` ended: its shares free when they end, and the others of its
    /// buckets are divided again.
    pub fn close(&self, client: ClientId) {
        let mut state = self.state();
        let State {
            buckets,
            streams,
            dirty,
        } = &mut *state;
        let Some(stream) = streams.remove(&client) else {
            return;
        };
        for key in stream.buckets {
            if let Some(b) = buckets.get_mut(&key) {
                b.streams -= 1;
                b.pending.push(Change::Leave(client));
                dirty.insert(key);
            }
        }
    }

    /// One pass: every bucket with reports to apply, a renewal or a freed share due
    /// is divided, once; the others are forgotten where this server has nothing more
    /// to do for them.
    pub async fn flush(&self) {
        let now = self.clock.now_us();
        // What was divided alone while the store failed is dropped once idle (after
        // an outage, nothing updates it again).
        if matches!(self.on_error, LedgerFailure::Local(_)) {
            self.alone.sweep();
        }
        let keys: Vec<BucketKey> = {
            let mut state = self.state();
            let State { buckets, dirty, .. } = &mut *state;
            let mut keys: Vec<BucketKey> = dirty.drain().collect();
            buckets.retain(|_, b| b.streams > 0 || b.due.is_some() || !b.pending.is_empty());
            keys.extend(
                (buckets.iter())
                    .filter(|(_, b)| b.due.is_some_and(|d| d <= now) && b.pending.is_empty())
                    .map(|(k, _)| k.clone()),
            );
            keys
        };
        // Each group of divisions is sent as it completes (one message per Envoy
        // for the group), at most TICK_CONCURRENCY at once.
        let mut done = futures_util::stream::iter(keys)
            .map(|k| async move { self.apply(&k).await })
            .buffer_unordered(TICK_CONCURRENCY)
            .ready_chunks(TICK_CONCURRENCY);
        while let Some(group) = done.next().await {
            let now = self.clock.now_us();
            let (on_time, late): (Vec<Outgoing>, Vec<Outgoing>) =
                group.into_iter().partition(|o| now <= o.send_by);
            let dropped: usize = late.iter().map(|o| o.sends.len()).sum();
            (self.late_assignments).fetch_add(dropped as u64, Ordering::Relaxed);
            if !late.is_empty() && !self.late.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    buckets = late.len(),
                    "quota buckets: assignments decided too long ago (a slow store) are not \
                     sent; the ledger still counts them, so their Envoys are under-admitted"
                );
            } else if late.is_empty() {
                self.late.store(false, Ordering::Relaxed);
            }
            let sends = on_time.into_iter().flat_map(|o| o.sends).collect();
            deliver(&mut self.state().streams, sends);
        }
    }

    /// Divides bucket `key` in the ledger with the reports and departures recorded
    /// for it (or, while the ledger fails, as `on_error` says); returns what to send.
    async fn apply(&self, key: &BucketKey) -> Outgoing {
        let nothing = Outgoing {
            sends: Vec::new(),
            send_by: u64::MAX,
        };
        let (rule, budget, name, pending) = {
            let mut state = self.state();
            let Some(b) = state.buckets.get_mut(key) else {
                return nothing;
            };
            let pending = std::mem::take(&mut b.pending);
            let QuotaStrategy::Budget { budget, .. } = b.rule.strategy else {
                // A blanket rule's bucket: answered at each report, nothing divided
                // (and no division of an earlier rule left due).
                b.due = None;
                b.stats = QuotaStats::default();
                return nothing;
            };
            (b.rule.clone(), budget, b.name.clone(), pending)
        };
        let server = self.server;
        let decide = |b: &mut tollgate::quota::QuotaBucket, now: u64| {
            for change in &pending {
                match *change {
                    Change::Report(client, usage) => b.record(client, server, usage, now),
                    Change::Leave(client) => {
                        b.depart(client);
                    }
                    Change::Superseded(client) => b.superseded(client),
                }
            }
            Decided {
                sends: b.tick(server, now),
                stats: b.stats(now),
                next_in: b.next_event(server).map(|e| e.saturating_sub(now)),
            }
        };
        let settings = rule.settings;
        // An assignment must reach its Envoy within the grace of the ledger's time:
        // half of it for this server, half for the network.
        let send_by =
            |age_us: u64| self.clock.now_us().saturating_sub(age_us) + settings.grace_us / 2;
        let e = match self.ledger.update(&name, budget, settings, decide).await {
            Ok(d) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("quota buckets: the store answers again");
                }
                return Outgoing {
                    send_by: send_by(d.age_us),
                    sends: self.kept(key, &name, Some(d.value)),
                };
            }
            Err(e) => e,
        };
        self.store_errors.fetch_add(1, Ordering::Relaxed);
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, on_error = ?self.on_error, "quota buckets: the store fails");
        }
        let blanket = match self.on_error {
            LedgerFailure::Local(n) => {
                let alone = self.alone.update(&name, budget.share(n), settings, decide);
                let sends = self.kept(key, &name, alone.await.ok().map(|d| d.value));
                let answered: Vec<ClientId> = sends.iter().map(|(c, _)| *c).collect();
                self.answered_alone(key, &pending, &answered);
                return Outgoing {
                    sends,
                    send_by: send_by(0),
                };
            }
            LedgerFailure::Nothing => {
                self.answered_alone(key, &pending, &[]);
                return nothing;
            }
            LedgerFailure::Deny => BlanketRule::DenyAll,
            LedgerFailure::Allow => BlanketRule::AllowAll,
        };
        // Each Envoy that reported is answered as the policy says.
        let reported: Vec<ClientId> = (pending.iter())
            .filter_map(|c| match c {
                Change::Report(client, _) => Some(*client),
                _ => None,
            })
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        self.answered_alone(key, &pending, &reported);
        let Some(id) = self.state().buckets.get(key).map(|b| b.id.clone()) else {
            return nothing;
        };
        let strategy = Strategy::BlanketRule(blanket as i32);
        Outgoing {
            sends: (reported.into_iter())
                .map(|client| (client, assign(id.clone(), strategy, settings.ttl_us)))
                .collect(),
            send_by: u64::MAX,
        }
    }

    /// While the ledger failed, `answered` were sent shares it does not know (which
    /// replace theirs at the Envoy): their next share from it is a new one. Kept, with
    /// the marks of earlier failures among `pending`, for the next division.
    fn answered_alone(&self, key: &BucketKey, pending: &[Change], answered: &[ClientId]) {
        let mut state = self.state();
        let State { buckets, dirty, .. } = &mut *state;
        let Some(b) = buckets.get_mut(key) else {
            return;
        };
        let before = b.pending.len();
        b.pending.extend(
            (pending.iter())
                .filter(|c| matches!(c, Change::Superseded(_)))
                .copied()
                .chain(answered.iter().map(|c| Change::Superseded(*c))),
        );
        if b.pending.len() > before {
            dirty.insert(key.clone());
        }
    }

    /// Keeps what a division of bucket `key` under ledger name `name` decided (its
    /// standing, its next tick); returns its assignments as the protocol writes them.
    /// Nothing if a reload changed the bucket's rule meanwhile: its Envoys have been
    /// told of the new one, and must not get a share of the old one after it.
    fn kept(
        &self,
        key: &BucketKey,
        name: &str,
        decided: Option<Decided>,
    ) -> Vec<(ClientId, BucketAction)> {
        let Some(d) = decided else {
            return Vec::new();
        };
        let now = self.clock.now_us();
        let mut state = self.state();
        let Some(b) = state.buckets.get_mut(key).filter(|b| b.name == name) else {
            return Vec::new();
        };
        b.stats = d.stats;
        b.due = d.next_in.map(|n| now + n);
        (d.sends.iter())
            .map(|a| (a.client, action(&b.id, a)))
            .collect()
    }

    /// The rules were loaded again: a bucket whose rule is unchanged keeps its
    /// division (every share stays as it is); a bucket whose rule changed is divided
    /// anew under it from each Envoy's next report (which replaces the Envoy's share
    /// at once: the old share may be spent until the new one arrives), or, if it is
    /// now a blanket rule (or a rule now takes a bucket that had none, and it is a
    /// blanket rule), each Envoy is sent it at once; a bucket no rule takes any more
    /// is abandoned (`AbandonAction`: each Envoy forgets it, and a request that
    /// subscribes it again is answered as an unruled bucket is).
    pub fn reload(&self, rules: &DescriptorRules) {
        let mut state = self.state();
        let State {
            buckets,
            streams,
            dirty,
        } = &mut *state;
        let mut abandoned = Vec::new();
        let mut sends = Vec::new();
        for (key, b) in buckets.iter_mut() {
            let Some(rule) = rules.quota_rule(&key.0, &key.1) else {
                abandoned.push(key.clone());
                continue;
            };
            let name = ledger_name(key, rule);
            if name != b.name {
                self.ledger.forget(&b.name);
                b.name = name;
                b.stats = QuotaStats::default();
                b.due = None;
                let holders = (streams.iter())
                    .filter(|(_, s)| s.buckets.contains(key))
                    .map(|(client, _)| *client);
                if let Some(action) = blanket_action(&b.id, rule, 0) {
                    b.pending.clear();
                    sends.extend(holders.map(|client| (client, action.clone())));
                } else if matches!(b.rule.strategy, QuotaStrategy::Blanket(_)) {
                    // Their blanket answer replaced any share a division (in Redis,
                    // one still kept under this name) counts them as holding: their
                    // next share is a new one, not a renewal.
                    b.pending.extend(holders.map(Change::Superseded));
                    dirty.insert(key.clone());
                }
            }
            b.rule = rule.clone();
        }
        // A bucket reported on with no rule that a blanket rule now takes is told at
        // once, and kept as if reported (one a budget now takes is divided from its
        // next report).
        for (client, s) in streams.iter_mut() {
            for (key, id) in std::mem::take(&mut s.unruled) {
                let Some(rule) = rules.quota_rule(&key.0, &key.1) else {
                    s.unruled.insert(key, id);
                    continue;
                };
                let Some(action) = blanket_action(&id, rule, 0) else {
                    continue;
                };
                sends.push((*client, action));
                let b = (buckets.entry(key.clone())).or_insert_with(|| Bucket::new(&key, rule, id));
                if s.buckets.insert(key) {
                    b.streams += 1;
                }
            }
        }
        for key in abandoned {
            let Some(b) = buckets.remove(&key) else {
                continue;
            };
            self.ledger.forget(&b.name);
            for (client, s) in streams.iter_mut() {
                if s.buckets.remove(&key) {
                    let abandon = bucket_action::BucketAction::AbandonAction(AbandonAction {});
                    let action = BucketAction {
                        bucket_id: Some(b.id.clone()),
                        bucket_action: Some(abandon),
                    };
                    sends.push((*client, action));
                }
            }
        }
        deliver(streams, sends);
    }

    /// Every bucket's standing.
    pub fn views(&self) -> Vec<BucketView> {
        let state = self.state();
        let mut views: Vec<BucketView> = (state.buckets.iter())
            .map(|((domain, id), b)| {
                let (count, figures) = match &b.rule.strategy {
                    QuotaStrategy::Budget { budget, .. } => {
                        let period = budget.rate.period_us as f64;
                        let per_second = |n: u64| n as f64 * 1e6 / period;
                        let figures = vec![
                            ("demand_per_second", per_second(b.stats.demand)),
                            ("assigned_per_second", per_second(b.stats.assigned)),
                            ("reserved_per_second", per_second(b.stats.reserved)),
                        ];
                        (("clients", b.stats.clients), figures)
                    }
                    // Nothing divided, nothing shared: this server's streams on it.
                    QuotaStrategy::Blanket(_) => (("streams", b.streams as u64), Vec::new()),
                };
                BucketView {
                    domain: domain.clone(),
                    bucket: descriptors::bucket_text(
                        id.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                    ),
                    rule: b.rule.name.clone(),
                    strategy: b.rule.strategy.clone(),
                    count,
                    figures,
                    reported: [b.allowed, b.denied],
                }
            })
            .collect();
        views.sort_by(|a, b| (&a.domain, &a.bucket).cmp(&(&b.domain, &b.bucket)));
        views
    }

    /// The ledger's calls to Redis by node (see `QuotaLedger::node_stats`).
    pub fn ledger_nodes(&self) -> Vec<(std::sync::Arc<str>, tollgate::redis::RedisStats)> {
        self.ledger.node_stats()
    }

    /// The store's troubles since start, as `redis_events`: bucket changes it failed
    /// (`quota_store_errors`), assignments not sent because a slow store decided
    /// them too long ago (`quota_late_assignments`).
    pub fn events(&self) -> [(&'static str, u64); 2] {
        [
            (
                "quota_store_errors",
                self.store_errors.load(Ordering::Relaxed),
            ),
            (
                "quota_late_assignments",
                self.late_assignments.load(Ordering::Relaxed),
            ),
        ]
    }

    /// How many streams are open.
    pub fn streams(&self) -> usize {
        self.state().streams.len()
    }
}

/// A bucket's name in the ledger: its domain and id, each part prefixed with its
/// length (no two buckets share a name whatever their text), then what its rule
/// divides (a changed rule starts a new division; an unchanged one, reloaded or on
/// another server, finds its own).
fn ledger_name((domain, id): &BucketKey, rule: &QuotaRule) -> String {
    let mut name = format!("{}:{domain}", domain.len());
    for (k, v) in id {
        name.push_str(&format!("{}:{k}{}:{v}", k.len(), v.len()));
    }
    name.push_str(&format!("|{}|{}", rule.strategy, rule.settings.ttl_us));
    name
}

/// Sends each client its bucket actions, in one response. A client with
/// [`MAX_QUEUED`] answers unread loses its outbox: its stream ends.
fn deliver(streams: &mut HashMap<ClientId, Stream>, sends: Vec<(ClientId, BucketAction)>) {
    let mut by_client: BTreeMap<ClientId, Vec<BucketAction>> = BTreeMap::new();
    for (client, a) in sends {
        by_client.entry(client).or_default().push(a);
    }
    for (client, bucket_action) in by_client {
        let Some(s) = streams.get_mut(&client) else {
            continue;
        };
        let response = RateLimitQuotaResponse { bucket_action };
        if let Some(outbox) = &s.outbox {
            if let Err(mpsc::error::TrySendError::Full(_)) = outbox.try_send(response) {
                s.outbox = None;
            }
        }
    }
}

/// One usage report, checked.
struct Reported {
    key: BucketKey,
    id: BucketId,
    usage: Usage,
}

/// The usage reports of a message, each checked as the protocol requires: at least
/// one; a bucket id of non-empty keys and values; a positive `time_elapsed`.
fn usages(reports: RateLimitQuotaUsageReports, domain: &str) -> Result<Vec<Reported>, Status> {
    if reports.bucket_quota_usages.is_empty() {
        return Err(Status::invalid_argument(
            "a message must carry at least one usage report",
        ));
    }
    (reports.bucket_quota_usages.into_iter())
        .map(|u| {
            let id = u
                .bucket_id
                .filter(|b| !b.bucket.is_empty())
                .ok_or_else(|| Status::invalid_argument("a usage report without a bucket_id"))?;
            if id.bucket.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
                return Err(Status::invalid_argument(
                    "a bucket_id's keys and values must not be empty",
                ));
            }
            // Zero is what Envoy sends with a bucket's first report (it counts the
            // time in whole seconds from the bucket's creation): a subscription,
            // whose demand is learned from the next one.
            let elapsed_us = match u.time_elapsed {
                Some(d) if d.seconds >= 0 && (0..1_000_000_000).contains(&d.nanos) => (d.seconds
                    as u64)
                    .saturating_mul(1_000_000)
                    .saturating_add(d.nanos as u64 / 1000),
                _ => {
                    return Err(Status::invalid_argument(
                        "a usage report needs a time_elapsed (not negative)",
                    ))
                }
            };
            // Longer says no more about the demand (and a huge one must not make
            // its client count as reporting for ever).
            let elapsed_us = elapsed_us.min(MAX_ELAPSED_US);
            let key = (
                domain.to_string(),
                id.bucket
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            );
            Ok(Reported {
                key,
                id,
                usage: Usage {
                    allowed: u.num_requests_allowed,
                    denied: u.num_requests_denied,
                    elapsed_us,
                },
            })
        })
        .collect()
}

/// An assignment as the protocol writes it.
fn action(id: &BucketId, a: &Assignment) -> BucketAction {
    let strategy = match a.share {
        Share::Deny => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Share::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_us,
        } => {
            // The protocol's fields are 32-bit: a larger share is written as a smaller
            // one (never a larger).
            let (per_fill, interval_us) = match u32::try_from(tokens_per_fill) {
                Ok(n) => (n, fill_interval_us),
                Err(_) => {
                    let n = u32::MAX;
                    let us = (u128::from(fill_interval_us) * u128::from(tokens_per_fill))
                        .div_ceil(u128::from(n));
                    (n, u64::try_from(us).unwrap_or(u64::MAX))
                }
            };
            Strategy::TokenBucket(TokenBucket {
                max_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
                tokens_per_fill: Some(envoy_types::pb::google::protobuf::UInt32Value {
                    value: per_fill,
                }),
                fill_interval: Some(duration(interval_us)),
            })
        }
    };
    assign(id.clone(), strategy, a.ttl_us)
}

/// What a blanket rule sends for bucket `id` to an Envoy whose report covered
/// `elapsed_us` (0 if unknown); `None` for a budget's rule.
fn blanket_action(id: &BucketId, rule: &QuotaRule, elapsed_us: u64) -> Option<BucketAction> {
    let QuotaStrategy::Blanket(blanket) = rule.strategy else {
        return None;
    };
    Some(blanket_answer(
        id,
        blanket,
        rule.settings.ttl_us,
        elapsed_us,
    ))
}

/// `blanket` for bucket `id`, for `ttl_us` or twice the Envoy's reporting interval
/// (`elapsed_us`, in whole seconds) if that is longer (at most an hour): only its
/// reports renew it, so it must outlast the time between two.
fn blanket_answer(id: &BucketId, blanket: Blanket, ttl_us: u64, elapsed_us: u64) -> BucketAction {
    let rule = match blanket {
        Blanket::AllowAll => BlanketRule::AllowAll,
        Blanket::DenyAll => BlanketRule::DenyAll,
    };
    let twice = elapsed_us.div_ceil(1_000_000).saturating_mul(2_000_000);
    let ttl_us = ttl_us.max(twice.min(descriptors::MAX_ASSIGNMENT_TTL_US));
    assign(id.clone(), Strategy::BlanketRule(rule as i32), ttl_us)
}

fn assign(id: BucketId, strategy: Strategy, ttl_us: u64) -> BucketAction {
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
            QuotaAssignmentAction {
                assignment_time_to_live: Some(duration(ttl_us)),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            },
        )),
    }
}

fn duration(us: u64) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(us / 1_000_000).unwrap_or(i64::MAX),
        nanos: ((us % 1_000_000) * 1000) as i32,
    }
}
