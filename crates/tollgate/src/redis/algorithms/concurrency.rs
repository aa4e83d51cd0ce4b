//! `concurrency` in Redis: not the decision script's (permits are leases of their
//! own, `RedisConcurrencyLimiter`).

use tollgate_core::algorithms::Concurrency;
use tollgate_core::Policy;

use super::LuaAlgorithm;
use crate::Error;

impl LuaAlgorithm for Concurrency {
    const FILE: Option<&'static str> = None;

    fn encode(&self, p: &Policy) -> Result<(Vec<String>, u64), Error> {
        Err(Error::Unsupported(format!(
            "{p}: concurrency limits in Redis are held by RedisConcurrencyLimiter (permits with leases), not by the decision script"
        )))
    }
}
