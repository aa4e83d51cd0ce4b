//! The parameters of a policy spec (`key=value,...`) as each algorithm reads them,
//! and [`Spec`]: what an algorithm implements beside its state machine so that the
//! list of algorithms can parse, print, share and carry over its policies.

use std::fmt;

use crate::algorithm::Algorithm;
use crate::units::{parse_duration, Rate, MAX_COUNT};

/// The `key=value` pairs of one spec, consumed as the algorithm reads them. Shared by
/// policy specs and adaptive controller specs (`crate::adaptive`).
pub(crate) struct Params<'a> {
    algo: &'static str,
    pairs: Vec<(&'a str, Option<&'a str>)>,
    /// `margin=`'s microseconds, added to every rate's period and every sliding
    /// window the algorithm reads (see [`Params::take_margin`]).
    margin_us: u64,
}

pub(crate) type Res<T> = Result<T, String>;

impl<'a> Params<'a> {
    /// Splits `body` into pairs, refusing a key not in `known` or given twice.
    pub(crate) fn parse(algo: &'static str, known: &[&str], body: &'a str) -> Res<Self> {
        let mut pairs: Vec<(&str, Option<&str>)> = Vec::new();
        for part in body.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = match part.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (part, None),
            };
            if !known.contains(&key) {
                return Err(format!(
                    "{algo}: unknown parameter '{key}' (expected one of: {})",
                    known.join(", ")
                ));
            }
            if pairs.iter().any(|(k, _)| *k == key) {
                return Err(format!("{algo}: parameter '{key}' is given twice"));
            }
            pairs.push((key, value));
        }
        Ok(Params {
            algo,
            pairs,
            margin_us: 0,
        })
    }

    /// Reads `margin=<duration>`: from then on [`Params::rate`] and
    /// [`Params::window`] answer with the margin added to the period and the window,
    /// so arrivals up to `margin` later than their admissions still fit the window
    /// the policy names (docs/semantics.md). A spelling of the wider policy, nothing
    /// more: it prints as that policy (`rate=5/s,margin=10ms` is `rate=5/1010ms`), and
    /// every store decides it as it decides any other. A rate's period widens to a
    /// whole number of microseconds per unit (see [`Params::rate`]).
    pub(crate) fn take_margin(&mut self) -> Res<u64> {
        if let Some(v) = self.value("margin")? {
            self.margin_us = self.duration_of("margin", v)?;
        }
        Ok(self.margin_us)
    }

    /// `d` widened by the margin.
    fn widened(&self, key: &str, d: u64) -> Res<u64> {
        d.checked_add(self.margin_us)
            .ok_or_else(|| format!("{}: {key} plus margin is too long", self.algo))
    }

    fn raw(&self, key: &str) -> Option<Option<&'a str>> {
        self.pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    pub(crate) fn value(&self, key: &str) -> Res<Option<&'a str>> {
        match self.raw(key) {
            None => Ok(None),
            Some(Some(v)) if !v.is_empty() => Ok(Some(v)),
            Some(_) => Err(format!(
                "{}: parameter '{key}' needs a value ({key}=...)",
                self.algo
            )),
        }
    }

    pub(crate) fn required(&self, key: &str, example: &str) -> Res<&'a str> {
        self.value(key)?.ok_or_else(|| {
            format!(
                "{}: missing parameter '{key}' (e.g. {key}={example})",
                self.algo
            )
        })
    }

    pub(crate) fn bad(&self, key: &str, value: &str, expected: &str) -> String {
        format!("{}: bad value '{value}' for '{key}': {expected}", self.algo)
    }

    pub(crate) fn count_of(&self, key: &str, v: &str) -> Res<u64> {
        let n: u64 = v
            .parse()
            .map_err(|_| self.bad(key, v, "expected a whole number"))?;
        if n > MAX_COUNT {
            return Err(self.bad(key, v, &format!("at most {MAX_COUNT}")));
        }
        Ok(n)
    }

    pub(crate) fn count(&self, key: &str, example: &str) -> Res<u64> {
        let v = self.required(key, example)?;
        self.count_of(key, v)
    }

    pub(crate) fn count_or(&self, key: &str, default: u64) -> Res<u64> {
        self.value(key)?
            .map_or(Ok(default), |v| self.count_of(key, v))
    }

    pub(crate) fn duration_of(&self, key: &str, v: &str) -> Res<u64> {
        parse_duration(v).map_err(|e| self.bad(key, v, &e))
    }

    pub(crate) fn duration(&self, key: &str, example: &str) -> Res<u64> {
        let v = self.required(key, example)?;
        self.duration_of(key, v)
    }

    /// `rate=`, its period widened by the margin and then to a whole number of
    /// microseconds per unit. Guava's arithmetic truncates each reservation's time to
    /// whole microseconds, losing up to 1 us a unit, which would take back a margin
    /// of a few microseconds: there, one more microsecond a unit.
    pub(crate) fn rate(&self) -> Res<Rate> {
        let v = self.required("rate", "10/s")?;
        let r = Rate::parse(v).map_err(|e| self.bad("rate", v, &e))?;
        if self.margin_us == 0 {
            return Ok(r);
        }
        let truncated = if self.algo.starts_with("smooth-") {
            r.count
        } else {
            0
        };
        let period = (self.widened("rate", r.period_us)?.checked_add(truncated))
            .and_then(|p| p.checked_next_multiple_of(r.count))
            .ok_or_else(|| format!("{}: rate plus margin is too slow", self.algo))?;
        Rate::new(r.count, period).map_err(|e| self.bad("rate", v, &e))
    }

    /// `window=` of a sliding window, widened by the margin.
    pub(crate) fn window(&self) -> Res<u64> {
        let w = self.duration("window", "1s")?;
        self.widened("window", w)
    }

    pub(crate) fn flag(&self, key: &str) -> Res<bool> {
        match self.raw(key) {
            None => Ok(false),
            Some(None) | Some(Some("true")) => Ok(true),
            Some(Some("false")) => Ok(false),
            Some(Some(v)) => Err(self.bad(key, v, "expected true or false")),
        }
    }

    /// Wraps an error from an algorithm's constructor.
    pub(crate) fn build<T>(&self, r: Res<T>) -> Res<T> {
        r.map_err(|e| format!("{}: {e}", self.algo))
    }
}

