//! `tollgate simulate --pattern closed-loop`: closed-loop clients (each sends, waits
//! for its answer, thinks, sends again; after a rejection it pauses) against a
//! modelled upstream (a processor shared past its capacity, with capacity changes),
//! through no limit, static concurrency limits and adaptive ones, on a virtual clock.
//! The adaptive limits run the library's own state machine
//! ([`tollgate::adaptive::AdaptiveGate`]), so the limits drawn are the limits a
//! process would reach under the same outcomes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::time::Duration;

use serde::Serialize;
use tollgate::adaptive::{
    AdaptiveGate, AdaptiveSpec, Enqueued, GateEvent, Outcome, Priority, Request, Ticket, WaiterId,
};

use super::chart::{Panel, Series};
use super::traffic::Rng;

/// Clients of one kind: how many, their priority, and who they are (for fair shares).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Clients in the group.
    pub clients: u32,
    /// Their requests' priority.
    pub priority: Priority,
    /// The caller they send as (fair shares count callers).
    pub caller: String,
}

impl std::str::FromStr for Group {
    type Err = String;
    /// `COUNT[:PRIORITY[:CALLER]]`, e.g. `32`, `4:critical`, `20:normal:greedy`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(':');
        let clients = parts
            .next()
            .and_then(|n| n.trim().parse::<u32>().ok())
            .filter(|n| (1..=100_000).contains(n))
            .ok_or_else(|| {
                format!("{s:?}: expected COUNT[:PRIORITY[:CALLER]] with COUNT 1..=100000")
            })?;
        let priority = match parts.next() {
            Some(p) => p.parse().map_err(|e| format!("{s:?}: {e}"))?,
            None => Priority::NORMAL,
        };
        let caller = parts.next().unwrap_or_default().to_string();
        if parts.next().is_some() {
            return Err(format!("{s:?}: expected COUNT[:PRIORITY[:CALLER]]"));
        }
        Ok(Group {
            clients,
            priority,
            caller,
        })
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.clients, self.priority)?;
        if !self.caller.is_empty() {
            write!(f, " ({})", self.caller)?;
        }
        Ok(())
    }
}

/// A limit in front of the upstream.
#[derive(Debug, Clone, PartialEq)]
pub enum SimulatedLimit {
    /// Every request goes through.
    None,
    /// At most this many in flight; a request beyond is rejected at once (the
    /// proxy's `limit_conn`).
    Static(u32),
    /// An adaptive limit.
    Adaptive(AdaptiveSpec),
}

impl fmt::Display for SimulatedLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimulatedLimit::None => f.write_str("no limit"),
            SimulatedLimit::Static(n) => write!(f, "static {n}"),
            SimulatedLimit::Adaptive(spec) => f.write_str(spec.controller.name()),
        }
    }
}

/// The modelled world.
#[derive(Debug, Clone)]
pub struct Model {
    /// Requests the upstream serves at full speed at once.
    pub capacity: u32,
    /// Service time at or below the capacity, us; each request's varies by up to
    /// `jitter` either way (seeded by `seed`), as a real service's does.
    pub service_us: u64,
    /// The service time's spread, a fraction (0.1: +-10 %).
    pub jitter: f64,
    /// The seed of the jitter.
    pub seed: u64,
    /// Capacity changes: (time, capacity), us.
    pub schedule: Vec<(u64, u32)>,
    /// Think time between an answer and the next request, us.
    pub think_us: u64,
    /// Pause after a rejection, us.
    pub pause_us: u64,
    /// Clients give up on a request after this long, us (none: never): the request
    /// fails (a dropped outcome for the limit) while the upstream keeps working on it.
    pub timeout_us: Option<u64>,
    /// How long, us.
    pub duration_us: u64,
    /// Totals leave out the first part (the limits' ramp), us.
    pub settle_us: u64,
    /// The clients.
    pub groups: Vec<Group>,
    /// Adaptive limits share among callers.
    pub fair: bool,
}

