//! The traffic `tollgate simulate` offers: generated patterns (seeded, so a run
//! repeats exactly) or a trace file, as arrivals on a virtual clock.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use tollgate::{Op, Policy};

/// A traffic pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Evenly spaced at the rate.
    Steady,
    /// Bursts of `burst` at once, on average at the rate.
    Burst,
    /// Bursts of `burst` just before and just after each whole second (10 ms either
    /// side): the fixed window's worst case.
    Boundary,
    /// Poisson arrivals at the rate.
    Poisson,
    /// The rate swinging between 0 and twice the rate, period duration/2.
    Sine,
    /// The rate growing from 0 to twice the rate over the duration.
    Ramp,
    /// Arrivals from a replay trace (`t_us,key,cost`).
    Trace(PathBuf),
    /// Closed-loop clients against a modelled upstream (`--clients`, `--capacity`,
    /// ...): no arrivals of its own; the closed-loop simulation (overload.rs) runs it.
    ClosedLoop,
}

impl std::str::FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "steady" => Pattern::Steady,
            "burst" => Pattern::Burst,
            "boundary" => Pattern::Boundary,
            "poisson" => Pattern::Poisson,
            "sine" => Pattern::Sine,
            "ramp" => Pattern::Ramp,
            "closed-loop" => Pattern::ClosedLoop,
            _ => match s.strip_prefix("trace:") {
                Some(path) if !path.is_empty() => Pattern::Trace(PathBuf::from(path)),
                _ => {
                    return Err(format!(
                        "unknown pattern '{s}' (expected steady, burst, boundary, poisson, sine, ramp, closed-loop or trace:FILE)"
                    ))
                }
            },
        })
    }
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The shape of the arrivals (steady, burst, boundary, poisson, sine, ramp, trace).
    pub pattern: Pattern,
    /// Requests per second (average).
    pub rate: f64,
    /// Length, in us.
    pub duration_us: u64,
    /// Burst size for burst and boundary.
    pub burst: u64,
    /// Seed.
    pub seed: u64,
    /// Distinct keys the requests spread over.
    pub keys: u64,
    /// How long each admitted request holds a `concurrency` permit, us.
    pub hold_us: Option<u64>,
}

/// The most requests one simulation generates.
pub const MAX_REQUESTS: usize = 20_000_000;

/// One arrival: time (us), key, cost.
pub type Arrival = (u64, u64, u64);

/// splitmix64, a tiny, well-known seeded generator: the same seed, the same numbers,
/// on every platform. The field is the state (the seed to begin with).
pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in [0, 1), uniformly.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The arrivals of a scenario, in time order.
pub fn traffic(s: &Scenario) -> anyhow::Result<Vec<Arrival>> {
    match &s.pattern {
        Pattern::Trace(path) => return read_trace(path),
        Pattern::ClosedLoop => bail!("closed-loop clients have no arrivals of their own"),
        _ => {}
    }
    if !(s.rate > 0.0 && s.rate.is_finite()) {
        bail!("--rate must be a positive number of requests per second");
    }
    if s.keys == 0 {
        bail!("--keys must be at least 1");
    }
    if s.burst == 0 {
        bail!("--burst must be at least 1");
    }
    let mut rng = Rng(s.seed);
    let mut times: Vec<u64> = Vec::new();
    let d = s.duration_us as f64;
    let gap = 1e6 / s.rate;
    // Each request costs about 60 bytes per policy in memory: bound the traffic.
    let cap = MAX_REQUESTS;
    match s.pattern {
        Pattern::Steady => {
            let mut t = 0.0;
            while t < d && times.len() < cap {
                times.push(t as u64);
                t += gap;
            }
        }
        Pattern::Burst => {
            let every = gap * s.burst as f64;
            let mut t = 0.0;
            while t < d && times.len() < cap {
                times.extend(std::iter::repeat_n(t as u64, s.burst as usize));
                t += every;
            }
        }
        Pattern::Boundary => {
            let mut second = 1u64;
            while second * 1_000_000 < s.duration_us && times.len() < cap {
                let b = second * 1_000_000;
                times.extend(std::iter::repeat_n(b - 10_000, s.burst as usize));
                times.extend(std::iter::repeat_n(b + 10_000, s.burst as usize));
                second += 2;
            }
        }
        Pattern::Poisson => {
            let mut t = 0.0;
            loop {
                t += -gap * (1.0 - rng.unit()).ln();
                if t >= d || times.len() >= cap {
                    break;
                }
                times.push(t as u64);
            }
        }
        Pattern::Sine | Pattern::Ramp => {
            // Thinning: candidates at twice the rate, kept with probability r(t)/2r.
            let mut t = 0.0;
            let period = d / 2.0;
            loop {
                t += -(gap / 2.0) * (1.0 - rng.unit()).ln();
                if t >= d || times.len() >= cap {
                    break;
                }
                let share = match s.pattern {
                    Pattern::Sine => 0.5 * (1.0 + (2.0 * std::f64::consts::PI * t / period).sin()),
                    _ => t / d,
                };
                if rng.unit() < share {
                    times.push(t as u64);
                }
            }
        }
        Pattern::Trace(_) | Pattern::ClosedLoop => unreachable!("handled above"),
    }
    times.sort_unstable();
    Ok(times
        .into_iter()
        .map(|t| (t, rng.next() % s.keys, 1))
        .collect())
}

fn read_trace(path: &Path) -> anyhow::Result<Vec<Arrival>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut out = Vec::new();
    let mut sink = std::io::sink();
    // Reuse replay's validation by replaying through an always-admitting policy.
    let policy: Policy = "concurrency:limit=1099511627776".parse().expect("valid");
    crate::replay::replay(&policy, Op::Try, file, &mut sink)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut reader = csv::Reader::from_path(path)?;
    let mut keys: HashMap<String, u64> = HashMap::new();
    for row in reader.records() {
        let row = row?;
        let t: u64 = row.get(0).unwrap_or("0").trim().parse()?;
        let next = keys.len() as u64;
        let key = *keys
            .entry(row.get(1).unwrap_or("").trim().to_string())
            .or_insert(next);
        let cost: u64 = row.get(2).unwrap_or("1").trim().parse()?;
        out.push((t, key, cost));
    }
    Ok(out)
}
