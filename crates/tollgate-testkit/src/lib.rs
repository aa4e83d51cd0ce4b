//! What tollgate's tests share, so that no crate borrows another's test files:
//! guards that stop the processes a test starts ([`Killed`]), free loopback ports
//! ([`free_port`], [`distinct_ports`]), and real Redis servers — a standalone server or
//! a 3-master Cluster started from the `redis-server` binary and stopped by PID
//! ([`RedisServers`]) — with the helpers the multi-process tests use
//! ([`run_children`], [`timing_sensitive`], [`rt`]); real nginx ([`Nginx`]) on a clock
//! the test steps ([`FrozenClock`], libfaketime); raw clients that misbehave on purpose
//! ([`dribble`], [`idle`]) and a process's open files and memory ([`open_fds`],
//! [`rss_kib`]); a relay that adds latency on the way to a server ([`DelayRelay`]);
//! certificates made with `openssl` ([`Pki`]) for servers that speak TLS; a master,
//! its replica and three Sentinels ([`Sentinels`]); a network namespace whose links a
//! test cuts and heals ([`Namespace`]).
//!
//! `scripts/test.sh` installs `redis-server` / `redis-tools`, `nginx`, `faketime` and
//! `openssl` when they are missing.

// Waiting for a server to come up is timed with the OS clock.
#![allow(clippy::disallowed_methods)]

mod clients;
mod netns;
mod nginx;
mod pki;
mod process;
mod redis;
mod relay;
mod sentinel;

pub use clients::{dribble, idle, open_fds, read_until_closed, rss_kib, Ended};
pub use netns::Namespace;
pub use nginx::{FrozenClock, Nginx, LIBFAKETIME};
pub use pki::Pki;
pub use process::{distinct_ports, free_port, release, Killed, ScratchDir};
pub use redis::{
    cli_binary, module_path, rt, run_children, server_binary, timing_sensitive, with_module,
    RedisServers,
};
pub use relay::DelayRelay;
pub use sentinel::{SentinelSetup, Sentinels};

/// Sleeps past the end of the current clock-aligned window of `window` (windows start
/// at multiples of it since the Unix epoch, as `fixed-window` and Envoy's units do)
/// when less than `margin` of it is left, so that a test counting admissions in one
/// window never straddles two.
pub fn clear_of_window_end(window: std::time::Duration, margin: std::time::Duration) {
    let left = window.as_micros() - unix_us() % window.as_micros();
    if left < margin.as_micros() {
        std::thread::sleep(std::time::Duration::from_micros(left as u64 + 1_000));
    }
}

/// Which clock-aligned window of `window` holds now: a test that counts admissions in
/// one window reads it before and after, and starts again (with fresh keys) when they
/// differ, since a busy machine can stretch any sequence past any margin.
pub fn window_index(window: std::time::Duration) -> u128 {
    unix_us() / window.as_micros()
}

fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
}
