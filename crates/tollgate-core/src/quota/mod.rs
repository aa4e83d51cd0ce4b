//! Quota buckets: one budget divided among clients that enforce their shares
//! themselves, as the Envoys of a fleet do under Envoy's rate limit quota filter
//! (RLQS): each client reports how many requests it allowed and denied; the bucket
//! divides its budget by their demand (max-min fair, [`max_min`]) and sends each
//! client its share as a local token bucket with a time to live ([`Assignment`]).
//!
//! # The guarantee
//!
//! Whatever the clients do within their assignments, all of them together admit no
//! more in any window than the bucket's policy would on its own ([`Budget`]: a GCRA,
//! token bucket or leaky bucket of rate `R` and burst `B` admits at most `B + R·w` in
//! any window of length `w`). The bucket keeps a ledger, as a hierarchical token
//! bucket: a client's share is a sub-bucket whose refill (its rate) is taken from the
//! budget's and whose first tokens (its burst, a new assignment starts full) are taken
//! from the budget's tokens when it is sent. At every instant the rates of the
//! assignments that may be in force add up to at most `R`, the bursts they may hold to
//! at most `B` less what the budget still holds, so the tokens in the whole system
//! never pass `B` and never flow in faster than `R`.
//!
//! An assignment may be in force from when it is sent until its time to live has
//! passed *at the client* (counted from its arrival) — or until the client applies the
//! next one, which the server cannot see. So the ledger counts every assignment sent
//! until `sent + ttl + grace`, its client's rate as the largest of those, its burst
//! likewise; a share that shrinks frees the difference only then. `grace` covers the
//! delivery: an assignment that takes longer than `grace` to arrive may be spent past
//! the ledger's count.
//!
//! # What it costs
//!
//! Under-admission, bounded: a share that moves from one client to another is counted
//! twice for one time to live; `headroom` units per period are never handed out, and
//! their refill pays for the bursts of changed assignments (a bucket whose rate is all
//! handed out has nothing left to start a new assignment with). A client whose
//! demand fits its share is not sent a new one (its assignment is extended, which
//! keeps its local bucket as it is): shares change only when the division moves a
//! client by more than `hysteresis` of its share.
//!
//! Clients must deny when they have no assignment and when theirs has expired (for
//! Envoy: `no_assignment_behavior` and `expired_assignment_behavior` falling back to
//! `DENY_ALL`); a client that goes on spending an expired assignment is outside the
//! guarantee.

mod fair;

use std::collections::BTreeMap;

pub use fair::max_min;

use crate::algorithms::{Gcra, LeakyBucket, TokenBucket};
use crate::{AnyAlgorithm, Policy, Rate};

/// A client of a bucket (one Envoy's stream), named by the server.
pub type ClientId = u64;

/// What a bucket's policy allows: `count` units per `period_us`, at most `burst` at
/// once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The rate (`count` per `period_us`), with at least 1000 units per period so that
    /// shares are fine-grained (a slow rate is written over a longer period).
    pub rate: Rate,
    /// The most units at once.
    pub burst: u64,
}

/// The longest period a budget's rate is written over to make its shares finer.
const MAX_PERIOD_US: u64 = 60_000_000;

impl Budget {
    /// The budget of `policy`: a `gcra`, `token-bucket` or `leaky-bucket` (their
    /// envelopes are alike: `burst + rate·w`). Other algorithms are refused with why.
    pub fn of(policy: &Policy) -> Result<Budget, String> {
        let (rate, burst) = match policy.algorithm() {
            AnyAlgorithm::Gcra(g) => (Gcra::rate(g), g.burst()),
            AnyAlgorithm::TokenBucket(t) => (TokenBucket::rate(t), t.capacity_tokens()),
            AnyAlgorithm::LeakyBucket(l) => (LeakyBucket::rate(l), l.capacity_units()),
            _ => {
                return Err(format!(
                    "a quota bucket's budget is a gcra, token-bucket or leaky-bucket policy \
                     (each Envoy enforces its share as a token bucket), not {}",
                    policy.name()
                ))
            }
        };
        Ok(Budget {
            rate: finer(rate),
            burst,
        })
    }
}

