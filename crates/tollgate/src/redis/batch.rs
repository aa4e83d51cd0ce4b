//! Automatic batching: checks waiting for the same Redis node go out as one call of the
//! decision driver, as soon as a call slot is free.
//!
//! A check joins a queue; one driver task takes everything queued (up to the batch
//! size) whenever fewer than `in_flight` calls are outstanding, and sends it as one call
//! per Cluster slot. An idle store sends a lone check at once (no timer, no added
//! latency); under load the checks that arrive while calls are out ride the next call
//! together, so Redis runs the driver's setup once for many checks and the client makes
//! one round trip for them. Each check is still decided atomically and in queue order
//! (the driver decides a call's checks one after another inside one script).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::call::{CheckCall, CheckReply};
use super::store::Caller;
use super::StoreError;

struct Pending {
    check: CheckCall,
    slot: u16,
    done: oneshot::Sender<Result<CheckReply, StoreError>>,
}

/// The queue in front of a store's connection.
pub(crate) struct Batcher {
    queue: mpsc::UnboundedSender<Pending>,
    cluster: bool,
}

impl Batcher {
    /// Starts the driver task on the current Tokio runtime. `max`: checks per call;
    /// `in_flight`: calls outstanding at once.
    pub fn start(caller: Arc<Caller>, max: usize, in_flight: usize, cluster: bool) -> Batcher {
        let (queue, rx) = mpsc::unbounded_channel();
        let slots = Arc::new(Semaphore::new(in_flight.max(1)));
        tokio::spawn(drive(caller, rx, max.max(1), slots, cluster));
        Batcher { queue, cluster }
    }

    /// Queues `check` and waits for its part of the reply (the caller bounds the wait).
    pub async fn submit(&self, check: CheckCall) -> Result<CheckReply, StoreError> {
        let slot = if self.cluster {
            slot(check.keys.first().map_or("", String::as_str))
        } else {
            0
        };
        let (done, answer) = oneshot::channel();
        self.queue
            .send(Pending { check, slot, done })
            .map_err(|_| StoreError::Protocol("the batching task has stopped".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Protocol("the batching task dropped a check".into()))?
    }
}

async fn drive(
    caller: Arc<Caller>,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    max: usize,
    slots: Arc<Semaphore>,
    cluster: bool,
) {
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut batch = Vec::with_capacity(max.min(64));
        if rx.recv_many(&mut batch, max).await == 0 {
            return; // every store handle is gone
        }
        if !cluster {
            tokio::spawn(send(caller.clone(), batch, Arc::new(permit)));
            continue;
        }
        // One call per slot (a script's keys must share one); the calls go out together.
        batch.sort_by_key(|p| p.slot);
        let permit = Arc::new(permit);
        while !batch.is_empty() {
            let first = batch[0].slot;
            let n = batch.iter().take_while(|p| p.slot == first).count();
            let rest = batch.split_off(n);
            tokio::spawn(send(caller.clone(), batch, permit.clone()));
            batch = rest;
        }
    }
}

/// Sends one call and hands each check its part; the permit is held until then.
async fn send(caller: Arc<Caller>, batch: Vec<Pending>, _permit: Arc<OwnedSemaphorePermit>) {
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

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag, modulo 16384.
pub(crate) fn slot(key: &str) -> u16 {
    let b = key.as_bytes();
    let tagged = b.iter().position(|&c| c == b'{').and_then(|open| {
        let close = b[open + 1..].iter().position(|&c| c == b'}')?;
        (close > 0).then(|| &b[open + 1..open + 1 + close])
    });
    crc16(tagged.unwrap_or(b)) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // Values from CLUSTER KEYSLOT on Redis 7.0.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("bar"), 5061);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        // An empty tag hashes the whole key.
        assert_eq!(slot("foo{}{bar}"), 8363);
    }
}
