//! Real Redis servers for tests: a standalone server or a 3-master Cluster, started
//! from the `redis-server` binary on free loopback ports and stopped by PID on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering};

use crate::netns::Namespace;
use crate::pki::Pki;
use crate::process::{distinct_ports, release};

/// Running redis-server processes.
pub struct RedisServers {
    children: Vec<Child>,
    /// Their ports, in start order.
    pub ports: Vec<u16>,
    dir: PathBuf,
    /// Each server's arguments, to start it again the same way.
    args: Vec<Vec<String>>,
    /// `redis-cli`'s TLS arguments, when the servers speak TLS only.
    cli_tls: Vec<String>,
    /// The password of `--requirepass` in the servers' arguments, for `redis-cli`.
    cli_auth: Option<String>,
    /// Each server's address (`127.0.0.1`, or one of a [`Namespace`]'s).
    pub hosts: Vec<String>,
    /// The network namespace they run in, if any.
    netns: Option<String>,
}

impl RedisServers {
    /// One standalone server.
    pub fn standalone() -> RedisServers {
        RedisServers::standalone_with(&[])
    }

    /// One standalone server with extra `redis-server` arguments.
    pub fn standalone_with(extra: &[&str]) -> RedisServers {
        let mut s = RedisServers::spawn(1, false, extra, None, None);
        s.wait_ready();
        s
    }

    /// One standalone server in `ns`, on its first address (`ns.addrs[0]`), so that
    /// its link can be cut from this host ([`Namespace::cut`]).
    pub fn standalone_in(ns: &Namespace) -> RedisServers {
        let mut s = RedisServers::spawn(1, false, &[], None, Some(ns));
        s.wait_ready();
        s
    }

    /// One standalone server speaking TLS only, with `pki`'s server certificate;
    /// `mutual`: every client must present a certificate signed by `pki`'s CA
    /// (`tls-auth-clients yes`). `extra` as for [`RedisServers::standalone_with`].
    pub fn standalone_tls(pki: &Pki, mutual: bool, extra: &[&str]) -> RedisServers {
        let mut s = RedisServers::spawn(1, false, extra, Some((pki, mutual)), None);
        s.wait_ready();
        s
    }

    /// A Cluster of three masters speaking TLS only, among themselves too
    /// (`tls-cluster yes`); clients need no certificate.
    pub fn cluster_tls(pki: &Pki) -> RedisServers {
        RedisServers::make_cluster(0, &[], Some((pki, false)), None)
    }

    /// A Cluster of three masters (no replicas) in `ns`, each on an address of its
    /// own (`ns.addrs[0..3]`), so that one can be cut off from this host
    /// ([`Namespace::cut`]) while the masters still see one another.
    pub fn cluster_in(ns: &Namespace) -> RedisServers {
        RedisServers::make_cluster(0, &[], None, Some(ns))
    }

