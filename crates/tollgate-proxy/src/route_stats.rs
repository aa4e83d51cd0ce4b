//! What one route's requests came to, counted as they end (a leaf): the answers by
//! status code, and how long the upstream took to answer. Shared by the workers
//! (relaxed atomics), kept with the route across reloads, read at each scrape.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The upstream time histogram's bounds, in µs (then +Inf).
pub const UPSTREAM_BOUNDS_US: [u64; 14] = [
    250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 10_000_000,
];

/// The counts of one route.
#[derive(Debug)]
pub struct RouteStats {
    /// Answers by status code (100 to 599; index `code - 100`).
    codes: Box<[AtomicU64; 500]>,
    /// Upstream answers by time bucket ([`UPSTREAM_BOUNDS_US`], then +Inf).
    upstream: [AtomicU64; UPSTREAM_BOUNDS_US.len() + 1],
    upstream_sum_us: AtomicU64,
}

impl Default for RouteStats {
    fn default() -> Self {
        RouteStats {
            codes: Box::new([const { AtomicU64::new(0) }; 500]),
            upstream: [const { AtomicU64::new(0) }; UPSTREAM_BOUNDS_US.len() + 1],
            upstream_sum_us: AtomicU64::new(0),
        }
    }
}

impl RouteStats {
    /// A request answered with `status` (the upstream's, or the proxy's own).
    pub fn answered(&self, status: u16) {
        if let Some(n) = (status.checked_sub(100)).and_then(|i| self.codes.get(usize::from(i))) {
            n.fetch_add(1, Relaxed);
        }
    }

    /// The upstream answered (or failed) after `us`.
    pub fn upstream(&self, us: u64) {
        let bucket = UPSTREAM_BOUNDS_US.partition_point(|b| *b < us);
        self.upstream[bucket].fetch_add(1, Relaxed);
        self.upstream_sum_us.fetch_add(us, Relaxed);
    }

    /// The status codes answered at least once, with their counts.
    pub fn codes(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        (self.codes.iter().enumerate())
            .map(|(i, n)| (i as u16 + 100, n.load(Relaxed)))
            .filter(|(_, n)| *n > 0)
    }

    /// The upstream times: their sum in µs and the count in each bucket.
    pub fn upstream_times(&self) -> (u64, Vec<u64>) {
        let buckets = self.upstream.iter().map(|n| n.load(Relaxed)).collect();
        (self.upstream_sum_us.load(Relaxed), buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_times_land_where_they_belong() {
        let s = RouteStats::default();
        for code in [200, 200, 429, 599, 99, 600, 0] {
            s.answered(code);
        }
        assert_eq!(
            s.codes().collect::<Vec<_>>(),
            [(200, 2), (429, 1), (599, 1)]
        );
        for us in [0, 250, 251, 20_000_000] {
            s.upstream(us);
        }
        let (sum, buckets) = s.upstream_times();
        assert_eq!(sum, 20_000_501);
        assert_eq!(
            (buckets[0], buckets[1], buckets[UPSTREAM_BOUNDS_US.len()]),
            (2, 1, 1)
        );
    }
}
