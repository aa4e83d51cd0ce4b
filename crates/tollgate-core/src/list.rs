//! The one list of algorithms. Each row names an algorithm's variant, the type of its
//! parameters (its state machine, in [`crate::algorithms`]), the type of one key's
//! state, its wire code and its spec name; [`AlgorithmKind`], [`AnyAlgorithm`], [`PolicyState`]
//! and the dispatch from a policy to its algorithm all follow from the list, and what
//! differs between algorithms lives beside each state machine ([`crate::Algorithm`]
//! and the crate's spec trait: parameters, parsing, printing, sharing, carrying state
//! over).
//!
//! Adding an algorithm: its state machine file (with both traits), its row here, its
//! Lua code and wire format in the Redis store, and its cases in the conformance
//! suite (CONTRIBUTING.md walks through it).

use std::fmt;

use crate::algorithm::{Algorithm, CheckMode};
use crate::decision::{CheckError, Decision};
use crate::params::{Params, Res, Spec};

/// Declares the algorithms: one row each,
/// `Variant(Parameters, State) = wire code, "spec-name", "what its state is";`.
macro_rules! algorithms {
    ($($v:ident($t:ty, $s:ty) = $code:literal, $name:literal, $what:literal;)*) => {
        /// Which algorithm a policy runs. The discriminant is the algorithm's wire
        /// code: the number the Redis store sends for it, part of its Redis key names
        /// (so it never changes).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum AlgorithmKind {
            $(#[doc = concat!("`", $name, "`: ", $what, ".")] $v = $code,)*
        }

        impl AlgorithmKind {
            /// Every algorithm, in the order of the list (the order the docs use).
            pub const ALL: &'static [AlgorithmKind] = &[$(AlgorithmKind::$v,)*];

            /// Its name in a policy spec (`sliding-window` names two algorithms).
            pub fn spec_name(self) -> &'static str {
                match self {
                    $(AlgorithmKind::$v => $name,)*
                }
            }

            /// Whether a charge means something for it (not for `shaper` and
            /// `concurrency`, which take no `max-debt`).
            pub fn chargeable(self) -> bool {
                match self {
                    $(AlgorithmKind::$v => <$t as Spec>::CHARGEABLE,)*
                }
            }

            /// The parameters its spec name takes, besides those every policy takes
            /// (`max-wait`, `shadow`, `max-debt`).
            pub fn params(self) -> &'static [&'static str] {
                match self {
                    $(AlgorithmKind::$v => <$t as Spec>::params($name),)*
                }
            }
        }

        /// The algorithm of a [`Policy`](crate::Policy), with its parameters: any of
        /// the list's, chosen at run time (from a spec), as [`crate::Algorithm`] is the
        /// trait each of them implements and [`AlgorithmKind`] names which one it is.
        #[derive(Debug, Clone, PartialEq)]
        pub enum AnyAlgorithm {
            $(#[doc = concat!("`", $name, "`: ", $what, ".")] $v($t),)*
        }

        /// One key's state under a [`Policy`](crate::Policy).
        #[derive(Debug, Clone, PartialEq)]
        pub enum PolicyState {
            $(#[doc = concat!("The state of `", $name, "`: ", $what, ".")] $v($s),)*
        }

        impl AnyAlgorithm {
            /// Which algorithm this is.
            pub fn kind(&self) -> AlgorithmKind {
                match self {
                    $(AnyAlgorithm::$v(_) => AlgorithmKind::$v,)*
                }
            }

            /// The state of a key created at `now`.
            pub(crate) fn init(&self, now: u64) -> PolicyState {
                match self {
                    $(AnyAlgorithm::$v(a) => PolicyState::$v(a.init(now)),)*
                }
            }

            /// [`Algorithm::check`]; a state of another algorithm (a policy changed at
            /// run time) starts afresh.
            pub(crate) fn check(
                &self,
                state: &mut PolicyState,
                now: u64,
                cost: u64,
                mode: CheckMode,
            ) -> Result<Decision, CheckError> {
                match self {
                    $(AnyAlgorithm::$v(a) => {
                        if !matches!(state, PolicyState::$v(_)) {
                            *state = PolicyState::$v(a.init(now));
                        }
                        let PolicyState::$v(s) = state else { unreachable!() };
                        a.check(s, now, cost, mode)
                    })*
                }
            }

            /// [`Algorithm::charge`], as [`AnyAlgorithm::check`] for a foreign state.
            pub(crate) fn charge(
                &self,
                state: &mut PolicyState,
                now: u64,
                cost: u64,
                max_debt: u64,
            ) -> Result<u64, CheckError> {
                match self {
                    $(AnyAlgorithm::$v(a) => {
                        if !matches!(state, PolicyState::$v(_)) {
                            *state = PolicyState::$v(a.init(now));
                        }
                        let PolicyState::$v(s) = state else { unreachable!() };
                        a.charge(s, now, cost, max_debt)
                    })*
                }
            }

            /// [`Algorithm::refund`]; nothing to give back to a foreign state.
            pub(crate) fn refund(&self, state: &mut PolicyState, now: u64, cost: u64) {
                match (self, state) {
                    $((AnyAlgorithm::$v(a), PolicyState::$v(s)) => a.refund(s, now, cost),)*
                    _ => {}
                }
            }

            /// [`Algorithm::remaining`] (`None` for a foreign state).
            pub(crate) fn remaining(&self, state: &PolicyState, now: u64) -> Option<u64> {
                match (self, state) {
                    $((AnyAlgorithm::$v(a), PolicyState::$v(s)) => Some(a.remaining(s, now)),)*
                    _ => None,
                }
            }

            /// [`Algorithm::reset_after`] (`None` for a foreign state).
            pub(crate) fn reset_after(&self, state: &PolicyState, now: u64) -> Option<u64> {
                match (self, state) {
                    $((AnyAlgorithm::$v(a), PolicyState::$v(s)) => Some(a.reset_after(s, now)),)*
                    _ => None,
                }
            }

            /// [`Algorithm::idle`] (`None` for a foreign state).
            pub(crate) fn idle(&self, state: &PolicyState, now: u64) -> Option<bool> {
                match (self, state) {
                    $((AnyAlgorithm::$v(a), PolicyState::$v(s)) => Some(a.idle(s, now)),)*
                    _ => None,
                }
            }

            /// [`Algorithm::last_active`] (`None` for a foreign state).
            pub(crate) fn last_active(&self, state: &PolicyState) -> Option<u64> {
                match (self, state) {
                    $((AnyAlgorithm::$v(a), PolicyState::$v(s)) => Some(a.last_active(s)),)*
                    _ => None,
                }
            }

            /// [`Algorithm::limit`].
            pub(crate) fn limit(&self) -> u64 {
                match self {
                    $(AnyAlgorithm::$v(a) => a.limit(),)*
                }
            }

            /// [`Algorithm::window_us`].
            pub(crate) fn window_us(&self) -> u64 {
                match self {
                    $(AnyAlgorithm::$v(a) => a.window_us(),)*
                }
            }

            /// [`Algorithm::debt_cap`].
            pub(crate) fn debt_cap(&self, max_debt: u64) -> u64 {
                match self {
                    $(AnyAlgorithm::$v(a) => a.debt_cap(max_debt),)*
                }
            }

            /// [`Algorithm::paces`].
            pub(crate) fn paces(&self) -> bool {
                match self {
                    $(AnyAlgorithm::$v(a) => a.paces(),)*
                }
            }

            /// What it promises in any window of `w` us (see the spec trait).
            pub(crate) fn envelope(&self, w: u64) -> Option<u64> {
                match self {
                    $(AnyAlgorithm::$v(a) => a.envelope(w),)*
                }
            }

            /// Its share for one of `n` instances (see the spec trait).
            pub(crate) fn share(&self, n: u64) -> Res<AnyAlgorithm> {
                Ok(match self {
                    $(AnyAlgorithm::$v(a) => AnyAlgorithm::$v(a.share(n)?),)*
                })
            }

            /// The state a key keeps when its policy changes from `old` to this one;
            /// `None`: start afresh.
            pub(crate) fn carry_over(
                &self,
                old: &AnyAlgorithm,
                state: PolicyState,
                now: u64,
            ) -> Option<PolicyState> {
                match (old, self, state) {
                    $((AnyAlgorithm::$v(o), AnyAlgorithm::$v(n), PolicyState::$v(s)) => {
                        n.carry_over(o, s, now).map(PolicyState::$v)
                    })*
                    _ => None,
                }
            }

            /// Writes the algorithm's part of its spec (`gcra:rate=10/s,burst=5`).
            pub(crate) fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    $(AnyAlgorithm::$v(a) => a.fmt_spec(f),)*
                }
            }

            /// Parses the parameters `p` of spec name `name`: the first row of that
            /// name that takes them.
            pub(crate) fn from_spec(name: &str, p: &Params) -> Res<AnyAlgorithm> {
                $(if name == $name {
                    if let Some(a) = <$t as Spec>::from_spec(name, p)? {
                        return Ok(AnyAlgorithm::$v(a));
                    }
                })*
                Err(format!("unknown algorithm '{name}'"))
            }
        }
    };
}

