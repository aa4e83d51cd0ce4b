//! Fixed window counter.

use crate::algorithm::{schedule_algorithm, Schedule};
use std::fmt;

use crate::params::{share_count, windows_touched, Params, Res, Spec};
use crate::units::fmt_duration;

/// Where fixed windows start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Align {
    /// Windows start at multiples of the window length (since the clock's origin;
    /// for the default clock, the Unix epoch: a `1m` window starts on the minute).
    #[default]
    Clock,
    /// A window opens at the first request after the previous one ended.
    First,
}

/// What a window's end does to a count past the limit (a charge's debt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Debt {
    /// The debt carries into the windows after it, each window's `limit` paying it
    /// back first: a charge past the budget is never forgiven by a window's end.
    #[default]
    Carry,
    /// Every window starts from 0, as envoyproxy/ratelimit's counters (one key per
    /// window) do; what Envoy rule files' `rate_limit` entries use.
    Forgive,
}

/// At most `limit` cost per window: `count(window of t) + c <= limit` admits.
///
/// Cheap and predictable, but a client can get up to `2*limit` through around a window
/// boundary (`limit` at the end of one window and `limit` at the start of the next).
/// A charge may leave a window's count past the limit; that debt carries into the
/// following windows until their limits have paid it back (see [`Debt`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u64,
    window: u64,
    align: Align,
    debt: Debt,
}

/// One key's window: `count` admitted in the window starting at `start` (us). A window
/// starting after now holds reservations made by `acquire`. `count == 0`: no window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Start of the window, in us.
    pub start: u64,
    /// Cost admitted in it.
    pub count: u64,
}

impl FixedWindow {
    /// `limit` (>= 1) per `window_us` (>= 1).
    pub fn new(limit: u64, window_us: u64, align: Align) -> Result<Self, String> {
        super::check_limit_window(limit, window_us)?;
        Ok(FixedWindow {
            limit,
            window: window_us,
            align,
            debt: Debt::Carry,
        })
    }

    /// The same windows with `debt` at their ends.
    pub fn with_debt(self, debt: Debt) -> Self {
        FixedWindow { debt, ..self }
    }

    /// What a window's end does to a count past the limit.
    pub fn debt(&self) -> Debt {
        self.debt
    }

    /// The limit per window.
    pub fn limit_per_window(&self) -> u64 {
        self.limit
    }

    /// The window length in us.
    pub fn window_us(&self) -> u64 {
        self.window
    }

    /// Where windows start: on multiples of the window (clock) or at the first request.
    pub fn align(&self) -> Align {
        self.align
    }

    fn end(&self, s: &FixedWindowState) -> u64 {
        s.start.saturating_add(self.window)
    }

    /// The state as it stands at `now`: a window whose count passed the limit and
    /// which has ended hands its debt (`count - limit`) to the window after it, and
    /// so on, `limit` paid back per window (unless the debt is forgiven).
    pub fn at(&self, s: &FixedWindowState, now: u64) -> FixedWindowState {
        if self.debt == Debt::Forgive || s.count <= self.limit || now < self.end(s) {
            return *s;
        }
        let passed = (now - s.start) / self.window;
        match s.count.checked_sub(passed.saturating_mul(self.limit)) {
            Some(count) if count > 0 => FixedWindowState {
                start: s.start + passed * self.window,
                count,
            },
            _ => FixedWindowState::default(),
        }
    }

    /// Whether the state holds a window that is current or in the future at `now`
    /// (`s` as it stands at `now`).
    fn live(&self, s: &FixedWindowState, now: u64) -> bool {
        s.count > 0 && now < self.end(s)
    }

    /// How many windows from `s.start` on it takes until the count is at most `left`
    /// (`s` live): 1 when it is the next, more while a debt is paid back.
    fn windows_until(&self, s: &FixedWindowState, left: u64) -> u64 {
        let over = s.count.saturating_sub(left);
        match self.debt {
            Debt::Forgive => 1,
            Debt::Carry => over.div_ceil(self.limit).max(1),
        }
    }

    fn give_back(&self, s: &mut FixedWindowState, now: u64, cost: u64) {
        *s = self.at(s, now);
        if self.live(s, now) {
            s.count -= cost.min(s.count);
        }
    }
}

impl Schedule for FixedWindow {
    type State = FixedWindowState;
    fn window(&self) -> u64 {
        FixedWindow::window_us(self)
    }

    fn fresh(&self) -> FixedWindowState {
        FixedWindowState::default()
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn last_active(&self, s: &FixedWindowState) -> u64 {
        s.start
    }

    fn earliest(&self, s: &FixedWindowState, now: u64, cost: u64) -> u64 {
        let s = &self.at(s, now);
        if !self.live(s, now) {
            return now;
        }
        if s.count + cost <= self.limit {
            now.max(s.start)
        } else {
            // The window in which the count left over leaves room for `cost`.
            let k = self.windows_until(s, self.limit.saturating_sub(cost));
            s.start.saturating_add(k.saturating_mul(self.window))
        }
    }

    fn admit(&self, s: &mut FixedWindowState, _now: u64, at: u64, cost: u64) {
        *s = self.at(s, at);
        if self.live(s, at) && at >= s.start {
            s.count += cost;
        } else {
            s.start = match self.align {
                Align::Clock => at - at % self.window,
                Align::First => at,
            };
            s.count = cost;
        }
    }

    /// The count may pass the limit by `debt` for the rest of its window.
    fn room(&self, s: &FixedWindowState, at: u64, debt: u64) -> u64 {
        let s = &self.at(s, at);
        let cap = self.limit.saturating_add(debt);
        if self.live(s, at) {
            cap.saturating_sub(s.count)
        } else {
            cap
        }
    }

    /// A charge before a reserved window goes into that window (the one counted).
    fn charge_at(&self, s: &FixedWindowState, now: u64) -> u64 {
        let s = &self.at(s, now);
        if self.live(s, now) {
            now.max(s.start)
        } else {
            now
        }
    }

    fn remaining(&self, s: &FixedWindowState, now: u64) -> u64 {
        let s = &self.at(s, now);
        if !self.live(s, now) {
            self.limit
        } else if now < s.start {
            0
        } else {
            self.limit.saturating_sub(s.count)
        }
    }

    /// Until the window ends, or while in debt, until the debt is paid back.
    fn reset_after(&self, s: &FixedWindowState, now: u64) -> u64 {
        let s = &self.at(s, now);
        if self.live(s, now) {
            let k = self.windows_until(s, 0);
            s.start.saturating_add(k.saturating_mul(self.window)) - now
        } else {
            0
        }
    }
}

schedule_algorithm!(FixedWindow, FixedWindowState);

impl Spec for FixedWindow {
    const PARAMS: &'static [&'static str] = &["limit", "window", "align", "debt"];

