//! Each algorithm's state as text: the strings a shared store keeps under a key (the
//! Redis store's Lua code and the tollgate Redis module read and write exactly these),
//! parsed back into the state the algorithm decides on. Pure: no store is touched here.
//!
//! ```
//! use tollgate_core::{Op, Policy};
//! let p: Policy = "fixed-window:limit=5,window=1s".parse().unwrap();
//! let mut s = p.parse_state("", 0).unwrap(); // no text yet: a state made at 0
//! p.check(&mut s, 10, 2, Op::Try).unwrap();
//! assert_eq!(p.encode_state(&s).as_deref(), Some("0 2"));
//! assert_eq!(p.parse_state("0 2", 0).unwrap(), s);
//! ```

use std::collections::VecDeque;
use std::fmt::{self, Write};

use crate::algorithms::*;
use crate::{Algorithm, Policy, PolicyState};

/// A stored state string that is not one of its algorithm's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateError(pub String);

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StateError {}

/// An algorithm whose state a shared store keeps as text.
pub trait StoredState: Algorithm {
    /// Whether a store keeps the whole state as one string ([`StoredState::encode_state`]
    /// gives it): what a store can read and write with one `GET` and one `SET`.
    const ONE_STRING: bool = false;

    /// The state a non-empty stored string holds.
    fn parse_state(&self, s: &str) -> Result<Self::State, StateError>;

    /// Appends the string kept for `state` to `out` (the inverse of `parse_state`;
    /// nothing: a state as new, kept as no key), where a store keeps it as one string
    /// (`false`: kept otherwise, such as sliding-log's sorted set, or not kept in a
    /// store at all). A store's hot path writes into a buffer it reuses.
    fn write_state(&self, _state: &Self::State, _out: &mut String) -> bool {
        false
    }

    /// The string kept for `state` ([`StoredState::write_state`] into a new string).
    fn encode_state(&self, state: &Self::State) -> Option<String> {
        let mut s = String::new();
        self.write_state(state, &mut s).then_some(s)
    }
}

macro_rules! dispatch {
    ($($v:ident($t:ty, $s:ty) = $code:literal, $name:literal, $what:literal;)*) => {
        impl crate::AlgorithmKind {
            /// Whether a store keeps this algorithm's state as one string (see
            /// [`StoredState::ONE_STRING`]).
            pub fn state_is_one_string(self) -> bool {
                match self {
                    $(crate::AlgorithmKind::$v => <$t as StoredState>::ONE_STRING,)*
                }
            }
        }

        impl Policy {
            /// The state a store's string holds for this policy (`""`: a key without
            /// state, made at `created`).
            pub fn parse_state(&self, s: &str, created: u64) -> Result<PolicyState, StateError> {
                if s.is_empty() {
                    return Ok(self.init(created));
                }
                Ok(match self.algorithm() {
                    $(crate::AnyAlgorithm::$v(a) => PolicyState::$v(a.parse_state(s)?),)*
                })
            }

            /// `state` as a store keeps it for this policy, where one string holds it.
            pub fn encode_state(&self, state: &PolicyState) -> Option<String> {
                let mut s = String::new();
                self.write_state(state, &mut s).then_some(s)
            }

            /// Appends `state` as a store keeps it for this policy to `out`, where one
            /// string holds it (`false` where not: see [`StoredState::write_state`]).
            pub fn write_state(&self, state: &PolicyState, out: &mut String) -> bool {
                match (self.algorithm(), state) {
                    $((crate::AnyAlgorithm::$v(a), PolicyState::$v(s)) => a.write_state(s, out),)*
                    _ => false,
                }
            }
        }
    };
}

crate::with_algorithms!(dispatch);

/// The numbers of a state string.
fn nums<T: std::str::FromStr>(s: &str) -> Result<Vec<T>, StateError> {
    s.split_ascii_whitespace().map(|w| num(w, s)).collect()
}

/// One number `w` of the state string `s`.
fn num<T: std::str::FromStr>(w: &str, s: &str) -> Result<T, StateError> {
    (w.parse()).map_err(|_| StateError(format!("bad number {w:?} in state {s:?}")))
}

/// Exactly `N` numbers of a state string (read without a vector: a store's hot path
/// parses one state per key per decision).
fn exactly<const N: usize, T: std::str::FromStr + Copy + Default>(
    s: &str,
) -> Result<[T; N], StateError> {
    let mut out = [T::default(); N];
    let mut n = 0;
    for w in s.split_ascii_whitespace() {
        let v = num(w, s)?;
        if let Some(slot) = out.get_mut(n) {
            *slot = v;
        }
        n += 1;
    }
    if n != N {
        return Err(StateError(format!("state {s:?} should have {N} numbers")));
    }
    Ok(out)
}

