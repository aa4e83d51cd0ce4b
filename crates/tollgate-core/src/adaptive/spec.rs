//! The adaptive spec: `CONTROLLER:key=value,...`, in the policy spec's syntax
//! (`gradient:min=2,max=500`, `aimd`, `vegas:alpha=2,beta=4`).

use std::fmt;

use super::controller::ControllerKind;
use crate::params::{Params, Res};
use crate::spec::split_head;
use crate::units::fmt_duration;

/// The controllers a spec may name.
pub const CONTROLLERS: [&str; 3] = ["gradient", "aimd", "vegas"];

/// Parameters every controller takes.
const COMMON: &[&str] = &[
    "min",
    "max",
    "initial",
    "queue",
    "queue-delay",
    "baseline-window",
];

/// The largest `max` a spec may give: far beyond any concurrency a process holds.
pub const MAX_LIMIT: u32 = 1_000_000;

/// How long a request may wait for a permit before it is shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueDelay {
    /// Half the unloaded-latency baseline (at least 1 ms, the timer's resolution) once
    /// the service has shown its knee (a window that called for a cut, or bound
    /// without the limit growing); 1 s before that, while the limit is still growing
    /// towards the capacity. An admitted request's latency then stays within about
    /// 1.5 times the unloaded latency plus the controller's tolerance (critical work
    /// may wait twice the target).
    Auto,
    /// A fixed target, in microseconds.
    Fixed(u64),
}

/// An adaptive spec that does not parse, with what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid adaptive spec '{spec}': {message}")]
pub struct AdaptiveSpecError {
    /// The spec as given.
    pub spec: String,
    /// What is wrong, naming the controller and the bad part.
    pub message: String,
}

/// A parsed, valid adaptive limiter configuration.
///
/// ```
/// use tollgate_core::adaptive::AdaptiveSpec;
/// let spec: AdaptiveSpec = "gradient:min=2,max=500".parse().unwrap();
/// assert_eq!((spec.min, spec.max, spec.initial), (2, 500, 4));
/// assert_eq!(spec.to_string().parse::<AdaptiveSpec>().unwrap(), spec);
/// let err = "gradient:min=9,max=3".parse::<AdaptiveSpec>().unwrap_err();
/// assert!(err.to_string().contains("min=9 is above max=3"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveSpec {
    /// The controller and its settings.
    pub controller: ControllerKind,
    /// The floor: the limit never falls below it (default 1).
    pub min: u32,
    /// The ceiling (default 1000).
    pub max: u32,
    /// The limit before any outcome is known (default 4, within min..max): the
    /// controller grows it fast while it is used and the latency holds.
    pub initial: u32,
    /// The most requests waiting for a permit (default 1000; 0: nobody waits).
    pub queue: u32,
    /// The queueing-delay target (default `auto`).
    pub queue_delay: QueueDelay,
    /// How long the least window mean (plus one standard error) stays the baseline
    /// (default 10 s): a service
    /// that became slower for good is re-learned after this long.
    pub baseline_window_us: u64,
}

impl Default for AdaptiveSpec {
    /// `gradient` with every default.
    fn default() -> Self {
        AdaptiveSpec::parse("gradient").expect("the default spec parses")
    }
}

impl AdaptiveSpec {
    /// Parses a spec such as `gradient:min=2,max=500` (see docs/adaptive.md).
    pub fn parse(spec: &str) -> Result<Self, AdaptiveSpecError> {
        parse_inner(spec).map_err(|message| AdaptiveSpecError {
            spec: spec.to_string(),
            message,
        })
    }
}

impl std::str::FromStr for AdaptiveSpec {
    type Err = AdaptiveSpecError;
    fn from_str(s: &str) -> Result<Self, AdaptiveSpecError> {
        AdaptiveSpec::parse(s)
    }
}