/// Calls macro `$m` with the list of algorithms, one row each:
/// `Variant(Parameters, State) = wire code, "spec-name", "what its state is";` — for
/// code outside this crate that derives its own dispatch from the one list (the
/// Redis store's wire format), so that it names no algorithm a second time.
#[macro_export]
macro_rules! with_algorithms {
    ($m:ident) => {
        $m! {
            FixedWindow($crate::algorithms::FixedWindow, $crate::algorithms::FixedWindowState) = 4, "fixed-window", "a count per window";
            SlidingLog($crate::algorithms::SlidingLog, $crate::algorithms::SlidingLogState) = 5, "sliding-log", "a timestamp per admitted unit";
            SlidingWindow($crate::algorithms::SlidingWindow, $crate::algorithms::SlidingWindowState) = 6, "sliding-window",
                "K sub-window counters (`buckets=K`)";
            SlidingWindowWeighted($crate::algorithms::SlidingWindowWeighted, $crate::algorithms::WeightedState) = 7, "sliding-window",
                "two window counters, the previous one weighted by overlap (`mode=weighted`)";
            LeakyBucket($crate::algorithms::LeakyBucket, $crate::algorithms::LeakyBucketState) = 3, "leaky-bucket",
                "a level that drains continuously (the meter)";
            Gcra($crate::algorithms::Gcra, $crate::algorithms::GcraState) = 1, "gcra", "a theoretical arrival time";
            TokenBucket($crate::algorithms::TokenBucket, $crate::algorithms::TokenBucketState) = 2, "token-bucket",
                "tokens that refill continuously";
            SmoothBursty($crate::algorithms::Smooth, $crate::algorithms::SmoothState) = 8, "smooth-bursty", "Guava's SmoothBursty";
            SmoothWarmup($crate::algorithms::Smooth, $crate::algorithms::SmoothState) = 9, "smooth-warmup", "Guava's SmoothWarmingUp";
            LimitReq($crate::algorithms::LimitReq, $crate::algorithms::LimitReqState) = 10, "limit-req", "nginx's excess in milli-requests";
            Shaper($crate::algorithms::Shaper, $crate::algorithms::ShaperState) = 11, "shaper", "a release schedule";
            Concurrency($crate::algorithms::Concurrency, $crate::algorithms::ConcurrencyState) = 12, "concurrency", "permits in flight";
        }
    };
}

