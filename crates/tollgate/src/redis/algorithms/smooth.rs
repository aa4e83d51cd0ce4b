//! `smooth-bursty` and `smooth-warmup` in Redis: `lua/smooth.lua`.

use tollgate_core::algorithms::Smooth;
use tollgate_core::Policy;

use super::{LuaAlgorithm, LUA_EXACT};
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
}
