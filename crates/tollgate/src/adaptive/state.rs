//! The state every clone of an [`AdaptiveLimiter`](super::AdaptiveLimiter) and every
//! permit share: the core's gate behind a lock, and the senders that answer waiters.
//!
//! Times are read under the lock, so the gate sees them in order.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;
use tollgate_core::adaptive::{
    AdaptiveGate, AdaptiveSpec, AdaptiveStats, Enqueued, GateEvent, Outcome, Request, Shed, Ticket,
    WaiterId,
};
use tollgate_core::Clock;

/// What a waiter is told: a permit, or why it was shed.
pub(super) type Answer = Result<Ticket, Shed>;

/// A waiter's place: its handle, deadline (us) and where its answer arrives.
pub(super) type Place = (WaiterId, Option<u64>, oneshot::Receiver<Answer>);

#[derive(Debug)]
pub(super) struct Inner<C> {
    pub(super) clock: C,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    gate: AdaptiveGate,
    waiters: HashMap<WaiterId, oneshot::Sender<Answer>>,
}

impl<C: Clock> Inner<C> {
    pub(super) fn new(spec: AdaptiveSpec, fair: bool, clock: C) -> Self {
        Inner {
            clock,
            state: Mutex::new(State {
                gate: AdaptiveGate::new(spec, fair),
                waiters: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves the gate consistent (every method finishes
        // its bookkeeping before it can panic), so a poisoned lock is used as is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn spec(&self) -> AdaptiveSpec {
        *self.lock().gate.spec()
    }

    pub(super) fn stats(&self) -> AdaptiveStats {
        self.lock().gate.stats()
    }

    pub(super) fn try_acquire(&self, req: Request) -> Result<Ticket, Shed> {
        let mut state = self.lock();
        let now = self.clock.now_us();
        let got = state.gate.try_acquire(now, req);
        // Waiters whose reserve lapsed may have been granted on the way.
        self.settle(state);
        got
    }

    /// A permit now, or a place in the queue, or shed; `now` is when it was asked.
    pub(super) fn enqueue(
        &self,
        req: Request,
        max_wait_us: Option<u64>,
    ) -> Result<Result<Ticket, Place>, Shed> {
        let mut state = self.lock();
        let now = self.clock.now_us();
        let got = match state.gate.enqueue(now, req, max_wait_us) {
            Enqueued::Granted(t) => Ok(Ok(t)),
            Enqueued::Rejected(shed) => Err(shed),
            Enqueued::Waiting { id, deadline_us } => {
                let (tx, rx) = oneshot::channel();
                state.waiters.insert(id, tx);
                Ok(Err((id, deadline_us, rx)))
            }
        };
        // The arrival may have shed sheddable waiters, or granted waiters whose
        // reserve lapsed: tell them.
        self.settle(state);
        got
    }

    /// Sheds a waiter at its deadline; `None` if it was answered meanwhile, or is
    /// granted now (its answer is then on its way).
    pub(super) fn shed_waiter(&self, id: WaiterId) -> Option<Shed> {
        let mut state = self.lock();
        let now = self.clock.now_us();
        let shed = state.gate.shed_waiter(now, id);
        if shed.is_some() {
            state.waiters.remove(&id);
        }
        self.settle(state);
        shed
    }

    /// A waiter went away before its answer: its place is given up, and a permit
    /// granted to it meanwhile is given back.
    pub(super) fn abandon(&self, id: WaiterId, rx: &mut oneshot::Receiver<Answer>) {
        let mut state = self.lock();
        if state.gate.cancel(id) {
            state.waiters.remove(&id);
            return;
        }
        // Answered already. Closing first settles the race with a send still on its
        // way: either the answer is here now, or the send fails and its sender
        // releases the permit (see `settle`).
        rx.close();
        if let Ok(Ok(ticket)) = rx.try_recv() {
            let now = self.clock.now_us();
            state.gate.release(now, ticket, Outcome::Ignored);
            self.settle(state);
        }
    }

    /// Ends a permit and answers the waiters it frees.
    pub(super) fn release(&self, ticket: Ticket, outcome: Outcome) {
        let mut state = self.lock();
        let now = self.clock.now_us();
        state.gate.release(now, ticket, outcome);
        self.settle(state);
    }

    /// Answers the waiters the gate granted or shed, after letting go of the lock; a
    /// grant whose waiter went away meanwhile is released again.
    fn settle<'a>(&'a self, mut state: MutexGuard<'a, State>) {
        loop {
            let events: Vec<GateEvent> = state.gate.drain_events().collect();
            if events.is_empty() {
                return;
            }
            let mut orphans: Vec<Ticket> = Vec::new();
            let mut answers: Vec<(oneshot::Sender<Answer>, Answer)> = Vec::new();
            for e in events {
                let (id, answer) = match e {
                    GateEvent::Granted { id, ticket } => (id, Ok(ticket)),
                    GateEvent::Shed { id, reason } => (id, Err(reason)),
                };
                match (state.waiters.remove(&id), answer) {
                    (Some(tx), answer) => answers.push((tx, answer)),
                    // Every waiter of the gate has a sender; should one not, its
                    // permit must not be lost.
                    (None, Ok(ticket)) => orphans.push(ticket),
                    (None, Err(_)) => {}
                }
            }
            drop(state);
            for (tx, answer) in answers {
                if let Err(Ok(ticket)) = tx.send(answer) {
                    orphans.push(ticket);
                }
            }
            if orphans.is_empty() {
                return;
            }
            state = self.lock();
            let now = self.clock.now_us();
            for t in orphans {
                state.gate.release(now, t, Outcome::Ignored);
            }
        }
    }
}
