//! `token-bucket` and `leaky-bucket` in Redis: `lua/buckets.lua` (they share their
//! units).

use tollgate_core::algorithms::{LeakyBucket, TokenBucket};
use tollgate_core::{Policy, Rate};

use super::{bounded, LuaAlgorithm};
use crate::Error;

/// interval (ticks), scale, capacity * interval.
fn bucket(p: &Policy, r: Rate, capacity: u64) -> Result<(Vec<String>, u64), Error> {
    let cap = u128::from(capacity) * u128::from(r.interval_ticks());
    let params = vec![
        r.interval_ticks().to_string(),
        r.scale().to_string(),
        bounded("capacity * interval", p, cap)?,
    ];
    Ok((params, u64::MAX))
}

impl LuaAlgorithm for TokenBucket {
    const FILE: Option<&'static str> = Some("buckets");
    const LEASABLE: bool = true;

    fn encode(&self, p: &Policy) -> Result<(Vec<String>, u64), Error> {
        bucket(p, self.rate(), self.capacity_tokens())
    }
}

impl LuaAlgorithm for LeakyBucket {
    const FILE: Option<&'static str> = Some("buckets");
    const LEASABLE: bool = true;

    fn encode(&self, p: &Policy) -> Result<(Vec<String>, u64), Error> {
        bucket(p, self.rate(), self.capacity_units())
    }
}
