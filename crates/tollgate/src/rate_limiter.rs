//! [`RateLimiter`]: one per-key limiter interface over every store, so that code
//! written against it (a server, a middleware, a tool) runs unchanged on the memory
//! store, on Redis, or on whatever store is chosen at run time ([`AnyLimiter`]).
//!
//! Every store decides with the same core code and returns the same
//! [`RuleDecision`]; the stores differ only in where the state lives and in how they
//! can fail ([`Error::is_transient`]).

use std::borrow::Borrow;
use std::future::Future;
use std::hash::Hash;

use tollgate_core::{Clock, Decision, Op, RuleDecision, RuleSet};

use crate::{Error, KeyedLimiter};

/// Per-key rate limits over some store: the one interface the memory store
/// ([`KeyedLimiter`]), the Redis store (`redis::RedisLimiter`, feature `redis`) and
/// [`AnyLimiter`] implement.
///
/// Keys are `K`, `str` unless said otherwise: the Redis stores and [`AnyLimiter`] take
/// `str` and `String` keys, the memory store any key type it holds (an
/// `IpAddr`, a `u64`) and what it borrows as. Each method decides with the store's
/// time (the memory store's clock, Redis `TIME`); a [`RuleDecision`] reports the
/// overall decision and each policy's.
///
/// The memory store's [`KeyedLimiter`] has the same methods, with the same names and
/// arguments, as plain functions: its answers are immediate, so it needs no `.await`
/// (called on a `KeyedLimiter`, `check` is the plain one; in code generic over
/// `RateLimiter`, the trait's).
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
pub trait RateLimiter<K: ?Sized + Sync = str>: Send + Sync {
    /// Decides a request of `cost` for `key`: a try (`Op::Try`), an acquire that
    /// reserves the earliest admission and reports it as `wait` without waiting for
    /// it (`Op::Acquire`; see [`RateLimiter::acquire`] to wait), a charge of work
    /// already done (`Op::Charge`, see [`RateLimiter::charge`]), or Envoy's counting
    /// (`Op::Count`: charged whatever the answer, answered as a try).
    fn check_rules(
        &self,
        key: &K,
        cost: u64,
        op: Op,
    ) -> impl Future<Output = Result<RuleDecision, Error>> + Send;

    /// Tries `cost` for `key` now: the overall decision. Refused with
    /// [`Error::Paces`] for rules that pace (a `shaper`, a delaying `limit-req`), whose
    /// admitted tries carry a wait to sleep: [`RateLimiter::acquire`] sleeps it.
    fn check(&self, key: &K, cost: u64) -> impl Future<Output = Result<Decision, Error>> + Send {
        async move {
            Error::refuse_pacing(&self.rules())?;
            Ok(self.check_rules(key, cost, Op::Try).await?.decision)
        }
    }

    /// Charges `cost` units of work already done to `key` (tokens of a completion,
    /// bytes, rows): no limit test, so the key may go into debt up to each policy's
    /// `max-debt`; always admitted, `remaining` 0 while in debt, `retry_after` when a
    /// unit request fits again. The leased Redis store ends the key's slice and
    /// charges Redis directly (a slice cannot take a debt).
    fn charge(
        &self,
        key: &K,
        cost: u64,
    ) -> impl Future<Output = Result<RuleDecision, Error>> + Send {
        self.check_rules(key, cost, Op::Charge)
    }

