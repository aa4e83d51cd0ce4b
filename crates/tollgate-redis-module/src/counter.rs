//! `TOLLGATE.COUNT`, pure: the window counters of the Redis store (a clock-aligned
//! fixed window whose debt is forgiven, one integer key per window, as
//! envoyproxy/ratelimit keeps its counters) changed in one command for a batch of
//! keys, where plain commands take an `INCRBY` and a `PEXPIRE` each. Reading and
//! writing goes through [`Counters`], so this file touches no Redis (`keys.rs` does).
//!
//! Arguments after the keys, four per key: `op cost limit ttl`, where `op` is
//!
//! | op | change | as the plain commands do it |
//! |---|---|---|
//! | `a` | adds `cost` whatever the count (Envoy's hits, a charge) | `INCRBY`, and `PEXPIRE` |
//! | `t` | adds `cost` if the count stays within `limit` | `lua/counter.lua` `t` |
//! | `r` | takes `cost` back, never below 0 | `lua/counter.lua` `r` |
//! | `g` | nothing (a look) | `GET` |
//!
//! `ttl` is the time to live in ms (to the window's end, plus the margin) of a key that a
//! count makes, or finds without one; a key that already has one keeps it. It is
//! relative, as the plain commands' `PEXPIRE`, so that the caller's clock need not
//! agree with the server's; the server replicates it as an absolute time. The answer is each key's count before its change, in
//! order (a key changed twice in one call answers the second time what the first left).

/// The op of one count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Try,
    Refund,
    Get,
}

/// One key's count in a call: its op, cost, limit and time to live (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    pub op: Op,
    pub cost: u64,
    pub limit: u64,
    pub ttl_ms: u64,
}

/// Argument `4 i + COST` (after the keys) is key `i`'s cost, as [`Counters`] names it
/// to the server (which stores and replicates that very string).
pub const COST: usize = 1;

/// The largest cost or count: a Redis integer is signed 64-bit.
const MAX: u64 = i64::MAX as u64;

/// A call's keys as counters.
pub trait Counters {
    /// Key `i`'s count (`None`: no key), or why it holds none.
    fn count(&mut self, i: usize) -> Result<Option<u64>, String>;
    /// Makes key `i` holding argument `arg` (a cost: its count), with a time to live
    /// of `ttl_ms`.
    fn make(&mut self, i: usize, arg: usize, ttl_ms: u64);
    /// Writes key `i`'s count `after`, argument `by_arg` more than before, and its
    /// time to live `ttl_ms` if it has none.
    fn raise(&mut self, i: usize, after: u64, by_arg: usize, ttl_ms: u64);
    /// Writes key `i`'s count `after`, `by` less than before.
    fn lower(&mut self, i: usize, after: u64, by: u64);
}

/// A `TOLLGATE.COUNT` call of `n_keys` keys: `args` are the arguments after them.
pub fn count(n_keys: usize, args: &[&[u8]], keys: &mut impl Counters) -> Result<Vec<i64>, String> {
    let counts = parse(n_keys, args)?;
    let mut before = Vec::with_capacity(n_keys);
    for (i, c) in counts.iter().enumerate() {
        let now = keys.count(i)?;
        let n = now.unwrap_or(0);
        let adds = match c.op {
            Op::Add => c.cost > 0,
            Op::Try => c.cost > 0 && n.checked_add(c.cost).is_some_and(|s| s <= c.limit),
            Op::Refund => {
                if n > 0 {
                    let by = c.cost.min(n);
                    keys.lower(i, n - by, by);
                }
                false
            }
            Op::Get => false,
        };
        if adds {
            let after = (n.checked_add(c.cost).filter(|&a| a <= MAX)).ok_or_else(|| {
                format!("key {}: a count of {n} plus {} passes 2^63", i + 1, c.cost)
            })?;
            match now {
                None => keys.make(i, 4 * i + COST, c.ttl_ms),
                Some(_) => keys.raise(i, after, 4 * i + COST, c.ttl_ms),
            }
        }
        before.push(i64::try_from(n).map_err(|_| format!("key {}: a count past 2^63", i + 1))?);
    }
    Ok(before)
}

/// The counts of a call, checked.
fn parse(n_keys: usize, args: &[&[u8]]) -> Result<Vec<Count>, String> {
    if Some(args.len()) != n_keys.checked_mul(4) {
        return Err(format!(
            "{n_keys} keys need {} arguments after them (op cost limit ttl each), not {}",
            n_keys.saturating_mul(4),
            args.len()
        ));
    }
    (args.chunks_exact(4).enumerate())
        .map(|(i, a)| {
            let op = match a[0] {
                b"a" => Op::Add,
                b"t" => Op::Try,
                b"r" => Op::Refund,
                b"g" => Op::Get,
                other => {
                    let w = String::from_utf8_lossy(other);
                    return Err(format!("key {}: unknown op {w:?} (a, t, r or g)", i + 1));
                }
            };
            let number = |w: &[u8], what: &str| {
                canonical(w).ok_or_else(|| {
                    let w = String::from_utf8_lossy(w);
                    format!("key {}: {what} should be a whole number below 2^63 without sign or leading zeros, not {w:?}", i + 1)
                })
            };
            Ok(Count {
                op,
                cost: number(a[COST], "a cost")?,
                limit: number(a[2], "a limit")?,
                ttl_ms: number(a[3], "a time to live")?,
            })
        })
        .collect()
}

