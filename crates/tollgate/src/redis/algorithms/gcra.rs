//! `gcra` in Redis: `lua/gcra.lua`.

use tollgate_core::algorithms::{Gcra, GcraState};
use tollgate_core::Policy;

use super::{bounded, nums, ticks, LuaAlgorithm};
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

    /// "us" or "us frac" (ticks past the microsecond).
    fn parse_state(&self, s: &str) -> Result<GcraState, Error> {
        let v: Vec<u64> = nums(s)?;
        let (us, frac) = match v[..] {
            [us] => (us, 0),
            [us, frac] => (us, frac),
            _ => return Err(Error::Store(format!("bad gcra state {s:?}"))),
        };
        Ok(GcraState {
            tat: ticks(us, frac, self.rate().scale()),
        })
    }

    fn encode_state(&self, g: &GcraState) -> Option<String> {
        let scale = self.rate().scale();
        let (us, frac) = (g.tat / scale, g.tat % scale);
        Some(if frac == 0 {
            us.to_string()
        } else {
            format!("{us} {frac}")
        })
    }
}
