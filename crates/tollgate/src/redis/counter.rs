//! The window counter: a `fixed-window` policy with `align=clock` and `debt=forgive`
//! kept as envoyproxy/ratelimit keeps its counters, one integer key per window, so
//! that counting costs Redis what it costs envoyproxy/ratelimit: `INCRBY` and
//! `PEXPIRE`, plain commands, pipelined, no script.
//!
//! Opt-in ([`RedisLimiterOptions::window_counters`](super::RedisLimiterOptions)): the
//! keys differ from the scripts' (`...:0.<code>@<window length>/<window start>`, in
//! us), the window is cut by the node's clock as the process follows it
//! (`redis_time.rs`: its `TIME` every 10 s, within half a round trip), and acquire,
//! which reserves later windows, is refused. On a Cluster a batch's commands go as one
//! `MULTI`/`EXEC` (see `connection.rs`).
//!
//! Every operation returns the count the window held before it, and the Rust core
//! decides from that state exactly as it decides in memory:
//!
//! | operation | commands |
//! |---|---|
//! | count or charge of `c` (Envoy's hits) | `INCRBY key c`, and `PEXPIRE key ttl` unless the key is known to have its time to live |
//! | look, peek, a count or charge of 0 | `GET key` |
//! | try of `c` (all or nothing) | `lua/counter.lua`: `GET`, and `INCRBY` + `PEXPIRE` if it fits |
//! | refund of `c` | `lua/counter.lua`: `GET`, `DECRBY` never below 0 |
//!
//! A window's key is known to have its time to live ([`Expiring`]) once this process
//! set it (its `PEXPIRE` answered). So a key counted many times in a window costs one
//! command a hit, not two (envoyproxy/ratelimit sends both every time). A key that
//! was deleted meanwhile (a reset, an eviction) is made again by the `INCRBY` alone;
//! its answer says so (nothing counted before), and its `PEXPIRE` follows from a task
//! of its own, sent again until Redis answers. A call whose answers are lost sends
//! the `PEXPIRE` of every key it counted without one the same way, and forgets every
//! key it knew (see `Unexpired` in `connection.rs`).
//!
//! A count is never capped (a policy with `max-debt` does not qualify), where the
//! memory store caps it at the limit plus 2^40: only refunds of over 2^40 units after
//! charges past that cap could tell the two apart.

use std::collections::HashMap;
use std::sync::Mutex;

use redis::{Pipeline, Value};
use tollgate_core::algorithms::{Align, Debt};
use tollgate_core::{AnyAlgorithm, RuleSet};

use crate::Error;

const SCRIPT: &str = include_str!("../../lua/counter.lua");

/// The parameters of a rule set kept as window counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowCounter {
    limit: u64,
    window: u64,
    margin_ms: u64,
    /// A shadow policy reports a reject as admitted (and counts nothing for it).
    shadow: bool,
}

impl WindowCounter {
    /// The counter of `rules` when it is one `fixed-window` aligned on the clock whose
    /// debt is forgiven and uncapped; `None` otherwise.
    pub fn of(rules: &RuleSet, margin_ms: u64) -> Option<WindowCounter> {
        let [p] = rules.policies() else { return None };
        match p.algorithm() {
            AnyAlgorithm::FixedWindow(w)
                if w.align() == Align::Clock
                    && w.debt() == Debt::Forgive
                    && p.max_debt().is_none() =>
            {
                Some(WindowCounter {
                    limit: w.limit_per_window(),
                    window: w.window_us(),
                    margin_ms,
                    shadow: p.shadow(),
                })
            }
            _ => None,
        }
    }

    /// The start (us) of the window `now` is in.
    pub fn start(&self, now: u64) -> u64 {
        now - now % self.window
    }

    /// The key of the window `now` is in, from the policy's state key: it names the
    /// window's length and start (us), so a reload that changes the length starts
    /// afresh, as the memory store does.
    pub fn key(&self, base: &str, now: u64) -> String {
        format!("{base}@{}/{}", self.window, self.start(now))
    }

    /// The time to live (ms) of the key of the window `now` is in, as the scripts
    /// give a state: until the window's end, plus 1 ms, plus the margin. Relative, so
    /// that Redis's clock need not agree with this one.
    pub fn ttl_ms(&self, now: u64) -> u64 {
        (self.end(now) - now) / 1000 + 1 + self.margin_ms
    }

    /// The end (us) of the window `now` is in.
    pub fn end(&self, now: u64) -> u64 {
        self.start(now) + self.window
    }
}

/// What one check does to a window counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Adds its cost whatever the count (Envoy's counting, a charge).
    Add,
    /// Adds its cost if it fits within the limit.
    Try,
    /// Takes its cost back, never below 0.
    Refund,
    /// Changes nothing (a look, a peek, a count of 0).
    Read,
}

impl Change {
    /// Whether `self` of `cost` is a plain `INCRBY` (a count or charge of more than 0).
    pub fn increments(self, cost: u64) -> bool {
        self == Change::Add && cost > 0
    }
}

