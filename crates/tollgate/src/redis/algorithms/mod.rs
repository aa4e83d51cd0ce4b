//! The Redis side of each algorithm, one file per Lua file of `crates/tollgate/lua/`:
//! the parameter words a policy is sent as, the state string the Lua code keeps, and
//! whether a lease keeps the algorithm exactly. The dispatch from a policy follows
//! from the core's list of algorithms (`tollgate_core::with_algorithms!`).

mod buckets;
mod concurrency;
mod gcra;
mod limit_req;
mod shaper;
mod smooth;
mod windows;

use tollgate_core::{AlgorithmKind, AnyAlgorithm, Policy, PolicyState, StoredState};

use crate::Error;

/// Integers the script handles stay below this (doubles are exact below 2^53; the
/// margin leaves room for the sums of two of them).
pub(super) const LUA_EXACT: u128 = 1 << 52;

/// An algorithm as the Lua decision code knows it.
pub(crate) trait LuaAlgorithm: StoredState {
    /// Its file of `crates/tollgate/lua/` (`None`: not the decision script's;
    /// concurrency permits are leases of their own, `RedisConcurrencyLimiter`).
    const FILE: Option<&'static str>;

    /// Whether a lease can keep it exactly: a slice of its budget decided locally
    /// never admits more than the algorithm would (see `lease.rs`).
    const LEASABLE: bool = false;

    /// Its parameter words for the script (see its `.lua` file), and the largest
    /// cost the script keeps exact for it.
    fn encode(&self, p: &Policy) -> Result<(Vec<String>, u64), Error>;
}

macro_rules! dispatch {
    ($($v:ident($t:ty, $s:ty) = $code:literal, $name:literal, $what:literal;)*) => {
        /// The file of `crates/tollgate/lua/` that decides `kind`.
        pub(crate) fn file(kind: AlgorithmKind) -> Option<&'static str> {
            match kind {
                $(AlgorithmKind::$v => <$t as LuaAlgorithm>::FILE,)*
            }
        }

        /// Whether a lease can keep `kind` exactly.
        pub(crate) fn leasable_kind(kind: AlgorithmKind) -> bool {
            match kind {
                $(AlgorithmKind::$v => <$t as LuaAlgorithm>::LEASABLE,)*
            }
        }

        /// The name of `kind`'s wire code in the Lua code: its variant in capitals
        /// and underscores (`CODE.SLIDING_WINDOW_WEIGHTED`); a test checks
        /// `prelude.lua` against it.
        #[cfg(test)]
        pub(crate) fn lua_name(kind: AlgorithmKind) -> String {
            let variant = match kind {
                $(AlgorithmKind::$v => stringify!($v),)*
            };
            let mut name = String::new();
            for (i, c) in variant.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    name.push('_');
                }
                name.push(c.to_ascii_uppercase());
            }
            name
        }

        /// (parameters, largest cost) of `p` for the script.
        pub(crate) fn encode(p: &Policy) -> Result<(Vec<String>, u64), Error> {
            match p.algorithm() {
                $(AnyAlgorithm::$v(a) => a.encode(p),)*
            }
        }
    };
}

tollgate_core::with_algorithms!(dispatch);

/// The state the script returned for `p` (`""`: a key without state, created at
/// `created`).
pub(crate) fn parse_state(p: &Policy, s: &str, created: u64) -> Result<PolicyState, Error> {
    p.parse_state(s, created).map_err(|e| Error::Store(e.0))
}

/// `state` as the script keeps it for `p`, for the algorithms a lease keeps.
pub(crate) fn encode_state(p: &Policy, state: &PolicyState) -> Result<String, Error> {
    (p.encode_state(state))
        .ok_or_else(|| Error::Unsupported(format!("{p}: no lease encoding for this state")))
}

/// `v` as a script word, or why the script cannot keep it exactly.
pub(super) fn bounded(what: &str, p: &Policy, v: u128) -> Result<String, Error> {
    if v >= LUA_EXACT {
        return Err(Error::Unsupported(format!(
            "{p}: {what} ({v}) is beyond the exact integer range of the Redis scripts (2^52)"
        )));
    }
    Ok(v.to_string())
}
