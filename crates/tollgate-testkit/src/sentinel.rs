//! Redis Sentinel for tests: a master, one replica and three Sentinels watching them,
//! started from the `redis-server` binary (`--sentinel`) on free loopback ports and
//! stopped by PID on drop; with TLS and passwords when asked.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::pki::Pki;
use crate::process::{distinct_ports, release};
use crate::redis::{cli_binary, server_binary, RedisServers};

/// How to start a [`Sentinels`] setup.
#[derive(Default, Clone, Copy)]
pub struct SentinelSetup<'a> {
    /// Certificates: every server and Sentinel then speaks TLS only.
    pub tls: Option<&'a Pki>,
    /// The master's and replica's password (`requirepass`, `masterauth`).
    pub password: Option<&'a str>,
    /// The Sentinels' own password (`requirepass` in their config).
    pub sentinel_password: Option<&'a str>,
    /// More `redis-server` arguments for the master and the replica.
    pub extra: &'a [&'a str],
    /// How long the master may be silent before a Sentinel thinks it down (ms;
    /// default 1000).
    pub down_after_ms: u32,
}

/// A master (server 0 of `data`), its replica (server 1) and three Sentinels
/// monitoring them under one name with a quorum of two.
pub struct Sentinels {
    /// The master and the replica.
    pub data: RedisServers,
    children: Vec<Child>,
    /// The Sentinels' ports.
    pub ports: Vec<u16>,
    /// The master name the Sentinels know.
    pub name: String,
    tls: Vec<String>,
    password: Option<String>,
}

impl Sentinels {
    /// Starts the setup and waits until every Sentinel knows the replica and the
    /// other Sentinels (a failover can happen from then on).
    pub fn start(name: &str, setup: SentinelSetup) -> Sentinels {
        let mut extra: Vec<&str> = setup.extra.to_vec();
        if let Some(pw) = setup.password {
            extra.extend(["--requirepass", pw, "--masterauth", pw]);
        }
        let data = RedisServers::master_and_replica(&extra, setup.tls);
        let ports = distinct_ports(3);
        let dir = data.dir().join("sentinels");
        std::fs::create_dir_all(&dir).unwrap();
        let down_after = match setup.down_after_ms {
            0 => 1000,
            ms => ms,
        };
        let mut children = Vec::new();
        for &port in &ports {
            let mut conf = String::from("bind 127.0.0.1\n");
            match setup.tls {
                None => conf += &format!("port {port}\n"),
                Some(pki) => {
                    let file = |f: &str| pki.path(f).display().to_string();
                    conf += &format!(
                        "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                         tls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes\n",
                        file("server.pem"),
                        file("server.key"),
                        file("ca.pem")
                    );
                }
            }
            conf += &format!(
                "dir {}\nsentinel monitor {name} 127.0.0.1 {} 2\n\
                 sentinel down-after-milliseconds {name} {down_after}\n\
                 sentinel failover-timeout {name} 10000\n",
                dir.display(),
                data.ports[0]
            );
            if let Some(pw) = setup.password {
                conf += &format!("sentinel auth-pass {name} \"{pw}\"\n");
            }
            if let Some(pw) = setup.sentinel_password {
                conf += &format!("requirepass \"{pw}\"\nsentinel sentinel-pass \"{pw}\"\n");
            }
            let file = dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(&file, conf).unwrap();
            let child = Command::new(server_binary())
                .arg(&file)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel (scripts/test.sh installs it)");
            children.push(child);
        }
        let s = Sentinels {
            data,
            children,
            ports,
            name: name.into(),
            tls: setup
                .tls
                .map(RedisServers::cli_tls_args)
                .unwrap_or_default(),
            password: setup.sentinel_password.map(str::to_string),
        };
        s.wait_watching();
        s
    }

    fn wait_watching(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0..self.ports.len() {
            loop {
                let replicas = self.cli(i, &["SENTINEL", "REPLICAS", &self.name]);
                let sentinels = self.cli(i, &["SENTINEL", "SENTINELS", &self.name]);
                let known = |out: &str| out.lines().filter(|l| *l == "name").count();
                if known(&replicas) >= 1 && known(&sentinels) >= 2 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "sentinel {i} does not know the replica and the others: {replicas} / {sentinels}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// `redis-cli` against Sentinel `i`: its output.
    pub fn cli(&self, i: usize, args: &[&str]) -> String {
        let mut cli = Command::new(cli_binary());
        cli.args(&self.tls)
            .args(["-p", &self.ports[i].to_string()])
            .args(args);
        if let Some(pw) = &self.password {
            cli.env("REDISCLI_AUTH", pw);
        }
        let out = cli.output().expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The Sentinels' addresses, `127.0.0.1:port,...`.
    pub fn hosts(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        hosts.join(",")
    }

    /// The URL tollgate connects with (no password in it).
    pub fn url(&self) -> String {
        let s = if self.tls.is_empty() { "" } else { "s" };
        format!("redis{s}+sentinel://{}/{}", self.hosts(), self.name)
    }

    /// The port of the master Sentinel `i` names now.
    pub fn master_port(&self, i: usize) -> Option<u16> {
        let out = self.cli(i, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.name]);
        out.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        release(&self.ports);
    }
}
