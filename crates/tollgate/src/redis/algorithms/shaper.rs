//! `shaper` in Redis: `lua/shaper.lua`.

use tollgate_core::algorithms::Shaper;
use tollgate_core::Policy;

use super::{LuaAlgorithm, LUA_EXACT};
use crate::Error;

impl LuaAlgorithm for Shaper {
    const FILE: Option<&'static str> = Some("shaper");

    /// scale, interval (ticks), queue; a cost's schedule kept exact.
    fn encode(&self, _: &Policy) -> Result<(Vec<String>, u64), Error> {
        let r = self.rate();
        let params = vec![
            r.scale().to_string(),
            r.interval_ticks().to_string(),
            self.queue().to_string(),
        ];
        let per = u128::from(r.interval_ticks()).max(1);
        Ok((params, (LUA_EXACT / per).min(u128::from(u64::MAX)) as u64))
    }
}
