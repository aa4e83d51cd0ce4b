//! Where the tollgate Redis module decides (`crates/tollgate-redis-module`): per node,
//! found by `TOLLGATE.WIRE` when the store connects or on a node's first decision call,
//! and forgotten when the node answers that it does not know the command (a failover
//! to a server without it). A call goes to the module when its node has it and the
//! module decides every policy of every check ([`Wire::module`](super::script::Wire));
//! else to Functions or `EVALSHA` as before. Never for leases. (`Caller::module_call`
//! in `connection.rs` sends the calls.)

use std::sync::atomic::{AtomicU8, Ordering};

use redis::Value;

use super::per_node::PerNode;

/// The version of the module's arguments this store sends
/// (`tollgate_redis_module::WIRE`); a module of another version is not used.
const WIRE: i64 = 1;

pub(super) const UNKNOWN: u8 = 0;
pub(super) const LOADED: u8 = 1;
pub(super) const ABSENT: u8 = 2;

/// Whether each node has the module.
#[derive(Default)]
pub(super) struct ModuleNodes {
    nodes: PerNode<AtomicU8>,
}

impl ModuleNodes {
    pub(super) fn state(&self, node: usize) -> u8 {
        self.nodes
            .get(node, AtomicU8::default)
            .load(Ordering::Relaxed)
    }

    /// Whether `node` was found to have the module.
    pub(super) fn has(&self, node: usize) -> bool {
        self.state(node) == LOADED
    }

    pub(super) fn set(&self, node: usize, state: u8) {
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
