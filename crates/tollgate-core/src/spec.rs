//! The policy spec language: `ALGORITHM:key=value,key=value` (docs/semantics.md).
//!
//! Parsing is where every error lives: a parsed [`Policy`](crate::Policy) is always
//! valid, and prints back (`Display`) as a spec that parses to the same policy.

use std::fmt;

use crate::algorithms::*;
use crate::kind::{params_of, spec_names};
use crate::policy::{Algo, Policy};
use crate::units::{fmt_duration, parse_duration, Rate, MAX_COUNT};

/// A policy spec that does not parse, with what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpecError {
    /// The spec as given (empty for a rule set given no spec at all).
    pub spec: String,
    /// What is wrong, naming the algorithm and the bad part.
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.spec.is_empty() {
            return write!(f, "invalid rules: {}", self.message);
        }
        write!(f, "invalid policy '{}': {}", self.spec, self.message)
    }
}

/// Parameters every algorithm accepts.
const COMMON: &[&str] = &["max-wait", "shadow", "max-debt"];

/// The algorithms a charge has no meaning for, which take no `max-debt`.
const NOT_CHARGEABLE: &[&str] = &["shaper", "concurrency"];

/// The `key=value` pairs of one spec, consumed as the algorithm reads them. Shared by
/// policy specs and adaptive controller specs (`crate::adaptive`).
pub(crate) struct Params<'a> {
    algo: &'static str,
    pairs: Vec<(&'a str, Option<&'a str>)>,
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
        Ok(Params { algo, pairs })
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

    pub(crate) fn rate(&self) -> Res<Rate> {
        let v = self.required("rate", "10/s")?;
        Rate::parse(v).map_err(|e| self.bad("rate", v, &e))
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

impl Policy {
    /// Parses a spec such as `gcra:rate=10/s,burst=5` (see the crate docs).
    pub fn parse(spec: &str) -> Result<Self, SpecError> {
        parse_inner(spec).map_err(|message| SpecError {
            spec: spec.to_string(),
            message,
        })
    }
}

impl std::str::FromStr for Policy {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        Policy::parse(s)
    }
}

/// Splits `NAME:body` and finds NAME among `names` (`what` names the kind, e.g.
/// "algorithm"): the one place a spec's head is read, for policies and controllers.
pub(crate) fn split_head<'a>(
    spec: &'a str,
    what: &str,
    names: &[&'static str],
) -> Res<(&'static str, &'a str)> {
    let spec = spec.trim();
    let (name, body) = spec.split_once(':').unwrap_or((spec, ""));
    let name = name.trim();
    let found = names.iter().copied().find(|n| *n == name).ok_or_else(|| {
        if name.is_empty() {
            let upper = what.to_uppercase();
            format!(
                "missing {what} (expected {upper}:key=value,... with {upper} one of: {})",
                names.join(", ")
            )
        } else {
            format!(
                "unknown {what} '{name}' (expected one of: {})",
                names.join(", ")
            )
        }
    })?;
    Ok((found, body))
}

fn parse_inner(spec: &str) -> Res<Policy> {
    let (algo, body) = split_head(spec, "algorithm", &spec_names())?;
    let known: Vec<&str> = params_of(algo)
        .unwrap_or_default()
        .iter()
        .chain(COMMON)
        .copied()
        .filter(|k| *k != "max-debt" || !NOT_CHARGEABLE.contains(&algo))
        .collect();
    let p = Params::parse(algo, &known, body)?;
    let algo = match algo {
        "fixed-window" => {
            let align = match p.value("align")? {
                None | Some("clock") => Align::Clock,
                Some("first") => Align::First,
                Some(v) => return Err(p.bad("align", v, "expected clock or first")),
            };
            Algo::FixedWindow(p.build(FixedWindow::new(
                p.count("limit", "100")?,
                p.duration("window", "1s")?,
                align,
            ))?)
        }
        "sliding-log" => Algo::SlidingLog(p.build(SlidingLog::new(
            p.count("limit", "100")?,
            p.duration("window", "1s")?,
        ))?),
        "sliding-window" => sliding_window(&p)?,
        "leaky-bucket" => {
            let rate = p.rate()?;
            let capacity = p.count_or("capacity", rate.count)?;
            Algo::LeakyBucket(p.build(LeakyBucket::new(rate, capacity))?)
        }
        "token-bucket" => {
            let rate = p.rate()?;
            let capacity = p.count_or("capacity", rate.count)?;
            Algo::TokenBucket(p.build(TokenBucket::new(rate, capacity))?)
        }
        "gcra" => {
            let rate = p.rate()?;
            let burst = p.count_or("burst", rate.count)?;
            Algo::Gcra(p.build(Gcra::new(rate, burst))?)
        }
        "smooth-bursty" => {
            let rate = p.rate()?;
            let max_burst_us = match p.value("max-burst")? {
                Some(v) => p.duration_of("max-burst", v)?,
                None => 1_000_000,
            };
            Algo::SmoothBursty(p.build(Smooth::new(rate, SmoothKind::Bursty { max_burst_us }))?)
        }
        "smooth-warmup" => smooth_warmup(&p)?,
        "limit-req" => limit_req(&p)?,
        "shaper" => Algo::Shaper(p.build(Shaper::new(p.rate()?, p.count("queue", "100")?))?),
        "concurrency" => Algo::Concurrency(p.build(Concurrency::new(p.count("limit", "10")?))?),
        _ => unreachable!("every spec name of the algorithm table is handled"),
    };
    let max_wait_us = match p.value("max-wait")? {
        Some(v) => Some(p.duration_of("max-wait", v)?),
        None => None,
    };
    let shadow = p.flag("shadow")?;
    let max_debt = match p.value("max-debt")? {
        Some(v) => Some(p.count_of("max-debt", v)?),
        None => None,
    };
    Ok(Policy::from_parts(algo, max_wait_us, shadow).with_max_debt(max_debt))
}

