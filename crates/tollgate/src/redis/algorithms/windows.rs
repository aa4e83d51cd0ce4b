//! The window algorithms in Redis: `lua/windows.lua`.

use std::collections::VecDeque;

use tollgate_core::algorithms::{
    Align, FixedWindow, FixedWindowState, SlidingLog, SlidingLogState, SlidingWindow,
    SlidingWindowState, SlidingWindowWeighted, WeightedState,
};
use tollgate_core::Policy;

use super::{bounded, exactly, nums, LuaAlgorithm};
use crate::Error;

impl LuaAlgorithm for FixedWindow {
    const FILE: Option<&'static str> = Some("windows");
    const LEASABLE: bool = true;

    /// limit, window, 1 when aligned on the first request.
    fn encode(&self, p: &Policy) -> Result<(Vec<String>, u64), Error> {
        let first = matches!(self.align(), Align::First);
        let params = vec![
            bounded("limit", p, self.limit_per_window().into())?,
            bounded("window", p, self.window_us().into())?,
            u8::from(first).to_string(),
        ];
        Ok((params, u64::MAX))
    }

    /// "start count".
    fn parse_state(&self, s: &str) -> Result<FixedWindowState, Error> {
        let [start, count] = exactly(nums(s)?, s)?;
        Ok(FixedWindowState { start, count })
    }

    fn encode_state(&self, w: &FixedWindowState) -> Option<String> {
        Some(format!("{} {}", w.start, w.count))
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

    /// "ts cost ts cost ...": one member per admission in Redis; the core merges
    /// equal times.
    fn parse_state(&self, s: &str) -> Result<SlidingLogState, Error> {
        let v: Vec<u64> = nums(s)?;
        let mut entries: VecDeque<(u64, u64)> = VecDeque::with_capacity(v.len() / 2);
        let mut total = 0;
        for pair in v.chunks_exact(2) {
            let (ts, c) = (pair[0], pair[1]);
            total += c;
            match entries.back_mut() {
                Some(back) if back.0 == ts => back.1 += c,
                _ => entries.push_back((ts, c)),
            }
        }
        Ok(SlidingLogState { entries, total })
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

    /// "newest total count count ...".
    fn parse_state(&self, s: &str) -> Result<SlidingWindowState, Error> {
        let v: Vec<u64> = nums(s)?;
        if v.len() as u64 != self.buckets() + 2 {
            return Err(Error::Store(format!(
                "sliding-window state should have {} numbers",
                self.buckets() + 2
            )));
        }
        Ok(SlidingWindowState {
            newest: v[0],
            total: v[1],
            counts: v[2..].into(),
        })
    }

    fn encode_state(&self, w: &SlidingWindowState) -> Option<String> {
        let counts = w.counts.iter().map(u64::to_string).collect::<Vec<_>>();
        Some(format!("{} {} {}", w.newest, w.total, counts.join(" ")))
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

    /// "win prev curr".
    fn parse_state(&self, s: &str) -> Result<WeightedState, Error> {
        let [win, prev, curr] = exactly(nums(s)?, s)?;
        Ok(WeightedState { win, prev, curr })
    }

    fn encode_state(&self, w: &WeightedState) -> Option<String> {
        Some(format!("{} {} {}", w.win, w.prev, w.curr))
    }
}
