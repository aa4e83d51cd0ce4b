//! A progress line on stderr for the long commands (`bench`, `simulate`, `replay`):
//! one line redrawn in place, a few times a second, once the work has gone on for a
//! second; only when stderr is a terminal (a script reading the output sees none of
//! it), and cleared when the work ends.

use std::io::{IsTerminal, Write};

use tollgate::clock::{Clock, MonotonicClock};

/// How long work goes on before the line shows, and how often it is redrawn.
const QUIET_FOR_US: u64 = 1_000_000;
const REDRAW_EVERY_US: u64 = 250_000;

/// One command's progress line.
pub struct Progress {
    label: String,
    /// The amount of work, when known (the unit is the caller's: rows, bytes, ...).
    total: Option<u64>,
    show: bool,
    clock: MonotonicClock,
    started_us: u64,
    drawn_us: Option<u64>,
    width: usize,
}

impl Progress {
    /// A line for work called `label` of `total` units (`None`: not known), shown
    /// only if stderr is a terminal.
    pub fn new(label: impl Into<String>, total: Option<u64>) -> Progress {
        Progress::shown_if(std::io::stderr().is_terminal(), label, total)
    }

    /// A line shown only if `show` (tests draw it into nothing).
    pub fn shown_if(show: bool, label: impl Into<String>, total: Option<u64>) -> Progress {
        let clock = MonotonicClock::new();
        Progress {
            label: label.into(),
            total,
            show,
            started_us: clock.now_us(),
            clock,
            drawn_us: None,
            width: 0,
        }
    }

    /// Says that `done` units are done, with `detail` after the share (a rate, say);
    /// redraws when due. Cheap when not due: one clock read.
    pub fn update(&mut self, done: u64, detail: impl FnOnce() -> String) {
        if !self.show {
            return;
        }
        let now = self.clock.now_us();
        let due = match self.drawn_us {
            None => now.saturating_sub(self.started_us) >= QUIET_FOR_US,
            Some(at) => now.saturating_sub(at) >= REDRAW_EVERY_US,
        };
        if !due {
            return;
        }
        self.drawn_us = Some(now);
        let line = self.line(done, now, &detail());
        // Pad over a longer previous line.
        let pad = self.width.saturating_sub(line.chars().count());
        self.width = line.chars().count();
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{line}{:pad$}", "");
        let _ = err.flush();
    }

    /// The line for `done` units at `now_us`.
    fn line(&self, done: u64, now_us: u64, detail: &str) -> String {
        let elapsed = now_us.saturating_sub(self.started_us) as f64 / 1e6;
        let share = match self.total {
            Some(total) if total > 0 => {
                format!(" {:>3}%", (done.min(total) as u128 * 100 / total as u128))
            }
            _ => String::new(),
        };
        let detail = if detail.is_empty() {
            String::new()
        } else {
            format!(", {detail}")
        };
        format!("{}:{share} ({elapsed:.0}s{detail})", self.label)
    }

    /// Clears the line (also on drop).
    pub fn finish(&mut self) {
        if self.drawn_us.take().is_some() {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{:width$}\r", "", width = self.width);
            let _ = err.flush();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_gives_the_share_the_time_and_the_detail() {
        let p = Progress::shown_if(false, "replay", Some(200));
        let at = p.started_us + 3_000_000;
        assert_eq!(
            p.line(50, at, "1000 rows/s"),
            "replay:  25% (3s, 1000 rows/s)"
        );
        assert_eq!(p.line(500, at, ""), "replay: 100% (3s)");
        let unknown = Progress::shown_if(false, "bench", None);
        assert_eq!(
            unknown.line(7, unknown.started_us, "7 req/s"),
            "bench: (0s, 7 req/s)"
        );
    }

    #[test]
    fn a_hidden_line_never_draws() {
        let mut p = Progress::shown_if(false, "x", Some(1));
        p.started_us = 0;
        p.update(1, || unreachable!("a hidden line asks for no detail"));
        assert_eq!(p.drawn_us, None);
    }
}
