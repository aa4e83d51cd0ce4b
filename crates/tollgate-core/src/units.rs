//! Durations and rates as they appear in policy specs, and the exact integer form of
//! a rate's emission interval.

use std::fmt;

use crate::spec_error::SpecError;

/// Microseconds per unit suffix, largest first (the order used when printing).
const UNITS: &[(&str, u64)] = &[
    ("d", 86_400_000_000),
    ("h", 3_600_000_000),
    ("m", 60_000_000),
    ("s", 1_000_000),
    ("ms", 1_000),
    ("us", 1),
];

/// The longest duration a spec may name: 2^50 us, about 35 years. Keeps every product
/// the algorithms form inside 128-bit arithmetic with room to spare.
pub const MAX_DURATION_US: u64 = 1 << 50;

/// The latest time any algorithm is asked about: 2^62 us (about 146,000 years after
/// the clock's origin). [`crate::Policy`] clamps later times to it, which keeps every
/// `time + window` sum far from overflow; direct users of an [`crate::Algorithm`]
/// must stay below it.
pub const MAX_TIME_US: u64 = 1 << 62;

/// The largest count (limit, burst, capacity, queue, requests per period) a spec may
/// name: 2^40, about 10^12.
pub const MAX_COUNT: u64 = 1 << 40;

/// The most refill time a charge may put a key into debt for, whatever its
/// `max-debt` (about 12.7 days): keeps every state an exact integer in the Redis
/// scripts' doubles, even for rates kept in 1/4096 us ticks.
pub const MAX_DEBT_US: u64 = 1 << 40;

/// Parses a duration such as `250ms`, `1s`, `90s`, `1m`, `1h`, `1d`, `10us`, `5000ns`.
/// The result is in whole microseconds; `ns` values must be a multiple of 1000.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("'{s}' has no unit (expected e.g. 250ms, 1s, 1m, 1h, 1d)"))?;
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "'{s}' does not start with a whole number (expected e.g. 250ms, 1s, 1m)"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{num}' is not a whole number that fits 64 bits"))?;
    let us = if unit == "ns" {
        if n % 1_000 != 0 {
            return Err(format!(
                "'{s}' is not a whole number of microseconds (the finest unit tollgate keeps)"
            ));
        }
        n / 1_000
    } else {
        let per = UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, per)| *per)
            .ok_or_else(|| {
                format!("unknown unit '{unit}' in '{s}' (expected one of: ns, us, ms, s, m, h, d)")
            })?;
        n.checked_mul(per)
            .ok_or_else(|| format!("'{s}' is too long"))?
    };
    if us > MAX_DURATION_US {
        return Err(format!(
            "'{s}' is too long (at most {})",
            fmt_duration(MAX_DURATION_US)
        ));
    }
    Ok(us)
}

/// Prints a duration in microseconds in the largest unit that divides it exactly
/// (`1500ms`, `90s`, `1m`, `0us`).
pub fn fmt_duration(us: u64) -> String {
    for (unit, per) in UNITS {
        if us != 0 && us % per == 0 {
            return format!("{}{unit}", us / per);
        }
    }
    format!("{us}us")
}

/// A rate: `count` units every `period_us` microseconds (`10/s`, `5/250ms`, `7/m`).
///
/// Its emission interval `T = period/count` is rarely a whole number of microseconds
/// (`3/s` is 333333.33 us). So algorithms that keep time in their state work in
/// *scaled time*: one tick is `1/scale` us, with `scale = count / gcd(period, count)`,
/// which makes `T` exactly `interval_ticks = period / gcd(period, count)` ticks and no
/// rounded interval ever drifts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    /// Units per period (>= 1).
    pub count: u64,
    /// The period in microseconds (>= 1).
    pub period_us: u64,
}

impl Rate {
    /// A rate of `count` per `period_us` microseconds.
    pub fn new(count: u64, period_us: u64) -> Result<Self, String> {
        if count == 0 {
            return Err("the rate's count must be at least 1".into());
        }
        if count > MAX_COUNT {
            return Err(format!(
                "the rate's count {count} is above the maximum {MAX_COUNT}"
            ));
        }
        if period_us == 0 {
            return Err("the rate's period must be at least 1us".into());
        }
        if period_us > MAX_DURATION_US {
            return Err(format!(
                "the rate's period is too long (at most {})",
                fmt_duration(MAX_DURATION_US)
            ));
        }
        Ok(Rate { count, period_us })
    }