/// `sliding-window`: `buckets=K` or `mode=weighted` (the default), not both.
fn sliding_window(p: &Params) -> Res<Algo> {
    let (limit, window) = (p.count("limit", "100")?, p.duration("window", "1s")?);
    match (p.value("buckets")?, p.value("mode")?) {
        (Some(_), Some(_)) => {
            Err("sliding-window: give either buckets=K or mode=weighted, not both".into())
        }
        (Some(k), None) => {
            let k = p.count_of("buckets", k)?;
            Ok(Algo::SlidingWindow(
                p.build(SlidingWindow::new(limit, window, k))?,
            ))
        }
        (None, None) | (None, Some("weighted")) => Ok(Algo::SlidingWindowWeighted(
            p.build(SlidingWindowWeighted::new(limit, window))?,
        )),
        (None, Some(v)) => Err(p.bad("mode", v, "expected weighted (or buckets=K instead)")),
    }
}

/// `smooth-warmup`: Guava's warm-up period and cold factor.
fn smooth_warmup(p: &Params) -> Res<Algo> {
    let rate = p.rate()?;
    let warmup_us = p.duration("warmup", "10s")?;
    let cold_factor = match p.value("cold-factor")? {
        Some(v) => v
            .parse::<f64>()
            .map_err(|_| p.bad("cold-factor", v, "expected a number such as 3 or 2.5"))?,
        None => 3.0,
    };
    Ok(Algo::SmoothWarmup(p.build(Smooth::new(
        rate,
        SmoothKind::WarmingUp {
            warmup_us,
            cold_factor,
        },
    ))?))
}

/// `limit-req`: nginx's burst, and `nodelay` or `delay=N`, not both.
fn limit_req(p: &Params) -> Res<Algo> {
    let rate = p.rate()?;
    let burst = p.count_or("burst", 0)?;
    let delay = match (p.flag("nodelay")?, p.value("delay")?) {
        (true, Some(_)) => return Err("limit-req: give either nodelay or delay=N, not both".into()),
        (true, None) => Delay::Never,
        (false, Some(v)) => match p.count_of("delay", v)? {
            0 => Delay::All,
            n => Delay::After(n),
        },
        (false, None) => Delay::All,
    };
    Ok(Algo::LimitReq(p.build(LimitReq::new(rate, burst, delay))?))
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = fmt_duration;
        match self.algo() {
            Algo::FixedWindow(a) => {
                write!(
                    f,
                    "fixed-window:limit={},window={}",
                    a.limit_per_window(),
                    d(a.window_us())
                )?;
                if a.align() == Align::First {
                    f.write_str(",align=first")?;
                }
            }
            Algo::SlidingLog(a) => write!(
                f,
                "sliding-log:limit={},window={}",
                a.limit_per_window(),
                d(a.window_us())
            )?,
            Algo::SlidingWindow(a) => write!(
                f,
                "sliding-window:limit={},window={},buckets={}",
                a.limit_per_window(),
                d(a.window_us()),
                a.buckets()
            )?,
            Algo::SlidingWindowWeighted(a) => write!(
                f,
                "sliding-window:limit={},window={},mode=weighted",
                a.limit_per_window(),
                d(a.window_us())
            )?,
            Algo::LeakyBucket(a) => write!(
                f,
                "leaky-bucket:rate={},capacity={}",
                a.rate(),
                a.capacity_units()
            )?,
            Algo::TokenBucket(a) => write!(
                f,
                "token-bucket:rate={},capacity={}",
                a.rate(),
                a.capacity_tokens()
            )?,
            Algo::Gcra(a) => write!(f, "gcra:rate={},burst={}", a.rate(), a.burst())?,
            Algo::SmoothBursty(a) | Algo::SmoothWarmup(a) => match a.kind() {
                SmoothKind::Bursty { max_burst_us } => {
                    write!(f, "smooth-bursty:rate={}", a.rate())?;
                    if max_burst_us != 1_000_000 {
                        write!(f, ",max-burst={}", d(max_burst_us))?;
                    }
                }
                SmoothKind::WarmingUp {
                    warmup_us,
                    cold_factor,
                } => {
                    write!(f, "smooth-warmup:rate={},warmup={}", a.rate(), d(warmup_us))?;
                    if cold_factor != 3.0 {
                        write!(f, ",cold-factor={cold_factor}")?;
                    }
                }
            },
            Algo::LimitReq(a) => {
                write!(f, "limit-req:rate={}", a.rate())?;
                if a.burst() > 0 {
                    write!(f, ",burst={}", a.burst())?;
                }
                match a.delay() {
                    Delay::All => {}
                    Delay::After(n) => write!(f, ",delay={n}")?,
                    Delay::Never => f.write_str(",nodelay")?,
                }
            }
            Algo::Shaper(a) => write!(f, "shaper:rate={},queue={}", a.rate(), a.queue())?,
            Algo::Concurrency(a) => write!(f, "concurrency:limit={}", crate::Algorithm::limit(a))?,
        }
        if let Some(w) = self.max_wait_us() {
            write!(f, ",max-wait={}", d(w))?;
        }
        if self.shadow() {
            f.write_str(",shadow=true")?;
        }
        if let Some(n) = self.max_debt() {
            write!(f, ",max-debt={n}")?;
        }
        Ok(())
    }
}