crate::with_algorithms!(algorithms);

impl AlgorithmKind {
    /// Its wire code (the discriminant).
    pub fn wire_code(self) -> u8 {
        self as u8
    }
}

/// The algorithm names a spec may start with, each once, in the list's order.
pub fn spec_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for kind in AlgorithmKind::ALL {
        if !names.contains(&kind.spec_name()) {
            names.push(kind.spec_name());
        }
    }
    names
}

/// The parameters spec name `name` takes (besides those every policy takes); `None`
/// for a name no algorithm has.
pub fn params_of(name: &str) -> Option<&'static [&'static str]> {
    (AlgorithmKind::ALL.iter())
        .find(|k| k.spec_name() == name)
        .map(|k| k.params())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_codes_run_from_one_without_a_gap_and_shared_names_take_one_list() {
        let mut codes: Vec<u8> = AlgorithmKind::ALL.iter().map(|k| k.wire_code()).collect();
        codes.sort();
        assert_eq!(
            codes,
            (1..=AlgorithmKind::ALL.len() as u8).collect::<Vec<_>>()
        );
        for a in AlgorithmKind::ALL {
            for b in AlgorithmKind::ALL {
                if a.spec_name() == b.spec_name() {
                    assert_eq!(a.params(), b.params(), "{a:?} {b:?}");
                }
            }
        }
    }

    #[test]
    fn names_and_parameters_come_from_the_list() {
        assert_eq!(
            spec_names().len(),
            11,
            "sliding-window is one name for two rows"
        );
        assert_eq!(params_of("gcra"), Some(&["rate", "burst"][..]));
        assert_eq!(params_of("gcrb"), None);
        assert_eq!(AlgorithmKind::LimitReq.spec_name(), "limit-req");
    }
}
