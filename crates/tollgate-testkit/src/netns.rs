//! A network namespace of the test's own, joined to this host by a veth pair, so that
//! a test can cut a server's link by dropping packets inside it (iptables): nothing
//! is refused or reset, calls simply go unanswered, as when a switch, a node or a
//! security group fails. Needs root, iproute2 and iptables (`scripts/test.sh` runs as
//! root and installs them).

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Runs a command that must succeed.
fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| {
            panic!("{args:?}: {e} (the test needs iproute2 and iptables, and root)")
        });
    assert!(out.status.success(), "{args:?}: {out:?}");
}

/// A network namespace with up to five addresses (`addrs`) on its end of a veth pair,
/// the other end on this host; deleted (with the pair) on drop.
pub struct Namespace {
    /// Its name, for `ip netns exec`.
    pub name: String,
    /// The addresses inside it, reachable from this host.
    pub addrs: Vec<String>,
    /// The interface inside it that faces this host.
    inside: String,
}

impl Namespace {
    /// A namespace with `n` (1 to 5) addresses, on a /29 of 10.200.0.0/12 chosen by
    /// process and by namespace, so that tests running at once never share one.
    pub fn new(n: usize) -> Namespace {
        assert!(
            (1..=5).contains(&n),
            "a /29 holds five addresses beside the host's"
        );
        static MADE: AtomicU32 = AtomicU32::new(0);
        let made = MADE.fetch_add(1, Ordering::Relaxed);
        assert!(made < 4, "a test process makes at most four namespaces");
        let id = (std::process::id() % 50_000) * 4 + made;
        let name = format!("tgl{id}");
        let (host_if, inside) = (format!("tglh{id}"), format!("tgln{id}"));
        let net = format!("10.{}.{}", 200 + (id / 32 / 256) % 16, (id / 32) % 256);
        let base = (id % 32) * 8;
        let host = format!("{net}.{}", base + 1);
        let addrs: Vec<String> = (0..n as u32)
            .map(|i| format!("{net}.{}", base + 2 + i))
            .collect();
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run(&["ip", "netns", "add", &name]);
        let ns = Namespace {
            name: name.clone(),
            addrs,
            inside: inside.clone(),
        };
        run(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &inside,
        ]);
        run(&["ip", "link", "set", &inside, "netns", &name]);
        run(&["ip", "addr", "add", &format!("{host}/29"), "dev", &host_if]);
        run(&["ip", "link", "set", &host_if, "up"]);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        for addr in &ns.addrs {
            ns.exec(&["ip", "addr", "add", &format!("{addr}/29"), "dev", &inside]);
        }
        ns.exec(&["ip", "link", "set", &inside, "up"]);
        ns
    }

    /// Runs a command inside the namespace; it must succeed.
    pub fn exec(&self, args: &[&str]) {
        let mut all = vec!["ip", "netns", "exec", &self.name];
        all.extend(args);
        run(&all);
    }

    /// Drops (`cut`) or lets through again every packet from this host to `addr`, or
    /// to every address of the namespace when `addr` is `None`. Traffic between the
    /// addresses inside (a Cluster's bus) is not touched.
    pub fn cut(&self, addr: Option<&str>, cut: bool) {
        let op = if cut { "-I" } else { "-D" };
        let mut rule = vec!["iptables", op, "INPUT", "-i", &self.inside];
        if let Some(addr) = addr {
            rule.extend(["-d", addr]);
        }
        rule.extend(["-j", "DROP"]);
        self.exec(&rule);
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}
