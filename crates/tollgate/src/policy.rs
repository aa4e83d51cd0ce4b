//! Policies beyond the types a user starts with ([`Policy`](crate::Policy),
//! [`RuleSet`](crate::RuleSet), [`Rate`](crate::Rate)): the algorithms as state
//! machines, the list of algorithms, one key's state, and the spec language's units —
//! the pure core (`tollgate_core`) under the library's roof.

pub use tollgate_core::algorithms;
pub use tollgate_core::{
    densest_window, fmt_duration, params_of, parse_duration, Algorithm, AlgorithmKind,
    AnyAlgorithm, CheckMode, PolicyState, MAX_COUNT, MAX_DEBT_US, MAX_DURATION_US, MAX_TIME_US,
};
