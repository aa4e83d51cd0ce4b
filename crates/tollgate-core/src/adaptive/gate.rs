//! [`AdaptiveGate`]: permits under an adaptive limit, with a priority queue, fair
//! shares among callers and the controller's windows, as one deterministic state
//! machine over times handed in by the caller.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

use super::controller::ControllerState;
use super::request::{Outcome, Priority, Shed};
use super::spec::{AdaptiveSpec, QueueDelay};
use super::window::{Window, WindowSummary, WindowedMin};

/// How many standard errors above its mean a window counts towards the baseline.
/// The least of many noisy means is lower than the service's unloaded latency (by
/// about three standard errors over a few hundred windows); a baseline that low
/// reads chance as queueing, and cuts overshoot.
const BASELINE_ERRORS: u64 = 1;

/// The fewest outcomes in a window: below this a mean says too little.
pub const MIN_WINDOW: u32 = 10;

/// The queueing-delay target of `queue-delay=auto` until the service has shown its
/// knee (a window that called for a cut, or bound without the limit growing): while
/// the limit is still growing towards the capacity, waiting is the ramp, not
/// overload.
pub const AUTO_DELAY_BEFORE_KNEE_US: u64 = 1_000_000;

/// The least queueing-delay target of `queue-delay=auto`: timers are no finer.
pub const MIN_AUTO_DELAY_US: u64 = 1_000;

/// What one request asks of the gate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Request {
    /// Its priority (default normal).
    pub priority: Priority,
    /// Who sends it, for fair shares (a hash of an API key, client IP, tenant);
    /// `None`: no share applies.
    pub caller: Option<u64>,
}

impl Request {
    /// A request of this priority, from no caller in particular.
    pub fn new(priority: Priority) -> Self {
        Request {
            priority,
            caller: None,
        }
    }

    /// The same request from the caller `key` (hashed; equal keys share a share).
    pub fn caller(self, key: &(impl std::hash::Hash + ?Sized)) -> Self {
        use std::hash::{BuildHasher, BuildHasherDefault};
        // SipHash with fixed keys: the same caller hashes alike in every process run,
        // so simulations reproduce.
        let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
        Request {
            caller: Some(h.hash_one(key)),
            ..self
        }
    }
}

/// A held permit, as the gate knows it: handed back to [`AdaptiveGate::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    epoch: u64,
    admitted_us: u64,
    caller: Option<u64>,
    priority: Priority,
    /// Granted from a place kept for higher work, past its waiter's deadline.
    from_reserve: bool,
}

impl Ticket {
    /// When the permit was granted, in the gate's clock (us).
    pub fn admitted_us(&self) -> u64 {
        self.admitted_us
    }

    /// The priority it was granted at.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// Whether it was granted from a place kept for higher work (its waiter's
    /// deadline came first): that work, coming back, may take its place while it is
    /// held, even past the limit.
    pub fn from_reserve(&self) -> bool {
        self.from_reserve
    }
}

/// A waiter's handle: unique per gate.
pub type WaiterId = u64;

/// The answer to [`AdaptiveGate::enqueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// A permit was free.
    Granted(Ticket),
    /// The request waits; it is granted or shed by a later event, or at `deadline_us`
    /// by [`AdaptiveGate::shed_waiter`] (the caller's timer) or [`AdaptiveGate::expire`].
    Waiting {
        /// The waiter's handle.
        id: WaiterId,
        /// When it stops waiting, in the gate's clock (us); `None`: never.
        deadline_us: Option<u64>,
    },
    /// Rejected at once.
    Rejected(Shed),
}

/// What happened to a waiter since the caller last looked
/// ([`AdaptiveGate::drain_events`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateEvent {
    /// The waiter holds a permit now.
    Granted {
        /// The waiter.
        id: WaiterId,
        /// Its permit.
        ticket: Ticket,
    },
    /// The waiter was turned away.
    Shed {
        /// The waiter.
        id: WaiterId,
        /// Why.
        reason: Shed,
    },
}

