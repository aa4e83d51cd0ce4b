//! The options of a [`RedisStore`](super::RedisStore): how it talks to Redis, and the
//! counters of what it sent. Below the store and its caller, so both can read them.

use std::time::Duration;

/// How a [`RedisStore`](super::RedisStore) talks to Redis.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// The longest a decision may take (connect, send, answer); past it the call
    /// fails with a transient [`Error::Unavailable`](crate::Error::Unavailable). Default 250 ms.
    pub timeout: Duration,
    /// Added to each key's time to live, which is otherwise the time until its state
    /// is fully replenished. Default 1 s.
    pub ttl_margin: Duration,
    /// Prefix of every key (default `tollgate`); must not contain `{` or `}`.
    pub prefix: String,
    /// How the decision code is called. Default [`RedisCalls::Auto`].
    pub calls: RedisCalls,
    /// The most checks decided by one call (automatic batching; see
    /// [`RedisStore`](super::RedisStore)). 1 sends each check as its own call. Default 64.
    pub batch: usize,
    /// With batching, how many batched calls may be outstanding at once on the
    /// connection; checks arriving meanwhile wait for the next call. Default 2.
    pub in_flight: usize,
    /// With batching, a check that finds no other waiting is sent at once from its own
    /// task (no hand-off to the batching task) while fewer than this many such calls
    /// are out; past that, checks queue and ride batches. 0 queues every check.
    /// Default 8.
    pub direct_calls: usize,
}

/// Counters of a [`RedisStore`](super::RedisStore)'s decision calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallStats {
    /// Calls sent (`FCALL` or `EVALSHA`), including failed ones.
    pub calls: u64,
    /// Checks (try, acquire, peek, refund) those calls carried.
    pub checks: u64,
}

/// How a [`RedisStore`](super::RedisStore) calls its decision code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RedisCalls {
    /// Redis Functions where the server has them (Redis >= 7), `EVALSHA` otherwise.
    #[default]
    Auto,
    /// Redis Functions: the library is loaded once per node (`FUNCTION LOAD`) and each
    /// call runs only the algorithms it names (`FCALL`; `FCALL_RO` for peeks).
    Functions,
    /// `EVALSHA` of one script that defines every algorithm on each call (loaded with
    /// `SCRIPT LOAD` when Redis does not know it).
    Eval,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            timeout: Duration::from_millis(250),
            ttl_margin: Duration::from_secs(1),
            prefix: "tollgate".into(),
            calls: RedisCalls::Auto,
            batch: 64,
            in_flight: 2,
            direct_calls: 8,
        }
    }
}
