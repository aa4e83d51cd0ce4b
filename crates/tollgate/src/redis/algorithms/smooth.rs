//! `smooth-bursty` and `smooth-warmup` in Redis: `lua/smooth.lua`.

use tollgate_core::algorithms::{Smooth, SmoothState};
use tollgate_core::Policy;

use super::{exactly, nums, LuaAlgorithm, LUA_EXACT};
use crate::Error;

impl LuaAlgorithm for Smooth {
    const FILE: Option<&'static str> = Some("smooth");

    /// Guava's derived doubles, each the shortest string that parses back to the
    /// same double (`{:?}`).
    fn encode(&self, _: &Policy) -> Result<(Vec<String>, u64), Error> {
        let g = self.guava_params();
        let params = g.iter().map(|x| format!("{x:?}")).collect();
        // A cost's price in us must stay an exact integer in a double.
        let max = (LUA_EXACT as f64 / g[0].max(1.0)) as u64;
        Ok((params, max))
    }

    /// "stored next_free".
    fn parse_state(&self, s: &str) -> Result<SmoothState, Error> {
        let (stored, next) = s
            .split_once(' ')
            .ok_or_else(|| Error::Store(format!("bad smooth state {s:?}")))?;
        Ok(SmoothState {
            stored: stored
                .parse()
                .map_err(|_| Error::Store(format!("bad stored permits {stored:?}")))?,
            next_free: exactly::<1, u64>(nums(next)?, s)?[0],
        })
    }
}