/// One group's totals under one limit (after the settle time).
#[derive(Debug, Clone, Serialize)]
pub struct GroupTotals {
    /// The limit, as the table shows it.
    pub limit: String,
    /// The group.
    pub group: String,
    /// Successful requests per second.
    pub ok_per_s: f64,
    /// Rejected requests per second.
    pub shed_per_s: f64,
    /// Successful share of the requests answered, %.
    pub success_pct: f64,
    /// Median latency of successful requests (waiting included), ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
}

/// One limit's run: totals per group, and samples over time for the chart.
#[derive(Debug, Clone)]
pub struct Outcomes {
    /// What limited.
    pub label: String,
    /// Per group.
    pub groups: Vec<GroupTotals>,
    /// (time s, limit) every bucket.
    pub limit: Vec<(f64, f64)>,
    /// (time s, requests in flight at the upstream).
    pub in_flight: Vec<(f64, f64)>,
    /// (time s, successful requests per second) per bucket.
    pub goodput: Vec<(f64, f64)>,
    /// (time s, p99 latency ms) per bucket.
    pub p99: Vec<(f64, f64)>,
}

/// The chart's time resolution.
pub const BUCKET_US: u64 = 250_000;

#[derive(Debug, Clone, Copy)]
enum Event {
    Send(usize),
    /// The upstream finished client `c`'s request `n` (its `n`-th).
    Done(usize, u64, Option<Ticket>),
    /// Client `c` gave up on its request `n`.
    TimedOut(usize, u64, Option<Ticket>),
    Deadline(WaiterId),
    Capacity(u32),
    Sample,
}

/// The event queue: events at equal times run in the order they were scheduled.
#[derive(Default)]
struct Agenda {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    events: HashMap<u64, Event>,
    seq: u64,
}

impl Agenda {
    fn at(&mut self, t: u64, e: Event) {
        self.heap.push(Reverse((t, self.seq)));
        self.events.insert(self.seq, e);
        self.seq += 1;
    }

    fn next(&mut self) -> Option<(u64, Event)> {
        let Reverse((t, seq)) = self.heap.pop()?;
        Some((t, self.events.remove(&seq)?))
    }
}

/// Latencies (us) and counts for one group or one bucket.
#[derive(Default, Clone)]
struct Tally {
    latencies: Vec<u64>,
    shed: u64,
}

impl Tally {
    fn quantile_ms(&mut self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        self.latencies.sort_unstable();
        let i =
            ((self.latencies.len() as f64 * q).ceil() as usize).clamp(1, self.latencies.len()) - 1;
        self.latencies[i] as f64 / 1000.0
    }
}

struct World<'a> {
    model: &'a Model,
    /// Whether the limit orders requests by priority (an adaptive one does).
    prioritised: bool,
    rng: Rng,
    gate: Option<AdaptiveGate>,
    agenda: Agenda,
    capacity: u32,
    upstream: u32,
    /// Each client's group, when its current request was sent, and how many it sent.
    clients: Vec<(usize, u64, u64)>,
    waiting: HashMap<WaiterId, usize>,
    groups: Vec<Tally>,
    bucket: Tally,
    out: Outcomes,
}

/// The modelled service's `--capacity` (at least 1) and `--jitter` (a fraction from
/// 0 to 0.9), checked as `simulate` and `bench upstream` take them.
pub fn check_service(capacity: u32, jitter: f64) -> anyhow::Result<()> {
    if capacity == 0 {
        anyhow::bail!("--capacity must be at least 1");
    }
    if !(0.0..=0.9).contains(&jitter) {
        anyhow::bail!("--jitter {jitter}: expected a fraction from 0 to 0.9");
    }
    Ok(())
}

