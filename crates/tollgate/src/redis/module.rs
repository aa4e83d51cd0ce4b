//! Where the tollgate Redis module decides (`crates/tollgate-redis-module`): per node,
//! found by `TOLLGATE.WIRE` when the store connects or on a node's first decision call,
//! and forgotten when the node answers that it does not know the command (a failover
//! to a server without it); a node without it is asked again after [`ASK_AGAIN_MS`],
//! so a module loaded later (`MODULE LOAD`, a failover to a server that has it) is
//! used without a restart. A call goes to the module when its node has it and the
//! module decides every policy of every check ([`Wire::module`](super::script::Wire));
//! else to Functions or `EVALSHA` as before. Never for leases. (`Caller::module_call`
//! in `connection.rs` sends the calls.)

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use redis::Value;
use tollgate_core::{Clock, MonotonicClock};

use super::per_node::PerNode;

/// The version of the module's arguments this store sends
/// (`tollgate_redis_module::WIRE`); a module of another version is not used.
const WIRE: i64 = 1;

pub(super) const UNKNOWN: u8 = 0;
pub(super) const LOADED: u8 = 1;
pub(super) const ABSENT: u8 = 2;

/// How long a node found without the module is decided by Functions before it is
/// asked again (one call's probe, on that call).
pub(super) const ASK_AGAIN_MS: u64 = 30_000;

/// Whether each node has the module.
pub(super) struct ModuleNodes {
    nodes: PerNode<AtomicU8>,
    /// When each node was last found without it (ms of `clock`).
    absent_at: PerNode<AtomicU64>,
    clock: Box<dyn Clock>,
}

impl Default for ModuleNodes {
    fn default() -> Self {
        ModuleNodes::with_clock(Box::new(MonotonicClock::new()))
    }
}

impl ModuleNodes {
    fn with_clock(clock: Box<dyn Clock>) -> Self {
        ModuleNodes {
            nodes: PerNode::default(),
            absent_at: PerNode::default(),
            clock,
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_us() / 1000
    }

    /// `node`'s state for its next call: a node without the module for
    /// [`ASK_AGAIN_MS`] is `UNKNOWN` once (to the one call that claims the probe).
    pub(super) fn state(&self, node: usize) -> u8 {
        let state = self.stored(node);
        if state != ABSENT {
            return state;
        }
        let at = self.absent_at.get(node, AtomicU64::default);
        let (then, now) = (at.load(Ordering::Relaxed), self.now_ms());
        let due = now.saturating_sub(then) >= ASK_AGAIN_MS;
        if due && (at.compare_exchange(then, now, Ordering::Relaxed, Ordering::Relaxed)).is_ok() {
            return UNKNOWN;
        }
        ABSENT
    }

    fn stored(&self, node: usize) -> u8 {
        self.nodes
            .get(node, AtomicU8::default)
            .load(Ordering::Relaxed)
    }

    /// Whether `node` was found to have the module.
    pub(super) fn has(&self, node: usize) -> bool {
        self.stored(node) == LOADED
    }

    pub(super) fn set(&self, node: usize, state: u8) {
        if state == ABSENT {
            (self.absent_at.get(node, AtomicU64::default)).store(self.now_ms(), Ordering::Relaxed);
        }
        self.nodes
            .get(node, AtomicU8::default)
            .store(state, Ordering::Relaxed);
    }

    /// Records what `TOLLGATE.WIRE` answered on `node`.
    pub(super) fn found(&self, node: usize, name: &str, answer: redis::RedisResult<Value>) {
        match answer {
            Ok(Value::Int(WIRE)) => {
                tracing::info!(node = name, "redis: deciding with the tollgate module");
                self.set(node, LOADED);
            }
            Ok(other) => {
                tracing::warn!(node = name, answer = ?other, "redis: the tollgate module there is of another version (wire {WIRE} wanted): not used");
                self.set(node, ABSENT);
            }
            // No answer yet (a link down, a slot moving): asked again on the next call.
            Err(e)
                if e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_cluster_error() => {}
            // Any answer of the server's (an unknown command, an ACL that forbids it).
            Err(_) => self.set(node, ABSENT),
        }
    }
}

pub(super) fn unknown_command(e: &redis::RedisError) -> bool {
    e.to_string()
        .to_ascii_lowercase()
        .contains("unknown command")
}

/// `TOLLGATE.WIRE`.
pub(super) fn probe() -> redis::Cmd {
    redis::cmd("TOLLGATE.WIRE")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tollgate_core::ManualClock;

    struct Shared(Arc<ManualClock>);

    impl Clock for Shared {
        fn now_ns(&self) -> u64 {
            self.0.now_ns()
        }
    }

    #[test]
    fn a_node_without_the_module_is_asked_again_by_one_call_after_a_while() {
        let clock = Arc::new(ManualClock::new());
        let m = ModuleNodes::with_clock(Box::new(Shared(clock.clone())));
        assert_eq!(m.state(0), UNKNOWN);
        let unknown = Err(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "ERR unknown command",
        )));
        m.found(0, "n0", unknown);
        assert_eq!((m.state(0), m.has(0)), (ABSENT, false));
        clock.advance(std::time::Duration::from_millis(ASK_AGAIN_MS - 1));
        assert_eq!(m.state(0), ABSENT);
        clock.advance(std::time::Duration::from_millis(1));
        // One call probes; the others meanwhile stay on Functions.
        assert_eq!((m.state(0), m.state(0)), (UNKNOWN, ABSENT));
        m.found(0, "n0", Ok(Value::Int(WIRE)));
        assert_eq!((m.state(0), m.has(0)), (LOADED, true));
        // Another node is its own.
        assert_eq!(m.state(1), UNKNOWN);
    }
}
