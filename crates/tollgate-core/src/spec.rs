//! The policy spec language: `ALGORITHM:key=value,key=value` (docs/semantics.md).
//!
//! Parsing is where every error lives: a parsed [`Policy`](crate::Policy) is always
//! valid, and prints back (`Display`) as a spec that parses to the same policy.

use std::fmt;

use crate::list::{params_of, spec_names, Algo, AlgorithmKind};
use crate::params::{Params, Res};
use crate::policy::Policy;
use crate::units::fmt_duration;

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
        .collect();
    let p = Params::parse(algo, &known, body)?;
    let algo = Algo::from_spec(algo, &p)?;
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

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = fmt_duration;
        self.algo().fmt_spec(f)?;
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