/// Runs `model` through `limit`.
pub fn simulate(model: &Model, limit: &SimulatedLimit) -> Outcomes {
    let gate = match limit {
        SimulatedLimit::None => None,
        SimulatedLimit::Static(n) => Some(AdaptiveGate::new(
            format!("aimd:min={n},max={n},initial={n},queue=0")
                .parse()
                .expect("a static limit as a fixed aimd spec"),
            false,
        )),
        SimulatedLimit::Adaptive(spec) => Some(AdaptiveGate::new(*spec, model.fair)),
    };
    let clients: Vec<(usize, u64, u64)> = model
        .groups
        .iter()
        .enumerate()
        .flat_map(|(g, group)| (0..group.clients).map(move |_| (g, 0, 0)))
        .collect();
    let mut w = World {
        model,
        prioritised: matches!(limit, SimulatedLimit::Adaptive(_)),
        rng: Rng(model.seed.max(1)),
        gate,
        agenda: Agenda::default(),
        capacity: model.capacity,
        upstream: 0,
        waiting: HashMap::new(),
        groups: vec![Tally::default(); model.groups.len()],
        bucket: Tally::default(),
        out: Outcomes {
            label: limit.to_string(),
            groups: Vec::new(),
            limit: Vec::new(),
            in_flight: Vec::new(),
            goodput: Vec::new(),
            p99: Vec::new(),
        },
        clients,
    };
    // Clients start 100 us apart, so that they do not all arrive at one instant.
    for c in 0..w.clients.len() {
        w.agenda.at(c as u64 * 100, Event::Send(c));
    }
    for &(t, c) in &model.schedule {
        w.agenda.at(t, Event::Capacity(c));
    }
    w.agenda.at(BUCKET_US, Event::Sample);
    while let Some((t, e)) = w.agenda.next() {
        if t > model.duration_us {
            break;
        }
        w.handle(t, e);
    }
    w.finish(limit)
}

