//! Measurement: outcomes collected into windows, each summarised by its median
//! latency, and the unloaded-latency baseline as the least window median seen lately.
//!
//! Medians, not single samples, are what the controllers see: one sample can move a
//! window's median at most to the neighbouring sample of that window, so neither a
//! lucky fast response (the failure of a min-RTT baseline) nor one slow outlier moves
//! a limit by itself.

use std::collections::VecDeque;

/// The samples of the window being filled.
#[derive(Debug, Clone, Default)]
pub(crate) struct Window {
    /// Latencies of successful permits admitted under the current limit, in us.
    latencies: Vec<u64>,
    /// Dropped permits admitted under the current limit.
    pub(crate) drops: u32,
    /// The most permits held at once while the window was open.
    pub(crate) max_in_flight: u32,
    /// Whether a request found every permit in use while the window was open.
    pub(crate) saturated: bool,
}

/// What a closed window tells a controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowSummary {
    /// Successful samples in the window.
    pub samples: u32,
    /// Dropped permits in the window.
    pub drops: u32,
    /// The median latency of the successful samples, in us (`None` without any).
    pub median_us: Option<u64>,
    /// The unloaded-latency baseline after this window, in us.
    pub baseline_us: Option<u64>,
    /// The most permits held at once during the window.
    pub max_in_flight: u32,
    /// Whether the limit bound the traffic (every permit was in use at some point, or
    /// a request found none free): only then does a controller learn that a higher
    /// limit would be used.
    pub limit_bound: bool,
}

impl Window {
    pub(crate) fn reset(&mut self, in_flight: u32) {
        self.latencies.clear();
        self.drops = 0;
        self.max_in_flight = in_flight;
        self.saturated = false;
    }

    pub(crate) fn push(&mut self, latency_us: u64) {
        self.latencies.push(latency_us);
    }

    /// Outcomes counted so far (successes and drops).
    pub(crate) fn len(&self) -> u32 {
        self.latencies.len() as u32 + self.drops
    }

    /// The median (the lower one of an even count), reordering the samples.
    pub(crate) fn median(&mut self) -> Option<u64> {
        if self.latencies.is_empty() {
            return None;
        }
        let mid = (self.latencies.len() - 1) / 2;
        Some(*self.latencies.select_nth_unstable(mid).1)
    }

    pub(crate) fn samples(&self) -> u32 {
        self.latencies.len() as u32
    }
}

/// The least value pushed during the last `span_us`: a sliding-window minimum kept
/// as an ascending deque (each value is pushed and popped once).
#[derive(Debug, Clone)]
pub(crate) struct WindowedMin {
    span_us: u64,
    /// (time pushed, value), values strictly ascending from front to back.
    entries: VecDeque<(u64, u64)>,
}

impl WindowedMin {
    pub(crate) fn new(span_us: u64) -> Self {
        WindowedMin {
            span_us,
            entries: VecDeque::new(),
        }
    }

    pub(crate) fn push(&mut self, now_us: u64, value: u64) {
        while self.entries.back().is_some_and(|&(_, v)| v >= value) {
            self.entries.pop_back();
        }
        self.entries.push_back((now_us, value));
        self.expire(now_us);
    }

    /// Forgets values older than the span, keeping the newest value whatever its age
    /// (a baseline is never empty once learned).
    fn expire(&mut self, now_us: u64) {
        while self.entries.len() > 1
            && self
                .entries
                .front()
                .is_some_and(|&(t, _)| now_us.saturating_sub(t) > self.span_us)
        {
            self.entries.pop_front();
        }
    }

    pub(crate) fn get(&self) -> Option<u64> {
        self.entries.front().map(|&(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_a_window_moves_one_rank_for_one_outlier() {
        let mut w = Window::default();
        for _ in 0..9 {
            w.push(20_000);
        }
        w.push(10_000_000);
        assert_eq!(w.median(), Some(20_000));
        w.push(1);
        assert_eq!(w.median(), Some(20_000));
    }

    #[test]
    fn the_windowed_minimum_forgets_old_values_but_keeps_the_last() {
        let mut m = WindowedMin::new(10);
        m.push(0, 5);
        m.push(5, 7);
        assert_eq!(m.get(), Some(5));
        m.push(11, 9);
        assert_eq!(m.get(), Some(7));
        m.push(100, 12);
        assert_eq!(m.get(), Some(12));
        m.push(101, 3);
        assert_eq!(m.get(), Some(3));
    }
}
