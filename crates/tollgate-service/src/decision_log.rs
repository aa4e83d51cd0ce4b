//! One line per decision at debug, under the log target `tollgate::decisions`: the
//! domain, the descriptors' entries (values masked unless `reveal_values`), the
//! outcome, and the binding rule's name, policy, remaining and reset. Off, it costs
//! a decision one check of the log filter; on, at most `per_second` lines are
//! written each second, and the next line written says how many were not.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_runtime::config::DecisionLog as Settings;

use crate::{CheckResult, DescriptorRequest};

/// The log target of the decision lines.
pub const TARGET: &str = "tollgate::decisions";

/// A digest of a descriptor value (`#1a2b3c4d`): which value it is, without what it
/// is (a value may be an API key). The console masks values the same way.
pub fn value_digest(value: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, value.as_bytes());
    let mut out = String::from("#");
    for b in &digest.as_ref()[..4] {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The decision lines' budget and settings.
#[derive(Debug)]
pub struct DecisionLog {
    per_second: u64,
    reveal: bool,
    /// The second lines are being counted in (high 32 bits) and the lines written
    /// in it (low 32 bits).
    window: AtomicU64,
    /// Decisions not logged since the last line.
    unlogged: AtomicU64,
}

impl DecisionLog {
    /// The log `settings` ask for.
    pub fn new(settings: &Settings) -> Self {
        DecisionLog {
            per_second: settings.per_second.min(u64::from(u32::MAX)),
            reveal: settings.reveal_values,
            window: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
        }
    }

    /// Whether the decision lines are on (the log filter lets them through).
    #[inline]
    pub fn enabled() -> bool {
        tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
    }

    /// Writes the line of `result` (the decision of `descriptors` in `domain`, at
    /// `now_ns`), if this second's budget has room; else counts it.
    pub fn record(
        &self,
        now_ns: u64,
        domain: &str,
        descriptors: &[DescriptorRequest],
        result: &CheckResult,
    ) {
        if !self.take(now_ns / 1_000_000_000) {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let unlogged = self.unlogged.swap(0, Ordering::Relaxed);
        let entries = self.entries(descriptors);
        let outcome = result.overall.name();
        let Some((limit, decided)) = result.binding() else {
            tracing::debug!(target: TARGET, domain, entries, outcome, unlogged, "decision: no limit applied");
            return;
        };
        let d = &decided.decision;
        let rule = limit.name.as_deref().unwrap_or(&limit.path);
        let policy = match &limit.specs {
            Some(specs) => specs.get(decided.binding).cloned().unwrap_or_default(),
            None => match limit.envoy {
                Some((unit, n)) => format!("{n} per {}", format!("{unit:?}").to_lowercase()),
                None => String::new(),
            },
        };
        // When this request would pass (a reject), or when the binding policy is
        // replenished (an admit).
        let reset_ms = d.retry_after_us.unwrap_or(d.reset_after_us) as f64 / 1e3;
        tracing::debug!(
            target: TARGET,
            domain,
            entries,
            outcome,
            rule,
            policy,
            remaining = d.remaining,
            reset_ms,
            unlogged,
            "decision"
        );
    }

    /// Takes one line of second `second`'s budget.
    fn take(&self, second: u64) -> bool {
        let second = second & u64::from(u32::MAX);
        let mut current = self.window.load(Ordering::Relaxed);
        loop {
            let lines = match current >> 32 == second {
                true => current & u64::from(u32::MAX),
                false => 0,
            };
            if lines >= self.per_second {
                return false;
            }
            let next = (second << 32) | (lines + 1);
            match (self.window).compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => current = now,
            }
        }
    }

    /// The descriptors' entries: `k=v,k=v` each, descriptors apart by `; `.
    fn entries(&self, descriptors: &[DescriptorRequest]) -> String {
        let mut out = String::new();
        for (i, d) in descriptors.iter().enumerate() {
            if i > 0 {
                out.push_str("; ");
            }
            for (j, (k, v)) in d.entries.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                match self.reveal {
                    true => {
                        let _ = write!(out, "{k}={v}");
                    }
                    false => {
                        let _ = write!(out, "{k}={}", value_digest(v));
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_second_writes_its_budget_and_no_more() {
        let log = DecisionLog::new(&Settings {
            per_second: 3,
            reveal_values: false,
        });
        let taken = |s| (0..5).filter(|_| log.take(s)).count();
        assert_eq!(taken(7), 3);
        assert_eq!(taken(7), 0);
        assert_eq!(taken(8), 3);
        let none = DecisionLog::new(&Settings {
            per_second: 0,
            reveal_values: false,
        });
        assert!(!none.take(1));
    }

    #[test]
    fn values_are_digests_unless_revealed() {
        let d = |entries: &[(&str, &str)]| DescriptorRequest {
            entries: (entries.iter())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            hits: None,
            give_back: false,
            limit_override: None,
        };
        let descriptors = [
            d(&[("api_key", "secret-1"), ("path", "/a")]),
            d(&[("ip", "1.2.3.4")]),
        ];
        let masked = DecisionLog::new(&Settings::default()).entries(&descriptors);
        assert!(
            !masked.contains("secret-1") && !masked.contains("1.2.3.4"),
            "{masked}"
        );
        assert_eq!(masked.matches('#').count(), 3, "{masked}");
        assert!(
            masked.starts_with("api_key=#") && masked.contains("; ip=#"),
            "{masked}"
        );
        let shown = DecisionLog::new(&Settings {
            per_second: 1,
            reveal_values: true,
        })
        .entries(&descriptors);
        assert_eq!(shown, "api_key=secret-1,path=/a; ip=1.2.3.4");
        assert_eq!(value_digest("x"), value_digest("x"));
        assert_ne!(value_digest("x"), value_digest("y"));
    }
}