impl World<'_> {
    fn request(&self, c: usize) -> Request {
        let group = &self.model.groups[self.clients[c].0];
        // A static limit (the proxy's limit_conn) knows no priorities.
        let priority = if self.prioritised {
            group.priority
        } else {
            Priority::NORMAL
        };
        let req = Request::new(priority);
        if group.caller.is_empty() {
            req
        } else {
            req.caller(group.caller.as_str())
        }
    }

    fn handle(&mut self, t: u64, e: Event) {
        match e {
            Event::Send(c) => {
                self.clients[c].1 = t;
                self.clients[c].2 += 1;
                let req = self.request(c);
                match self.gate.as_mut().map(|g| g.enqueue(t, req, None)) {
                    None => self.start(t, c, None),
                    Some(Enqueued::Granted(ticket)) => self.start(t, c, Some(ticket)),
                    Some(Enqueued::Waiting { id, deadline_us }) => {
                        self.waiting.insert(id, c);
                        if let Some(d) = deadline_us {
                            self.agenda.at(d, Event::Deadline(id));
                        }
                    }
                    Some(Enqueued::Rejected(_)) => self.shed(t, c),
                }
                self.settle(t);
            }
            Event::Done(c, n, ticket) => {
                self.upstream -= 1;
                let (g, sent, current) = self.clients[c];
                if n != current || self.timed_out(sent, t) {
                    return; // the client gave up on it already
                }
                if t >= self.model.settle_us {
                    self.groups[g].latencies.push(t - sent);
                }
                self.bucket.latencies.push(t - sent);
                if let (Some(gate), Some(ticket)) = (self.gate.as_mut(), ticket) {
                    let latency_us = t - ticket.admitted_us();
                    gate.release(t, ticket, Outcome::Success { latency_us });
                }
                self.agenda.at(t + self.model.think_us, Event::Send(c));
                self.settle(t);
            }
            Event::TimedOut(c, n, ticket) => {
                if n != self.clients[c].2 {
                    return;
                }
                if let (Some(gate), Some(ticket)) = (self.gate.as_mut(), ticket) {
                    gate.release(t, ticket, Outcome::Dropped);
                }
                self.shed(t, c);
                self.settle(t);
            }
            Event::Deadline(id) => {
                let shed = self.gate.as_mut().and_then(|g| g.shed_waiter(t, id));
                if shed.is_some() {
                    if let Some(c) = self.waiting.remove(&id) {
                        self.shed(t, c);
                    }
                }
                // Or granted, where a reserve lapsed.
                self.settle(t);
            }
            Event::Capacity(c) => self.capacity = c,
            Event::Sample => {
                let s = t as f64 / 1e6;
                let limit = self
                    .gate
                    .as_ref()
                    .map_or(f64::NAN, |g| f64::from(g.limit()));
                if !limit.is_nan() {
                    self.out.limit.push((s, limit));
                }
                self.out.in_flight.push((s, f64::from(self.upstream)));
                let ok = self.bucket.latencies.len() as f64;
                self.out.goodput.push((s, ok * 1e6 / BUCKET_US as f64));
                self.out.p99.push((s, self.bucket.quantile_ms(0.99)));
                self.bucket = Tally::default();
                self.agenda.at(t + BUCKET_US, Event::Sample);
            }
        }
    }

    /// Sends client `c`'s request to the upstream: its service time grows with the
    /// requests in flight there past the capacity.
    fn start(&mut self, t: u64, c: usize, ticket: Option<Ticket>) {
        self.upstream += 1;
        let cap = u64::from(self.capacity.max(1));
        let base = self.model.service_us * u64::from(self.upstream).max(cap) / cap;
        let spread = 1.0 + self.model.jitter * (2.0 * self.rng.unit() - 1.0);
        let service = ((base as f64 * spread) as u64).max(1);
        let (_, sent, n) = self.clients[c];
        match self.model.timeout_us {
            // The upstream finishes (its in-flight count falls) whatever the client
            // does; the client's answer is the timeout.
            Some(timeout) if t + service > sent + timeout => {
                self.agenda.at(t + service, Event::Done(c, n, None));
                self.agenda
                    .at(sent + timeout, Event::TimedOut(c, n, ticket));
            }
            _ => self.agenda.at(t + service, Event::Done(c, n, ticket)),
        }
    }

    /// Whether a request sent at `sent` and answered at `t` came too late.
    fn timed_out(&self, sent: u64, t: u64) -> bool {
        self.model
            .timeout_us
            .is_some_and(|timeout| t > sent + timeout)
    }

    fn shed(&mut self, t: u64, c: usize) {
        if t >= self.model.settle_us {
            self.groups[self.clients[c].0].shed += 1;
        }
        self.bucket.shed += 1;
        self.agenda.at(t + self.model.pause_us, Event::Send(c));
    }

    /// Starts what the gate granted, sheds what it shed.
    fn settle(&mut self, t: u64) {
        let Some(gate) = self.gate.as_mut() else {
            return;
        };
        let events: Vec<GateEvent> = gate.drain_events().collect();
        for e in events {
            match e {
                GateEvent::Granted { id, ticket } => {
                    if let Some(c) = self.waiting.remove(&id) {
                        self.start(t, c, Some(ticket));
                    }
                }
                GateEvent::Shed { id, .. } => {
                    if let Some(c) = self.waiting.remove(&id) {
                        self.shed(t, c);
                    }
                }
            }
        }
    }

    fn finish(mut self, limit: &SimulatedLimit) -> Outcomes {
        let secs = self
            .model
            .duration_us
            .saturating_sub(self.model.settle_us)
            .max(1) as f64
            / 1e6;
        for (g, tally) in self.groups.iter_mut().enumerate() {
            let ok = tally.latencies.len() as f64;
            let shed = tally.shed as f64;
            self.out.groups.push(GroupTotals {
                limit: limit.to_string(),
                group: self.model.groups[g].to_string(),
                ok_per_s: ok / secs,
                shed_per_s: shed / secs,
                success_pct: 100.0 * ok / (ok + shed).max(1.0),
                p50_ms: tally.quantile_ms(0.5),
                p99_ms: tally.quantile_ms(0.99),
            });
        }
        self.out
    }
}

