//! The adaptive gate's guarantees, on random operations under a virtual clock: the limit
//! stays in [min, max], grants never exceed the limit (counting the granted class and
//! those above it), held permits are never revoked, strict priority and FIFO within
//! one, fair shares, determinism.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tollgate_core::adaptive::{
    AdaptiveGate, AdaptiveSpec, Enqueued, GateEvent, Outcome, Priority, Request, Shed, Ticket,
};

#[derive(Debug, Clone)]
enum Op {
    Arrive {
        priority: u8,
        caller: u8,
        max_wait_ms: Option<u8>,
    },
    Release {
        pick: usize,
        latency_ms: u16,
        dropped: bool,
    },
    Advance {
        ms: u16,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop::sample::select(vec![0u8, 50, 100, 150, 200]), 0u8..4, prop::option::of(0u8..50))
            .prop_map(|(priority, caller, max_wait_ms)| Op::Arrive { priority, caller, max_wait_ms }),
        4 => (any::<usize>(), 1u16..200, prop::bool::weighted(0.1))
            .prop_map(|(pick, latency_ms, dropped)| Op::Release { pick, latency_ms, dropped }),
        1 => (0u16..100).prop_map(|ms| Op::Advance { ms }),
    ]
}

#[derive(Debug, Clone, Copy)]
struct Queued {
    priority: Priority,
    caller: u64,
}

