//! Envoy's rate limit quota service (RLQS, `envoy.service.rate_limit_quota.v3`): the
//! quota buckets the Envoys of a fleet report on, each dividing the budget of its
//! `quota_buckets` rule among them by demand ([`tollgate::policy::quota`]), and the
//! conversions between the protocol's messages and the division's.
//!
//! A stream is one Envoy (a client of every bucket it reports on). Its reports go to
//! their buckets; what a bucket decides goes to whichever of its clients it concerns,
//! on that client's stream. Renewals and freed shares are sent by [`QuotaBuckets::tick`]
//! (every [`TICK`]). A bucket no rule takes is answered `ALLOW_ALL` (as Envoy's
//! ratelimit service answers a descriptor no rule matches), renewed while reported.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tollgate::clock::{Clock, MonotonicClock};
use tollgate::policy::quota::{Assignment, ClientId, QuotaBucket, Share};
use tonic::Status;

use crate::service::descriptors::{DescriptorRules, QuotaRule};

/// How often renewals are sent and freed shares divided again.
pub const TICK: Duration = Duration::from_millis(50);

/// The most buckets one stream may report on (a stream past it is ended with
/// `RESOURCE_EXHAUSTED`).
pub const MAX_BUCKETS_PER_STREAM: usize = 10_000;

/// The most buckets kept in all (a report that would add one more ends its stream
/// with `RESOURCE_EXHAUSTED`).
pub const MAX_BUCKETS: usize = 100_000;

/// The most answers waiting for a stream's client to read them; past it the client
/// is not reading, and its stream ends with `RESOURCE_EXHAUSTED`.
pub const MAX_QUEUED: usize = 256;

/// The time to live of the `ALLOW_ALL` sent for a bucket no rule takes.
const UNRULED_TTL: Duration = Duration::from_secs(60);

/// A bucket, named by its domain and bucket id (keys in order).
type BucketKey = (String, BTreeMap<String, String>);

/// Every quota bucket reported on, and the streams reporting.
pub struct QuotaBuckets {
    state: Mutex<State>,
    next_client: AtomicU64,
    clock: MonotonicClock,
}

#[derive(Default)]
struct State {
    buckets: HashMap<BucketKey, Bucket>,
    streams: HashMap<ClientId, Stream>,
}

/// One bucket: its rule, its id as Envoy sent it, and its division.
struct Bucket {
    rule: Arc<QuotaRule>,
    id: BucketId,
    quota: QuotaBucket,
}

