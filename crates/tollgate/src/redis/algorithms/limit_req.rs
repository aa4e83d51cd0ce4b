//! `limit-req` in Redis: `lua/limit_req.lua`.

use tollgate_core::algorithms::{Delay, LimitReq};
use tollgate_core::Policy;

use super::{bounded, LuaAlgorithm};
use crate::Error;

impl LuaAlgorithm for LimitReq {
    const FILE: Option<&'static str> = Some("limit_req");

    /// rate (milli-requests/s), burst * 1000, delay * 1000 (-1: nodelay).
    fn encode(&self, p: &Policy) -> Result<(Vec<String>, u64), Error> {
        let delay = match self.delay() {
            Delay::All => 0i128,
            Delay::After(n) => i128::from(n) * 1000,
            Delay::Never => -1,
        };
        let params = vec![
            self.rate_milli().to_string(),
            bounded("burst * 1000", p, u128::from(self.burst()) * 1000)?,
            delay.to_string(),
        ];
        Ok((params, u64::MAX))
    }
}
