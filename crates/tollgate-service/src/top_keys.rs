//! The keys used most and rejected most, kept in bounded memory: Space-Saving
//! (Metwally, Agrawal and El Abbadi, 2005) in a few shards, so that two workers
//! rarely meet on one lock, over one decision in [`SAMPLE`] (each thread counts its
//! own): with more keys than it tracks, every key it meets afresh costs a scan of its
//! shard, and a decision should not pay that. A key's count is then an estimate (the
//! sampled count times `SAMPLE`), over by at most its `error`; a key used more than a
//! shard's share of `1/capacity` of the decisions is in the list.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

const SHARDS: usize = 8;

/// Keys tracked per shard and list: 8 x 64 x 2 entries at most, whatever the traffic.
pub const PER_SHARD: usize = 64;

/// One decision in this many is counted.
pub const SAMPLE: u32 = 16;

thread_local! {
    /// This thread's draws for the sampling (xorshift32): at random, not every
    /// `SAMPLE`th, since a request's descriptors are counted one after the other
    /// and a fixed stride would always land on the same one.
    static DRAW: std::cell::Cell<u32> = const { std::cell::Cell::new(0x9E37_79B9) };
}

/// One key's standing.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KeyCount {
    /// The counter key (the domain and the descriptor's entries).
    pub key: String,
    /// Decisions counted for it (an upper bound).
    pub count: u64,
    /// How much of `count` may belong to keys it displaced.
    pub error: u64,
}

#[derive(Default)]
struct SpaceSaving {
    counts: HashMap<Box<str>, (u64, u64)>,
}

impl SpaceSaving {
    fn add(&mut self, key: &str) {
        if let Some(c) = self.counts.get_mut(key) {
            c.0 += 1;
            return;
        }
        let mut error = 0;
        if self.counts.len() >= PER_SHARD {
            // The least counted key makes room; the newcomer inherits its count as
            // the bound on its error.
            let least = (self.counts.iter())
                .min_by_key(|(_, c)| c.0)
                .map(|(k, c)| (k.clone(), c.0));
            if let Some((k, n)) = least {
                self.counts.remove(&k);
                error = n;
            }
        }
        self.counts.insert(key.into(), (error + 1, error));
    }

    fn halve(&mut self) {
        self.counts.retain(|_, c| {
            *c = (c.0 / 2, c.1 / 2);
            c.0 > 0
        });
    }
}

#[derive(Default)]
struct Shard {
    used: SpaceSaving,
    rejected: SpaceSaving,
}

/// The keys used most and rejected most, recently (counts halve every
/// [`TopKeys::age`]).
pub struct TopKeys {
    shards: [Mutex<Shard>; SHARDS],
    hasher: RandomState,
    every: u32,
}

impl Default for TopKeys {
    fn default() -> Self {
        TopKeys::sampling(SAMPLE)
    }
}

impl TopKeys {
    /// Counting one decision in `every` (at least 1: each).
    pub fn sampling(every: u32) -> TopKeys {
        TopKeys {
            shards: Default::default(),
            hasher: RandomState::new(),
            every: every.max(1),
        }
    }

    /// Counts one decision on `key` (if it is the one in [`SAMPLE`] counted).
    pub fn record(&self, key: &str, rejected: bool) {
        let skip = self.every > 1
            && DRAW.with(|d| {
                let mut x = d.get();
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                d.set(x);
                x % self.every != 0
            });
        if skip {
            return;
        }
        let shard = self.hasher.hash_one(key) as usize % SHARDS;
        let mut s = self.shards[shard].lock().unwrap_or_else(|e| e.into_inner());
        s.used.add(key);
        if rejected {
            s.rejected.add(key);
        }
    }

    /// Halves every count, so that the lists follow what happens now.
    pub fn age(&self) {
        for s in &self.shards {
            let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
            s.used.halve();
            s.rejected.halve();
        }
    }

    /// The `n` keys used most and the `n` rejected most, most first.
    pub fn top(&self, n: usize) -> (Vec<KeyCount>, Vec<KeyCount>) {
        let (mut used, mut rejected) = (Vec::new(), Vec::new());
        for s in &self.shards {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            for (list, from) in [(&mut used, &s.used), (&mut rejected, &s.rejected)] {
                let n = u64::from(self.every);
                list.extend(from.counts.iter().map(|(k, &(count, error))| KeyCount {
                    key: k.to_string(),
                    count: count * n,
                    error: error * n,
                }));
            }
        }
        for list in [&mut used, &mut rejected] {
            list.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
            list.truncate(n);
        }
        (used, rejected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_keys_stay_listed_among_many_light_ones_and_memory_stays_bounded() {
        let top = TopKeys::sampling(1);
        for i in 0..100_000u64 {
            top.record(&format!("light-{i}"), false);
            if i % 10 == 0 {
                top.record("heavy-a", true);
            }
            if i % 20 == 0 {
                top.record("heavy-b", false);
            }
        }
        let (used, rejected) = top.top(5);
        assert_eq!(used[0].key, "heavy-a");
        assert!(used[0].count - used[0].error <= 10_000 && used[0].count >= 10_000);
        assert_eq!(used[1].key, "heavy-b");
        assert_eq!(rejected.len(), 1);
        assert_eq!(
            (rejected[0].key.as_str(), rejected[0].count),
            ("heavy-a", 10_000)
        );
        let tracked: usize = (top.shards.iter())
            .map(|s| s.lock().unwrap().used.counts.len())
            .sum();
        assert!(tracked <= SHARDS * PER_SHARD);
    }

    #[test]
    fn ageing_halves_and_forgets_what_falls_to_zero() {
        let top = TopKeys::sampling(1);
        for _ in 0..4 {
            top.record("a", false);
        }
        top.record("b", true);
        top.age();
        let (used, rejected) = top.top(10);
        assert_eq!(
            used,
            vec![KeyCount {
                key: "a".into(),
                count: 2,
                error: 0
            }]
        );
        assert!(rejected.is_empty());
    }

    #[test]
    fn sampled_counts_estimate_the_whole_and_every_position_of_a_request_is_seen() {
        let top = TopKeys::sampling(16);
        // Requests of two descriptors, counted back to back: both are sampled.
        for _ in 0..16_000 {
            top.record("first", false);
            top.record("second", false);
        }
        let (used, _) = top.top(2);
        for k in &used {
            assert!((12_000..20_000).contains(&k.count), "{k:?}");
        }
        assert_eq!(used.len(), 2);
    }
}