/// One stream: where its answers go (`None` once its client stopped reading them),
/// its domain, and the buckets it reported on.
struct Stream {
    outbox: Option<mpsc::Sender<RateLimitQuotaResponse>>,
    domain: Option<String>,
    buckets: HashSet<BucketKey>,
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
    /// Its rule's policy.
    pub policy: String,
    /// Envoys reporting on it or holding a share.
    pub clients: u64,
    /// Its demand, assigned and reserved rates, per second, named as reported.
    pub rates: [(&'static str, f64); 3],
}

impl Default for QuotaBuckets {
    fn default() -> Self {
        QuotaBuckets {
            state: Mutex::new(State::default()),
            next_client: AtomicU64::new(1),
            clock: MonotonicClock::new(),
        }
    }
}

impl QuotaBuckets {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new stream: its client id and the receiver of what it is sent.
    pub fn open(&self) -> (ClientId, mpsc::Receiver<RateLimitQuotaResponse>) {
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        let (outbox, inbox) = mpsc::channel(MAX_QUEUED);
        let stream = Stream {
            outbox: Some(outbox),
            domain: None,
            buckets: HashSet::new(),
        };
        self.state().streams.insert(id, stream);
        (id, inbox)
    }

    /// One message of stream `client`: its usage reports, each to its bucket (found
    /// under `rules`). `Err` ends the stream with that status.
    pub fn report(
        &self,
        client: ClientId,
        reports: RateLimitQuotaUsageReports,
        rules: &DescriptorRules,
    ) -> Result<(), Status> {
        let mut state = self.state();
        // Read under the lock: time spent waiting for it must not eat the grace.
        let now = self.clock.now_us();
        let State { buckets, streams } = &mut *state;
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
        // The whole message is checked before any of it is applied: a bad usage must
        // not leave the good ones before it decided but unsent.
        let usages = usages(reports, &domain)?;
        let new = usages
            .iter()
            .filter(|u| !stream.buckets.contains(&u.key))
            .count();
        if stream.buckets.len() + new > MAX_BUCKETS_PER_STREAM {
            return Err(Status::resource_exhausted(format!(
                "a stream may report on at most {MAX_BUCKETS_PER_STREAM} buckets"
            )));
        }
        if buckets.len() + new > MAX_BUCKETS {
            return Err(Status::resource_exhausted(format!(
                "the server keeps at most {MAX_BUCKETS} buckets"
            )));
        }
        stream.domain = Some(domain.clone());
        let mut sends: Vec<(ClientId, BucketAction)> = Vec::new();
        for u in usages {
            let Some(rule) = rules.quota_rule(&domain, &u.key.1) else {
                // No rule takes it: not limited here.
                sends.push((client, allow_all(u.id)));
                continue;
            };
            stream.buckets.insert(u.key.clone());
            let bucket = buckets.entry(u.key).or_insert_with(|| Bucket {
                rule: rule.clone(),
                id: u.id,
                quota: QuotaBucket::new(rule.budget, rule.settings, now),
            });
            let out = bucket
                .quota
                .report(client, u.allowed, u.denied, u.elapsed_us, now);
            sends.extend(out.into_iter().map(|a| (a.client, action(&bucket.id, &a))));
        }
        deliver(streams, sends);
        Ok(())
    }

    /// Stream `client` ended: its shares free when they end, and the others of its
    /// buckets are divided again.
    pub fn close(&self, client: ClientId) {
        let mut state = self.state();
        let now = self.clock.now_us();
        let State { buckets, streams } = &mut *state;
        let Some(stream) = streams.remove(&client) else {
            return;
        };
        let mut sends = Vec::new();
        for key in stream.buckets {
            if let Some(b) = buckets.get_mut(&key) {
                let out = b.quota.leave(client, now);
                sends.extend(out.into_iter().map(|a| (a.client, action(&b.id, &a))));
            }
        }
        deliver(streams, sends);
    }

    /// Sends what is due (renewals, freed shares) and forgets buckets nobody holds.
    pub fn tick(&self) {
        let mut state = self.state();
        let now = self.clock.now_us();
        let State { buckets, streams } = &mut *state;
        let mut sends = Vec::new();
        buckets.retain(|_, b| {
            if b.quota.next_event().is_some_and(|e| e <= now) {
                let out = b.quota.tick(now);
                sends.extend(out.into_iter().map(|a| (a.client, action(&b.id, &a))));
            }
            !b.quota.is_idle(now)
        });
        deliver(streams, sends);
    }

    /// Every bucket's standing.
    pub fn views(&self) -> Vec<BucketView> {
        let now = self.clock.now_us();
        let state = self.state();
        let mut views: Vec<BucketView> = (state.buckets.iter())
            .map(|((domain, id), b)| {
                let stats = b.quota.stats(now);
                let period = b.quota.budget().rate.period_us as f64;
                let per_second = |n: u64| n as f64 * 1e6 / period;
                BucketView {
                    domain: domain.clone(),
                    bucket: id
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(","),
                    rule: b.rule.name.clone(),
                    policy: b.rule.policy.to_string(),
                    clients: stats.clients,
                    rates: [
                        ("demand_per_second", per_second(stats.demand)),
                        ("assigned_per_second", per_second(stats.assigned)),
                        ("reserved_per_second", per_second(stats.reserved)),
                    ],
                }
            })
            .collect();
        views.sort_by(|a, b| (&a.domain, &a.bucket).cmp(&(&b.domain, &b.bucket)));
        views
    }

    /// How many streams are open.
    pub fn streams(&self) -> usize {
        self.state().streams.len()
    }
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
struct Usage {
    key: BucketKey,
    id: BucketId,
    allowed: u64,
    denied: u64,
    elapsed_us: u64,
}

/// The usage reports of a message, each checked as the protocol requires: at least
/// one; a bucket id of non-empty keys and values; a positive `time_elapsed`.
fn usages(reports: RateLimitQuotaUsageReports, domain: &str) -> Result<Vec<Usage>, Status> {
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
            let elapsed_us = match u.time_elapsed {
                Some(d) if d.seconds >= 0 && (0..1_000_000_000).contains(&d.nanos) => (d.seconds
                    as u64)
                    .saturating_mul(1_000_000)
                    .saturating_add(d.nanos as u64 / 1000),
                _ => 0,
            };
            if elapsed_us == 0 {
                return Err(Status::invalid_argument(
                    "a usage report needs a positive time_elapsed",
                ));
            }
            let key = (
                domain.to_string(),
                id.bucket
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            );
            Ok(Usage {
                key,
                id,
                allowed: u.num_requests_allowed,
                denied: u.num_requests_denied,
                elapsed_us,
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

/// `ALLOW_ALL` for a bucket no rule takes.
fn allow_all(id: BucketId) -> BucketAction {
    let strategy = Strategy::BlanketRule(BlanketRule::AllowAll as i32);
    assign(id, strategy, UNRULED_TTL.as_micros() as u64)
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
