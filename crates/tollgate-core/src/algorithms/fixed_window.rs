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

/// At most `limit` cost per window: `count(window of t) + c <= limit` admits.
///
/// Cheap and predictable, but a client can get up to `2*limit` through around a window
/// boundary (`limit` at the end of one window and `limit` at the start of the next).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u64,
    window: u64,
    align: Align,
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
        })
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

    /// Whether the state holds a window that is current or in the future at `now`.
    fn live(&self, s: &FixedWindowState, now: u64) -> bool {
        s.count > 0 && now < self.end(s)
    }

    fn give_back(&self, s: &mut FixedWindowState, now: u64, cost: u64) {
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
        if !self.live(s, now) {
            return now;
        }
        if s.count + cost <= self.limit {
            now.max(s.start)
        } else {
            self.end(s)
        }
    }

    fn admit(&self, s: &mut FixedWindowState, _now: u64, at: u64, cost: u64) {
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
        let cap = self.limit + debt;
        if self.live(s, at) {
            cap.saturating_sub(s.count)
        } else {
            cap
        }
    }

    /// A charge before a reserved window goes into that window (the one counted).
    fn charge_at(&self, s: &FixedWindowState, now: u64) -> u64 {
        if self.live(s, now) {
            now.max(s.start)
        } else {
            now
        }
    }

    fn remaining(&self, s: &FixedWindowState, now: u64) -> u64 {
        if !self.live(s, now) {
            self.limit
        } else if now < s.start {
            0
        } else {
            self.limit.saturating_sub(s.count)
        }
    }

    fn reset_after(&self, s: &FixedWindowState, now: u64) -> u64 {
        if self.live(s, now) {
            self.end(s) - now
        } else {
            0
        }
    }
}

schedule_algorithm!(FixedWindow, FixedWindowState);

impl Spec for FixedWindow {
    const PARAMS: &'static [&'static str] = &["limit", "window", "align"];

    fn from_spec(_: &str, p: &Params) -> Res<Option<Self>> {
        let align = match p.value("align")? {
            None | Some("clock") => Align::Clock,
            Some("first") => Align::First,
            Some(v) => return Err(p.bad("align", v, "expected clock or first")),
        };
        let limit = p.count("limit", "100")?;
        let window = p.duration("window", "1s")?;
        Ok(Some(p.build(FixedWindow::new(limit, window, align))?))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (limit, window) = (self.limit_per_window(), fmt_duration(self.window_us()));
        write!(f, "fixed-window:limit={limit},window={window}")?;
        if self.align() == Align::First {
            f.write_str(",align=first")?;
        }
        Ok(())
    }

    fn share(&self, n: u64) -> Res<Self> {
        let limit = share_count(self.limit_per_window(), n);
        FixedWindow::new(limit, self.window_us(), self.align())
    }

    fn envelope(&self, w: u64) -> Option<u64> {
        Some(self.limit.saturating_mul(windows_touched(self.window, w)))
    }

    /// The count stays while the windows are the same.
    fn carry_over(&self, old: &Self, state: FixedWindowState, _: u64) -> Option<FixedWindowState> {
        (old.window_us() == self.window_us() && old.align() == self.align()).then_some(state)
    }
}
