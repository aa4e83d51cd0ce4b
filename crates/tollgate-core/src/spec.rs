//! The policy spec language: `ALGORITHM:key=value,key=value` (docs/semantics.md).
//!
//! Parsing is where every error lives: a parsed [`Policy`](crate::Policy) is always
//! valid, and prints back (`Display`) as a spec that parses to the same policy.

use std::fmt;
use std::time::Duration;

use crate::list::{params_of, spec_names, AlgorithmKind, AnyAlgorithm};
use crate::params::{Params, Res};
use crate::policy::Policy;
pub use crate::spec_error::SpecError;
use crate::units::{fmt_duration, Rate};

/// Parameters every algorithm accepts (`max-debt` where a charge means something,
/// `margin` where the policy is a rate or a window).
const COMMON: &[&str] = &["max-wait", "shadow", "max-debt", "margin"];

impl Policy {
    /// Parses a spec such as `gcra:rate=10/s,burst=5` (see the crate docs).
    pub fn parse(spec: &str) -> Result<Self, SpecError> {
        parse_inner(spec).map_err(|message| SpecError {
            spec: spec.to_string(),
            message,
        })
    }
}

/// Typed constructors: the spec language's policies from Rust values. Each builds
/// the spec it prints as and parses it, so a typed policy is validated (and refused)
/// exactly as its spec would be. Durations count in whole microseconds.
///
/// ```
/// use std::time::Duration;
/// use tollgate_core::{Policy, Rate};
///
/// let api = Policy::gcra(Rate::per_second(10)?, 20)?;
/// assert_eq!(api, "gcra:rate=10/s,burst=20".parse::<Policy>()?);
/// let daily = Policy::fixed_window(10_000, Duration::from_secs(86_400))?;
/// assert_eq!(daily.to_string(), "fixed-window:limit=10000,window=1d");
/// let paced = Policy::gcra(Rate::per_second(5)?, 1)?.with_max_wait(Duration::from_secs(2))?;
/// assert_eq!(paced.to_string(), "gcra:rate=5/s,burst=1,max-wait=2s");
/// assert!(Policy::shaper(Rate::per_second(5)?, 10)?.with_max_debt(3).is_err()); // a queue takes no debt
/// # Ok::<(), tollgate_core::SpecError>(())
/// ```
impl Policy {
    /// `gcra:rate=R,burst=B`: exactly `burst` at one instant, then one per interval.
    pub fn gcra(rate: Rate, burst: u64) -> Result<Policy, SpecError> {
        Policy::parse(&format!("gcra:rate={rate},burst={burst}"))
    }

    /// `token-bucket:rate=R,capacity=C`.
    pub fn token_bucket(rate: Rate, capacity: u64) -> Result<Policy, SpecError> {
        Policy::parse(&format!("token-bucket:rate={rate},capacity={capacity}"))
    }

    /// `leaky-bucket:rate=R,capacity=C` (the meter).
    pub fn leaky_bucket(rate: Rate, capacity: u64) -> Result<Policy, SpecError> {
        Policy::parse(&format!("leaky-bucket:rate={rate},capacity={capacity}"))
    }

    /// `fixed-window:limit=N,window=W` (clock-aligned).
    pub fn fixed_window(limit: u64, window: Duration) -> Result<Policy, SpecError> {
        let window = fmt_duration(micros(window));
        Policy::parse(&format!("fixed-window:limit={limit},window={window}"))
    }

    /// `sliding-log:limit=N,window=W`: exact in every window.
    pub fn sliding_log(limit: u64, window: Duration) -> Result<Policy, SpecError> {
        let window = fmt_duration(micros(window));
        Policy::parse(&format!("sliding-log:limit={limit},window={window}"))
    }

    /// `sliding-window:limit=N,window=W` (weighted).
    pub fn sliding_window(limit: u64, window: Duration) -> Result<Policy, SpecError> {
        let window = fmt_duration(micros(window));
        Policy::parse(&format!("sliding-window:limit={limit},window={window}"))
    }