/// A whole number below 2^63 written as Redis writes one (digits, no sign, no leading
/// zero), since a cost is stored and replicated as it was sent.
fn canonical(w: &[u8]) -> Option<u64> {
    if w.is_empty() || w.len() > 19 || (w[0] == b'0' && w.len() > 1) {
        return None;
    }
    // 19 digits fit in a u64; read in one pass (this runs four times a key).
    let mut n: u64 = 0;
    for &b in w {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(b - b'0');
    }
    (n <= MAX).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The server's time (ms) in these tests.
    const NOW: u64 = 1_764_000_000_000;

    /// Keys in a map: a count, its expiry, and what was replicated.
    #[derive(Default)]
    struct Map {
        names: Vec<&'static str>,
        args: Vec<&'static str>,
        values: HashMap<&'static str, (u64, Option<u64>)>,
        replicated: Vec<String>,
    }

    impl Counters for Map {
        fn count(&mut self, i: usize) -> Result<Option<u64>, String> {
            Ok(self.values.get(self.names[i]).map(|v| v.0))
        }
        fn make(&mut self, i: usize, arg: usize, ttl: u64) {
            let (name, value) = (self.names[i], self.args[arg]);
            self.values
                .insert(name, (value.parse().unwrap(), Some(NOW + ttl)));
            self.replicated
                .push(format!("SET {name} {value} PXAT {}", NOW + ttl));
        }
        fn raise(&mut self, i: usize, after: u64, by_arg: usize, ttl: u64) {
            let name = self.names[i];
            let v = self.values.get_mut(name).unwrap();
            v.0 = after;
            self.replicated
                .push(format!("INCRBY {name} {}", self.args[by_arg]));
            if v.1.is_none() {
                v.1 = Some(NOW + ttl);
                self.replicated
                    .push(format!("PEXPIREAT {name} {}", NOW + ttl));
            }
        }
        fn lower(&mut self, i: usize, after: u64, by: u64) {
            let name = self.names[i];
            self.values.get_mut(name).unwrap().0 = after;
            self.replicated.push(format!("DECRBY {name} {by}"));
        }
    }

    fn call(
        m: &mut Map,
        names: &[&'static str],
        args: &[&'static str],
    ) -> Result<Vec<i64>, String> {
        m.names = names.to_vec();
        m.args = args.to_vec();
        let words: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        count(names.len(), &words, m)
    }

    #[test]
    fn counts_change_as_the_plain_commands_would_and_replicate_as_effects() {
        let mut m = Map::default();
        let at = "2000";
        // A key made by a count, counted again in the same call, then looked at.
        let before = call(
            &mut m,
            &["w", "w", "w"],
            &["a", "3", "5", at, "a", "4", "5", at, "g", "0", "5", at],
        );
        assert_eq!(before.unwrap(), [0, 3, 7]);
        assert_eq!(m.values["w"], (7, Some(NOW + 2000)));
        assert_eq!(m.replicated, ["SET w 3 PXAT 1764000002000", "INCRBY w 4"]);
        // A try that does not fit changes nothing; one that fits adds.
        m.replicated.clear();
        let before = call(&mut m, &["w", "v"], &["t", "1", "7", at, "t", "2", "2", at]);
        assert_eq!(before.unwrap(), [7, 0]);
        assert_eq!(m.values["w"].0, 7);
        assert_eq!(m.values["v"].0, 2);
        assert_eq!(m.replicated, ["SET v 2 PXAT 1764000002000"]);
        m.replicated.clear();
        let before = call(&mut m, &["w"], &["t", "1", "7", at]);
        assert_eq!((before.unwrap(), m.values["w"].0), (vec![7], 7));
        // A refund never takes below 0, and of nothing changes nothing.
        let before = call(
            &mut m,
            &["w", "w", "n"],
            &["r", "5", "0", at, "r", "9", "0", at, "r", "1", "0", at],
        );
        assert_eq!(before.unwrap(), [7, 2, 0]);
        assert_eq!(m.values["w"].0, 0);
        assert!(!m.values.contains_key("n"));
        assert_eq!(m.replicated, ["DECRBY w 5", "DECRBY w 2"]);
        // A key found without a time to live gets one.
        m.values.insert("x", (1, None));
        m.replicated.clear();
        call(&mut m, &["x"], &["a", "1", "0", at]).unwrap();
        assert_eq!(m.values["x"], (2, Some(NOW + 2000)));
        assert_eq!(m.replicated, ["INCRBY x 1", "PEXPIREAT x 1764000002000"]);
        // A count of 0 makes no key.
        call(&mut m, &["z"], &["a", "0", "0", at]).unwrap();
        assert!(!m.values.contains_key("z"));
    }

    #[test]
    fn bad_arguments_are_named() {
        let mut m = Map::default();
        let at = "2000";
        for (args, says) in [
            (vec!["a", "1", "5"], "1 keys need 4 arguments"),
            (vec!["x", "1", "5", at], "unknown op \"x\""),
            (vec!["a", "01", "5", at], "a cost should be a whole number"),
            (vec!["a", "+1", "5", at], "a cost should be a whole number"),
            (vec!["a", "1", "-5", at], "a limit should be a whole number"),
            (
                vec!["a", "1", "5", "9223372036854775808"],
                "a time to live should be",
            ),
            (vec!["a", "", "5", at], "a cost should be"),
        ] {
            let e = call(&mut m, &["k"], &args).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
        assert!(m.values.is_empty());
        // A count that would pass 2^63 is refused, and changes nothing.
        m.values.insert("big", (MAX, Some(1)));
        let e = call(&mut m, &["big"], &["a", "1", "0", at]).unwrap_err();
        assert!(e.contains("passes 2^63"), "{e}");
        assert_eq!(m.values["big"].0, MAX);
    }
}
