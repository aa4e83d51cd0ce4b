//! # tollgate-core
//!
//! Every classic rate-limiting algorithm as a pure, deterministic state machine: no
//! I/O, no async, no locks, no reading of the system clock. A caller hands each check
//! the time (`now`, in microseconds of some [`Clock`]) and one key's state; the
//! algorithm decides and updates the state. Stores (in memory, Redis) and servers wrap
//! this core; all of them make the same decisions because they run the same arithmetic.
//!
//! ```
//! use tollgate_core::{Policy, Op};
//!
//! // The "red carpet" example: one request per 10 s, bursts of 3.
//! let policy: Policy = "gcra:rate=1/10s,burst=3".parse().unwrap();
//! let mut key = policy.init(0);
//! let s = 1_000_000; // microseconds per second
//! assert!(policy.check(&mut key, 0, 1, Op::Try).unwrap().allowed);
//! let at_2s: Vec<bool> = (0..3)
//!     .map(|_| policy.check(&mut key, 2 * s, 1, Op::Try).unwrap().allowed)
//!     .collect();
//! assert_eq!(at_2s, [true, true, false]);
//! assert!(policy.check(&mut key, 45 * s, 1, Op::Try).unwrap().allowed);
//! ```
//!
//! ## Policy specs
//!
//! `ALGORITHM:key=value,...`; rates are `N/s`, `N/m`, `N/h`, `N/d` or `N/<duration>`;
//! durations `250ms`, `1s`, `1m`, `1h`, `1d`, `us`, `ns`. Every policy also takes
//! `max-wait=<duration>` and `shadow=true`.
//!
//! | algorithm | parameters |
//! |---|---|
//! | `fixed-window` | `limit`, `window`, `align=clock\|first`, `debt=carry\|forgive` |
//! | `sliding-log` | `limit`, `window` |
//! | `sliding-window` | `limit`, `window`, `buckets=K` or `mode=weighted` (default) |
//! | `leaky-bucket` | `rate`, `capacity` (default: the rate's count) |
//! | `gcra` | `rate`, `burst` (default: the rate's count) |
//! | `token-bucket` | `rate`, `capacity` (default: the rate's count) |
//! | `smooth-bursty` | `rate`, `max-burst=1s` |
//! | `smooth-warmup` | `rate`, `warmup`, `cold-factor=3` |
//! | `limit-req` | `rate`, `burst=0`, `nodelay` or `delay=N` |
//! | `shaper` | `rate`, `queue` |
//! | `concurrency` | `limit` |
//!
//! ## Time and numbers
//!
//! All state is integers in microseconds (or in exact scaled ticks of `1/scale` us for
//! rates whose interval is not a whole number of microseconds, see [`Rate`]), except
//! Guava's two limiters, which keep Guava's doubles to match it exactly.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod adaptive;
mod algorithm;
pub mod algorithms;
mod clock;
mod decision;
mod list;
mod params;
mod policy;
pub mod quota;
mod rules;
mod spec;
mod spec_error;
mod stored;
mod units;

pub use algorithm::{Algorithm, CheckMode};
pub use clock::{Clock, ManualClock, MonotonicClock};
pub use decision::{CheckError, Decision, Rejected};
pub use list::{params_of, spec_names, AlgorithmKind};
pub use policy::{densest_window, AnyAlgorithm, Op, Policy, PolicyState};
pub use rules::{RuleDecision, RuleSet};
pub use spec::SpecError;
pub use stored::{StateError, StoredState};
pub use units::{
    fmt_duration, parse_duration, Rate, MAX_COUNT, MAX_DEBT_US, MAX_DURATION_US, MAX_TIME_US,
};
