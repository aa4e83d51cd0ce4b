//! The controllers: how a limit moves after each window of outcomes. Pure arithmetic
//! over [`WindowSummary`]; the gate decides when a window closes.

use super::window::WindowSummary;

/// Which controller moves the limit, with its own settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ControllerKind {
    /// Latency gradient (the default): the limit follows the ratio of the unloaded
    /// latency to the window's mean latency.
    Gradient {
        /// The latency ratio (mean / baseline) still read as "no queueing".
        tolerance: f64,
        /// The factor applied to the limit when permits are dropped.
        backoff: f64,
    },
    /// Additive increase, multiplicative decrease: grows while limit-bound without
    /// drops, backs off on drops. Ignores latency.
    Aimd {
        /// Added to the limit after a limit-bound window without drops.
        increase: u32,
        /// The factor applied to the limit when permits are dropped.
        backoff: f64,
    },
    /// TCP Vegas: estimates the requests queued at the service from the baseline
    /// latency and keeps that estimate between `alpha` and `beta` (each times
    /// `log10(limit)`, at least 1).
    Vegas {
        /// Grow while fewer than `alpha x log10(limit)` requests are queued.
        alpha: f64,
        /// Shrink while more than `beta x log10(limit)` requests are queued.
        beta: f64,
        /// The factor applied to the limit when permits are dropped.
        backoff: f64,
    },
}

impl ControllerKind {
    /// The controller's name in a spec: `gradient`, `aimd` or `vegas`.
    pub fn name(&self) -> &'static str {
        match self {
            ControllerKind::Gradient { .. } => "gradient",
            ControllerKind::Aimd { .. } => "aimd",
            ControllerKind::Vegas { .. } => "vegas",
        }
    }
}

/// The most a limit may fall in one window (a factor): one window of bad news halves
/// it at most, so a transient cannot collapse it to the floor.
pub(crate) const MAX_CUT: f64 = 0.5;

/// The moving part of a controller: the limit (fractional, so that small steps add
/// up), and the gradient's growth step and last known knee.
#[derive(Debug, Clone)]
pub(crate) struct ControllerState {
    pub(crate) limit: f64,
    /// The next increase (gradient).
    step: f64,
    /// The limit at which queueing was last seen (gradient); infinite until then.
    knee: f64,
    /// Whether the last window called for a cut (drops, queueing), even one the
    /// floor stopped.
    pub(crate) cut: bool,
}

impl ControllerState {
    pub(crate) fn new(initial: u32) -> Self {
        ControllerState {
            limit: f64::from(initial),
            step: 1.0,
            knee: f64::INFINITY,
            cut: false,
        }
    }

    /// Moves the limit after a window; the result is clamped to `[min, max]`.
    pub(crate) fn on_window(
        &mut self,
        kind: &ControllerKind,
        w: &WindowSummary,
        min: u32,
        max: u32,
    ) {
        let l = self.limit;
        let next = match *kind {
            ControllerKind::Gradient { tolerance, backoff } => self.gradient(w, tolerance, backoff),
            ControllerKind::Aimd { increase, backoff } => {
                if w.drops > 0 {
                    l * backoff
                } else if w.limit_bound {
                    l + f64::from(increase)
                } else {
                    l
                }
            }
            ControllerKind::Vegas {
                alpha,
                beta,
                backoff,
            } => {
                let lg = l.log10().max(1.0);
                match (w.drops, w.mean_us, w.baseline_us) {
                    (d, _, _) if d > 0 => l * backoff,
                    (_, Some(m), Some(b)) if m > 0 => {
                        let used = f64::from(w.max_in_flight).min(l);
                        let queued = used * (1.0 - b as f64 / m as f64);
                        if queued > beta * lg {
                            l - lg
                        } else if queued < alpha * lg && w.limit_bound {
                            l + lg
                        } else {
                            l
                        }
                    }
                    _ => l,
                }
            }
        };
        self.cut = next < l;
        // Cuts come out of the lowest class's permits first.
        let protected = f64::from(w.protected).min(l);
        self.limit = (next.max(l * MAX_CUT).max(protected)).clamp(f64::from(min), f64::from(max));
    }

