//! # tollgate
//!
//! Rate limiting for Rust services. This crate is what applications import; today it
//! re-exports the pure engine, [`tollgate_core`]: every algorithm, the policy spec
//! language, [`Decision`] and the clocks. Keyed in-memory and Redis stores, waiting,
//! and the tower layer build on it.
//!
//! ```
//! use tollgate::{Clock, ManualClock, Op, Policy};
//!
//! let clock = ManualClock::new();
//! let policy: Policy = "token-bucket:rate=5/s,capacity=2".parse()?;
//! let mut state = policy.init(clock.now_us());
//! assert!(policy.check(&mut state, clock.now_us(), 2, Op::Try)?.allowed);
//! let d = policy.check(&mut state, clock.now_us(), 1, Op::Try)?;
//! assert!(!d.allowed);
//! assert_eq!(d.retry_after, Some(std::time::Duration::from_millis(200)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub use tollgate_core::*;