/// The summary table: one row per limit and group.
pub fn table(runs: &[Outcomes]) -> String {
    let mut s = format!(
        "{:<14} {:<24} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "limit", "clients", "ok/s", "shed/s", "success", "p50 ms", "p99 ms"
    );
    for g in runs.iter().flat_map(|r| &r.groups) {
        s += &format!(
            "{:<14} {:<24} {:>9.1} {:>9.1} {:>8.2}% {:>9.1} {:>9.1}\n",
            g.limit, g.group, g.ok_per_s, g.shed_per_s, g.success_pct, g.p50_ms, g.p99_ms
        );
    }
    s
}

/// The chart's panels: the limit, the upstream's requests in flight, goodput and p99
/// latency over time, a line per limit.
pub fn panels(runs: &[Outcomes]) -> Vec<Panel> {
    let series = |pick: fn(&Outcomes) -> &Vec<(f64, f64)>| -> Vec<Series> {
        // Every run in every panel, even without points (no limit has no limit
        // line), so that a run keeps its colour.
        runs.iter()
            .map(|r| (r.label.clone(), pick(r).clone()))
            .collect()
    };
    vec![
        Panel {
            y_desc: "limit (permits)".into(),
            series: series(|r| &r.limit),
        },
        Panel {
            y_desc: "in flight at the upstream".into(),
            series: series(|r| &r.in_flight),
        },
        Panel {
            y_desc: "goodput (req/s)".into(),
            series: series(|r| &r.goodput),
        },
        Panel {
            y_desc: "p99 latency (ms)".into(),
            series: series(|r| &r.p99),
        },
    ]
}

/// Capacity changes: (time after the start, new capacity), in order.
#[derive(Debug, Clone)]
pub struct Schedule(pub Vec<(Duration, u32)>);

