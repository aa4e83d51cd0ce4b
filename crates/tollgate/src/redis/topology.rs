//! Which node holds each key, as the store last learned it, so that health and
//! batching are kept per node and a node's fault reaches its own keys only.
//!
//! One node for a standalone server or a Sentinel master. For a Cluster, the slot map
//! of `CLUSTER SLOTS`, fetched in a task of its own when the store starts, when it is
//! older than [`MAX_AGE_MS`] and soon after a call fails (a failover or a reshard moves
//! slots); until it is known, every key counts as on node 0, named `cluster`. A node
//! keeps its index across refreshes (indexes only grow), so that per-node state held
//! elsewhere stays with its node. The client follows `MOVED` and `ASK` by itself: a
//! stale map only files a key's health under its former node until the next refresh.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use redis::Value;
use tollgate_core::{Clock, MonotonicClock};

/// A map this old is fetched again on the next call.
pub(crate) const MAX_AGE_MS: u64 = 10_000;
/// After a failed call, the map is fetched again if it is older than this.
pub(crate) const AFTER_FAILURE_MS: u64 = 1_000;

/// The nodes a store's keys live on.
pub(crate) struct Topology {
    cluster: bool,
    map: ArcSwap<SlotMap>,
    /// Held while a reply is taken in, so that two fetches never give one index to
    /// two nodes.
    learning: std::sync::Mutex<()>,
    /// When (ms on `clock`, from 1) a fetch was last started; 0: never.
    fetched_ms: AtomicU64,
    clock: MonotonicClock,
}

struct SlotMap {
    /// The node index of each slot; empty until the map is known.
    owner: Vec<u16>,
    /// Each node's `host:port` (or `cluster` for index 0 of a Cluster, the keys
    /// whose node is not known yet).
    nodes: Vec<Arc<str>>,
}

impl Topology {
    /// One node named `name`.
    pub fn single(name: &str) -> Topology {
        Topology::with(false, name)
    }

    /// A Cluster whose map is not known yet.
    pub fn cluster() -> Topology {
        Topology::with(true, "cluster")
    }

    fn with(cluster: bool, first: &str) -> Topology {
        Topology {
            cluster,
            map: ArcSwap::from_pointee(SlotMap {
                owner: Vec::new(),
                nodes: vec![first.into()],
            }),
            learning: std::sync::Mutex::new(()),
            fetched_ms: AtomicU64::new(0),
            clock: MonotonicClock::new(),
        }
    }

    /// The Cluster slot of a Redis key (0 for one node).
    pub fn slot(&self, redis_key: &str) -> u16 {
        if self.cluster {
            slot(redis_key)
        } else {
            0
        }
    }

    /// The index of the node that holds `slot`.
    pub fn node_of(&self, slot: u16) -> usize {
        let map = self.map.load();
        map.owner
            .get(usize::from(slot))
            .map_or(0, |&i| usize::from(i))
    }

    /// The name (`host:port`) of node `i`.
    pub fn name(&self, i: usize) -> Arc<str> {
        let map = self.map.load();
        map.nodes.get(i).cloned().unwrap_or_else(|| "?".into())
    }

    /// The nodes that hold slots now, by index and name (node 0 alone while a
    /// Cluster's map is not known).
    pub fn serving(&self) -> Vec<(usize, Arc<str>)> {
        let map = self.map.load();
        let mut held = vec![map.owner.is_empty(); map.nodes.len()];
        for &i in &map.owner {
            held[usize::from(i)] = true;
        }
        (map.nodes.iter().enumerate())
            .filter(|(i, _)| held[*i])
            .map(|(i, n)| (i, n.clone()))
            .collect()
    }

    /// Whether to fetch the map again now: it is older than `max_age_ms` and no
    /// other fetch started since (this one is then counted as started).
    pub fn due(&self, max_age_ms: u64) -> bool {
        if !self.cluster {
            return false;
        }
        let now = self.clock.now_us() / 1000 + 1;
        let last = self.fetched_ms.load(Ordering::Relaxed);
        if last != 0 && now < last.saturating_add(max_age_ms) {
            return false;
        }
        (self.fetched_ms)
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether this is a Cluster (whose map is fetched).
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// Takes in a `CLUSTER SLOTS` reply: `[[start, end, [host, port, ...], replicas...], ...]`.
    pub fn learn(&self, reply: &Value) {
        let Value::Array(ranges) = reply else { return };
        let _one = self.learning.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.map.load();
        let mut nodes = old.nodes.clone();
        let mut owner = vec![0u16; 16384];
        let mut learned = false;
        for range in ranges {
            let Value::Array(parts) = range else { continue };
            let (Some(start), Some(end), Some(master)) =
                (int(parts.first()), int(parts.get(1)), parts.get(2))
            else {
                continue;
            };
            let Value::Array(master) = master else {
                continue;
            };
            let (Some(host), Some(port)) = (text(master.first()), int(master.get(1))) else {
                continue;
            };
            let name = format!("{host}:{port}");
            let i = match nodes.iter().position(|n| **n == *name) {
                Some(i) => i,
                None => {
                    nodes.push(name.into());
                    nodes.len() - 1
                }
            };
            let (start, end) = (start.min(16383) as usize, end.min(16383) as usize);
            for o in &mut owner[start..=end.max(start)] {
                *o = u16::try_from(i).unwrap_or(0);
            }
            learned = true;
        }
        if !learned {
            return; // nothing usable: keep the map it had
        }
        self.map.store(Arc::new(SlotMap { owner, nodes }));
    }
}

fn int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
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
    use super::*;

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
        ])
    }

    /// Nodes keep their index when the map changes: slots move, indexes do not.
    #[test]
    fn a_node_keeps_its_index_across_maps() {
        let t = Topology::cluster();
        assert_eq!(t.node_of(100), 0);
        t.learn(&Value::Array(vec![
            range(0, 8191, "10.0.0.1", 7000),
            range(8192, 16383, "10.0.0.2", 7001),
        ]));
        assert_eq!((t.node_of(100), t.node_of(9000)), (1, 2));
        assert_eq!(&*t.name(2), "10.0.0.2:7001");
        t.learn(&Value::Array(vec![
            range(0, 99, "10.0.0.3", 7002),
            range(100, 16383, "10.0.0.2", 7001),
        ]));
        assert_eq!((t.node_of(5), t.node_of(100), t.node_of(9000)), (3, 2, 2));
        assert_eq!(t.map.load().nodes.len(), 4);
        let serving: Vec<usize> = t.serving().into_iter().map(|(i, _)| i).collect();
        assert_eq!(serving, [2, 3], "node 1 holds no slot now");
    }

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
