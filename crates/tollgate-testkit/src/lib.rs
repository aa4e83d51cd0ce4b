//! What tollgate's tests share, so that no crate borrows another's test files:
//! guards that stop the processes a test starts ([`Killed`]), free loopback ports
//! ([`free_port`], [`distinct_ports`]), and real Redis servers — a standalone server or
//! a 3-master Cluster started from the `redis-server` binary and stopped by PID
//! ([`RedisServers`]) — with the helpers the multi-process tests use
//! ([`run_children`], [`timing_sensitive`], [`rt`]).
//!
//! `scripts/test.sh` installs `redis-server` / `redis-tools` when they are missing.

// Waiting for a server to come up is timed with the OS clock.
#![allow(clippy::disallowed_methods)]

mod process;
mod redis;

pub use process::{distinct_ports, free_port, release, Killed};
pub use redis::{rt, run_children, timing_sensitive, RedisServers};
