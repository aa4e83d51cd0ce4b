//! [`RateLimiter`]: one per-key limiter interface over every store, so that code
//! written against it (a server, a middleware, a tool) runs unchanged on the memory
//! store, on Redis, or on whatever store is chosen at run time ([`AnyLimiter`]).
//!
//! Every store decides with the same core code and returns the same
//! [`RuleDecision`]; the stores differ only in where the state lives and in how they
//! can fail ([`LimitError::is_transient`]).

use std::future::Future;

use tollgate_core::{CheckError, Decision, Op, RuleDecision, RuleSet};

use crate::{KeyedError, KeyedLimiter};

/// Why a [`RateLimiter`] could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// The request itself is invalid: a cost of 0, or more than a policy can ever
    /// admit. Waiting does not help.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// The memory store is full and refuses new keys
    /// ([`OnFull::RefuseNew`](crate::OnFull::RefuseNew)).
    #[error("too many keys: the limiter holds its maximum of {max} keys and refuses new ones")]
    TooManyKeys {
        /// The configured maximum.
        max: usize,
    },
    /// The store cannot keep this policy or cost (e.g. a cost beyond the exact
    /// integer range of the Redis scripts).
    #[error("not supported by this store: {0}")]
    Unsupported(String),
    /// The store is unreachable, slow or failing. Transient: the caller (or the
    /// store's failure policy) decides whether to admit or reject meanwhile.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store's configuration is invalid (a bad URL, prefix or limiter name).
    #[error("store configuration: {0}")]
    Config(String),
    /// The store answered something it never sends.
    #[error("store error: {0}")]
    Store(String),
}

impl LimitError {
    /// Whether the failure is the store's and may pass (unreachable, slow): the kind
    /// a fail-open or fail-closed policy applies to. An invalid request or
    /// configuration is not transient.
    pub fn is_transient(&self) -> bool {
        matches!(self, LimitError::Unavailable(_))
    }
}

impl From<KeyedError> for LimitError {
    fn from(e: KeyedError) -> Self {
        match e {
            KeyedError::Check(c) => LimitError::Check(c),
            KeyedError::TooManyKeys { max } => LimitError::TooManyKeys { max },
        }
    }
}

/// Per-key rate limits over some store: the one interface the memory store
/// ([`KeyedLimiter`]), the Redis store (`redis::RedisLimiter`, feature `redis`) and
/// [`AnyLimiter`] implement.
///
/// Keys are strings. Each method decides with the store's time (the memory store's
/// clock, Redis `TIME`); a [`RuleDecision`] reports the overall decision and each
/// policy's.
///
/// ```
/// use tollgate::{AnyLimiter, RateLimiter, RuleSet};
///
/// // Code that limits does not care where the counts live.
/// async fn login_allowed(limiter: &impl RateLimiter, user: &str) -> bool {
///     // A store failure admits here (fail open); `is_transient` tells it apart.
///     match limiter.check(user, 1).await {
///         Ok(d) => d.allowed,
///         Err(e) => e.is_transient(),
///     }
/// }
///
/// # tokio_test_block_on(async {
/// let rules = RuleSet::parse(&["gcra:rate=5/m,burst=2"])?;
/// // The memory store; `AnyLimiter::redis(...)` keeps the same limits in Redis.
/// let limiter = AnyLimiter::memory(rules);
/// assert!(login_allowed(&limiter, "ada").await);
/// assert!(login_allowed(&limiter, "ada").await);
/// assert!(!login_allowed(&limiter, "ada").await);
/// assert!(login_allowed(&limiter, "bob").await);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
pub trait RateLimiter: Send + Sync {
    /// Decides a request of `cost` for `key`: a try (`Op::Try`), an acquire that
    /// reserves the earliest admission and reports it as `wait` without waiting for
    /// it (`Op::Acquire`; see [`RateLimiter::acquire`] to wait), a charge of work
    /// already done (`Op::Charge`, see [`RateLimiter::charge`]), or Envoy's counting
    /// (`Op::Count`: charged whatever the answer, answered as a try).
    fn check_rules(
        &self,
        key: &str,
        cost: u64,
        op: Op,
    ) -> impl Future<Output = Result<RuleDecision, LimitError>> + Send;