/// Runs `ops`, checking every invariant as it goes; returns the final stats' debug form.
fn run(spec: &str, fair: bool, ops: &[Op]) -> String {
    let spec: AdaptiveSpec = spec.parse().unwrap();
    let mut gate = AdaptiveGate::new(spec, fair);
    let mut now = 0u64;
    let mut held: Vec<(Ticket, u64)> = Vec::new();
    // When each held permit was granted, counted in changes of the limit (as `held`).
    let mut granted_at: Vec<u64> = Vec::new();
    let mut limit_changes = 0u64;
    let mut queued: BTreeMap<u64, Queued> = BTreeMap::new();
    let mut holders: BTreeMap<u64, u32> = BTreeMap::new();
    for op in ops {
        let in_flight_before = gate.in_flight();
        let limit_before = gate.limit();
        let mut arrival = None;
        match *op {
            Op::Arrive {
                priority,
                caller,
                max_wait_ms,
            } => {
                let req = Request {
                    priority: Priority(priority),
                    caller: Some(u64::from(caller)),
                };
                let got = gate.enqueue(now, req, max_wait_ms.map(|m| u64::from(m) * 1000));
                // Waiters granted on its way (a reserve that lapsed) come first.
                arrival = Some((req, got));
            }
            Op::Release {
                pick,
                latency_ms,
                dropped,
            } => {
                if !held.is_empty() {
                    let at = pick % held.len();
                    let (t, caller) = held.swap_remove(at);
                    granted_at.swap_remove(at);
                    *holders.get_mut(&caller).unwrap() -= 1;
                    now = now.max(t.admitted_us());
                    let outcome = if dropped {
                        Outcome::Dropped
                    } else {
                        Outcome::Success {
                            latency_us: u64::from(latency_ms) * 1000,
                        }
                    };
                    gate.release(now, t, outcome);
                }
            }
            Op::Advance { ms } => {
                now += u64::from(ms) * 1000;
                gate.expire(now);
            }
        }
        // A release may close a window and change the limit before it grants.
        limit_changes += u64::from(gate.limit() != limit_before);
        let events: Vec<GateEvent> = gate.drain_events().collect();
        let mut granted = Vec::new();
        for e in events {
            match e {
                GateEvent::Granted { id, ticket } => {
                    granted.push(ticket.priority());
                    let me = queued
                        .remove(&id)
                        .expect("granted a waiter that was queued");
                    // Strict priority, FIFO within one (fair shares may pass over a
                    // caller holding more, within the same priority).
                    for (&other, q) in &queued {
                        assert!(q.priority <= me.priority, "granted {me:?} before {q:?}");
                        if q.priority == me.priority && other < id {
                            // Passed over only for a caller holding more.
                            assert!(fair, "FIFO broken: {other} waited before {id}");
                            let held = |c: u64| holders.get(&c).copied().unwrap_or(0);
                            assert!(
                                held(q.caller) > held(me.caller),
                                "passed over a caller holding no more"
                            );
                        }
                        if fair && q.priority == me.priority {
                            // Never granted to a caller holding more than a waiting one.
                            let held = |c: u64| holders.get(&c).copied().unwrap_or(0);
                            assert!(
                                held(me.caller) <= held(q.caller),
                                "granted {me:?} holding more than {q:?}"
                            );
                        }
                    }
                    held.push((ticket, me.caller));
                    granted_at.push(limit_changes);
                    *holders.entry(me.caller).or_default() += 1;
                }
                GateEvent::Shed { id, reason } => {
                    let full = queued.len() >= spec.queue as usize;
                    let me = queued.remove(&id).expect("shed a waiter that was queued");
                    if reason == Shed::Outranked {
                        // A sheddable waiter gives way; any other only to make room.
                        assert!(me.priority.is_sheddable() || full, "{me:?} outranked");
                    }
                }
            }
        }
        if let Some((req, got)) = arrival.take() {
            let caller = req.caller.unwrap();
            match got {
                Enqueued::Granted(t) => {
                    // Only past waiters of a lower priority (held back by the
                    // permits kept for higher ones).
                    assert!(
                        queued.values().all(|q| q.priority < req.priority),
                        "a permit was free while others waited"
                    );
                    granted.push(t.priority());
                    held.push((t, caller));
                    granted_at.push(limit_changes);
                    *holders.entry(caller).or_default() += 1;
                }
                Enqueued::Waiting { id, .. } => {
                    queued.insert(
                        id,
                        Queued {
                            priority: req.priority,
                            caller,
                        },
                    );
                }
                Enqueued::Rejected(Shed::Outranked) => {
                    assert!(req.priority.is_sheddable());
                    assert!(queued.values().any(|q| q.priority > req.priority));
                }
                Enqueued::Rejected(_) => {}
            }
        }
        let s = gate.stats();
        assert!(
            s.limit >= spec.min && s.limit <= spec.max,
            "limit {} left [{}, {}]",
            s.limit,
            spec.min,
            spec.max
        );
        assert_eq!(s.in_flight as usize, held.len());
        assert_eq!(s.queued as usize, queued.len());
        // Grants only below the limit, but for work coming back to its places while
        // lower work holds permits granted before the limit last changed or from a
        // place kept for higher work: then at most the limit for the granted class
        // and those above it, and past the limit by no more than those lower permits.
        if s.in_flight > in_flight_before {
            for &p in &granted {
                let at_or_above = held.iter().filter(|(t, _)| t.priority() >= p).count();
                let older_below = (held.iter().zip(&granted_at))
                    .filter(|((t, _), &at)| {
                        t.priority() < p && (at < limit_changes || t.from_reserve())
                    })
                    .count();
                assert!(
                    at_or_above as u32 <= s.limit,
                    "{at_or_above} in flight at {p:?} and above, over a limit of {}",
                    s.limit
                );
                assert!(
                    s.in_flight as usize <= s.limit as usize + older_below,
                    "{} in flight over a limit of {} with {older_below} older lower permits",
                    s.in_flight,
                    s.limit
                );
            }
        }
        // A request waits under a free permit only when that permit is kept for a
        // higher priority than any waiting.
        if s.in_flight < s.limit && !queued.is_empty() {
            assert!(
                s.in_flight + s.reserved >= s.limit,
                "free permits while requests wait: {s:?}"
            );
        }
    }
    format!("{:?}", gate.stats())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn gradient_keeps_every_invariant(ops in prop::collection::vec(op(), 1..400)) {
        run("gradient:min=2,max=20,initial=3,queue=8", false, &ops);
    }

    #[test]
    fn aimd_and_vegas_keep_every_invariant(ops in prop::collection::vec(op(), 1..400)) {
        run("aimd:min=1,max=6,queue=5,queue-delay=30ms", false, &ops);
        run("vegas:min=3,max=50,initial=3,queue=4", false, &ops);
    }

    #[test]
    fn fair_shares_keep_every_invariant(ops in prop::collection::vec(op(), 1..400)) {
        run("gradient:min=1,max=12,initial=4,queue=10", true, &ops);
    }

    #[test]
    fn the_same_operations_give_the_same_state(ops in prop::collection::vec(op(), 1..200)) {
        let spec = "gradient:min=1,max=30,queue=10";
        prop_assert_eq!(run(spec, true, &ops), run(spec, true, &ops));
    }
}