/// Requests shed, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShedCounts {
    /// [`Shed::Busy`].
    pub busy: u64,
    /// [`Shed::QueueFull`].
    pub queue_full: u64,
    /// [`Shed::QueueDelay`].
    pub queue_delay: u64,
    /// [`Shed::MaxWait`].
    pub max_wait: u64,
    /// [`Shed::Outranked`].
    pub outranked: u64,
}

/// The state of an adaptive limiter, for metrics and dashboards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptiveStats {
    /// The limit now.
    pub limit: u32,
    /// Permits held now (may exceed a limit that just fell: held permits are never
    /// revoked).
    pub in_flight: u32,
    /// Requests waiting now.
    pub queued: u32,
    /// Free permits kept for priorities above the most important waiter's, as of the
    /// last call to the gate: the most those priorities held lately beyond what they
    /// hold now (0 when nobody waits; `try_acquire` of a lower priority is refused
    /// as `Busy` by the same reserve). Requests wait under a free permit only when it
    /// is kept so, and at most until their deadline.
    pub reserved: u32,
    /// The unloaded-latency baseline (the least window mean lately, each counted one
    /// standard error up), in us.
    pub baseline_us: Option<u64>,
    /// The trimmed mean latency of the last window, in us.
    pub last_mean_us: Option<u64>,
    /// The queueing-delay target now, in us (`None`: unbounded).
    pub queue_delay_us: Option<u64>,
    /// Windows closed so far (each may have moved the limit).
    pub windows: u64,
    /// Permits granted so far.
    pub admitted: u64,
    /// Requests shed so far, by reason.
    pub shed: ShedCounts,
    /// Requests shed so far, by class: sheddable (below normal), normal (below
    /// critical), critical.
    pub shed_by_class: [u64; 3],
}

#[derive(Debug, Clone, Copy)]
struct Waiter {
    priority: Priority,
    caller: Option<u64>,
    arrived_us: u64,
    deadline_us: Option<u64>,
    /// The caller's own bound came first (`Shed::MaxWait`), not the target.
    by_max_wait: bool,
}

/// The permits one priority holds, and the most it held lately: what the classes
/// below it must leave free for it.
#[derive(Debug, Clone, Copy)]
struct ClassLoad {
    priority: Priority,
    held: u32,
    /// The most held at once since the current window opened.
    peak: u32,
    /// The most held at once during the previous window.
    peak_before: u32,
    /// When it last released a permit (us).
    released_us: u64,
    /// Of `held`, the permits granted before the limit last changed or from a place
    /// kept for higher work: higher work coming back may take their places.
    stale: u32,
}