/// `AT=CAPACITY,...`, e.g. `5s=4,10s=8`.
pub fn parse_schedule(s: &str) -> Result<Schedule, String> {
    let steps =
        s.split(',')
            .map(|step| {
                let (at, c) = step
                    .split_once('=')
                    .ok_or_else(|| format!("{step:?}: expected AT=CAPACITY, e.g. 5s=4"))?;
                let at = tollgate_runtime::config::duration_arg(at)?;
                let c: u32 = c.parse().ok().filter(|c| *c > 0).ok_or_else(|| {
                    format!("{step:?}: the capacity must be a whole number above 0")
                })?;
                Ok((at, c))
            })
            .collect::<Result<Vec<_>, String>>()?;
    Ok(Schedule(steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(groups: &[&str], schedule: Vec<(u64, u32)>) -> Model {
        Model {
            capacity: 8,
            service_us: 20_000,
            jitter: 0.1,
            seed: 1,
            schedule,
            think_us: 0,
            pause_us: 1_000,
            timeout_us: None,
            duration_us: 15_000_000,
            settle_us: 2_000_000,
            groups: groups.iter().map(|g| g.parse().unwrap()).collect(),
            fair: false,
        }
    }

    #[test]
    fn groups_parse_and_refuse_nonsense() {
        let g: Group = "20:sheddable:batch".parse().unwrap();
        assert_eq!(
            (g.clients, g.priority, g.caller.as_str()),
            (20, Priority::SHEDDABLE, "batch")
        );
        assert!("0".parse::<Group>().is_err());
        assert!("4:urgent"
            .parse::<Group>()
            .unwrap_err()
            .contains("invalid priority 'urgent'"));
        assert!("4:normal:a:b".parse::<Group>().is_err());
    }

    #[test]
    fn the_adaptive_limit_beats_both_static_limits_on_the_same_world() {
        let m = model(&["32"], vec![]);
        let none = simulate(&m, &SimulatedLimit::None);
        let high = simulate(&m, &SimulatedLimit::Static(32));
        let low = simulate(&m, &SimulatedLimit::Static(4));
        let adaptive = simulate(&m, &SimulatedLimit::Adaptive("gradient".parse().unwrap()));
        let (n, h, l, a) = (
            &none.groups[0],
            &high.groups[0],
            &low.groups[0],
            &adaptive.groups[0],
        );
        // Without a limit (or with one at 4x C) latency is 4x; at C/2 goodput halves.
        assert!(n.p99_ms >= 75.0 && h.p99_ms >= 75.0, "{n:?} {h:?}");
        assert!(l.ok_per_s <= 210.0, "{l:?}");
        assert!(a.ok_per_s >= 0.95 * 400.0, "{a:?}");
        assert!(a.p99_ms <= 40.0, "{a:?}");
        // The same world twice: the same numbers.
        let again = simulate(&m, &SimulatedLimit::Adaptive("gradient".parse().unwrap()));
        assert_eq!(
            format!("{:?}", again.groups),
            format!("{:?}", adaptive.groups)
        );
        assert_eq!(again.limit, adaptive.limit);
    }

    #[test]
    fn the_limit_follows_the_capacity_down_and_back() {
        let m = model(&["32"], vec![(5_000_000, 4), (10_000_000, 8)]);
        let r = simulate(&m, &SimulatedLimit::Adaptive("gradient".parse().unwrap()));
        let at = |from: f64, to: f64| -> Vec<f64> {
            r.limit
                .iter()
                .filter(|(t, _)| (from..to).contains(t))
                .map(|p| p.1)
                .collect()
        };
        assert!(
            at(6.0, 10.0).iter().all(|l| (3.0..=6.0).contains(l)),
            "{:?}",
            at(6.0, 10.0)
        );
        assert!(
            at(11.0, 15.0).iter().all(|l| (6.0..=11.0).contains(l)),
            "{:?}",
            at(11.0, 15.0)
        );
    }

    #[test]
    fn with_client_timeouts_no_limit_collapses_and_aimd_backs_off_on_the_drops() {
        let mut m = model(&["32"], vec![]);
        m.timeout_us = Some(60_000);
        // 32 in flight take 80 ms: every request times out while the upstream works.
        let none = simulate(&m, &SimulatedLimit::None);
        assert!(none.groups[0].ok_per_s < 10.0, "{:?}", none.groups);
        // AIMD learns only from the timeouts: it rides just below them, and the
        // work of the requests that still time out is lost.
        let aimd = simulate(&m, &SimulatedLimit::Adaptive("aimd".parse().unwrap()));
        assert!(aimd.groups[0].ok_per_s >= 0.6 * 400.0, "{:?}", aimd.groups);
        assert!(aimd.groups[0].p99_ms <= 60.0, "{:?}", aimd.groups);
        // The gradient sees the latency rise long before: no timeouts at all.
        let gradient = simulate(&m, &SimulatedLimit::Adaptive("gradient".parse().unwrap()));
        assert!(
            gradient.groups[0].ok_per_s >= 0.95 * 400.0,
            "{:?}",
            gradient.groups
        );
        assert!(gradient.groups[0].p99_ms <= 40.0, "{:?}", gradient.groups);
    }

    #[test]
    fn critical_clients_keep_their_latency_beside_sheddable_ones() {
        let m = model(&["4:critical", "20:sheddable"], vec![]);
        let r = simulate(&m, &SimulatedLimit::Adaptive("gradient".parse().unwrap()));
        let (critical, sheddable) = (&r.groups[0], &r.groups[1]);
        assert!(
            critical.success_pct >= 99.0 && critical.p99_ms <= 40.0,
            "{critical:?}"
        );
        assert!(sheddable.success_pct < 50.0, "{sheddable:?}");
    }
}
