//! One rule's counters and how a decision counts on them (envoyproxy/ratelimit's
//! per-descriptor statistics): a leaf, read by the metrics of both namings.

use prometheus_client::metrics::counter::Counter;

/// The admitted hits of `h` that landed past the near-limit threshold
/// (`floor(limit x ratio)`, in `f32` as envoyproxy/ratelimit computes it).
pub(super) fn near_limit_hits(h: Hits, ratio: f32) -> u64 {
    let threshold = (h.limit as f32 * ratio).floor() as u64;
    let used_after = h.limit.saturating_sub(h.remaining);
    let used_before = used_after.saturating_sub(h.hits);
    used_after.saturating_sub(threshold.max(used_before))
}

/// A decision's outcome, as counted.
#[derive(Debug, Clone, Copy)]
#[repr(usize)]
pub enum Verdict {
    /// Admitted.
    Allowed,
    /// Rejected.
    Rejected,
    /// Rejected by a rule in shadow mode, so admitted.
    ShadowRejected,
}

/// One rule's counters (or one value's, under `detailed_metric`): its decisions by
/// outcome and envoyproxy/ratelimit's per-descriptor statistics, in hits. Held by the
/// rule itself, so counting is a few atomic adds.
#[derive(Debug, Clone)]
pub struct RuleStats {
    pub(super) decisions: [Counter; 3],
    pub(super) total_hits: Counter,
    pub(super) over_limit: Counter,
    pub(super) near_limit: Counter,
    pub(super) within_limit: Counter,
    pub(super) shadow_mode: Counter,
}

impl RuleStats {
    /// Counts one descriptor's decision, hits past `near_limit_ratio` of the limit
    /// being near it. Hits are counted as envoyproxy/ratelimit counts them, except
    /// that a rejected request counts nothing against its limit here (all or
    /// nothing), so all its hits are over the limit.
    pub fn count(&self, h: Hits, near_limit_ratio: f32) {
        self.decisions[h.verdict as usize].inc();
        self.total_hits.inc_by(h.hits);
        match h.verdict {
            Verdict::Allowed => {
                self.within_limit.inc_by(h.hits);
                let near = near_limit_hits(h, near_limit_ratio);
                if near > 0 {
                    self.near_limit.inc_by(near);
                }
            }
            Verdict::Rejected => {
                self.over_limit.inc_by(h.hits);
            }
            Verdict::ShadowRejected => {
                self.over_limit.inc_by(h.hits);
                self.shadow_mode.inc_by(h.hits);
            }
        }
    }

    /// Its hits by envoyproxy/ratelimit's statistic.
    pub fn hit_counts(&self) -> [(&'static str, u64); 5] {
        [
            ("total_hits", self.total_hits.get()),
            ("over_limit", self.over_limit.get()),
            ("near_limit", self.near_limit.get()),
            ("within_limit", self.within_limit.get()),
            ("shadow_mode", self.shadow_mode.get()),
        ]
    }
}

/// What one descriptor's decision counts: its hits, and where its limit stood.
#[derive(Debug, Clone, Copy)]
pub struct Hits {
    /// The descriptor's hits (its cost; 0 for a look).
    pub hits: u64,
    /// The decision's outcome.
    pub verdict: Verdict,
    /// The limit the decision reports (its headline: requests per unit for Envoy's
    /// limits).
    pub limit: u64,
    /// What the limit still admits after this decision.
    pub remaining: u64,
}