impl ClassLoad {
    /// The permits this class held lately and does not hold now, kept for it while
    /// its last release is at most `span_us` old (a client between two requests
    /// comes back within about one unloaded latency).
    fn reserve(&self, now_us: u64, span_us: u64) -> u32 {
        if now_us.saturating_sub(self.released_us) > span_us {
            return 0;
        }
        self.peak.max(self.peak_before).saturating_sub(self.held)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct CallerLoad {
    held: u32,
    waiting: u32,
}

/// Permits under an adaptive limit (see the module docs of
/// [`crate::adaptive`]). Every method takes `now` in microseconds of one clock that
/// never goes backwards; the same calls give the same results.
///
/// ```
/// use tollgate_core::adaptive::{AdaptiveGate, AdaptiveSpec, Enqueued, Outcome, Request};
///
/// let mut gate = AdaptiveGate::new("gradient:initial=1".parse::<AdaptiveSpec>()?, false);
/// let Enqueued::Granted(ticket) = gate.enqueue(0, Request::default(), None) else { panic!() };
/// // The limit is 1: the next request waits for the permit.
/// let Enqueued::Waiting { id, .. } = gate.enqueue(0, Request::default(), None) else { panic!() };
/// gate.release(20_000, ticket, Outcome::Success { latency_us: 20_000 });
/// assert!(matches!(gate.drain_events().next(),
///     Some(tollgate_core::adaptive::GateEvent::Granted { id: granted, .. }) if granted == id));
/// # Ok::<(), tollgate_core::adaptive::AdaptiveSpecError>(())
/// ```
#[derive(Debug, Clone)]
pub struct AdaptiveGate {
    spec: AdaptiveSpec,
    fair: bool,
    ctl: ControllerState,
    limit: u32,
    /// Whether the service has shown its knee: a window that called for a cut, or
    /// bound without the limit growing.
    knee_seen: bool,
    in_flight: u32,
    /// Bumped whenever the limit changes: outcomes of permits granted under an
    /// earlier limit do not describe the new one and are left out of windows.
    epoch: u64,
    window: Window,
    baseline: WindowedMin,
    last_mean: Option<u64>,
    windows: u64,
    order: BTreeSet<(Reverse<Priority>, WaiterId)>,
    waiters: HashMap<WaiterId, Waiter>,
    next_id: WaiterId,
    callers: HashMap<u64, CallerLoad>,
    /// Permits held by priority, the highest first (a handful of entries).
    classes: Vec<ClassLoad>,
    /// The latest time handed in (us): reserves lapse with it.
    now_us: u64,
    events: Vec<GateEvent>,
    admitted: u64,
    shed: ShedCounts,
    shed_by_class: [u64; 3],
}

impl AdaptiveGate {
    /// A gate at the spec's initial limit; `fair`: waiting callers share the limit.
    pub fn new(spec: AdaptiveSpec, fair: bool) -> Self {
        AdaptiveGate {
            ctl: ControllerState::new(spec.initial),
            limit: spec.initial,
            knee_seen: false,
            fair,
            in_flight: 0,
            epoch: 0,
            window: Window::default(),
            baseline: WindowedMin::new(spec.baseline_window_us),
            last_mean: None,
            windows: 0,
            order: BTreeSet::new(),
            waiters: HashMap::new(),
            next_id: 0,
            callers: HashMap::new(),
            classes: Vec::new(),
            now_us: 0,
            events: Vec::new(),
            admitted: 0,
            shed: ShedCounts::default(),
            shed_by_class: [0; 3],
            spec,
        }
    }

    /// The spec the gate runs.
    pub fn spec(&self) -> &AdaptiveSpec {
        &self.spec
    }

    /// The limit now.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Permits held now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// A permit now, or [`Shed::Busy`] at once (never waits, never jumps the queue:
    /// while a request of its priority or above waits, no permit is free for it).
    pub fn try_acquire(&mut self, now_us: u64, req: Request) -> Result<Ticket, Shed> {
        self.catch_up(now_us);
        if self.fits(req.priority) && !self.waiting_at_or_above(req.priority) {
            return Ok(self.admit(now_us, req));
        }
        self.window.saturated = true;
        Err(self.count_shed(req.priority, Shed::Busy { limit: self.limit }))
    }

    /// A permit now, or a place in the queue (by priority, FIFO within one), or a
    /// rejection. `max_wait_us` bounds the wait besides the queueing-delay target.
    /// Other waiters may be shed by this arrival: see [`Self::drain_events`].
    pub fn enqueue(&mut self, now_us: u64, req: Request, max_wait_us: Option<u64>) -> Enqueued {
        self.catch_up(now_us);
        if self.fits(req.priority) && !self.waiting_at_or_above(req.priority) {
            return Enqueued::Granted(self.admit(now_us, req));
        }
        self.window.saturated = true;
        if self.spec.queue == 0 || max_wait_us == Some(0) {
            return Enqueued::Rejected(
                self.count_shed(req.priority, Shed::Busy { limit: self.limit }),
            );
        }
        let top = self.order.first().map(|&(Reverse(p), _)| p);
        if req.priority.is_sheddable() && top.is_some_and(|p| p > req.priority) {
            return Enqueued::Rejected(self.count_shed(req.priority, Shed::Outranked));
        }
        if self.order.len() >= self.spec.queue as usize {
            match self.order.last().copied() {
                Some((Reverse(p), last)) if p < req.priority => {
                    self.shed_queued(last, Shed::Outranked)
                }
                _ => {
                    let queue = self.spec.queue;
                    return Enqueued::Rejected(
                        self.count_shed(req.priority, Shed::QueueFull { queue }),
                    );
                }
            }
        }
        // Sheddable waiters give way to a more important request that has to wait.
        while let Some(&(Reverse(p), id)) = self.order.last() {
            if !(p.is_sheddable() && p < req.priority) {
                break;
            }
            self.shed_queued(id, Shed::Outranked);
        }
        // Critical work may wait twice as long: right after the limit falls, more
        // permits are held than the new limit, and the first free one can take
        // several releases; critical requests are the ones worth that wait.
        let target = self.queue_delay_us().map(|t| {
            if req.priority >= Priority::CRITICAL {
                t.saturating_mul(2)
            } else {
                t
            }
        });
        let (wait, by_max_wait) = match (target, max_wait_us) {
            (Some(t), Some(m)) => (Some(t.min(m)), m < t),
            (t, None) => (t, false),
            (None, m) => (m, true),
        };
        let id = self.next_id;
        self.next_id += 1;
        let deadline_us = wait.map(|w| now_us.saturating_add(w));
        self.order.insert((Reverse(req.priority), id));
        self.waiters.insert(
            id,
            Waiter {
                priority: req.priority,
                caller: req.caller,
                arrived_us: now_us,
                deadline_us,
                by_max_wait,
            },
        );
        if let Some(c) = self.caller_load(req.caller) {
            c.waiting += 1;
        }
        Enqueued::Waiting { id, deadline_us }
    }

    /// Ends a permit with its outcome: a sample for the controller, then waiters are
    /// granted the free permits.
    pub fn release(&mut self, now_us: u64, ticket: Ticket, outcome: Outcome) {
        debug_assert!(self.in_flight > 0, "a permit released twice");
        self.now_us = self.now_us.max(now_us);
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(c) = self
            .classes
            .iter_mut()
            .find(|c| c.priority == ticket.priority)
        {
            c.held = c.held.saturating_sub(1);
            c.released_us = now_us;
            if ticket.epoch != self.epoch || ticket.from_reserve {
                c.stale = c.stale.saturating_sub(1);
            }
        }
        if let Some(caller) = ticket.caller {
            if let Some(c) = self.callers.get_mut(&caller) {
                c.held = c.held.saturating_sub(1);
            }
            self.forget_idle(caller);
        }
        if ticket.epoch == self.epoch {
            match outcome {
                Outcome::Success { latency_us } => self.window.push(latency_us),
                Outcome::Dropped => self.window.drops += 1,
                Outcome::Ignored => {}
            }
            if self.window.len() >= MIN_WINDOW.max(self.limit) {
                self.close_window(now_us);
            }
        }
        self.pump(now_us);
    }

    /// Removes a waiter whose deadline has come and says why it was shed; `None` if it
    /// is no longer waiting (granted or shed meanwhile), or is granted now: permits
    /// kept for higher priorities do not stay idle past a waiter's deadline, they go
    /// to the waiters in their order (see the events).
    pub fn shed_waiter(&mut self, now_us: u64, id: WaiterId) -> Option<Shed> {
        // A permit kept for higher work may have lapsed since the last event: a
        // waiter it held back takes it now rather than be shed.
        self.catch_up(now_us);
        // Nor does a permit kept for higher work stay idle past a waiter's deadline:
        // the free permits go to the waiters in their order (priority, then first
        // come or the fair share), reserves aside, and so to this one unless others
        // come first.
        if self.in_flight < self.limit {
            self.pump_with(now_us, false);
        }
        let w = self.remove_waiter(id)?;
        let waited_us = now_us.saturating_sub(w.arrived_us);
        let reason = if w.by_max_wait {
            Shed::MaxWait { waited_us }
        } else {
            Shed::QueueDelay { waited_us }
        };
        Some(self.count_shed(w.priority, reason))
    }

    /// Sheds every waiter whose deadline is at or before `now_us` (as events): for
    /// callers that drive time themselves, such as a simulation.
    pub fn expire(&mut self, now_us: u64) {
        let mut due: Vec<WaiterId> = self
            .waiters
            .iter()
            .filter(|(_, w)| w.deadline_us.is_some_and(|d| d <= now_us))
            .map(|(&id, _)| id)
            .collect();
        due.sort_unstable(); // in arrival order, whatever the map's
        for id in due {
            if let Some(reason) = self.shed_waiter(now_us, id) {
                self.events.push(GateEvent::Shed { id, reason });
            }
        }
    }

    /// Removes a waiter that gave up (its future was dropped): not counted as shed.
    /// Returns whether it was still waiting.
    pub fn cancel(&mut self, id: WaiterId) -> bool {
        self.remove_waiter(id).is_some()
    }

    /// The grants and sheds of waiters since the last call, in order.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, GateEvent> {
        self.events.drain(..)
    }

    /// The state now.
    pub fn stats(&self) -> AdaptiveStats {
        AdaptiveStats {
            limit: self.limit,
            in_flight: self.in_flight,
            queued: self.order.len() as u32,
            reserved: (self.order.first())
                .map_or(0, |&(Reverse(p), _)| self.reserved_above(p))
                .min(self.limit.saturating_sub(self.in_flight)),
            baseline_us: self.baseline.get(),
            last_mean_us: self.last_mean,
            queue_delay_us: self.queue_delay_us(),
            windows: self.windows,
            admitted: self.admitted,
            shed: self.shed,
            shed_by_class: self.shed_by_class,
        }
    }

    /// The queueing-delay target now (`None`: unbounded).
    pub fn queue_delay_us(&self) -> Option<u64> {
        match self.spec.queue_delay {
            QueueDelay::Fixed(us) => Some(us),
            QueueDelay::Auto => match self.baseline.get() {
                Some(b) if self.knee_seen => Some((b / 2).max(MIN_AUTO_DELAY_US)),
                _ => Some(AUTO_DELAY_BEFORE_KNEE_US),
            },
        }
    }

    fn admit(&mut self, now_us: u64, req: Request) -> Ticket {
        self.in_flight += 1;
        self.admitted += 1;
        self.window.max_in_flight = self.window.max_in_flight.max(self.in_flight);
        if let Some(c) = self.caller_load(req.caller) {
            c.held += 1;
        }
        let at = match self.classes.iter().position(|c| c.priority <= req.priority) {
            Some(i) if self.classes[i].priority == req.priority => i,
            at => {
                let at = at.unwrap_or(self.classes.len());
                let class = ClassLoad {
                    priority: req.priority,
                    held: 0,
                    peak: 0,
                    peak_before: 0,
                    released_us: 0,
                    stale: 0,
                };
                self.classes.insert(at, class);
                at
            }
        };
        let class = &mut self.classes[at];
        class.held += 1;
        class.peak = class.peak.max(class.held);
        Ticket {
            epoch: self.epoch,
            admitted_us: now_us,
            caller: req.caller.filter(|_| self.fair),
            priority: req.priority,
            from_reserve: false,
        }
    }

    /// Moves the gate's time to `now_us` and grants the waiters that the permits
    /// kept for higher priorities held back, where those reserves have lapsed.
    fn catch_up(&mut self, now_us: u64) {
        self.now_us = self.now_us.max(now_us);
        if !self.order.is_empty() {
            self.pump(now_us);
        }
    }

    /// Whether a request of `priority` may take a permit now: one is free beyond
    /// those the higher priorities held lately and do not hold now (a critical
    /// client between two requests keeps its place; lower work never takes it).
    fn fits(&self, priority: Priority) -> bool {
        let reserved = self.reserved_above(priority);
        if self.in_flight.saturating_add(reserved) < self.limit {
            return true;
        }
        // Work coming back to a place its class held lately, where lower work holds
        // permits granted before the limit last changed or from a place kept for
        // higher work: those permits, not the work coming back, absorb the cut.
        // Never past the limit for this class and those above, nor past the limit by
        // more than those lower permits.
        let span = self.baseline.get().unwrap_or(MIN_AUTO_DELAY_US);
        let (mut at_or_above, mut own_reserve, mut stale_below) = (0u32, 0u32, 0u32);
        for c in &self.classes {
            if c.priority >= priority {
                at_or_above += c.held;
            } else {
                stale_below += c.stale;
            }
            if c.priority == priority {
                own_reserve = c.reserve(self.now_us, span);
            }
        }
        own_reserve > 0
            && at_or_above.saturating_add(reserved) < self.limit
            && self.in_flight < self.limit.saturating_add(stale_below)
    }

    /// The permits kept for priorities above `priority`.
    fn reserved_above(&self, priority: Priority) -> u32 {
        // Before any window closed: a millisecond, the timers' resolution.
        let span = self.baseline.get().unwrap_or(MIN_AUTO_DELAY_US);
        (self.classes.iter())
            .take_while(|c| c.priority > priority)
            .map(|c| c.reserve(self.now_us, span))
            .sum()
    }

    /// Whether a request of `priority` or above is waiting (it goes first).
    fn waiting_at_or_above(&self, priority: Priority) -> bool {
        self.order
            .first()
            .is_some_and(|&(Reverse(p), _)| p >= priority)
    }

    /// The permits the classes above the lowest one that held any during the window
    /// held at most: a cut does not take the limit below them, so the lowest class
    /// absorbs it first (it is left no permit beyond their reserve).
    fn protected(&self) -> u32 {
        let Some(lowest) = self.classes.iter().rposition(|c| c.peak > 0) else {
            return 0;
        };
        self.classes[..lowest].iter().map(|c| c.peak).sum()
    }

    /// A new window: what each class held at most in the one that closed is
    /// remembered for one more window; classes that hold nothing and reserve
    /// nothing are forgotten.
    fn roll_classes(&mut self) {
        for c in &mut self.classes {
            c.peak_before = c.peak;
            c.peak = c.held;
        }
        self.classes.retain(|c| c.held > 0 || c.peak_before > 0);
    }

    fn caller_load(&mut self, caller: Option<u64>) -> Option<&mut CallerLoad> {
        let caller = caller.filter(|_| self.fair)?;
        Some(self.callers.entry(caller).or_default())
    }

    fn forget_idle(&mut self, caller: u64) {
        if self
            .callers
            .get(&caller)
            .is_some_and(|c| c.held == 0 && c.waiting == 0)
        {
            self.callers.remove(&caller);
        }
    }

    fn remove_waiter(&mut self, id: WaiterId) -> Option<Waiter> {
        let w = self.waiters.remove(&id)?;
        self.order.remove(&(Reverse(w.priority), id));
        if let Some(caller) = w.caller.filter(|_| self.fair) {
            if let Some(c) = self.callers.get_mut(&caller) {
                c.waiting = c.waiting.saturating_sub(1);
            }
            self.forget_idle(caller);
        }
        Some(w)
    }

    fn shed_queued(&mut self, id: WaiterId, reason: Shed) {
        if let Some(w) = self.remove_waiter(id) {
            let reason = self.count_shed(w.priority, reason);
            self.events.push(GateEvent::Shed { id, reason });
        }
    }

    fn count_shed(&mut self, priority: Priority, reason: Shed) -> Shed {
        let s = &mut self.shed;
        match reason {
            Shed::Busy { .. } => s.busy += 1,
            Shed::QueueFull { .. } => s.queue_full += 1,
            Shed::QueueDelay { .. } => s.queue_delay += 1,
            Shed::MaxWait { .. } => s.max_wait += 1,
            Shed::Outranked => s.outranked += 1,
        }
        let class = if priority.is_sheddable() {
            0
        } else if priority < Priority::CRITICAL {
            1
        } else {
            2
        };
        self.shed_by_class[class] += 1;
        reason
    }

    fn close_window(&mut self, now_us: u64) {
        let trimmed = self.window.trimmed();
        let mean = trimmed.map(|(m, _)| m);
        if let Some((m, e)) = trimmed {
            self.baseline.push(now_us, m + BASELINE_ERRORS * e);
            self.last_mean = Some(m);
        }
        let summary = WindowSummary {
            drops: self.window.drops,
            mean_us: mean,
            mean_error_us: trimmed.map_or(0, |(_, e)| e),
            baseline_us: self.baseline.get(),
            max_in_flight: self.window.max_in_flight,
            limit_bound: self.window.saturated || self.window.max_in_flight >= self.limit,
            protected: self.protected(),
        };
        let before = self.ctl.limit;
        self.ctl.on_window(
            &self.spec.controller,
            &summary,
            self.spec.min,
            self.spec.max,
        );
        // The knee: the controller called for a cut (even one the floor stopped), or
        // the limit bound and did not grow (vegas holding, a limit pinned at max).
        self.knee_seen |= self.ctl.cut || (summary.limit_bound && self.ctl.limit <= before);
        let limit = self.ctl.limit as u32;
        if limit != self.limit {
            self.limit = limit;
            self.epoch += 1;
            for c in &mut self.classes {
                c.stale = c.held;
            }
        }
        self.windows += 1;
        self.window.reset(self.in_flight);
        self.roll_classes();
    }

    /// Grants free permits to waiters: the most important first, FIFO within a
    /// priority; with fair shares, among the waiters of that priority the first of
    /// the caller holding the fewest permits (max-min fairness, filled one permit at
    /// a time; a waiter without a caller counts as holding none).
    fn pump(&mut self, now_us: u64) {
        self.pump_with(now_us, true);
    }

    /// [`Self::pump`], keeping the permits reserved for higher priorities or not.
    fn pump_with(&mut self, now_us: u64, keep_reserves: bool) {
        while let Some(&(Reverse(top), first)) = self.order.first() {
            let free = if keep_reserves {
                self.fits(top)
            } else {
                self.in_flight < self.limit
            };
            if !free {
                return;
            }
            let id = if self.fair {
                let held = |id: &WaiterId| {
                    self.waiters[id]
                        .caller
                        .and_then(|c| self.callers.get(&c))
                        .map_or(0, |c| c.held)
                };
                // min_by_key keeps the first of equals: FIFO among them.
                self.order
                    .range((Reverse(top), 0)..=(Reverse(top), WaiterId::MAX))
                    .map(|&(_, id)| id)
                    .min_by_key(held)
                    .unwrap_or(first)
            } else {
                first
            };
            let w = self.remove_waiter(id).expect("a queued waiter");
            let from_reserve = !keep_reserves && !self.fits(w.priority);
            let mut ticket = self.admit(
                now_us,
                Request {
                    priority: w.priority,
                    caller: w.caller,
                },
            );
            if from_reserve {
                ticket.from_reserve = true;
                if let Some(c) = (self.classes.iter_mut()).find(|c| c.priority == w.priority) {
                    c.stale += 1;
                }
            }
            self.events.push(GateEvent::Granted { id, ticket });
        }
    }
}
