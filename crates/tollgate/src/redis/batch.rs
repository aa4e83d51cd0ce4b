//! Automatic batching: checks waiting for the same Redis node go out as one call of the
//! decision driver. Each node has a queue and drivers of its own ([`Batchers`]), so
//! that a node that stops answering holds up its own checks only.
//!
//! A check that finds nobody waiting and fewer than `direct_calls` lone calls out is sent at
//! once by its own task (no timer, no hand-off). Otherwise it joins a queue; `in_flight`
//! driver tasks each take everything queued (up to the batch size) as soon as their
//! previous call is answered, and send it as one call per Cluster slot. So under load
//! the checks that arrive while calls are out ride the next call together: Redis runs
//! the driver's setup once for many checks and the client makes one round trip for
//! them. Each check is still decided atomically and in queue order (the driver decides
//! a call's checks one after another inside one script).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::call::{CheckCall, CheckReply};
use super::connection::Caller;
use super::per_node::PerNode;
use crate::Error;

struct Pending {
    check: CheckCall,
    slot: u16,
    done: oneshot::Sender<Result<CheckReply, Error>>,
}

/// One batching queue per node, started on a node's first check.
pub(crate) struct Batchers {
    caller: Arc<Caller>,
    max: usize,
    in_flight: usize,
    direct: usize,
    nodes: PerNode<Batcher>,
}

impl Batchers {
    /// Queues of `max` checks per call, `in_flight` queued calls and `direct` lone
    /// calls outstanding at once per node (see [`Batcher::start`]).
    pub fn new(caller: Arc<Caller>, max: usize, in_flight: usize, direct: usize) -> Batchers {
        Batchers {
            caller,
            max,
            in_flight,
            direct,
            nodes: PerNode::default(),
        }
    }

    /// Node `node`'s queue, started now (on the store's runtime) if it has none.
    pub fn of(&self, node: usize) -> Arc<Batcher> {
        let (max, in_flight, direct) = (self.max, self.in_flight, self.direct);
        (self.nodes).get(node, || {
            Batcher::start(self.caller.clone(), max, in_flight, direct)
        })
    }
}

/// The queue in front of one node.
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Pending>,
    caller: Arc<Caller>,
    /// Calls sent straight from callers' tasks, outstanding at once.
    direct: Semaphore,
    /// Checks queued and not yet taken by the driver.
    queued: Arc<AtomicUsize>,
}

impl Batcher {
    /// Starts the driver tasks on the store's runtime. `max`: checks per call;
    /// `in_flight`: queued calls outstanding at once (one driver each); `direct`: lone
    /// calls sent from callers' tasks at once, at most.
    pub fn start(caller: Arc<Caller>, max: usize, in_flight: usize, direct: usize) -> Batcher {
        let (queue, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let queued = Arc::new(AtomicUsize::new(0));
        for _ in 0..in_flight.max(1) {
            let (driver, rx, queued) = (caller.clone(), rx.clone(), queued.clone());
            caller.spawn(drive(driver, rx, max.max(1), queued));
        }
        Batcher {
            queue,
            caller: caller.clone(),
            direct: Semaphore::new(direct),
            queued,
        }
    }

    /// Sends `check` at once from the caller's own task when fewer than `direct_calls` such
    /// calls are out and nothing waits (no hand-off to another task: an idle or lightly loaded store pays
    /// nothing for batching); else queues it for the next call and waits for its part
    /// of the reply, `timeout` at most. (A direct call is bounded by the call's own
    /// timeout, which must fire, not be cut short: it is what replaces a silent
    /// connection.)
    pub async fn submit(&self, check: CheckCall, timeout: Duration) -> Result<CheckReply, Error> {
        if self.queued.load(Ordering::Acquire) == 0 {
            if let Ok(_permit) = self.direct.try_acquire() {
                return Ok(self.caller.send(&[&check]).await?.remove(0));
            }
        }
        let slot = check.slot;
        let (done, answer) = oneshot::channel();
        self.queued.fetch_add(1, Ordering::AcqRel);
        self.queue
            .send(Pending { check, slot, done })
            .map_err(|_| Error::Store("the batching task has stopped".into()))?;
        tokio::time::timeout(timeout, answer)
            .await
            .map_err(|_| super::timeout(timeout))?
            .map_err(|_| Error::Store("the batching task dropped a check".into()))?
    }
}

/// One of `in_flight` drivers: takes what is queued (after the other driver's take, in
/// order), sends it, hands each check its part, and takes again.
async fn drive(
    caller: Arc<Caller>,
    rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Pending>>>,
    max: usize,
    queued: Arc<AtomicUsize>,
) {
    loop {
        let mut batch = Vec::with_capacity(max.min(64));
        if rx.lock().await.recv_many(&mut batch, max).await == 0 {
            return; // every store handle is gone
        }
        queued.fetch_sub(batch.len(), Ordering::AcqRel);
        // One call per Cluster slot (a script's keys must share one; one node has
        // slot 0 only) and per kind (window counters' plain commands, or the
        // decision code: each call succeeds or fails whole); the calls go out
        // together, this driver sending the last.
        let group_of = |p: &Pending| (p.slot, p.check.wire.counter.is_some());
        batch.sort_by_key(group_of);
        loop {
            let last = batch.last().map(group_of);
            let n = batch
                .iter()
                .rev()
                .take_while(|p| Some(group_of(p)) == last)
                .count();
            let group = batch.split_off(batch.len() - n);
            if batch.is_empty() {
                batch = group;
                break;
            }
            tokio::spawn(send(caller.clone(), group));
        }
        send(caller.clone(), batch).await;
    }
}

/// Sends one call and hands each check its part.
async fn send(caller: Arc<Caller>, batch: Vec<Pending>) {
    let checks: Vec<&CheckCall> = batch.iter().map(|p| &p.check).collect();
    match caller.send(&checks).await {
        Ok(replies) => {
            for (p, r) in batch.into_iter().zip(replies) {
                let _ = p.done.send(Ok(r));
            }
        }
        Err(e) => {
            for p in batch {
                let _ = p.done.send(Err(e.clone()));
            }
        }
    }
}