fn parse_inner(spec: &str) -> Res<AdaptiveSpec> {
    let (name, body) = split_head(spec, "controller", &CONTROLLERS)?;
    let own: &[&str] = match name {
        "gradient" => &["tolerance", "backoff"],
        "aimd" => &["increase", "backoff"],
        _ => &["alpha", "beta", "backoff"],
    };
    let known: Vec<&str> = own.iter().chain(COMMON).copied().collect();
    let p = Params::parse(name, &known, body)?;
    let controller = controller(name, &p)?;
    let (min, max, initial) = bounds(name, &p)?;
    let queue = limit_count(&p, "queue", 1000)?;
    let queue_delay = match p.value("queue-delay")? {
        None | Some("auto") => QueueDelay::Auto,
        Some(v) => match p.duration_of("queue-delay", v)? {
            0 => return Err(p.bad("queue-delay", v, "expected auto or a duration above 0")),
            us => QueueDelay::Fixed(us),
        },
    };
    let baseline_window_us = match p.value("baseline-window")? {
        None => 10_000_000,
        Some(v) => match p.duration_of("baseline-window", v)? {
            0 => return Err(p.bad("baseline-window", v, "expected a duration above 0")),
            us => us,
        },
    };
    Ok(AdaptiveSpec {
        controller,
        min,
        max,
        initial,
        queue,
        queue_delay,
        baseline_window_us,
    })
}

/// Controller `name`'s own parameters, and the `backoff` they share.
fn controller(name: &str, p: &Params) -> Res<ControllerKind> {
    // One window never cuts below half (MAX_CUT): a smaller factor would not act.
    let backoff = number(
        p,
        "backoff",
        0.9,
        |x| (0.5..1.0).contains(&x),
        "expected a factor from 0.5 up to 1 (excluded), such as 0.9",
    )?;
    Ok(match name {
        "gradient" => ControllerKind::Gradient {
            tolerance: number(
                p,
                "tolerance",
                1.2,
                |x| (1.0..=10.0).contains(&x),
                "expected a latency ratio from 1 to 10, such as 1.2",
            )?,
            backoff,
        },
        "aimd" => ControllerKind::Aimd {
            increase: match limit_count(p, "increase", 1)? {
                0 => return Err(p.bad("increase", "0", "expected at least 1")),
                n => n,
            },
            backoff,
        },
        _ => {
            let positive = |x: f64| x > 0.0;
            let alpha = number(
                p,
                "alpha",
                3.0,
                positive,
                "expected a positive number such as 3",
            )?;
            let beta = number(
                p,
                "beta",
                6.0,
                positive,
                "expected a positive number such as 6",
            )?;
            if alpha >= beta {
                return Err(format!("vegas: alpha={alpha} must be below beta={beta}"));
            }
            ControllerKind::Vegas {
                alpha,
                beta,
                backoff,
            }
        }
    })
}

/// The limit's floor, ceiling and starting value: `min`, `max` and `initial`.
fn bounds(name: &str, p: &Params) -> Res<(u32, u32, u32)> {
    let min = limit_count(p, "min", 1)?;
    let max = limit_count(p, "max", 1000)?;
    if min == 0 {
        return Err(format!("{name}: min=0: the floor must be at least 1"));
    }
    if min > max {
        let default = if p.value("max")?.is_none() {
            " (the default)"
        } else {
            ""
        };
        return Err(format!("{name}: min={min} is above max={max}{default}"));
    }
    let initial = match p.value("initial")? {
        None => 4.clamp(min, max),
        Some(v) => {
            let n = limit_count(p, "initial", 0)?;
            if n < min || n > max {
                return Err(p.bad("initial", v, &format!("expected {min}..={max} (min..=max)")));
            }
            n
        }
    };
    Ok((min, max, initial))
}

/// A finite number parameter that passes `ok`, or `default` when absent.
fn number(
    p: &Params,
    key: &str,
    default: f64,
    ok: impl Fn(f64) -> bool,
    expected: &str,
) -> Res<f64> {
    match p.value(key)? {
        None => Ok(default),
        Some(v) => match v.parse::<f64>() {
            Ok(x) if x.is_finite() && ok(x) => Ok(x),
            _ => Err(p.bad(key, v, expected)),
        },
    }
}