    /// `n` per second (`n/s` in a spec); `n` is at least 1.
    ///
    /// ```
    /// use tollgate_core::Rate;
    /// assert_eq!(Rate::per_second(10)?.to_string(), "10/s");
    /// assert_eq!(Rate::per(5, std::time::Duration::from_millis(250))?.to_string(), "5/250ms");
    /// assert!(Rate::per_minute(0).is_err());
    /// # Ok::<(), tollgate_core::SpecError>(())
    /// ```
    pub fn per_second(n: u64) -> Result<Rate, SpecError> {
        Rate::per_us(n, 1_000_000)
    }

    /// `n` per minute (`n/m`).
    pub fn per_minute(n: u64) -> Result<Rate, SpecError> {
        Rate::per_us(n, 60_000_000)
    }

    /// `n` per hour (`n/h`).
    pub fn per_hour(n: u64) -> Result<Rate, SpecError> {
        Rate::per_us(n, 3_600_000_000)
    }

    /// `n` per day (`n/d`).
    pub fn per_day(n: u64) -> Result<Rate, SpecError> {
        Rate::per_us(n, 86_400_000_000)
    }

    /// `n` per `period` (whole microseconds; `n/<duration>`).
    pub fn per(n: u64, period: std::time::Duration) -> Result<Rate, SpecError> {
        Rate::per_us(n, u64::try_from(period.as_micros()).unwrap_or(u64::MAX))
    }

    fn per_us(n: u64, period_us: u64) -> Result<Rate, SpecError> {
        Rate::new(n, period_us).map_err(|message| SpecError {
            spec: format!("{n}/{}", fmt_duration(period_us)),
            message,
        })
    }

    /// Parses `N/s`, `N/m`, `N/h`, `N/d` or `N/<duration>` (`5/250ms`).
    pub fn parse(s: &str) -> Result<Self, String> {
        let (n, per) = s.split_once('/').ok_or_else(|| {
            format!(
                "'{s}' is not a rate (expected N/s, N/m, N/h, N/d or N/<duration> like 5/250ms)"
            )
        })?;
        let count: u64 = n.trim().parse().map_err(|_| {
            format!("'{n}' in rate '{s}' is not a whole number (write 0.5/s as 1/2s)")
        })?;
        let per = per.trim();
        let period_us = if per.starts_with(|c: char| c.is_ascii_digit()) {
            parse_duration(per)?
        } else {
            parse_duration(&format!("1{per}"))
                .map_err(|_| format!("unknown unit '{per}' in rate '{s}' (expected s, m, h, d or a duration like 250ms)"))?
        };
        Rate::new(count, period_us)
    }

    fn gcd(&self) -> u64 {
        let (mut a, mut b) = (self.period_us, self.count);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    }

    /// Ticks per microsecond in scaled time (see the type's docs).
    pub fn scale(&self) -> u64 {
        self.count / self.gcd()
    }

    /// The emission interval `T` in scaled ticks (exact).
    pub fn interval_ticks(&self) -> u64 {
        self.period_us / self.gcd()
    }

    /// Units per second, as a float (for Guava-compatible algorithms, which use doubles).
    pub fn units_per_second(&self) -> f64 {
        self.count as f64 * 1e6 / self.period_us as f64
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.period_us {
            1_000_000 => write!(f, "{}/s", self.count),
            60_000_000 => write!(f, "{}/m", self.count),
            3_600_000_000 => write!(f, "{}/h", self.count),
            86_400_000_000 => write!(f, "{}/d", self.count),
            p => write!(f, "{}/{}", self.count, fmt_duration(p)),
        }
    }
}

/// `a / b` for `b > 0`. 128-bit division is a slow library call, and nearly every
/// operand fits 64 bits (and most divisors are 1), so those cases take the fast path.
#[inline]
pub(crate) fn div(a: u128, b: u128) -> u128 {
    if b == 1 {
        a
    } else if (a | b) >> 64 == 0 {
        u128::from(a as u64 / b as u64)
    } else {
        a / b
    }
}

/// `ceil(a / b)` for `b > 0`, with the fast paths of [`div`].
#[inline]
pub(crate) fn div_ceil(a: u128, b: u128) -> u128 {
    if b == 1 {
        a
    } else if (a | b) >> 64 == 0 {
        u128::from((a as u64).div_ceil(b as u64))
    } else {
        a.div_ceil(b)
    }
}

/// Exact division by a divisor fixed in advance (an emission interval), without the
/// cost of a hardware divide on the hot path: a float reciprocal gives the quotient to
/// within one or two, and integer multiplications correct it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Divisor {
    d: u64,
    inv: f64,
}