    /// A master (server 0) and its replica (server 1), synced; `extra` and `tls` as for
    /// [`RedisServers::standalone_with`] and [`RedisServers::standalone_tls`] (clients
    /// need no certificate).
    pub fn master_and_replica(extra: &[&str], tls: Option<&Pki>) -> RedisServers {
        let mut s = RedisServers::spawn(2, false, extra, tls.map(|pki| (pki, false)), None);
        s.wait_ready();
        let master = s.ports[0].to_string();
        let ok = s.cli(1, &["REPLICAOF", "127.0.0.1", &master]);
        assert!(ok.contains("OK"), "REPLICAOF: {ok}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !s
            .cli(1, &["info", "replication"])
            .contains("master_link_status:up")
        {
            assert!(Instant::now() < deadline, "the replica did not sync");
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    /// The directory the servers run in.
    pub(crate) fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// `redis-cli`'s arguments for a server with `pki`'s certificates.
    pub(crate) fn cli_tls_args(pki: &Pki) -> Vec<String> {
        let file = |f: &str| pki.path(f).display().to_string();
        vec![
            "--tls".into(),
            "--cacert".into(),
            file("ca.pem"),
            "--cert".into(),
            file("client.pem"),
            "--key".into(),
            file("client.key"),
        ]
    }

    /// `redis-cli -h HOST -p PORT args...` against server `i`: its output.
    pub fn cli(&self, i: usize, args: &[&str]) -> String {
        let out = self
            .redis_cli()
            .args(["-h", &self.hosts[i], "-p", &self.ports[i].to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A Cluster of three masters (no replicas), slots assigned.
    pub fn cluster() -> RedisServers {
        RedisServers::cluster_of(0, &[])
    }

    /// A Cluster of three masters with `replicas` replicas each (servers 0-2 are the
    /// masters), slots assigned; `extra` goes to every `redis-server` (e.g. a short
    /// `--cluster-node-timeout` for a quick failover).
    pub fn cluster_of(replicas: usize, extra: &[&str]) -> RedisServers {
        RedisServers::make_cluster(replicas, extra, None, None)
    }

    fn make_cluster(
        replicas: usize,
        extra: &[&str],
        tls: Option<(&Pki, bool)>,
        ns: Option<&Namespace>,
    ) -> RedisServers {
        let mut s = RedisServers::spawn(3 * (1 + replicas), true, extra, tls, ns);
        s.wait_ready();
        let nodes = s.addresses();
        let out = s
            .redis_cli()
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        // Wait until every node agrees the cluster is up.
        let deadline = Instant::now() + Duration::from_secs(20);
        for i in 0..s.ports.len() {
            loop {
                if s.cli(i, &["cluster", "info"]).contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster did not come up");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        // And every replica has its master's data (a replica that never synced
        // cannot take over).
        for i in 3..s.ports.len() {
            while !s
                .cli(i, &["info", "replication"])
                .contains("master_link_status:up")
            {
                assert!(Instant::now() < deadline, "replica {i} did not sync");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        s
    }

    fn spawn(
        n: usize,
        cluster: bool,
        extra: &[&str],
        tls: Option<(&Pki, bool)>,
        ns: Option<&Namespace>,
    ) -> RedisServers {
        static MADE: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tollgate-redis-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut children = Vec::new();
        let mut all_args = Vec::new();
        let hosts: Vec<String> = (0..n)
            .map(|i| ns.map_or("127.0.0.1".into(), |ns| ns.addrs[i].clone()))
            .collect();
        let netns = ns.map(|ns| ns.name.clone());
        // A Cluster node's bus port is its own choice too: by default it is the port
        // plus 10000, which a busy machine may have in use, and past 55535 the server
        // refuses to start (a free port above it made "redis-server did not start").
        let ports = distinct_ports(if cluster { 2 * n } else { n });
        let (ports, bus) = ports.split_at(n);
        for (i, &port) in ports.iter().enumerate() {
            // Defaults first: a later argument (in `extra`) wins.
            let mut args: Vec<String> = ["--bind", &hosts[i], "--save", "", "--appendonly", "no"]
                .iter()
                .map(|a| a.to_string())
                .collect();
            match tls {
                None => args.extend(["--port".into(), port.to_string()]),
                Some((pki, mutual)) => {
                    let file = |name: &str| pki.path(name).display().to_string();
                    args.extend(["--port".into(), "0".into()]);
                    args.extend(["--tls-port".into(), port.to_string()]);
                    args.extend(["--tls-cert-file".into(), file("server.pem")]);
                    args.extend(["--tls-key-file".into(), file("server.key")]);
                    args.extend(["--tls-ca-cert-file".into(), file("ca.pem")]);
                    let auth = if mutual { "yes" } else { "no" };
                    args.extend(["--tls-auth-clients".into(), auth.into()]);
                    args.extend(["--tls-replication".into(), "yes".into()]);
                    if cluster {
                        args.extend(["--tls-cluster".into(), "yes".into()]);
                    }
                }
            }
            if ns.is_some() {
                // Reached over the veth, not the loopback interface; every address is
                // local inside the namespace, so a node's own is named for it to
                // announce and to connect to the others from.
                args.extend(["--protected-mode".into(), "no".into()]);
                if cluster {
                    args.extend(["--cluster-announce-ip".into(), hosts[i].clone()]);
                    args.extend(["--bind-source-addr".into(), hosts[i].clone()]);
                }
            }
            // A directory each: a replica's full sync renames the snapshot it received
            // to `dump.rdb` in its directory and loads that file, so replicas syncing at
            // once in one directory could each load another's data.
            let own = dir.join(format!("node-{i}"));
            std::fs::create_dir_all(&own).unwrap();
            args.extend(["--dir".into(), own.display().to_string()]);
            if cluster {
                args.extend(["--cluster-enabled".into(), "yes".into()]);
                args.extend(["--cluster-port".into(), bus[i].to_string()]);
                args.extend([
                    "--cluster-config-file".into(),
                    format!("nodes-{i}-{port}.conf"),
                ]);
            }
            args.extend(extra.iter().map(|a| a.to_string()));
            children.push(spawn_server(netns.as_deref(), &args));
            all_args.push(args);
        }
        let cli_tls = tls
            .map(|(pki, _)| RedisServers::cli_tls_args(pki))
            .unwrap_or_default();
        RedisServers {
            children,
            ports: ports.to_vec(),
            dir,
            args: all_args,
            cli_tls,
            cli_auth: extra
                .iter()
                .position(|a| *a == "--requirepass")
                .and_then(|i| extra.get(i + 1))
                .map(|p| p.to_string()),
            hosts,
            netns,
        }
    }

    /// Every server's `host:port`.
    pub fn addresses(&self) -> Vec<String> {
        (self.hosts.iter().zip(&self.ports))
            .map(|(h, p)| format!("{h}:{p}"))
            .collect()
    }

    /// A `redis-cli` command that speaks to these servers (TLS, password).
    fn redis_cli(&self) -> Command {
        let mut cli = Command::new(cli_binary());
        cli.args(&self.cli_tls);
        if let Some(password) = &self.cli_auth {
            cli.env("REDISCLI_AUTH", password);
        }
        cli
    }

    /// The process id of server `i`.
    pub fn pid(&self, i: usize) -> u32 {
        self.children[i].id()
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for (host, &port) in self.hosts.iter().zip(&self.ports) {
            while std::net::TcpStream::connect((host.as_str(), port)).is_err() {
                assert!(Instant::now() < deadline, "redis-server did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The URL tollgate connects with.
    pub fn url(&self) -> String {
        let tls = if self.cli_tls.is_empty() { "" } else { "s" };
        let nodes = self.addresses();
        if nodes.len() == 1 {
            format!("redis{tls}://{}/", nodes[0])
        } else {
            format!("redis{tls}+cluster://{}", nodes.join(","))
        }
    }

    /// Stops server `i` (kill by PID).
    pub fn stop(&mut self, i: usize) {
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
    }

    /// Freezes server `i` (SIGSTOP): its connections stay open, nothing answers.
    pub fn pause(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// Thaws server `i` (SIGCONT): it runs what queued up meanwhile.
    pub fn resume(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.children[i].id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Starts server `i` again on its port, with the arguments it first had (so a
    /// server with `--appendonly yes` reloads its data).
    pub fn restart(&mut self, i: usize) {
        let port = self.ports[i];
        let args = self.args[i].clone();
        let spawn = || spawn_server(self.netns.as_deref(), &args);
        // A server that exits at once could not bind yet (the old socket lingering on
        // a loaded machine): start it again until it stays up.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut child = spawn();
        loop {
            std::thread::sleep(Duration::from_millis(50));
            match child.try_wait() {
                Ok(Some(status)) => {
                    assert!(
                        Instant::now() < deadline,
                        "redis-server on port {port} keeps exiting ({status})"
                    );
                    child = spawn();
                }
                _ => break,
            }
        }
        self.children[i] = child;
        self.wait_ready();
    }
}

/// The server the tests start: `redis-server`, or the binary named by
/// `TOLLGATE_REDIS_SERVER` (the test command runs the Redis suites again with Valkey's
/// `valkey-server`).
pub fn server_binary() -> String {
    std::env::var("TOLLGATE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// The tollgate Redis module (`crates/tollgate-redis-module`): `TOLLGATE_REDIS_MODULE`,
/// else `libtollgate_redis_module.so` beside the running test's build (cargo puts a
/// test binary in `target/<profile>/deps/`). `scripts/test.sh` builds it first.
pub fn module_path() -> String {
    if let Ok(p) = std::env::var("TOLLGATE_REDIS_MODULE") {
        return p;
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let so = profile.join("libtollgate_redis_module.so");
    assert!(
        so.exists(),
        "{} is missing: build it with `cargo build -p tollgate-redis-module` (scripts/test.sh does), or set TOLLGATE_REDIS_MODULE",
        so.display()
    );
    so.display().to_string()
}

/// `redis-server` arguments that load the tollgate module ([`module_path`]).
pub fn with_module() -> [String; 2] {
    ["--loadmodule".into(), module_path()]
}

/// Its command-line client: `redis-cli`, or `TOLLGATE_REDIS_CLI` (`valkey-cli`).
pub fn cli_binary() -> String {
    std::env::var("TOLLGATE_REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

/// Starts `redis-server` with `args`, inside network namespace `netns` if given.
fn spawn_server(netns: Option<&str>, args: &[String]) -> Child {
    let mut cmd = match netns {
        Some(ns) => {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns, &server_binary()]);
            cmd
        }
        None => Command::new(server_binary()),
    };
    cmd.args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (scripts/test.sh installs it)")
}

impl Drop for RedisServers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        release(&self.ports);
    }
}

/// Runs `n` copies of this test binary's test `child` (an `#[ignore]`d test that reads
/// `env_var`, here set to `value`) at once, and returns the numbers each printed after
/// `tag` on a line of its stdout.
pub fn run_children(child: &str, n: usize, env_var: &str, value: &str, tag: &str) -> Vec<Vec<i64>> {
    let children: Vec<_> = (0..n)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    child,
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(env_var, value)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find_map(|l| l.split(tag).nth(1))
                .unwrap_or_else(|| panic!("no report from a child: {text}"));
            line.split_whitespace()
                .map(|n| n.parse().unwrap())
                .collect()
        })
        .collect()
}

/// A two-worker tokio runtime, as the tests' clients use.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Held by the tests whose assertions involve time (child processes hammering, a
/// server killed under load), so that they do not run beside one another in one
/// test binary on a two-core machine.
pub fn timing_sensitive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
