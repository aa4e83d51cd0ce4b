//! `gcra` in Redis: `lua/gcra.lua`.

use tollgate_core::algorithms::Gcra;
use tollgate_core::Policy;

use super::{bounded, LuaAlgorithm};
use crate::Error;

impl LuaAlgorithm for Gcra {
    const FILE: Option<&'static str> = Some("gcra");
    const LEASABLE: bool = true;

    /// scale, interval (ticks), burst * interval.
    fn encode(&self, p: &Policy) -> Result<(Vec<String>, u64), Error> {
        let r = self.rate();
        let tau = u128::from(self.burst()) * u128::from(r.interval_ticks());
        let params = vec![
            r.scale().to_string(),
            r.interval_ticks().to_string(),
            bounded("burst * interval", p, tau)?,
        ];
        Ok((params, u64::MAX))
    }
}