impl PartialEq for Divisor {
    fn eq(&self, other: &Self) -> bool {
        self.d == other.d
    }
}

impl Eq for Divisor {}

impl Divisor {
    pub fn new(d: u64) -> Self {
        assert!(d > 0, "division by zero");
        Divisor {
            d,
            inv: 1.0 / d as f64,
        }
    }

    /// A divisor whose reciprocal is already known.
    #[inline(always)]
    pub fn with_inverse(d: u64, inv: f64) -> Self {
        Divisor { d, inv }
    }

    /// `1/d`.
    pub fn inverse(&self) -> f64 {
        self.inv
    }

    /// `x / d`, exactly, for `x < 2^63`.
    #[inline(always)]
    pub fn div_u64(&self, x: u64) -> u64 {
        if x < self.d {
            return 0;
        }
        let mut q = (x as f64 * self.inv) as u64;
        // The estimate is off by at most a few units either way.
        while q > 0 && q.saturating_mul(self.d) > x {
            q -= 1;
        }
        while (q + 1).saturating_mul(self.d) <= x {
            q += 1;
        }
        q
    }

    /// `x / d`, exactly.
    #[inline]
    pub fn div(&self, x: u128) -> u128 {
        if x < u128::from(self.d) {
            return 0;
        }
        if x >> 63 != 0 {
            return x / u128::from(self.d);
        }
        u128::from(self.div_u64(x as u64))
    }
}

/// `a / b` truncated toward zero, as C and Rust do, with a 64-bit fast path.
#[inline]
pub(crate) fn idiv(a: i128, b: i128) -> i128 {
    match (i64::try_from(a), i64::try_from(b)) {
        (Ok(a), Ok(b)) => i128::from(a / b),
        _ => a / b,
    }
}

/// Narrows a 128-bit intermediate to u64, saturating.
/// The time `rate` takes for `n` units, in us, rounded up (saturating).
pub(crate) fn time_for(n: u64, rate: Rate) -> u64 {
    sat(div_ceil(
        u128::from(n) * u128::from(rate.period_us),
        u128::from(rate.count),
    ))
}

pub(crate) fn sat(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_print() {
        assert_eq!(parse_duration("250ms"), Ok(250_000));
        assert_eq!(parse_duration("90s"), Ok(90_000_000));
        assert_eq!(parse_duration("1d"), Ok(86_400_000_000));
        assert_eq!(parse_duration("3000ns"), Ok(3));
        assert!(parse_duration("1500ns")
            .unwrap_err()
            .contains("whole number of microseconds"));
        assert!(parse_duration("5").unwrap_err().contains("no unit"));
        assert!(parse_duration("5w")
            .unwrap_err()
            .contains("unknown unit 'w'"));
        assert!(parse_duration("ms").unwrap_err().contains("whole number"));
        assert!(parse_duration("99999999999999999999s").is_err());
        assert_eq!(fmt_duration(90_000_000), "90s");
        assert_eq!(fmt_duration(1_500_000), "1500ms");
        assert_eq!(fmt_duration(0), "0us");
    }

    #[test]
    fn divisor_is_exact() {
        for d in [
            1u64,
            3,
            7,
            1_000_000,
            333_333,
            86_400_000_000,
            (1 << 40) + 1,
        ] {
            let div = Divisor::new(d);
            for x in [
                0u64,
                1,
                d - 1,
                d,
                d + 1,
                2 * d - 1,
                12_345_678_901,
                (1 << 62) - 1,
                1 << 62,
            ] {
                assert_eq!(div.div(u128::from(x)), u128::from(x / d), "{x} / {d}");
            }
            assert_eq!(div.div(u128::MAX), u128::MAX / u128::from(d));
        }
    }

    #[test]
    fn rates_parse_print_and_scale_exactly() {
        let r = Rate::parse("3/s").unwrap();
        assert_eq!((r.scale(), r.interval_ticks()), (3, 1_000_000));
        let r = Rate::parse("10/s").unwrap();
        assert_eq!((r.scale(), r.interval_ticks()), (1, 100_000));
        let r = Rate::parse("5/250ms").unwrap();
        assert_eq!(r.to_string(), "5/250ms");
        assert_eq!(Rate::parse("7/m").unwrap().to_string(), "7/m");
        assert!(Rate::parse("0/s").unwrap_err().contains("at least 1"));
        assert!(Rate::parse("1.5/s").unwrap_err().contains("whole number"));
        assert!(Rate::parse("10/fortnight")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(Rate::parse("10").unwrap_err().contains("not a rate"));
    }
}
