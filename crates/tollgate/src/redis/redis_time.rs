//! Redis's clock for the window counters (`counter.rs`), whose plain commands cannot
//! read `TIME` themselves: each node's `TIME` is read once, then followed with this
//! process's monotonic clock and read again every [`REFRESH_US`]. So the windows of
//! every instance on one Redis cut where Redis's clock says, as the scripts' do,
//! whatever the instances' own wall clocks say: within half a round trip of `TIME`,
//! plus what the local clock drifts in [`REFRESH_US`] (tens of microseconds). A read
//! whose round trip is much longer than the one the offset came from (it queued behind
//! other calls on the connection, so halfway is a worse guess) keeps that offset while
//! it is under [`KEEP_US`] old.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use tollgate_core::{Clock, MonotonicClock};

use super::per_node::PerNode;

/// How long an offset is used before `TIME` is read again.
pub(crate) const REFRESH_US: u64 = 10_000_000;
/// How long an offset from a quick read is kept over reads that took much longer.
pub(crate) const KEEP_US: u64 = 60_000_000;

/// Each node's clock, as an offset from this process's.
#[derive(Default)]
pub(crate) struct RedisClocks {
    local: MonotonicClock,
    nodes: PerNode<NodeClock>,
}

#[derive(Default)]
struct NodeClock {
    /// Redis's time minus the local time (us).
    offset_us: AtomicI64,
    /// Local time the offset was learned at, or last confirmed (0: never).
    learned_at: AtomicU64,
    /// The round trip of the read the offset came from, and when it was read.
    rtt_us: AtomicU64,
    measured_at: AtomicU64,
}

impl RedisClocks {
    /// This process's clock (us since the epoch).
    pub fn local_us(&self) -> u64 {
        self.local.now_us()
    }

    /// Node `node`'s time now (us since the epoch), by its last offset, and whether
    /// the caller should read its `TIME` (never read yet, or due again: then one
    /// caller is told so, and the others go on with the last offset meanwhile).
    pub fn now(&self, node: usize) -> (Option<u64>, bool) {
        let c = self.nodes.get(node, NodeClock::default);
        let learned = c.learned_at.load(Ordering::Acquire);
        let local = self.local_us();
        if learned == 0 {
            return (None, true);
        }
        let now = local.saturating_add_signed(c.offset_us.load(Ordering::Relaxed));
        let due = local.saturating_sub(learned) >= REFRESH_US
            && (c.learned_at)
                .compare_exchange(learned, local.max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
        (Some(now), due)
    }

    /// Learns node `node`'s clock from its `TIME` answer `redis_us`, asked at local
    /// time `sent` and answered at `received`: Redis read it, at best guess, halfway
    /// (unless the offset in use came from a much quicker read, under [`KEEP_US`]
    /// ago). Returns the node's time now.
    pub fn learn(&self, node: usize, sent: u64, received: u64, redis_us: u64) -> u64 {
        let c = self.nodes.get(node, NodeClock::default);
        let rtt = received.saturating_sub(sent);
        let known = c.measured_at.load(Ordering::Acquire);
        let keep = known != 0
            && received.saturating_sub(known) < KEEP_US
            && rtt > 2 * c.rtt_us.load(Ordering::Relaxed) + 100;
        if !keep {
            let mid = sent + rtt / 2;
            let offset = i64::try_from(i128::from(redis_us) - i128::from(mid)).unwrap_or(0);
            c.offset_us.store(offset, Ordering::Relaxed);
            c.rtt_us.store(rtt, Ordering::Relaxed);
            c.measured_at.store(received.max(1), Ordering::Release);
        }
        c.learned_at.store(received.max(1), Ordering::Release);
        received.saturating_add_signed(c.offset_us.load(Ordering::Relaxed))
    }
}

/// `TIME`'s answer (seconds and microseconds, as strings) in us since the epoch.
pub(crate) fn time_us(value: &redis::Value) -> Option<u64> {
    let redis::Value::Array(parts) = value else {
        return None;
    };
    let number = |v: &redis::Value| -> Option<u64> {
        match v {
            redis::Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            redis::Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        }
    };
    match parts.as_slice() {
        [s, us] => number(s)?.checked_mul(1_000_000)?.checked_add(number(us)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_clock_is_its_time_read_halfway_then_followed_until_one_caller_reads_it_again() {
        let clocks = RedisClocks::default();
        assert_eq!(clocks.now(0), (None, true));
        let local = clocks.local_us();
        // Redis 3 hours ahead, read over a 100 us round trip.
        let ahead = 3 * 3_600_000_000;
        let now = clocks.learn(0, local - 100, local, local - 50 + ahead);
        assert_eq!(now, local + ahead);
        let (later, due) = clocks.now(0);
        let later = later.unwrap();
        assert!(!due && later >= local + ahead && later < local + ahead + 1_000_000);
        // Another node has its own clock.
        assert_eq!(clocks.now(1), (None, true));
        // Due again after REFRESH_US: one caller is told to read it, the next goes on
        // with the last offset.
        clocks.learn(
            0,
            local - REFRESH_US - 1,
            local - REFRESH_US,
            local - REFRESH_US,
        );
        let (first, due) = clocks.now(0);
        assert!(due && first.is_some());
        let (second, due) = clocks.now(0);
        assert!(!due && second.is_some());
    }

    #[test]
    fn a_slow_read_keeps_the_offset_of_a_quick_one_for_a_minute() {
        let clocks = RedisClocks::default();
        let t = clocks.local_us();
        // A quick read: Redis 1 s ahead, 100 us round trip.
        clocks.learn(0, t - 100, t, t - 50 + 1_000_000);
        // A read that queued 10 ms says 5 ms less: the quick one's offset stays.
        let now = clocks.learn(0, t - 10_000, t, t - 5_000 + 995_000);
        assert_eq!(now, t + 1_000_000);
        // A read a minute later replaces it, however slow.
        let later = t + KEEP_US;
        let now = clocks.learn(0, later - 10_000, later, later - 5_000 + 995_000);
        assert_eq!(now, later + 995_000);
    }

    #[test]
    fn time_reads_seconds_and_microseconds() {
        let v = redis::Value::Array(vec![
            redis::Value::BulkString(b"1764806400".to_vec()),
            redis::Value::BulkString(b"123456".to_vec()),
        ]);
        assert_eq!(time_us(&v), Some(1_764_806_400_123_456));
        assert_eq!(time_us(&redis::Value::Nil), None);
    }
}