/// `rate` written with at least 1000 units per period where the period may grow (up
/// to [`MAX_PERIOD_US`]).
fn finer(rate: Rate) -> Rate {
    if rate.count >= 1000 {
        return rate;
    }
    let k = 1000u64.div_ceil(rate.count);
    let k = k.min((MAX_PERIOD_US / rate.period_us).max(1));
    Rate {
        count: rate.count * k,
        period_us: rate.period_us * k,
    }
}

/// How a bucket divides its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaSettings {
    /// An assignment's time to live, as sent.
    pub ttl_us: u64,
    /// How much later than its sending an assignment may still be in force: its
    /// delivery time (a client counts the time to live from the arrival).
    pub grace_us: u64,
    /// A client that has not reported for this long gets no more renewals (its share
    /// frees when its assignment ends).
    pub stale_us: u64,
    /// Units per period never handed out (their refill starts changed assignments).
    pub headroom: u64,
    /// A client is sent a new share only when the division moves it by more than
    /// this many thousandths of its share (and at least one unit).
    pub hysteresis_permille: u64,
}

impl Default for QuotaSettings {
    fn default() -> Self {
        QuotaSettings {
            ttl_us: 1_000_000,
            grace_us: 250_000,
            stale_us: 3_000_000,
            headroom: 0,
            hysteresis_permille: 50,
        }
    }
}

/// A share as a client enforces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Every request denied.
    Deny,
    /// A token bucket that starts full with `max_tokens` and refills `tokens_per_fill`
    /// every `fill_interval_us`, continuously.
    TokenBucket {
        /// Its size (the client's burst).
        max_tokens: u64,
        /// Units per `fill_interval_us` (the client's rate).
        tokens_per_fill: u64,
        /// The refill period.
        fill_interval_us: u64,
    },
}

/// An assignment to send to `client`: enforce `share` for `ttl_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    /// To whom.
    pub client: ClientId,
    /// What to enforce.
    pub share: Share,
    /// For how long after its arrival.
    pub ttl_us: u64,
}

/// A share sent, as the ledger counts it: `rate` units per period and `burst` until
/// `until` (sent + ttl + grace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grant {
    rate: u64,
    burst: u64,
    until: u64,
}

/// One client's standing.
#[derive(Debug, Clone, Default)]
struct Client {
    /// Units per period it wanted at its last report (allowed + denied); `None` before
    /// its first report with an elapsed time.
    demand: Option<u64>,
    /// When it last reported.
    reported_at: u64,
    /// The share last sent, and when it ends in the ledger.
    current: Option<Grant>,
    /// Shares sent before it that may still be in force.
    older: Vec<Grant>,
    /// When `current` is sent again (extended).
    renew_at: u64,
    /// Its stream ended: no more assignments.
    gone: bool,
}

impl Client {
    /// Every grant that may be in force after `now`.
    fn grants(&self, now: u64) -> impl Iterator<Item = &Grant> {
        self.current
            .iter()
            .chain(self.older.iter())
            .filter(move |g| g.until > now)
    }

    /// The most rate and burst this client may use after `now`.
    fn reserved(&self, now: u64) -> (u64, u64) {
        self.grants(now)
            .fold((0, 0), |(r, b), g| (r.max(g.rate), b.max(g.burst)))
    }
}

/// One bucket's budget, its clients and the ledger of what they were sent.
#[derive(Debug, Clone)]
pub struct QuotaBucket {
    budget: Budget,
    settings: QuotaSettings,
    /// The budget's tokens not handed out, in units × period_us, as of `level_at`.
    level: u128,
    level_at: u64,
    clients: BTreeMap<ClientId, Client>,
}

/// A bucket's standing, for metrics and the config dump.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaStats {
    /// Clients with a live assignment or a recent report.
    pub clients: u64,
    /// What they want, in units per period (unknown demands not counted).
    pub demand: u64,
    /// The rates of their current shares, in units per period.
    pub assigned: u64,
    /// The rates the ledger counts (shares that may still be in force).
    pub reserved: u64,
}

impl QuotaBucket {
    /// A bucket dividing `budget`, its tokens full at `now`.
    pub fn new(budget: Budget, settings: QuotaSettings, now: u64) -> Self {
        QuotaBucket {
            budget,
            settings,
            level: u128::from(budget.burst) * u128::from(budget.rate.period_us),
            level_at: now,
            clients: BTreeMap::new(),
        }
    }