    /// `smooth-bursty:rate=R`: Guava's `RateLimiter.create(rate)`.
    pub fn smooth_bursty(rate: Rate) -> Result<Policy, SpecError> {
        Policy::parse(&format!("smooth-bursty:rate={rate}"))
    }

    /// `limit-req:rate=R,burst=B`, with `nodelay` when `nodelay` (else every excess
    /// request is delayed, nginx's default).
    pub fn limit_req(rate: Rate, burst: u64, nodelay: bool) -> Result<Policy, SpecError> {
        let nodelay = if nodelay { ",nodelay" } else { "" };
        Policy::parse(&format!("limit-req:rate={rate},burst={burst}{nodelay}"))
    }

    /// `shaper:rate=R,queue=Q`.
    pub fn shaper(rate: Rate, queue: u64) -> Result<Policy, SpecError> {
        Policy::parse(&format!("shaper:rate={rate},queue={queue}"))
    }

    /// `concurrency:limit=N`.
    pub fn concurrency(limit: u64) -> Result<Policy, SpecError> {
        Policy::parse(&format!("concurrency:limit={limit}"))
    }

    /// This policy with `max-wait` (the longest `acquire` may wait).
    pub fn with_max_wait(&self, max_wait: Duration) -> Result<Policy, SpecError> {
        let p = Policy::from_parts(self.algorithm().clone(), None, self.shadow())
            .max_debt_set(self.max_debt());
        Policy::parse(&format!("{p},max-wait={}", fmt_duration(micros(max_wait))))
    }

    /// This policy with `max-debt` (units a charge may leave past empty).
    pub fn with_max_debt(&self, max_debt: u64) -> Result<Policy, SpecError> {
        let p = self.clone().max_debt_set(None);
        Policy::parse(&format!("{p},max-debt={max_debt}"))
    }

    /// This policy in shadow mode (decides and reports, never rejects).
    pub fn in_shadow_mode(&self) -> Policy {
        Policy::from_parts(self.algorithm().clone(), self.max_wait_us(), true)
            .max_debt_set(self.max_debt())
    }
}

/// A duration in whole microseconds (saturating).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
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

/// Whether the algorithms of spec name `name` can be charged.
fn chargeable(name: &str) -> bool {
    (AlgorithmKind::ALL.iter()).any(|k| k.spec_name() == name && k.chargeable())
}

fn parse_inner(spec: &str) -> Res<Policy> {
    let (algo, body) = split_head(spec, "algorithm", &spec_names())?;
    let known: Vec<&str> = params_of(algo)
        .unwrap_or_default()
        .iter()
        .chain(COMMON)
        .copied()
        .filter(|k| *k != "max-debt" || chargeable(algo))
        .filter(|k| *k != "margin" || algo != "concurrency")
        .collect();
    let mut p = Params::parse(algo, &known, body)?;
    let margin = p.take_margin()?;
    if margin > 0 && algo == "fixed-window" {
        return Err(format!(
            "{algo}: margin needs a window that slides: a fixed window's edges sit on \
             one clock, and arrivals that come late cross them whatever the margin \
             (for a limit counted by someone else, use sliding-log:limit=N,window=W,margin=M)"
        ));
    }
    let algo = AnyAlgorithm::from_spec(algo, &p).map_err(|e| match margin {
        0 => e,
        m => format!(
            "{e} (margin={} is part of it: the window and the rate's period are that much longer)",
            crate::units::fmt_duration(m)
        ),
    })?;
    let max_wait_us = match p.value("max-wait")? {
        Some(v) => Some(p.duration_of("max-wait", v)?),
        None => None,
    };
    let shadow = p.flag("shadow")?;
    let max_debt = match p.value("max-debt")? {
        Some(v) => Some(p.count_of("max-debt", v)?),
        None => None,
    };
    Ok(Policy::from_parts(algo, max_wait_us, shadow).max_debt_set(max_debt))
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = fmt_duration;
        self.algorithm().fmt_spec(f)?;
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
