//! Child processes and ports.

use std::net::TcpListener;
use std::process::Child;

/// A child process killed (and reaped) when the guard drops, so that a failing test
/// leaves nothing running.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    distinct_ports(1)[0]
}

/// `n` loopback ports nobody listens on right now, all different (each listener is
/// held until all are chosen).
pub fn distinct_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a loopback port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("a bound address").port())
        .collect()
}