    /// The budget divided.
    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// A usage report from `client` at `now`: `allowed` and `denied` requests over
    /// the `elapsed_us` since its previous report (its first report subscribes it).
    /// Returns the assignments to send (to any client).
    pub fn report(
        &mut self,
        client: ClientId,
        allowed: u64,
        denied: u64,
        elapsed_us: u64,
        now: u64,
    ) -> Vec<Assignment> {
        let period = self.budget.rate.period_us;
        let c = self.clients.entry(client).or_default();
        c.gone = false;
        c.reported_at = now;
        if elapsed_us > 0 {
            let wanted = u128::from(allowed.saturating_add(denied)) * u128::from(period)
                / u128::from(elapsed_us);
            c.demand = Some(u64::try_from(wanted).unwrap_or(u64::MAX));
        }
        self.divide(now)
    }

    /// `client`'s stream ended at `now`: it is sent nothing more, and its share frees
    /// when its last assignment ends. Returns the assignments to send to the others.
    pub fn leave(&mut self, client: ClientId, now: u64) -> Vec<Assignment> {
        if let Some(c) = self.clients.get_mut(&client) {
            c.gone = true;
        }
        self.divide(now)
    }

    /// Renewals due and shares freed by `now`: the assignments to send.
    pub fn tick(&mut self, now: u64) -> Vec<Assignment> {
        self.divide(now)
    }

    /// When [`Self::tick`] has something to do next (a renewal, or a share that frees).
    pub fn next_event(&self) -> Option<u64> {
        let mut next: Option<u64> = None;
        let mut at = |t: u64| next = Some(next.map_or(t, |n| n.min(t)));
        for c in self.clients.values() {
            if !c.gone && c.current.is_some() {
                at(c.renew_at);
            }
            for g in c.current.iter().chain(c.older.iter()) {
                at(g.until);
            }
        }
        next
    }

    /// Whether the bucket has nobody left to count (it can be forgotten).
    pub fn is_idle(&self, now: u64) -> bool {
        self.clients
            .values()
            .all(|c| c.gone && c.grants(now).next().is_none())
    }

    /// The bucket's standing at `now`.
    pub fn stats(&self, now: u64) -> QuotaStats {
        let mut s = QuotaStats::default();
        for c in self.clients.values() {
            let live = !c.gone && now.saturating_sub(c.reported_at) < self.settings.stale_us;
            if live || c.grants(now).next().is_some() {
                s.clients += 1;
            }
            if live {
                s.demand += c.demand.unwrap_or(0);
            }
            s.assigned += c.current.filter(|g| g.until > now).map_or(0, |g| g.rate);
            s.reserved += c.reserved(now).0;
        }
        s
    }

    /// The ledger brought to `now`: grants that ended are dropped, and the budget's
    /// tokens refilled by what the grants left of the rate over each stretch between.
    fn advance(&mut self, now: u64) {
        let period = u128::from(self.budget.rate.period_us);
        let count = self.budget.rate.count;
        while self.level_at < now {
            let from = self.level_at;
            // The next instant the reservations change.
            let to = self
                .clients
                .values()
                .flat_map(|c| c.grants(from).map(|g| g.until))
                .filter(|&u| u < now)
                .min()
                .unwrap_or(now);
            let (rate, burst) = self.reserved_total(from, None);
            let inflow = u128::from(count.saturating_sub(rate)) * u128::from(to - from);
            let cap = u128::from(self.budget.burst.saturating_sub(burst)) * period;
            self.level = (self.level + inflow).min(cap.max(self.level.min(cap)));
            self.level_at = to;
        }
        for c in self.clients.values_mut() {
            if c.current.is_some_and(|g| g.until <= now) {
                c.current = None;
            }
            c.older.retain(|g| g.until > now);
        }
        self.clients
            .retain(|_, c| !(c.gone && c.current.is_none() && c.older.is_empty()));
    }

    /// What the ledger counts after `at`, over every client but `except`.
    fn reserved_total(&self, at: u64, except: Option<ClientId>) -> (u64, u64) {
        self.clients
            .iter()
            .filter(|(id, _)| Some(**id) != except)
            .map(|(_, c)| c.reserved(at))
            .fold((0, 0), |(r, b), (cr, cb)| (r + cr, b + cb))
    }