    /// Settles a request that took `reserved` units at admission (its try's cost:
    /// the bound it declared) once it is known to have used `used`: charges what it
    /// used beyond the reservation (into debt if need be, up to each policy's
    /// `max-debt`), gives back what it did not use. The decision is the charge's, or
    /// the key as it then stands. Reserving the bound at admission is what keeps
    /// requests of one key in flight at once from spending, together, more than the
    /// budget plus what they declared: a try of 1 and a charge afterwards lets any
    /// number of them through before the first is charged. When the refund is made
    /// and the look after it fails, the error is returned with the refund applied:
    /// do not settle again.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// use tollgate::{AnyLimiter, RateLimiter, RuleSet};
    ///
    /// // 1,000 tokens a day per key (nothing refills while the example runs).
    /// let tokens = AnyLimiter::memory(RuleSet::parse(&["token-bucket:rate=1000/d,capacity=1000"])?);
    /// let (max_tokens, prompt) = (300u64, 120u64); // what the request declares
    /// let reserved = max_tokens.saturating_add(prompt);
    /// let d = tokens.check("api-key-1", reserved).await?;
    /// assert!(d.allowed); // else: 429, Retry-After from d.retry_after()
    /// // ... run the completion; it used 250 tokens in all ...
    /// let after = tokens.settle("api-key-1", reserved, 250).await?;
    /// assert_eq!(after.decision.remaining, 750); // 170 given back
    /// // A usage of 0 gives the whole reservation back, never wraps.
    /// let d = tokens.check("api-key-2", reserved).await?;
    /// assert_eq!(tokens.settle("api-key-2", reserved, 0).await?.decision.remaining, 1000);
    /// # let _ = d;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn settle(
        &self,
        key: &K,
        reserved: u64,
        used: u64,
    ) -> impl Future<Output = Result<RuleDecision, Error>> + Send {
        async move {
            if used > reserved {
                return self.charge(key, used - reserved).await;
            }
            if used < reserved {
                self.refund(key, reserved - used).await?;
            }
            self.peek(key, 0).await
        }
    }

    /// The decision a try of `cost` would get now, changing nothing (cost 0: the
    /// states as they stand).
    fn peek(&self, key: &K, cost: u64) -> impl Future<Output = Result<RuleDecision, Error>> + Send;

    /// Gives back `cost` units admitted earlier to every policy of `key` (e.g. the
    /// work they paid for failed); never beyond a fully replenished state.
    fn refund(&self, key: &K, cost: u64) -> impl Future<Output = Result<(), Error>> + Send;

    /// Forgets `key`'s state: its next request is a new key's.
    fn reset(&self, key: &K) -> impl Future<Output = Result<(), Error>> + Send;

    /// Waits until `cost` units for `key` are admitted (FIFO per key), or rejects at
    /// once when the wait would exceed a policy's `max-wait`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it waits gives the reservation back.
    fn acquire(&self, key: &K, cost: u64) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// The rule set in force.
    fn rules(&self) -> RuleSet;

    /// Replaces the rule set for every key; states carry over where they keep their
    /// meaning. A store that cannot keep the new rules refuses them and keeps the old.
    fn set_rules(&self, rules: RuleSet) -> Result<(), Error>;
}

/// The memory store, for any key it holds or borrows as: decisions are immediate
/// (the futures are ready at once; an acquire's sleep is the only wait).
impl<K, Q, C> RateLimiter<Q> for KeyedLimiter<K, C>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized + Sync,
    C: Clock + Send + Sync + 'static,
{
    async fn check_rules(&self, key: &Q, cost: u64, op: Op) -> Result<RuleDecision, Error> {
        KeyedLimiter::check_rules(self, key, cost, op)
    }

    async fn check(&self, key: &Q, cost: u64) -> Result<Decision, Error> {
        KeyedLimiter::check(self, key, cost)
    }

    async fn peek(&self, key: &Q, cost: u64) -> Result<RuleDecision, Error> {
        KeyedLimiter::peek(self, key, cost)
    }

    async fn refund(&self, key: &Q, cost: u64) -> Result<(), Error> {
        KeyedLimiter::refund(self, key, cost);
        Ok(())
    }

    async fn reset(&self, key: &Q) -> Result<(), Error> {
        KeyedLimiter::reset(self, key);
        Ok(())
    }

    async fn acquire(&self, key: &Q, cost: u64) -> Result<Decision, Error> {
        KeyedLimiter::acquire(self, key, cost).await
    }

    fn rules(&self) -> RuleSet {
        KeyedLimiter::rules(self)
    }

    fn set_rules(&self, rules: RuleSet) -> Result<(), Error> {
        KeyedLimiter::set_rules(self, rules);
        Ok(())
    }
}

/// `String` keys for a store whose keys are `str` (the tower layer's key closures
/// return owned keys): each method is the `str` one.
macro_rules! string_keys {
    ($store:ty) => {
        impl $crate::RateLimiter<String> for $store {
            fn check_rules(
                &self,
                key: &String,
                cost: u64,
                op: tollgate_core::Op,
            ) -> impl std::future::Future<
                Output = Result<tollgate_core::RuleDecision, $crate::Error>,
            > + Send {
                $crate::RateLimiter::<str>::check_rules(self, key, cost, op)
            }

            fn check(
                &self,
                key: &String,
                cost: u64,
            ) -> impl std::future::Future<Output = Result<tollgate_core::Decision, $crate::Error>>
                   + Send {
                $crate::RateLimiter::<str>::check(self, key, cost)
            }

            fn peek(
                &self,
                key: &String,
                cost: u64,
            ) -> impl std::future::Future<
                Output = Result<tollgate_core::RuleDecision, $crate::Error>,
            > + Send {
                $crate::RateLimiter::<str>::peek(self, key, cost)
            }

            fn refund(
                &self,
                key: &String,
                cost: u64,
            ) -> impl std::future::Future<Output = Result<(), $crate::Error>> + Send {
                $crate::RateLimiter::<str>::refund(self, key, cost)
            }

            fn reset(
                &self,
                key: &String,
            ) -> impl std::future::Future<Output = Result<(), $crate::Error>> + Send {
                $crate::RateLimiter::<str>::reset(self, key)
            }

            fn acquire(
                &self,
                key: &String,
                cost: u64,
            ) -> impl std::future::Future<Output = Result<tollgate_core::Decision, $crate::Error>>
                   + Send {
                $crate::RateLimiter::<str>::acquire(self, key, cost)
            }

            fn rules(&self) -> tollgate_core::RuleSet {
                $crate::RateLimiter::<str>::rules(self)
            }

            fn set_rules(&self, rules: tollgate_core::RuleSet) -> Result<(), $crate::Error> {
                $crate::RateLimiter::<str>::set_rules(self, rules)
            }
        }
    };
}
#[cfg(feature = "redis")]
pub(crate) use string_keys;

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