fn req(priority: Priority, caller: u64) -> Request {
    Request {
        priority,
        caller: Some(caller),
    }
}

fn grant(gate: &mut AdaptiveGate, r: Request) -> Ticket {
    match gate.enqueue(0, r, None) {
        Enqueued::Granted(t) => t,
        other => panic!("expected a permit, got {other:?}"),
    }
}

fn wait(gate: &mut AdaptiveGate, now: u64, r: Request) -> u64 {
    match gate.enqueue(now, r, None) {
        Enqueued::Waiting { id, .. } => id,
        other => panic!("expected to wait, got {other:?}"),
    }
}

#[test]
fn sheddable_work_gives_way_as_soon_as_critical_work_waits() {
    let mut gate = AdaptiveGate::new("gradient:initial=1".parse().unwrap(), false);
    let t = grant(&mut gate, req(Priority::NORMAL, 0));
    let shed = wait(&mut gate, 0, req(Priority::SHEDDABLE, 1));
    let normal = wait(&mut gate, 0, req(Priority::NORMAL, 2));
    assert_eq!(
        gate.drain_events().collect::<Vec<_>>(),
        [GateEvent::Shed {
            id: shed,
            reason: Shed::Outranked
        }]
    );
    assert_eq!(
        gate.enqueue(0, req(Priority::SHEDDABLE, 3), None),
        Enqueued::Rejected(Shed::Outranked)
    );
    let critical = wait(&mut gate, 0, req(Priority::CRITICAL, 4));
    gate.release(1000, t, Outcome::Ignored);
    let granted: Vec<u64> = gate
        .drain_events()
        .map(|e| match e {
            GateEvent::Granted { id, .. } => id,
            e => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(granted, [critical]);
    assert_eq!(gate.stats().queued, 1);
    assert!(gate.cancel(normal));
    assert_eq!(gate.stats().shed_by_class, [2, 0, 0]);
}

#[test]
fn a_full_queue_makes_room_for_more_important_work_only() {
    let mut gate = AdaptiveGate::new("aimd:initial=1,queue=2".parse().unwrap(), false);
    let _t = grant(&mut gate, req(Priority::NORMAL, 0));
    let _a = wait(&mut gate, 0, req(Priority::NORMAL, 1));
    let b = wait(&mut gate, 0, req(Priority::NORMAL, 2));
    assert_eq!(
        gate.enqueue(0, req(Priority::NORMAL, 3), None),
        Enqueued::Rejected(Shed::QueueFull { queue: 2 })
    );
    let _c = wait(&mut gate, 0, req(Priority::CRITICAL, 4));
    assert_eq!(
        gate.drain_events().collect::<Vec<_>>(),
        [GateEvent::Shed {
            id: b,
            reason: Shed::Outranked
        }]
    );
}

#[test]
fn a_waiter_is_shed_at_the_queueing_delay_target_or_its_own_bound() {
    let mut gate = AdaptiveGate::new(
        "gradient:initial=1,queue-delay=30ms".parse().unwrap(),
        false,
    );
    let _t = grant(&mut gate, Request::default());
    let Enqueued::Waiting { id: a, deadline_us } = gate.enqueue(5_000, Request::default(), None)
    else {
        panic!()
    };
    assert_eq!(deadline_us, Some(35_000));
    let Enqueued::Waiting { id: b, deadline_us } =
        gate.enqueue(5_000, Request::default(), Some(10_000))
    else {
        panic!()
    };
    assert_eq!(deadline_us, Some(15_000));
    gate.expire(15_000);
    assert_eq!(
        gate.shed_waiter(35_000, a),
        Some(Shed::QueueDelay { waited_us: 30_000 })
    );
    assert_eq!(
        gate.drain_events().collect::<Vec<_>>(),
        [GateEvent::Shed {
            id: b,
            reason: Shed::MaxWait { waited_us: 10_000 }
        }]
    );
    let s = gate.stats();
    assert_eq!((s.shed.queue_delay, s.shed.max_wait), (1, 1));
}

#[test]
fn a_greedy_caller_gets_its_share_while_others_wait_and_everything_when_alone() {
    let mut gate = AdaptiveGate::new("aimd:initial=4,min=4,max=4".parse().unwrap(), true);
    // Alone, the greedy caller holds all four permits.
    let mut greedy: Vec<Ticket> = (0..4)
        .map(|_| grant(&mut gate, req(Priority::NORMAL, 9)))
        .collect();
    for _ in 0..6 {
        wait(&mut gate, 0, req(Priority::NORMAL, 9));
    }
    let quiet = wait(&mut gate, 0, req(Priority::NORMAL, 1));
    // The quiet caller's request passes the greedy caller's earlier ones.
    gate.release(1000, greedy.pop().unwrap(), Outcome::Ignored);
    let first: Vec<GateEvent> = gate.drain_events().collect();
    assert!(
        matches!(first[..], [GateEvent::Granted { id, .. }] if id == quiet),
        "{first:?}"
    );
    // Only the greedy caller waits now: its waiters take the permits it frees.
    gate.release(2000, greedy.pop().unwrap(), Outcome::Ignored);
    assert_eq!(gate.drain_events().count(), 1);
    // A second quiet request passes the greedy caller's older waiters again: its
    // caller holds 1 permit, the greedy caller 3.
    let quiet2 = wait(&mut gate, 3000, req(Priority::NORMAL, 1));
    gate.release(4000, greedy.pop().unwrap(), Outcome::Ignored);
    let next: Vec<GateEvent> = gate.drain_events().collect();
    assert!(
        matches!(next[..], [GateEvent::Granted { id, .. }] if id == quiet2),
        "{next:?}"
    );
}

#[test]
fn the_automatic_queueing_delay_arms_at_the_knee_even_without_a_cut() {
    // A limit pinned at its max binds without growing: that is the knee too.
    let mut gate = AdaptiveGate::new("aimd:min=2,max=2,initial=2".parse().unwrap(), false);
    assert_eq!(gate.queue_delay_us(), Some(1_000_000));
    let mut now = 0;
    for _ in 0..5 {
        let a = grant(&mut gate, Request::default());
        let b = grant(&mut gate, Request::default());
        now += 20_000;
        gate.release(now, a, Outcome::Success { latency_us: 20_000 });
        gate.release(now, b, Outcome::Success { latency_us: 20_000 });
    }
    assert_eq!(gate.stats().windows, 1);
    assert_eq!(gate.queue_delay_us(), Some(10_000));
}

#[test]
fn permits_critical_work_held_lately_are_kept_from_lower_work() {
    let mut gate = AdaptiveGate::new("gradient:initial=4,queue=10".parse().unwrap(), false);
    let critical: Vec<Ticket> = (0..3)
        .map(|c| grant(&mut gate, req(Priority::CRITICAL, c)))
        .collect();
    let _shed = grant(&mut gate, req(Priority::SHEDDABLE, 9));
    // A critical client between two requests: its permit is not lower work's to take.
    gate.release(20_000, critical[0], Outcome::Success { latency_us: 20_000 });
    let waiting = wait(&mut gate, 20_000, req(Priority::SHEDDABLE, 8));
    assert_eq!(gate.stats().reserved, 1);
    match gate.enqueue(20_100, req(Priority::CRITICAL, 0), None) {
        Enqueued::Granted(_) => {}
        other => panic!("critical work passes the waiting sheddable: {other:?}"),
    }
    // Integer priorities between the named ones keep theirs the same way.
    let mut gate = AdaptiveGate::new("gradient:initial=2,queue=10".parse().unwrap(), false);
    let high = grant(&mut gate, req(Priority(150), 0));
    let _low = grant(&mut gate, req(Priority(120), 1));
    gate.release(1_000, high, Outcome::Ignored);
    wait(&mut gate, 1_000, req(Priority::NORMAL, 2));
    assert!(matches!(
        gate.enqueue(1_000, req(Priority(150), 0), None),
        Enqueued::Granted(_)
    ));
    let _ = waiting;
}

#[test]
fn work_coming_back_after_a_cut_takes_the_places_lower_work_holds_past_the_limit() {
    let mut gate = AdaptiveGate::new("gradient:initial=10,queue=10".parse().unwrap(), false);
    let mut critical: Vec<Ticket> = (0..8)
        .map(|c| grant(&mut gate, req(Priority::CRITICAL, c)))
        .collect();
    let _sheddable = [
        grant(&mut gate, req(Priority::SHEDDABLE, 8)),
        grant(&mut gate, req(Priority::SHEDDABLE, 9)),
    ];
    // Critical clients answered with drops and coming straight back, until a window
    // of 10 outcomes closes with a cut (10 x 0.9): 9 in flight against a limit of 9,
    // two of them the sheddable permits granted before the cut.
    let mut now = 0;
    for i in 0..10 {
        now += 1_000;
        let t = critical.remove(0);
        gate.release(now, t, Outcome::Dropped);
        if i < 9 {
            critical.push(grant(&mut gate, req(Priority::CRITICAL, i)));
        }
    }
    let s = gate.stats();
    assert_eq!((s.limit, s.in_flight), (9, 9), "{s:?}");
    // The critical client comes back to its place: the lower work holding permits
    // past the fallen limit absorbs the cut, not it.
    match gate.enqueue(now + 100, req(Priority::CRITICAL, 9), None) {
        Enqueued::Granted(_) => {}
        other => panic!("critical work kept out by sheddable permits: {other:?}"),
    }
    assert_eq!(gate.in_flight(), 10);
    // Nothing more: lower work waits for the limit, and critical work beyond what its
    // class held lately competes as before. Without a change of the limit, lower
    // permits are no one's to take: a reserve alone never passes the limit.
    assert!(!matches!(
        gate.enqueue(now + 100, req(Priority::SHEDDABLE, 10), None),
        Enqueued::Granted(_)
    ));
    wait(&mut gate, now + 100, req(Priority::CRITICAL, 11));
    let mut gate = AdaptiveGate::new("gradient:initial=4,queue=10".parse().unwrap(), false);
    let c0 = grant(&mut gate, req(Priority::CRITICAL, 0));
    let c1 = grant(&mut gate, req(Priority::CRITICAL, 1));
    let _low = grant(&mut gate, req(Priority::SHEDDABLE, 2));
    gate.release(1_000, c0, Outcome::Ignored);
    // The critical reserve lapses (no baseline yet: a millisecond): lower work takes
    // both free places.
    for caller in 3..5 {
        match gate.enqueue(5_000, req(Priority::SHEDDABLE, caller), None) {
            Enqueued::Granted(_) => {}
            other => panic!("a lapsed reserve keeps nothing: {other:?}"),
        }
    }
    // A critical release makes its class's reserve live again (2 held lately).
    gate.release(5_100, c1, Outcome::Ignored);
    assert!(matches!(
        gate.enqueue(5_100, req(Priority::CRITICAL, 0), None),
        Enqueued::Granted(_)
    ));
    assert_eq!(gate.in_flight(), 4);
    wait(&mut gate, 5_100, req(Priority::CRITICAL, 1));
}