    fn from_spec(_: &str, p: &Params) -> Res<Option<Self>> {
        let align = match p.value("align")? {
            None | Some("clock") => Align::Clock,
            Some("first") => Align::First,
            Some(v) => return Err(p.bad("align", v, "expected clock or first")),
        };
        let debt = match p.value("debt")? {
            None | Some("carry") => Debt::Carry,
            Some("forgive") => Debt::Forgive,
            Some(v) => return Err(p.bad("debt", v, "expected carry or forgive")),
        };
        let limit = p.count("limit", "100")?;
        let window = p.duration("window", "1s")?;
        let fw = p.build(FixedWindow::new(limit, window, align))?;
        Ok(Some(fw.with_debt(debt)))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (limit, window) = (self.limit_per_window(), fmt_duration(self.window_us()));
        write!(f, "fixed-window:limit={limit},window={window}")?;
        if self.align() == Align::First {
            f.write_str(",align=first")?;
        }
        if self.debt() == Debt::Forgive {
            f.write_str(",debt=forgive")?;
        }
        Ok(())
    }

    fn share(&self, n: u64) -> Res<Self> {
        let limit = share_count(self.limit_per_window(), n);
        Ok(FixedWindow::new(limit, self.window_us(), self.align())?.with_debt(self.debt))
    }

    fn envelope(&self, w: u64) -> Option<u64> {
        Some(self.limit.saturating_mul(windows_touched(self.window, w)))
    }

    /// The count stays while the windows are the same.
    fn carry_over(&self, old: &Self, state: FixedWindowState, _: u64) -> Option<FixedWindowState> {
        (old.window_us() == self.window_us() && old.align() == self.align()).then_some(state)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Op, Policy};

    const S: u64 = 1_000_000;

    #[test]
    fn a_debt_carries_into_the_windows_after_it_until_paid_back() {
        let p: Policy = "fixed-window:limit=100,window=1s".parse().unwrap();
        let mut s = p.init(0);
        // 350 units of work reported in the first window: 250 past the limit.
        let d = p.charge(&mut s, 200_000, 350).unwrap();
        assert_eq!((d.remaining, d.retry_after_us), (0, Some(2 * S + 800_000)));
        assert_eq!(d.reset_after_us, 3 * S + 800_000);
        // Windows 1 and 2 pay back 200 of the debt: nothing fits in them.
        for t in [S, 2 * S - 1, 2 * S, 3 * S - 1] {
            let d = p.check(&mut s, t, 1, Op::Try).unwrap();
            assert!(!d.allowed, "admitted at {t} us while in debt");
        }
        // Window 3 starts with the last 50: 50 more fit, the 51st does not.
        assert_eq!(p.status(&s, 3 * S).remaining, 50);
        assert!(p.check(&mut s, 3 * S, 50, Op::Try).unwrap().allowed);
        let d = p.check(&mut s, 3 * S + 1, 1, Op::Try).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after_us, Some(S - 1));
        // A window with nothing carried is as new.
        assert_eq!(p.status(&s, 4 * S).remaining, 100);
        assert_eq!(p.status(&s, 4 * S).reset_after_us, 0);
    }

    #[test]
    fn a_debt_is_paid_back_by_windows_that_passed_unseen() {
        let p: Policy = "fixed-window:limit=10,window=1m,align=first"
            .parse()
            .unwrap();
        let mut s = p.init(0);
        // Opens [7 s, 67 s) with 35 of debt.
        assert!(p.charge(&mut s, 7 * S, 45).unwrap().allowed);
        // Four windows later ([247 s, 307 s)) 5 are carried: 5 fit.
        let at = 7 * S + 240 * S + 30 * S;
        assert_eq!(p.status(&s, at).remaining, 5);
        assert!(p.check(&mut s, at, 5, Op::Try).unwrap().allowed);
        assert!(!p.check(&mut s, at, 1, Op::Try).unwrap().allowed);
    }

    #[test]
    fn a_forgiven_debt_ends_with_its_window() {
        let p: Policy = "fixed-window:limit=100,window=1s,debt=forgive"
            .parse()
            .unwrap();
        assert_eq!(
            p.to_string(),
            "fixed-window:limit=100,window=1s,debt=forgive"
        );
        let mut s = p.init(0);
        let d = p.charge(&mut s, 200_000, 350).unwrap();
        assert_eq!(
            (d.retry_after_us, d.reset_after_us),
            (Some(800_000), 800_000)
        );
        assert!(p.check(&mut s, S, 100, Op::Try).unwrap().allowed);
        let e = "fixed-window:limit=1,debt=never"
            .parse::<Policy>()
            .unwrap_err();
        assert!(e.to_string().contains("expected carry or forgive"), "{e}");
    }
}
