//! Child processes and ports.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::process::Child;
use std::sync::Mutex;

/// A child process killed (and reaped) when the guard drops, so that a failing test
/// leaves nothing running.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Ports handed out in this process and not released: a server stopped for a while
/// (a Redis restart test) keeps its port, so a test running beside it never gets it.
static RESERVED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

fn reserved() -> std::sync::MutexGuard<'static, BTreeSet<u16>> {
    RESERVED.lock().unwrap_or_else(|e| e.into_inner())
}

/// A loopback port nobody listens on right now, reserved for this process.
pub fn free_port() -> u16 {
    distinct_ports(1)[0]
}

/// `n` loopback ports nobody listens on right now, all different (each listener is
/// held until all are chosen) and none handed out before in this process unless
/// [`release`]d.
pub fn distinct_ports(n: usize) -> Vec<u16> {
    let mut taken = reserved();
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        let l = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = l.local_addr().expect("a bound address").port();
        if taken.insert(port) {
            held.push((port, l));
        }
    }
    held.into_iter().map(|(port, _)| port).collect()
}

/// Gives `ports` back for later tests to use.
pub fn release(ports: &[u16]) {
    let mut taken = reserved();
    for p in ports {
        taken.remove(p);
    }
}

/// A directory of its own under the system's temporary directory, removed (with what
/// it holds) on drop.
pub struct ScratchDir(pub std::path::PathBuf);

impl ScratchDir {
    /// A new, empty directory whose name carries `tag`.
    pub fn new(tag: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!(
            "tollgate-{tag}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        ScratchDir(dir)
    }

    /// Writes `text` to `name` in the directory; its path, as text.
    pub fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("a file in the scratch directory");
        path.display().to_string()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
