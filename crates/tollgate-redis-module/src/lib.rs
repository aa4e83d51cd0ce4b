//! # tollgate-redis-module
//!
//! tollgate's decisions as a Redis (7.0 and later) and Valkey module: the calls of the
//! Functions library that the Redis store sends (`crates/tollgate/lua/check.lua`),
//! decided in native code by tollgate-core on the same keys and the same state
//! strings, so a node with the module and a node without it decide alike. Load it
//! with `--loadmodule /path/to/libtollgate_redis_module.so` (or `loadmodule` in
//! redis.conf); the store finds it by `TOLLGATE.WIRE` and uses it where it is loaded.
//!
//! Commands (keys as `FCALL` takes them: their count, then the keys):
//!
//! | command | arguments after the keys | answer |
//! |---|---|---|
//! | `TOLLGATE.BATCH` | `nonce count (op set at cost)... set...` | `now (admitted state...)...` |
//! | `TOLLGATE.PEEK` | the same, peeks only (read-only) | the same |
//! | `TOLLGATE.TRY` | `set cost at [nonce]` | `now admitted state...` |
//! | `TOLLGATE.CHARGE` | `set cost at [nonce]` | `now 1 state...` |
//! | `TOLLGATE.WIRE` | none | the version of these arguments ([`WIRE`]) |
//!
//! A rule set is one argument, `"margin spec spec ..."`: the TTL margin in ms and each
//! policy's spec. The module decides the algorithms whose state is one string
//! ([`call::decides`]); the store sends other rule sets to the Functions library.
//!
//! It never takes the server down: every argument is checked and a bad one answered
//! with an error naming it, and a panic is caught at the command's edge.

pub mod call;
// The server's side: with the Redis allocator, so not in unit tests or fuzzing (no
// server there).
#[cfg(not(any(test, fuzzing)))]
mod commands;
#[cfg(not(any(test, fuzzing)))]
mod keys;

/// The version of the commands' arguments and answers; a store sends them only to a
/// module of its own version.
pub const WIRE: i64 = 1;