    /// The gradient rule (docs/adaptive.md): cut to `used / ratio` when the mean
    /// passes `tolerance x baseline`, grow when limit-bound without queueing.
    fn gradient(&mut self, w: &WindowSummary, tolerance: f64, backoff: f64) -> f64 {
        let l = self.limit;
        if w.drops > 0 {
            self.knee = l;
            self.step = 1.0;
            return l * backoff;
        }
        let (Some(m), Some(b)) = (w.mean_us, w.baseline_us) else {
            return l;
        };
        let ratio = m as f64 / b.max(1) as f64;
        // Queueing, not chance: the mean passes the tolerance by more than twice its
        // standard error (a service whose times jitter +-20 % strays ~4 % in a window
        // of ten, and the baseline is the least of many such means).
        let sure = m.saturating_sub(2 * w.mean_error_us) as f64 / b.max(1) as f64;
        if sure > tolerance {
            // Little's law: at `ratio` times the unloaded latency, `used / ratio`
            // requests in flight would have been served without queueing.
            self.knee = l;
            self.step = 1.0;
            let used = f64::from(w.max_in_flight).min(l);
            return (used / ratio).min(l);
        }
        if !w.limit_bound {
            return l;
        }
        let grown = l + self.step;
        // Below the last knee: halve the distance to it each window (at least 1);
        // at or past it: the step doubles each window (at most doubling the limit),
        // to find new capacity fast.
        self.step = if self.knee.is_finite() && grown < self.knee {
            ((self.knee - grown) / 2.0).floor().max(1.0)
        } else {
            (self.step * 2.0).min(grown).max(1.0)
        };
        grown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRADIENT: ControllerKind = ControllerKind::Gradient {
        tolerance: 1.2,
        backoff: 0.9,
    };

    fn window(mean: u64, baseline: u64, in_flight: u32) -> WindowSummary {
        WindowSummary {
            drops: 0,
            mean_us: Some(mean),
            mean_error_us: 0,
            baseline_us: Some(baseline),
            max_in_flight: in_flight,
            limit_bound: true,
            protected: 0,
        }
    }

    /// A service of capacity `c` sharing its processor: latency `base x n / c` past c.
    fn processor_sharing(c: u32, n: u32) -> u64 {
        20_000 * u64::from(n.max(c)) / u64::from(c)
    }

    fn settle(state: &mut ControllerState, c: u32, windows: usize) -> Vec<u32> {
        (0..windows)
            .map(|_| {
                let n = state.limit as u32;
                state.on_window(
                    &GRADIENT,
                    &window(processor_sharing(c, n), 20_000, n),
                    1,
                    1000,
                );
                state.limit as u32
            })
            .collect()
    }

    #[test]
    fn gradient_finds_the_knee_of_a_processor_sharing_service_and_follows_it() {
        let mut s = ControllerState::new(4);
        let limits = settle(&mut s, 8, 12);
        // Slow start, then a cycle just above the capacity.
        assert_eq!(limits, [5, 7, 11, 8, 9, 10, 8, 9, 10, 8, 9, 10]);
        // Capacity halves: one window cuts to it, then the same cycle.
        let limits = settle(&mut s, 4, 6);
        assert!(limits.iter().all(|&l| (4..=5).contains(&l)), "{limits:?}");
        // Capacity back to 8: found again within a few windows.
        let limits = settle(&mut s, 8, 8);
        assert!(
            limits[4..].iter().all(|&l| (8..=10).contains(&l)),
            "{limits:?}"
        );
    }

    #[test]
    fn a_cut_leaves_the_higher_classes_what_they_held() {
        // 10 in flight, 8 of them critical, at 1.25x the baseline: Little's law says
        // 8; at twice the baseline it would say 5, but the sheddable work goes
        // first: the limit stops at what critical work held.
        let mut s = ControllerState::new(10);
        let mut w = window(40_000, 20_000, 10);
        w.protected = 8;
        s.on_window(&GRADIENT, &w, 1, 1000);
        assert_eq!(s.limit, 8.0);
        assert!(s.cut);
        // With one class in flight, nothing is protected: the cut is whole.
        s.on_window(&GRADIENT, &window(40_000, 20_000, 8), 1, 1000);
        assert_eq!(s.limit, 4.0);
    }

    #[test]
    fn a_limit_that_is_not_used_does_not_grow() {
        let mut s = ControllerState::new(10);
        let mut w = window(20_000, 20_000, 3);
        w.limit_bound = false;
        s.on_window(&GRADIENT, &w, 1, 1000);
        assert_eq!(s.limit, 10.0);
    }

    #[test]
    fn one_window_never_cuts_more_than_half_nor_leaves_min_max() {
        let mut s = ControllerState::new(100);
        s.on_window(&GRADIENT, &window(10_000_000, 20_000, 100), 1, 1000);
        assert_eq!(s.limit, 50.0);
        let mut s = ControllerState::new(10);
        s.on_window(&GRADIENT, &window(10_000_000, 20_000, 10), 8, 1000);
        assert_eq!(s.limit, 8.0);
        let mut s = ControllerState::new(999);
        s.on_window(&GRADIENT, &window(20_000, 20_000, 999), 1, 1000);
        assert_eq!(s.limit, 1000.0);
    }

    #[test]
    fn aimd_adds_while_bound_and_multiplies_down_on_drops() {
        let kind = ControllerKind::Aimd {
            increase: 1,
            backoff: 0.9,
        };
        let mut s = ControllerState::new(10);
        s.on_window(&kind, &window(1, 1, 10), 1, 100);
        assert_eq!(s.limit, 11.0);
        let mut w = window(1, 1, 11);
        w.drops = 3;
        s.on_window(&kind, &w, 1, 100);
        assert!((s.limit - 9.9).abs() < 1e-9);
    }

    #[test]
    fn vegas_holds_between_alpha_and_beta_queued() {
        let kind = ControllerKind::Vegas {
            alpha: 3.0,
            beta: 6.0,
            backoff: 0.9,
        };
        let mut s = ControllerState::new(8);
        for _ in 0..20 {
            let n = s.limit as u32;
            s.on_window(&kind, &window(processor_sharing(8, n), 20_000, n), 1, 1000);
        }
        // 3..6 requests queued at a capacity of 8: a limit of 11..14.
        assert!((11.0..=14.0).contains(&s.limit), "{}", s.limit);
    }
}
