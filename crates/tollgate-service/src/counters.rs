//! [`Counters`]: where the limits of the rules keep their counts, in this process or
//! in Redis. Chosen once, before the rules load, so each limit holds exactly one
//! limiter, made with the limit.

use std::sync::Arc;

use tollgate::keyed::KeyedOptions;
use tollgate::redis::RedisStore;
use tollgate::{AnyLimiter, KeyedLimiter, RuleSet};

use tollgate::quota::QuotaLedger;

use tollgate_runtime::config::store::StoreConfig;

/// The store every limit of the rules counts in.
#[derive(Clone)]
pub enum Counters {
    /// In this process, each limit's keys bounded by the options.
    Memory(KeyedOptions),
    /// In Redis (standalone or Cluster, leased where the store config says).
    Redis(Arc<RedisCounters>),
}

impl Default for Counters {
    fn default() -> Self {
        Counters::Memory(KeyedOptions::default())
    }
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Counters::Memory(_) => "Counters::Memory",
            Counters::Redis(_) => "Counters::Redis",
        })
    }
}

/// Counters kept in Redis.
pub struct RedisCounters {
    store: RedisStore,
    config: StoreConfig,
    /// The Redis of the per-second limits, when `store.per_second` names one.
    per_second: Option<(RedisStore, StoreConfig)>,
}

impl Counters {
    /// Counts in Redis as `config` says (connects now; a single node may still be
    /// down, a Cluster must answer).
    pub async fn redis(config: &StoreConfig) -> anyhow::Result<Counters> {
        let per_second = match config.per_second_config() {
            Some(c) => Some((
                c.connect()
                    .await
                    .map_err(|e| e.context("store.per_second"))?,
                c,
            )),
            None => None,
        };
        Ok(Counters::Redis(Arc::new(RedisCounters {
            store: config.connect().await?,
            config: config.clone(),
            per_second,
        })))
    }

    /// The limiter of the limit at `path` (which names its Redis keys): a rule set
    /// the store cannot keep is refused here, when the rules load.
    pub fn limiter(&self, path: &str, rules: RuleSet) -> Result<AnyLimiter, String> {
        match self {
            Counters::Memory(options) => Ok(AnyLimiter::Memory(KeyedLimiter::with_options(
                rules,
                *options,
                tollgate::clock::MonotonicClock::new(),
            ))),
            Counters::Redis(redis) => {
                // Braces in the name would move the Cluster hash tag.
                let name = path.replace(['{', '}'], "_");
                let (store, config) = match &redis.per_second {
                    Some((store, config)) if StoreConfig::is_per_second(&rules) => (store, config),
                    _ => (&redis.store, &redis.config),
                };
                let window_counters = config.window_counters.unwrap_or(true);
                config
                    .limiter(store, &name, rules, window_counters)
                    .map_err(|e| format!("with store redis (limit {path}): {e}"))
            }
        }
    }

    /// Where the quota buckets (RLQS) are kept: with the counts (with Redis, shared
    /// by every server on it).
    pub fn quota_ledger(&self) -> QuotaLedger {
        match self {
            Counters::Memory(_) => QuotaLedger::memory(),
            Counters::Redis(redis) => QuotaLedger::redis(redis.store.clone()),
        }
    }

    /// Where the counts live: `memory` or `redis` (a trace attribute).
    pub fn store_name(&self) -> &'static str {
        match self {
            Counters::Memory(_) => "memory",
            Counters::Redis(_) => "redis",
        }
    }

    /// The store's configuration, when the counts live in Redis.
    pub fn store_config(&self) -> Option<&StoreConfig> {
        match self {
            Counters::Memory(_) => None,
            Counters::Redis(r) => Some(&r.config),
        }
    }

    /// The Redis store, when the counts live there.
    pub fn store(&self) -> Option<&RedisStore> {
        match self {
            Counters::Memory(_) => None,
            Counters::Redis(r) => Some(&r.store),
        }
    }

    /// Whether a Redis connection skips certificate checks (an `insecure_*` switch).
    pub fn tls_insecure(&self) -> bool {
        let insecure = |s: &RedisStore| s.options().tls.as_ref().is_some_and(|t| t.insecure());
        self.store().is_some_and(insecure) || self.per_second_store().is_some_and(insecure)
    }

    /// The Redis of the per-second limits, when there is one.
    pub fn per_second_store(&self) -> Option<&RedisStore> {
        match self {
            Counters::Memory(_) => None,
            Counters::Redis(r) => r.per_second.as_ref().map(|(s, _)| s),
        }
    }
}
