//! Adaptive concurrency: a concurrency limit that finds the service's capacity from
//! what each permit reports when it ends, sheds low-value work first and shares the
//! limit fairly among callers.
//!
//! * A permit ends with an [`Outcome`]: `Success` with its latency, `Dropped` (a
//!   timeout, an overload answer from upstream) or `Ignored` (says nothing about
//!   capacity; a permit dropped without a report). Only outcomes move the limit, and
//!   only within `[min, max]`.
//! * Outcomes are gathered into windows of at least `max(10, limit)` outcomes of
//!   permits granted under the current limit (older permits describe an older limit
//!   and are left out). A window is summarised by its trimmed mean latency (the
//!   `max(1, n/20)` fastest and slowest samples left out); the baseline is the least
//!   window mean of the last `baseline-window` (10 s). No single sample moves a
//!   trimmed mean beyond the range of the window's other samples, so one lucky or
//!   one slow response cannot move a limit by itself (a *dropped* permit is a signal
//!   of overload: one in a window backs the limit off); one window lowers a limit by
//!   half at most.
//! * The controllers ([`ControllerKind`]): `gradient` (the default) cuts the limit to
//!   `in_flight / (mean / baseline)` (the concurrency that Little's law says was
//!   served without queueing) when the mean passes `tolerance x baseline`, and
//!   grows it while it binds and the latency holds — fast far from the last knee,
//!   by one near it; `aimd`; `vegas`. None needs a probe that stops traffic.
//! * Held permits are never revoked: a falling limit only stops new admissions.
//! * Waiters queue by [`Priority`], FIFO within one; a waiter is shed when its wait
//!   passes the queueing-delay target (`queue-delay`, by default half the baseline
//!   once the service has shown its knee), when the queue is full, or — sheddable
//!   work — as soon as more important work has to wait.
//! * Higher priorities are protected at capacity: a request takes a permit only if one
//!   is free beyond those the priorities above it held lately (this window or the
//!   last, while their last release is at most one baseline old) and do not hold
//!   now; a cut never takes the limit below what the priorities above the lowest one
//!   in flight held during the window, so the lowest class absorbs it — also while
//!   lower work holds permits granted before the limit last changed, or from a place
//!   kept for higher work (at a lower waiter's deadline): work coming back to a place
//!   its class held lately takes it as long as its class and those above hold fewer
//!   than the limit, and the permits in flight stay under the limit plus those lower
//!   permits (which only end: lower work gets no new permit until in flight is under
//!   the limit). While the work of one priority and above fits the capacity on its
//!   own, it is neither shed nor slowed by lower work.
//! * A service whose times jitter: a window counts towards the baseline at its mean
//!   plus one standard error, and the gradient cuts only when the mean minus two
//!   standard errors passes the tolerance (chance is not read as queueing).
//! * Fair shares (optional): a freed permit goes to the waiter (of the top priority)
//!   whose caller holds the fewest permits, FIFO among equals — max-min fairness,
//!   filled one permit at a time; held permits are never taken back. Nobody is
//!   limited while permits are free.
//!
//! [`AdaptiveGate`] is the whole state machine: the library's `AdaptiveLimiter`
//! wraps it with a lock, wakers and timers, and `tollgate simulate` drives it with a
//! virtual clock, so the same inputs give the same limits everywhere.

mod controller;
mod gate;
mod request;
mod spec;
mod window;

pub use controller::ControllerKind;
pub use gate::{
    AdaptiveGate, AdaptiveStats, Enqueued, GateEvent, Request, ShedCounts, Ticket, WaiterId,
    AUTO_DELAY_BEFORE_KNEE_US, MIN_AUTO_DELAY_US, MIN_WINDOW,
};
pub use request::{Outcome, Priority, PriorityError, Shed};
pub use spec::{AdaptiveSpec, AdaptiveSpecError, QueueDelay, CONTROLLERS, MAX_LIMIT};
pub use window::WindowSummary;