impl WindowCounter {
    /// Appends the commands of `change` of `cost` at `now` to the window's `key`;
    /// `expire`: whether a count sets the key's time to live.
    pub fn push(
        &self,
        pipe: &mut Pipeline,
        key: &str,
        (change, cost, now): (Change, u64, u64),
        expire: bool,
    ) {
        match change {
            _ if change.increments(cost) => {
                pipe.cmd("INCRBY").arg(key).arg(cost);
                if expire {
                    self.push_expire(pipe, key, now);
                }
            }
            Change::Try | Change::Refund => {
                let op = if change == Change::Try { "t" } else { "r" };
                pipe.cmd("EVAL")
                    .arg(SCRIPT)
                    .arg(1)
                    .arg(key)
                    .arg(op)
                    .arg(cost)
                    .arg(self.limit)
                    .arg(self.ttl_ms(now));
            }
            Change::Add | Change::Read => {
                pipe.cmd("GET").arg(key);
            }
        }
    }

    /// Appends the `PEXPIRE` of the window's `key` at `now` (its answer ignored).
    pub fn push_expire(&self, pipe: &mut Pipeline, key: &str, now: u64) {
        pipe.cmd("PEXPIRE").arg(key).arg(self.ttl_ms(now)).ignore();
    }

    /// What the decision driver would have answered for `change` of `cost` at `now`,
    /// from its command's answer `value`: whether it admitted, the count the window
    /// held before, and that as the driver's state (`"start count"`, or none).
    pub fn reply(
        &self,
        change: Change,
        cost: u64,
        now: u64,
        value: Value,
    ) -> Result<(bool, u64, Value), Error> {
        let bad = |what: &str| Error::Store(format!("window counter reply: {what}"));
        let count = match value {
            Value::Nil => 0,
            Value::Int(n) => u64::try_from(n).map_err(|_| bad("negative count"))?,
            Value::BulkString(b) => std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("count is not a number"))?,
            other => return Err(bad(&format!("unexpected {other:?}"))),
        };
        let before = match change.increments(cost) {
            true => count
                .checked_sub(cost)
                .ok_or_else(|| bad("count below the charge"))?,
            false => count,
        };
        let admitted = change != Change::Try || self.shadow || before + cost <= self.limit;
        let state = if before == 0 {
            Value::Nil
        } else {
            Value::BulkString(format!("{} {before}", self.start(now)).into_bytes())
        };
        Ok((admitted, before, state))
    }
}

/// The most window keys [`Expiring`] keeps; past it, those of ended windows go, and
/// if that is not enough, all (their counts then send `PEXPIRE` again).
const EXPIRING_MAX: usize = 1 << 16;

/// Window keys known to have their time to live, each until its window's end (us,
/// the node's clock as the counters follow it).
#[derive(Default)]
pub(crate) struct Expiring {
    keys: Mutex<HashMap<String, u64>>,
}

impl Expiring {
    /// For each of `keys` at `now`: whether it is known to have its time to live.
    pub fn known(&self, keys: &[String], now: u64) -> Vec<bool> {
        let map = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        (keys.iter())
            .map(|k| map.get(k).is_some_and(|&end| end > now))
            .collect()
    }

    /// Remembers `key` as having its time to live until `end`.
    pub fn learn(&self, key: String, end: u64, now: u64) {
        let mut map = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= EXPIRING_MAX {
            map.retain(|_, &mut e| e > now);
            if map.len() >= EXPIRING_MAX / 2 {
                map.clear();
            }
        }
        map.insert(key, end);
    }

    /// Forgets every key: their next counts set their time to live again.
    pub fn clear(&self) {
        self.keys.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(spec: &str) -> Option<WindowCounter> {
        WindowCounter::of(&RuleSet::parse(&[spec]).unwrap(), 1000)
    }

    #[test]
    fn only_a_lone_clock_aligned_forgiving_uncapped_fixed_window_is_a_counter() {
        let c = counter("fixed-window:limit=5,window=1s,debt=forgive").unwrap();
        assert_eq!((c.limit, c.window), (5, 1_000_000));
        assert_eq!(c.start(1_763_000_000_123_456), 1_763_000_000_000_000);
        // 876.544 ms to the window's end (whole ms: 876); + 1 ms; + the 1 s margin.
        assert_eq!(c.ttl_ms(1_763_000_000_123_456), 1877);
        for other in [
            "fixed-window:limit=5,window=1s",
            "fixed-window:limit=5,window=1s,debt=forgive,align=first",
            "fixed-window:limit=5,window=1s,debt=forgive,max-debt=3",
            "gcra:rate=5/s,burst=5",
        ] {
            assert_eq!(counter(other), None, "{other}");
        }
        let two = RuleSet::parse(&[
            "fixed-window:limit=5,window=1s,debt=forgive",
            "fixed-window:limit=50,window=1m,debt=forgive",
        ])
        .unwrap();
        assert_eq!(WindowCounter::of(&two, 0), None);
    }
}