    /// The division at `now`: each live client's fair share, sent where it moved
    /// and the ledger allows, and the renewals due.
    fn divide(&mut self, now: u64) -> Vec<Assignment> {
        self.advance(now);
        let s = self.settings;
        let count = self.budget.rate.count;
        let live: Vec<ClientId> = self
            .clients
            .iter()
            .filter(|(_, c)| !c.gone && now.saturating_sub(c.reported_at) < s.stale_us)
            .map(|(id, _)| *id)
            .collect();
        let demands: Vec<Option<u64>> = live.iter().map(|id| self.clients[id].demand).collect();
        let capacity = count.saturating_sub(s.headroom);
        let targets = max_min(capacity, &demands, 1);
        let mut out = Vec::new();
        // Shrinking shares first: what they give up is counted until their old
        // assignments end, but their new ones are in the ledger before any growth.
        let mut order: Vec<(ClientId, u64)> = live.iter().copied().zip(targets).collect();
        order.sort_by_key(|(id, target)| {
            let cur = self.clients[id].current.map_or(0, |g| g.rate);
            (*target >= cur, *id)
        });
        for (id, target) in order {
            if let Some(a) = self.settle(id, target, now) {
                out.push(a);
            }
        }
        out
    }

    /// Moves client `id` toward `target` units per period as far as the ledger
    /// allows; the assignment to send, if any.
    fn settle(&mut self, id: ClientId, target: u64, now: u64) -> Option<Assignment> {
        let s = self.settings;
        let period = u128::from(self.budget.rate.period_us);
        let (others_rate, others_burst) = self.reserved_total(now, Some(id));
        let c = &self.clients[&id];
        let cur = c.current.map(|g| g.rate);
        let moved = match cur {
            None => true,
            Some(cur) => {
                let band = (cur * s.hysteresis_permille / 1000).max(1);
                target.abs_diff(cur) > band
            }
        };
        // What the ledger can give this client now (its older grants stay counted).
        let older_rate = c
            .older
            .iter()
            .filter(|g| g.until > now)
            .map(|g| g.rate)
            .max()
            .unwrap_or(0);
        let room = self.budget.rate.count.saturating_sub(others_rate);
        let rate = if older_rate > room {
            0
        } else {
            target.min(room)
        };
        let grow = cur.is_none_or(|cur| rate != cur) && moved;
        if !grow {
            // Unchanged: extended when due.
            let c = self.clients.get_mut(&id)?;
            let g = c.current.as_mut()?;
            if now < c.renew_at {
                return None;
            }
            g.until = now + s.ttl_us + s.grace_us;
            let (rate, burst) = (g.rate, g.burst);
            c.renew_at = now + s.ttl_us / 2;
            let share = self.share(rate, burst);
            return Some(self.assignment(id, share));
        }
        let burst = if rate == 0 {
            0
        } else {
            let fair = u128::from(self.budget.burst) * u128::from(rate)
                / u128::from(self.budget.rate.count);
            let older_burst = c
                .older
                .iter()
                .filter(|g| g.until > now)
                .map(|g| g.burst)
                .max()
                .unwrap_or(0);
            let cur_burst = c.current.map_or(0, |g| g.burst);
            let free = self.budget.burst.saturating_sub(others_burst);
            if older_burst.max(cur_burst) > free {
                0
            } else {
                u64::try_from(fair.max(1))
                    .unwrap_or(u64::MAX)
                    .min(free)
                    .min(u64::try_from(self.level / period).unwrap_or(u64::MAX))
            }
        };
        if rate > 0 && burst == 0 {
            // No token to start a new bucket with yet: the current share stays.
            return None;
        }
        let grant = Grant {
            rate,
            burst,
            until: now + s.ttl_us + s.grace_us,
        };
        self.level -= u128::from(burst) * period;
        let c = self.clients.get_mut(&id)?;
        if let Some(old) = c.current.replace(grant) {
            c.older.push(old);
        }
        c.renew_at = now + s.ttl_us / 2;
        let share = self.share(rate, burst);
        Some(self.assignment(id, share))
    }

    fn share(&self, rate: u64, burst: u64) -> Share {
        if rate == 0 || burst == 0 {
            return Share::Deny;
        }
        Share::TokenBucket {
            max_tokens: burst,
            tokens_per_fill: rate,
            fill_interval_us: self.budget.rate.period_us,
        }
    }

    fn assignment(&self, client: ClientId, share: Share) -> Assignment {
        Assignment {
            client,
            share,
            ttl_us: self.settings.ttl_us,
        }
    }
}
