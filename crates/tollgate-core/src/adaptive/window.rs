//! Measurement: outcomes collected into windows, each summarised by its trimmed mean
//! latency, and the unloaded-latency baseline as the least window mean seen lately
//! (each counted one standard error up: see the gate).
//!
//! A mean, because Little's law holds for means: a service of capacity C with a FIFO
//! queue delays only the requests past C, which a median does not see until they are
//! half of all. Trimmed — the `max(1, n/20)` fastest and slowest samples of a window
//! are left out — so that no single sample moves it beyond the range of the other
//! samples: neither a lucky fast response (the failure of a min-RTT baseline) nor one
//! slow outlier moves a limit by itself.

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
    /// Dropped permits in the window.
    pub drops: u32,
    /// The trimmed mean latency of the successful samples, in us (`None` without any).
    pub mean_us: Option<u64>,
    /// The standard error of that mean (the kept samples' standard deviation over
    /// the square root of their number), in us: how far the mean of a window this
    /// size strays by chance on a service whose times jitter.
    pub mean_error_us: u64,
    /// The unloaded-latency baseline after this window, in us.
    pub baseline_us: Option<u64>,
    /// The most permits held at once during the window.
    pub max_in_flight: u32,
    /// Whether the limit bound the traffic (every permit was in use at some point, or
    /// a request found none free): only then does a controller learn that a higher
    /// limit would be used.
    pub limit_bound: bool,
    /// The permits that priorities above the lowest one in the window held at most:
    /// a cut never takes the limit below them (below the limit itself), so the lowest
    /// class absorbs cuts first. 0 when one priority held every permit.
    pub protected: u32,
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

    /// The mean of the samples without the `max(1, n/20)` lowest and highest (all of
    /// them below three samples), and its standard error; reorders the samples.
    pub(crate) fn trimmed(&mut self) -> Option<(u64, u64)> {
        let n = self.latencies.len();
        if n == 0 {
            return None;
        }
        let k = if n < 3 { 0 } else { (n / 20).max(1) };
        self.latencies.sort_unstable();
        let kept = &self.latencies[k..n - k];
        let sum: u128 = kept.iter().map(|&l| u128::from(l)).sum();
        let mean = (sum / kept.len() as u128) as u64;
        let m = kept.len() as f64;
        let var = (kept.iter())
            .map(|&l| (l as f64 - mean as f64).powi(2))
            .sum::<f64>()
            / (m - 1.0).max(1.0);
        Some((mean, (var / m).sqrt() as u64))
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
    use proptest::prelude::*;

    proptest! {
        /// The documented bound: whatever one sample is, the trimmed mean of a window
        /// of at least 3 stays within the range of the window's other samples.
        #[test]
        fn one_sample_never_moves_the_trimmed_mean_beyond_the_others(
            others in prop::collection::vec(1u64..1_000_000, 2..300),
            outlier in any::<u64>(),
            at in any::<prop::sample::Index>(),
        ) {
            let mut w = Window::default();
            let mut samples = others.clone();
            samples.insert(at.index(samples.len() + 1), outlier);
            for s in samples {
                w.push(s);
            }
            let m = w.trimmed().unwrap().0;
            let (lo, hi) = (*others.iter().min().unwrap(), *others.iter().max().unwrap());
            prop_assert!((lo..=hi).contains(&m), "{m} outside [{lo}, {hi}]");
        }
    }

    #[test]
    fn one_outlier_does_not_move_the_trimmed_mean_out_of_the_other_samples() {
        let mut w = Window::default();
        for _ in 0..9 {
            w.push(20_000);
        }
        w.push(10_000_000);
        assert_eq!(w.trimmed().map(|t| t.0), Some(20_000));
        w.push(1);
        assert_eq!(w.trimmed().map(|t| t.0), Some(20_000));
        // A FIFO queue delaying a tenth of the requests shows.
        let mut w = Window::default();
        for i in 0..40 {
            w.push(if i % 10 == 0 { 40_000 } else { 20_000 });
        }
        assert_eq!(w.trimmed().map(|t| t.0), Some(21_111));
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