/// An algorithm as policies know it, implemented beside each state machine: the
/// parameters of its spec, parsing and printing them, and what a policy does with
/// the parameters as a whole (divide them among instances, carry a state over to new
/// ones). With [`Algorithm`], everything the list of algorithms dispatches to.
pub(crate) trait Spec: Algorithm + Sized {
    /// The parameters its spec name takes, besides `max-wait`, `shadow`, `max-debt`
    /// and `margin`.
    const PARAMS: &'static [&'static str];

    /// The parameters spec name `name` takes, where one type serves two names.
    fn params(_name: &str) -> &'static [&'static str] {
        Self::PARAMS
    }

    /// Whether a charge means something for it (not for a queue or a permit: those
    /// take no `max-debt` and refuse charges with `CheckError::NotChargeable`).
    const CHARGEABLE: bool = true;

    /// Parses the parameters of spec name `name` (its row's). `None`: the parameters
    /// select the next row of the same spec name (`sliding-window` with or without
    /// `buckets=K`).
    fn from_spec(name: &str, p: &Params) -> Res<Option<Self>>;

    /// Writes `name:key=value,...`, the spec that parses back to these parameters
    /// (defaults left out where the spec may leave them out).
    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;

    /// Its share for one of `n` (> 1) instances that split a global limit: every
    /// rate divided by `n` exactly ([`share_rate`]), every count divided by `n`
    /// rounded down ([`share_count`]), so `n` shares never admit more than the whole.
    fn share(&self, n: u64) -> Res<Self>;

    /// The state a key keeps when its policy changes from `old` to `self` at `now`;
    /// `None` to start afresh (see [`Policy::carry_over`]).
    fn carry_over(&self, old: &Self, state: Self::State, now: u64) -> Option<Self::State>;

    /// What it promises: the most units it admits, by admission time (arrival plus
    /// any wait), in any window of `w` microseconds (half-open: `[t, t + w)`), from
    /// any state, under tries and acquires; `None` when it promises no rate
    /// (`concurrency` bounds what is in flight, not what passes). See
    /// [`Policy::envelope`].
    fn envelope(&self, w: u64) -> Option<u64>;
}

/// How many units a rate lets through at most in a window of `w` us when they are
/// spaced at least one interval (`period / count`) apart: `n` of them span
/// `(n - 1)` intervals, which must be shorter than `w`.
pub(crate) fn paced(rate: Rate, w: u64) -> u64 {
    if w == 0 {
        return 0;
    }
    let n = (u128::from(w) * u128::from(rate.count)).div_ceil(u128::from(rate.period_us));
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// How many windows of `width` us (clock-aligned, or laid end to end as
/// `align=first` opens them) a window of `w` us can touch: `w` instants reach across
/// `ceil((w - 1) / width)` boundaries at most.
pub(crate) fn windows_touched(width: u64, w: u64) -> u64 {
    if w == 0 {
        return 0;
    }
    (w - 1).div_ceil(width.max(1)) + 1
}

/// A count's share for one of `n` instances: rounded down, at least 1.
pub(crate) fn share_count(x: u64, n: u64) -> u64 {
    (x / n).max(1)
}

/// A rate's share for one of `n` instances, exactly (the period times `n`).
pub(crate) fn share_rate(r: Rate, n: u64) -> Res<Rate> {
    let period = (r.period_us.checked_mul(n))
        .ok_or_else(|| format!("rate {r} divided by {n} is too slow"))?;
    Rate::new(r.count, period)
}