/// Awaits `$call` on the inner limiter bound to `$l`. A Redis store's futures are boxed:
/// they are kilobytes (a connection's calls, timeouts, a lease), and unboxed they
/// would make every caller's future as large, copied on each check of the memory
/// store too; one allocation is nothing beside a Redis round trip.
macro_rules! each_store_await {
    ($self:expr, $l:ident => $call:expr) => {
        match $self {
            AnyLimiter::Memory($l) => $call.await,
            #[cfg(feature = "redis")]
            AnyLimiter::Redis($l) => Box::pin($call).await,
            #[cfg(feature = "redis")]
            AnyLimiter::Leased($l) => Box::pin($call).await,
        }
    };
}

impl AnyLimiter {
    /// A memory-store limiter of `rules` (default [`KeyedOptions`](crate::keyed::KeyedOptions)).
    pub fn memory(rules: impl Into<RuleSet>) -> AnyLimiter {
        AnyLimiter::Memory(KeyedLimiter::new(rules))
    }

    /// A Redis-store limiter of `rules` named `name` on `store` (see
    /// `redis::RedisLimiter::new`), with the default options: a Redis that does not
    /// answer is an error (see [`AnyLimiter::redis_with`] for a failure policy).
    #[cfg(feature = "redis")]
    pub fn redis(
        store: crate::redis::RedisStore,
        name: &str,
        rules: impl Into<RuleSet>,
    ) -> Result<AnyLimiter, Error> {
        Ok(AnyLimiter::Redis(crate::redis::RedisLimiter::new(
            store, name, rules,
        )?))
    }

    /// [`AnyLimiter::redis`] with options: the failure policy (what is decided while
    /// Redis does not answer), its probe interval and the negative cache.
    #[cfg(feature = "redis")]
    pub fn redis_with(
        store: crate::redis::RedisStore,
        name: &str,
        rules: impl Into<RuleSet>,
        options: crate::redis::RedisLimiterOptions,
    ) -> Result<AnyLimiter, Error> {
        let limiter = crate::redis::RedisLimiter::with_options(store, name, rules, options)?;
        Ok(AnyLimiter::Redis(limiter))
    }

    /// The rule set in force.
    pub fn rules(&self) -> RuleSet {
        each_store!(self, l => l.rules())
    }

    /// Replaces the rule set (see [`RateLimiter::set_rules`]).
    pub fn set_rules(&self, rules: RuleSet) -> Result<(), Error> {
        each_store!(self, l => RateLimiter::<str>::set_rules(l, rules))
    }
}

impl RateLimiter for AnyLimiter {
    async fn check_rules(&self, key: &str, cost: u64, op: Op) -> Result<RuleDecision, Error> {
        each_store_await!(self, l => RateLimiter::<str>::check_rules(l, key, cost, op))
    }

    async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        each_store_await!(self, l => RateLimiter::<str>::check(l, key, cost))
    }

    async fn peek(&self, key: &str, cost: u64) -> Result<RuleDecision, Error> {
        each_store_await!(self, l => RateLimiter::<str>::peek(l, key, cost))
    }

    async fn refund(&self, key: &str, cost: u64) -> Result<(), Error> {
        each_store_await!(self, l => RateLimiter::<str>::refund(l, key, cost))
    }

    async fn reset(&self, key: &str) -> Result<(), Error> {
        each_store_await!(self, l => RateLimiter::<str>::reset(l, key))
    }

    async fn acquire(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        each_store_await!(self, l => RateLimiter::<str>::acquire(l, key, cost))
    }

    fn rules(&self) -> RuleSet {
        AnyLimiter::rules(self)
    }

    fn set_rules(&self, rules: RuleSet) -> Result<(), Error> {
        AnyLimiter::set_rules(self, rules)
    }
}

string_keys!(AnyLimiter);