/// Ticks `us * scale + frac` as the core keeps them.
fn ticks(us: u64, frac: u64, scale: u64) -> u64 {
    u64::try_from(u128::from(us) * u128::from(scale) + u128::from(frac)).unwrap_or(u64::MAX)
}

/// "us" or "us frac": ticks as whole microseconds and the ticks past them.
fn write_ticks(t: u64, scale: u64, out: &mut String) -> bool {
    let (us, frac) = (t / scale, t % scale);
    if frac == 0 {
        write!(out, "{us}").is_ok()
    } else {
        write!(out, "{us} {frac}").is_ok()
    }
}

impl StoredState for Gcra {
    const ONE_STRING: bool = true;

    /// "us" or "us frac" (ticks past the microsecond).
    fn parse_state(&self, s: &str) -> Result<GcraState, StateError> {
        let mut w = s.split_ascii_whitespace();
        let (us, frac) = match (w.next(), w.next(), w.next()) {
            (Some(us), None, None) => (num(us, s)?, 0),
            (Some(us), Some(frac), None) => (num(us, s)?, num(frac, s)?),
            _ => return Err(StateError(format!("bad gcra state {s:?}"))),
        };
        Ok(GcraState {
            tat: ticks(us, frac, self.rate().scale()),
        })
    }

    fn write_state(&self, g: &GcraState, out: &mut String) -> bool {
        write_ticks(g.tat, self.rate().scale(), out)
    }
}

impl StoredState for TokenBucket {
    const ONE_STRING: bool = true;

    /// "tokens last".
    fn parse_state(&self, s: &str) -> Result<TokenBucketState, StateError> {
        let [tokens, last] = exactly::<2, i64>(s)?;
        Ok(TokenBucketState {
            tokens,
            last: last as u64,
        })
    }

    fn write_state(&self, t: &TokenBucketState, out: &mut String) -> bool {
        write!(out, "{} {}", t.tokens, t.last).is_ok()
    }
}

impl StoredState for LeakyBucket {
    const ONE_STRING: bool = true;

    /// "level last".
    fn parse_state(&self, s: &str) -> Result<LeakyBucketState, StateError> {
        let [level, last] = exactly::<2, i64>(s)?;
        Ok(LeakyBucketState {
            level,
            last: last as u64,
        })
    }

    fn write_state(&self, l: &LeakyBucketState, out: &mut String) -> bool {
        write!(out, "{} {}", l.level, l.last).is_ok()
    }
}

impl StoredState for FixedWindow {
    const ONE_STRING: bool = true;

    /// "start count".
    fn parse_state(&self, s: &str) -> Result<FixedWindowState, StateError> {
        let [start, count] = exactly(s)?;
        Ok(FixedWindowState { start, count })
    }

    fn write_state(&self, w: &FixedWindowState, out: &mut String) -> bool {
        write!(out, "{} {}", w.start, w.count).is_ok()
    }
}