/// A count parameter up to [`MAX_LIMIT`].
fn limit_count(p: &Params, key: &str, default: u64) -> Res<u32> {
    let n = p.count_or(key, default)?;
    u32::try_from(n)
        .ok()
        .filter(|n| *n <= MAX_LIMIT)
        .ok_or_else(|| p.bad(key, &n.to_string(), &format!("at most {MAX_LIMIT}")))
}

impl fmt::Display for AdaptiveSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.controller.name())?;
        match self.controller {
            ControllerKind::Gradient { tolerance, backoff } => {
                write!(f, ":tolerance={tolerance},backoff={backoff}")?
            }
            ControllerKind::Aimd { increase, backoff } => {
                write!(f, ":increase={increase},backoff={backoff}")?
            }
            ControllerKind::Vegas {
                alpha,
                beta,
                backoff,
            } => write!(f, ":alpha={alpha},beta={beta},backoff={backoff}")?,
        }
        write!(
            f,
            ",min={},max={},initial={},queue={},queue-delay=",
            self.min, self.max, self.initial, self.queue
        )?;
        match self.queue_delay {
            QueueDelay::Auto => f.write_str("auto")?,
            QueueDelay::Fixed(us) => f.write_str(&fmt_duration(us))?,
        }
        write!(
            f,
            ",baseline-window={}",
            fmt_duration(self.baseline_window_us)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(spec: &str) -> String {
        AdaptiveSpec::parse(spec).unwrap_err().to_string()
    }

    #[test]
    fn bad_specs_name_what_is_wrong() {
        assert!(err("cubic")
            .contains("unknown controller 'cubic' (expected one of: gradient, aimd, vegas)"));
        assert!(err("gradient:min=-1").contains("bad value '-1' for 'min'"));
        assert!(err("gradient:min=0").contains("min=0"));
        assert!(err("gradient:min=10,max=5").contains("min=10 is above max=5"));
        assert!(err("gradient:initial=2000").contains("expected 1..=1000"));
        assert!(err("gradient:tolerance=0.5").contains("'tolerance'"));
        assert!(err("aimd:backoff=1.5").contains("from 0.5 up to 1"));
        assert!(err("aimd:backoff=0.1").contains("from 0.5 up to 1"));
        assert!(err("aimd:increase=0").contains("expected at least 1"));
        assert!(err("").contains("missing controller"));
        assert!(err(":min=2").contains("missing controller"));
        assert!(err("gradient:min=2000").contains("max=1000 (the default)"));
        assert!(err("gradient:tolerance=1e300").contains("'tolerance'"));
        assert!(AdaptiveSpec::parse("x")
            .unwrap_err()
            .to_string()
            .starts_with("invalid adaptive spec 'x'"));
        assert!(err("aimd:tolerance=2").contains("unknown parameter 'tolerance'"));
        assert!(err("vegas:alpha=6,beta=3").contains("alpha=6 must be below beta=3"));
        assert!(err("gradient:queue-delay=0s").contains("'queue-delay'"));
        assert!(err("gradient:max=2000000").contains("at most 1000000"));
        assert!(err("gradient:max=nan").contains("whole number"));
    }

    #[test]
    fn every_controller_prints_back_to_itself() {
        for s in [
            "gradient",
            "gradient:min=2,max=50,initial=10,tolerance=1.5,queue=0,queue-delay=20ms",
            "aimd:increase=2,backoff=0.5,baseline-window=1m",
            "vegas:alpha=2,beta=4,min=3",
        ] {
            let spec = AdaptiveSpec::parse(s).unwrap();
            assert_eq!(
                spec.to_string().parse::<AdaptiveSpec>().unwrap(),
                spec,
                "{s}"
            );
        }
    }

    #[test]
    fn initial_defaults_into_min_max() {
        assert_eq!(AdaptiveSpec::parse("aimd:min=10").unwrap().initial, 10);
        assert_eq!(AdaptiveSpec::parse("aimd:max=2").unwrap().initial, 2);
    }
}
