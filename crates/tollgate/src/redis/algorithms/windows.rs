//! The window algorithms in Redis: `lua/windows.lua`.
use tollgate_core::algorithms::{
    Align, Debt, FixedWindow, SlidingLog, SlidingWindow, SlidingWindowWeighted,
};
use tollgate_core::Policy;

use super::{bounded, LuaAlgorithm};
use crate::Error;

impl LuaAlgorithm for FixedWindow {
    const FILE: Option<&'static str> = Some("windows");
    const LEASABLE: bool = true;

    /// limit, window, 1 when aligned on the first request, 1 when a debt carries.
    fn encode(&self, p: &Policy) -> Result<(Vec<String>, u64), Error> {
        let first = matches!(self.align(), Align::First);
        let carry = matches!(self.debt(), Debt::Carry);
        let params = vec![
            bounded("limit", p, self.limit_per_window().into())?,
            bounded("window", p, self.window_us().into())?,
            u8::from(first).to_string(),
            u8::from(carry).to_string(),
        ];
        Ok((params, u64::MAX))
    }
}

impl LuaAlgorithm for SlidingLog {
    const FILE: Option<&'static str> = Some("windows");

    /// limit, window.
    fn encode(&self, p: &Policy) -> Result<(Vec<String>, u64), Error> {
        let params = vec![
            bounded("limit", p, self.limit_per_window().into())?,
            bounded("window", p, self.window_us().into())?,
        ];
        Ok((params, u64::MAX))
    }
}

impl LuaAlgorithm for SlidingWindow {
    const FILE: Option<&'static str> = Some("windows");
    const LEASABLE: bool = true;

    /// limit, window, buckets, bucket width.
    fn encode(&self, p: &Policy) -> Result<(Vec<String>, u64), Error> {
        let params = vec![
            bounded("limit", p, self.limit_per_window().into())?,
            bounded("window", p, self.window_us().into())?,
            self.buckets().to_string(),
            (self.window_us() / self.buckets()).to_string(),
        ];
        Ok((params, u64::MAX))
    }
}

impl LuaAlgorithm for SlidingWindowWeighted {
    const FILE: Option<&'static str> = Some("windows");
    const LEASABLE: bool = true;

    /// limit, window (their product kept exact).
    fn encode(&self, p: &Policy) -> Result<(Vec<String>, u64), Error> {
        let lw = u128::from(self.limit_per_window()) * u128::from(self.window_us());
        bounded("limit * window", p, lw)?;
        let params = vec![
            self.limit_per_window().to_string(),
            self.window_us().to_string(),
        ];
        Ok((params, u64::MAX))
    }
}