impl StoredState for SlidingLog {
    /// "ts cost ts cost ...": a store keeps one member per admission (a sorted
    /// set); the core merges equal times.
    fn parse_state(&self, s: &str) -> Result<SlidingLogState, StateError> {
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

impl StoredState for SlidingWindow {
    const ONE_STRING: bool = true;

    /// "newest total count count ...".
    fn parse_state(&self, s: &str) -> Result<SlidingWindowState, StateError> {
        let v: Vec<u64> = nums(s)?;
        if v.len() as u64 != self.buckets() + 2 {
            return Err(StateError(format!(
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

    /// A state with no buckets yet (as new) is kept as no key at all: `""`.
    fn write_state(&self, w: &SlidingWindowState, out: &mut String) -> bool {
        if w.counts.is_empty() {
            return true;
        }
        let _ = write!(out, "{} {}", w.newest, w.total);
        (w.counts.iter()).all(|c| write!(out, " {c}").is_ok())
    }
}

impl StoredState for SlidingWindowWeighted {
    const ONE_STRING: bool = true;

    /// "win prev curr".
    fn parse_state(&self, s: &str) -> Result<WeightedState, StateError> {
        let [win, prev, curr] = exactly(s)?;
        Ok(WeightedState { win, prev, curr })
    }

    fn write_state(&self, w: &WeightedState, out: &mut String) -> bool {
        write!(out, "{} {} {}", w.win, w.prev, w.curr).is_ok()
    }
}

impl StoredState for Smooth {
    const ONE_STRING: bool = true;

    /// "stored next_free": the stored permits a double, written in the shortest form
    /// that reads back to the same double (the Lua code writes 17 digits; both read
    /// back alike).
    fn parse_state(&self, s: &str) -> Result<SmoothState, StateError> {
        let (stored, next) =
            (s.split_once(' ')).ok_or_else(|| StateError(format!("bad smooth state {s:?}")))?;
        Ok(SmoothState {
            stored: (stored.parse())
                .map_err(|_| StateError(format!("bad stored permits {stored:?}")))?,
            next_free: exactly::<1, u64>(next)?[0],
        })
    }

    fn write_state(&self, s: &SmoothState, out: &mut String) -> bool {
        write!(out, "{} {}", s.stored, s.next_free).is_ok()
    }
}

impl StoredState for LimitReq {
    const ONE_STRING: bool = true;

    /// "last_ms excess".
    fn parse_state(&self, s: &str) -> Result<LimitReqState, StateError> {
        let [last_ms, excess] = exactly::<2, i64>(s)?;
        Ok(LimitReqState {
            last_ms: last_ms as u64,
            excess,
        })
    }

    fn write_state(&self, s: &LimitReqState, out: &mut String) -> bool {
        write!(out, "{} {}", s.last_ms, s.excess).is_ok()
    }
}

impl StoredState for Shaper {
    const ONE_STRING: bool = true;

    /// "last_us last_frac pending ...".
    fn parse_state(&self, s: &str) -> Result<ShaperState, StateError> {
        let v: Vec<u64> = nums(s)?;
        if v.len() < 2 {
            return Err(StateError(format!("bad shaper state {s:?}")));
        }
        Ok(ShaperState {
            last: Some(ticks(v[0], v[1], self.rate().scale())),
            pending: v[2..].iter().copied().collect(),
        })
    }

    /// Nothing before the first admission (kept as no key).
    fn write_state(&self, s: &ShaperState, out: &mut String) -> bool {
        let Some(last) = s.last else {
            return true;
        };
        let scale = self.rate().scale();
        let _ = write!(out, "{} {}", last / scale, last % scale);
        (s.pending.iter()).all(|r| write!(out, " {r}").is_ok())
    }
}

impl StoredState for Concurrency {
    /// Permits are kept as leases of their own, never as one state string.
    fn parse_state(&self, s: &str) -> Result<ConcurrencyState, StateError> {
        Err(StateError(format!("no concurrency state as text: {s:?}")))
    }
}

#[cfg(test)]
mod tests {
    use crate::{Op, Policy};

    /// Every algorithm a store keeps as one string gives back what it was given.
    #[test]
    fn a_state_read_back_from_its_text_is_the_same_state() {
        for spec in [
            "gcra:rate=7/s,burst=3",
            "token-bucket:rate=5/s,capacity=9",
            "leaky-bucket:rate=3/s",
            "fixed-window:limit=4,window=1s",
            "sliding-window:limit=6,window=1s,buckets=4",
            "sliding-window:limit=6,window=1s",
            "smooth-bursty:rate=3/s",
            "smooth-warmup:rate=7/s,warmup=2s",
            "limit-req:rate=3/s,burst=2",
            "shaper:rate=3/s,queue=4",
        ] {
            let p: Policy = spec.parse().unwrap();
            assert!(p.algorithm().kind().state_is_one_string(), "{spec}");
            let mut s = p.init(1_000);
            for t in [1_000, 1_001, 150_003, 700_000] {
                let _ = p.check(&mut s, t, 1, Op::Try).unwrap();
                let text = p.encode_state(&s).expect(spec);
                assert_eq!(p.parse_state(&text, 0).unwrap(), s, "{spec}: {text}");
            }
        }
    }

    #[test]
    fn a_bad_state_string_says_what_is_wrong() {
        let p: Policy = "fixed-window:limit=4,window=1s".parse().unwrap();
        let e = p.parse_state("1 x", 0).unwrap_err();
        assert_eq!(e.0, "bad number \"x\" in state \"1 x\"");
        let e = p.parse_state("1 2 3", 0).unwrap_err();
        assert_eq!(e.0, "state \"1 2 3\" should have 2 numbers");
    }
}