    /// Tries `cost` for `key` now: the overall decision.
    fn check(
        &self,
        key: &str,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, LimitError>> + Send {
        async move { Ok(self.check_rules(key, cost, Op::Try).await?.decision) }
    }

    /// Charges `cost` units of work already done to `key` (tokens of a completion,
    /// bytes, rows): no limit test, so the key may go into debt up to each policy's
    /// `max-debt`; always admitted, `remaining` 0 while in debt, `retry_after` when a
    /// unit request fits again. The leased Redis store ends the key's slice and
    /// charges Redis directly (a slice cannot take a debt).
    fn charge(
        &self,
        key: &str,
        cost: u64,
    ) -> impl Future<Output = Result<RuleDecision, LimitError>> + Send {
        self.check_rules(key, cost, Op::Charge)
    }

    /// The decision a try of `cost` would get now, changing nothing.
    fn peek(
        &self,
        key: &str,
        cost: u64,
    ) -> impl Future<Output = Result<RuleDecision, LimitError>> + Send;

    /// Gives back `cost` units admitted earlier to every policy of `key` (e.g. the
    /// work they paid for failed); never beyond a fully replenished state.
    fn refund(&self, key: &str, cost: u64) -> impl Future<Output = Result<(), LimitError>> + Send;

    /// Forgets `key`'s state: its next request is a new key's.
    fn reset(&self, key: &str) -> impl Future<Output = Result<(), LimitError>> + Send;

    /// Waits until `cost` units for `key` are admitted (FIFO per key), or rejects at
    /// once when the wait would exceed a policy's `max-wait`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it waits gives the reservation back.
    fn acquire(
        &self,
        key: &str,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, LimitError>> + Send;

    /// The rule set in force.
    fn rules(&self) -> RuleSet;

    /// Replaces the rule set for every key; states carry over where they keep their
    /// meaning. A store that cannot keep the new rules refuses them and keeps the old.
    fn set_rules(&self, rules: RuleSet) -> Result<(), LimitError>;
}

/// The memory store: decisions are immediate (the futures are ready at once).
impl<C: crate::Clock + Send + Sync + 'static> RateLimiter for KeyedLimiter<String, C> {
    async fn check_rules(&self, key: &str, cost: u64, op: Op) -> Result<RuleDecision, LimitError> {
        Ok(KeyedLimiter::check_rules(self, key, cost, op)?)
    }

    async fn check(&self, key: &str, cost: u64) -> Result<Decision, LimitError> {
        Ok(self.check_n(key, cost)?)
    }

    async fn peek(&self, key: &str, cost: u64) -> Result<RuleDecision, LimitError> {
        Ok(self.peek_rules(key, cost)?)
    }

    async fn refund(&self, key: &str, cost: u64) -> Result<(), LimitError> {
        KeyedLimiter::refund(self, key, cost);
        Ok(())
    }

    async fn reset(&self, key: &str) -> Result<(), LimitError> {
        KeyedLimiter::reset(self, key);
        Ok(())
    }

    async fn acquire(&self, key: &str, cost: u64) -> Result<Decision, LimitError> {
        Ok(KeyedLimiter::acquire(self, key, cost).await?)
    }

    fn rules(&self) -> RuleSet {
        KeyedLimiter::rules(self)
    }

    fn set_rules(&self, rules: RuleSet) -> Result<(), LimitError> {
        KeyedLimiter::set_rules(self, rules);
        Ok(())
    }
}

/// A [`RateLimiter`] whose store is chosen at run time (from configuration): the
/// memory store or Redis. Cheap to clone (the stores are shared).
#[derive(Debug, Clone)]
pub enum AnyLimiter {
    /// Counts kept in this process.
    Memory(KeyedLimiter<String>),
    /// Counts kept in Redis, shared by every instance using the same Redis and name.
    #[cfg(feature = "redis")]
    Redis(crate::redis::RedisLimiter),
    /// Counts kept in Redis, hot keys decided locally from leased slices.
    #[cfg(feature = "redis")]
    Leased(crate::redis::LeasedLimiter),
}

impl AnyLimiter {
    /// A memory-store limiter of `rules` (default [`KeyedOptions`](crate::KeyedOptions)).
    pub fn memory(rules: impl Into<RuleSet>) -> AnyLimiter {
        AnyLimiter::Memory(KeyedLimiter::new(rules))
    }

    /// A Redis-store limiter of `rules` named `name` on `store` (see
    /// `redis::RedisLimiter::new`).
    #[cfg(feature = "redis")]
    pub fn redis(
        store: crate::redis::RedisStore,
        name: &str,
        rules: impl Into<RuleSet>,
    ) -> Result<AnyLimiter, LimitError> {
        Ok(AnyLimiter::Redis(crate::redis::RedisLimiter::new(
            store, name, rules,
        )?))
    }
}

/// Runs `$body` with `$l` bound to the inner limiter, whichever store it is.
macro_rules! each_store {
    ($self:expr, $l:ident => $body:expr) => {
        match $self {
            AnyLimiter::Memory($l) => $body,
            #[cfg(feature = "redis")]
            AnyLimiter::Redis($l) => $body,
            #[cfg(feature = "redis")]
            AnyLimiter::Leased($l) => $body,
        }
    };
}

impl RateLimiter for AnyLimiter {
    async fn check_rules(&self, key: &str, cost: u64, op: Op) -> Result<RuleDecision, LimitError> {
        each_store!(self, l => RateLimiter::check_rules(l, key, cost, op).await)
    }

    async fn check(&self, key: &str, cost: u64) -> Result<Decision, LimitError> {
        each_store!(self, l => RateLimiter::check(l, key, cost).await)
    }

    async fn peek(&self, key: &str, cost: u64) -> Result<RuleDecision, LimitError> {
        each_store!(self, l => RateLimiter::peek(l, key, cost).await)
    }

    async fn refund(&self, key: &str, cost: u64) -> Result<(), LimitError> {
        each_store!(self, l => RateLimiter::refund(l, key, cost).await)
    }

    async fn reset(&self, key: &str) -> Result<(), LimitError> {
        each_store!(self, l => RateLimiter::reset(l, key).await)
    }

    async fn acquire(&self, key: &str, cost: u64) -> Result<Decision, LimitError> {
        each_store!(self, l => RateLimiter::acquire(l, key, cost).await)
    }

    fn rules(&self) -> RuleSet {
        each_store!(self, l => RateLimiter::rules(l))
    }

    fn set_rules(&self, rules: RuleSet) -> Result<(), LimitError> {
        each_store!(self, l => RateLimiter::set_rules(l, rules))
    }
}
