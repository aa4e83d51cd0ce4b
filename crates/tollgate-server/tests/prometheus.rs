//! The Grafana dashboards and Prometheus rules of `deploy/` against a real Prometheus
//! (Debian's `prometheus` package, which `scripts/test.sh` installs) scraping real
//! servers under load: three `serve` (Redis behind a relay that can slow it down with
//! an RLQS fleet; memory with traces; xDS with no server), a `proxy` on Redis before
//! two `bench upstream`s, every metrics listener on TLS (one certificate a day or two
//! from expiry).
//!
//! - `promtool check rules` passes, and the dashboards are what
//!   `deploy/grafana/dashboards.py` writes.
//! - While the servers are healthy, no alert fires but the expiring certificate's two
//!   and the absent xDS server's (and slow decisions, if the machine makes them so).
//! - Then each alert is made to come true and must fire: Redis paused (SIGSTOP) for
//!   the store alerts of `serve` and the proxy, Redis slowed for slow decisions, one
//!   key's burst for a rule and a route rejecting above their usual share, critical
//!   traffic past the adaptive limit, a bad rule file and a bad proxy config, a
//!   server killed. The rules run as they are written, except that every `for:` is
//!   cut to 5s so that the test takes seconds rather than minutes.
//! - Every expression of both dashboards (panels and variables) returns data (a finite
//!   number) over the run, through Prometheus's HTTP API.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use tollgate_testkit::{self as testkit, DelayRelay, Killed, Pki, RedisServers, ScratchDir};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

/// Starts `command` with its output in `dir/NAME.log`; killed on drop.
fn spawn(dir: &Path, name: &str, command: &mut Command) -> Killed {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let child = command
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    Killed(child)
}

/// Starts `command` and waits for its first line (a server's banner).
fn spawn_server(dir: &Path, name: &str, command: &mut Command) -> Killed {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let mut child: Child = command
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut banner = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut banner)
        .unwrap();
    assert!(!banner.is_empty(), "{name} exited: see {name}.log");
    Killed(child)
}

/// Waits until something listens on `port`.
fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Prometheus's HTTP API: `GET /api/v1/PATH` with `params` (curl encodes them).
struct Api(String);

impl Api {
    fn get(&self, path: &str, params: &[(&str, &str)]) -> Value {
        let mut curl = Command::new("curl");
        curl.args(["-sS", "-G", &format!("{}/api/v1/{path}", self.0)]);
        for (k, v) in params {
            curl.args(["--data-urlencode", &format!("{k}={v}")]);
        }
        let out = curl
            .output()
            .expect("curl runs (scripts/test.sh installs it)");
        let body: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{path} {params:?}: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        assert_eq!(body["status"], "success", "{path} {params:?}: {body}");
        body["data"].clone()
    }

    fn query(&self, expr: &str) -> Vec<Value> {
        let data = self.get("query", &[("query", expr)]);
        data["result"].as_array().cloned().unwrap_or_default()
    }

    /// Prometheus's time now (Unix seconds), for a range query's bounds.
    fn now(&self) -> String {
        let data = self.get("query", &[("query", "time()")]);
        data["result"][1].as_str().unwrap().to_string()
    }

    /// What the alerts read, for a failure's message.
    fn explain(&self) -> String {
        let exprs = [
            "histogram_quantile(0.99, sum by (instance, le) (rate(tollgate_decision_duration_seconds_bucket[5m])))",
            "tollgate:rule_rejected_ratio:rate5m",
            "avg_over_time(tollgate:rule_rejected_ratio:rate5m[1d])",
            "tollgate:proxy_route_rejected_ratio:rate5m",
            "avg_over_time(tollgate:proxy_route_rejected_ratio:rate5m[1d])",
            "sum by (instance, rule, outcome) (rate(tollgate_decisions_total[5m]))",
            "sum by (route, code) (rate(tollgate_proxy_requests_total[5m]))",
            "sum without (kind) (increase(tollgate_redis_call_errors_total[5m]))",
            "sum without (kind) (increase(tollgate_redis_call_duration_seconds_count[5m]))",
        ];
        (exprs.iter())
            .map(|e| {
                let values: Vec<String> = (self.query(e).iter())
                    .map(|r| format!("{} {}", r["metric"], r["value"][1]))
                    .collect();
                format!("{e}: {values:?}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The firing alerts, as `NAME{label=value,...}` over `labels`.
    fn firing(&self) -> Vec<(String, Value)> {
        let data = self.get("alerts", &[]);
        (data["alerts"].as_array().unwrap().iter())
            .filter(|a| a["state"] == "firing")
            .map(|a| {
                (
                    a["labels"]["alertname"].as_str().unwrap().to_string(),
                    a["labels"].clone(),
                )
            })
            .collect()
    }
}

/// Waits until every alert of `expected` (name, label, value) has fired, each at some
/// point (an alert that reads a share of the last day's may resolve before another
/// fires).
fn wait_firing(api: &Api, expected: &[(&str, &str, &str)], within: Duration) {
    let deadline = Instant::now() + within;
    let mut missing = expected.to_vec();
    loop {
        let firing = api.firing();
        missing.retain(|(name, label, value)| {
            !firing
                .iter()
                .any(|(n, labels)| n == name && labels[*label] == *value)
        });
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not firing within {within:?}: {missing:?}; firing: {firing:?}\n{}",
            api.explain()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The `expr` of the alert `name` in the rules file's text `rules`.
fn alert_expr(rules: &str, name: &str) -> String {
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(rules).unwrap();
    let rules = doc["groups"].as_sequence().unwrap().iter();
    (rules.flat_map(|g| g["rules"].as_sequence().unwrap()))
        .find(|r| r["alert"].as_str() == Some(name))
        .and_then(|r| r["expr"].as_str())
        .unwrap_or_else(|| panic!("no alert {name}"))
        .to_string()
}

/// Waits until Prometheus finds `expr` true for the target `instance` (the state an
/// alert's `for:` starts from), and says how long it took.
fn wait_true(api: &Api, expr: &str, instance: &str, within: Duration) {
    let start = Instant::now();
    let deadline = start + within;
    while !(api.query(expr).iter()).any(|r| r["metric"]["instance"] == *instance) {
        assert!(
            Instant::now() < deadline,
            "{expr} not true for {instance} within {within:?}\n{}",
            api.explain()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("true for {instance} after {:?}: {expr}", start.elapsed());
}

/// Every expression of a Grafana dashboard: its panels' targets and its query
/// variables' metric selectors, with the variables as "All" selects them.
fn dashboard_expressions(file: &Path) -> Vec<(String, String)> {
    let board: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let mut out = Vec::new();
    for panel in board["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap().to_string();
            out.push((title, target["expr"].as_str().unwrap().to_string()));
        }
    }
    for var in board["templating"]["list"].as_array().unwrap() {
        if var["type"] != "query" {
            continue;
        }
        // label_values(SELECTOR, LABEL): the selector must return series with it.
        let def = var["definition"].as_str().unwrap();
        let inner = &def["label_values(".len()..def.len() - 1];
        let (selector, label) = inner.rsplit_once(", ").unwrap();
        let name = format!("variable {}", var["name"].as_str().unwrap());
        out.push((name, format!("count by ({label}) ({selector})")));
    }
    let all = |e: &str| {
        (e.replace("$__rate_interval", "5s"))
            .replace("=~\"$job\"", "=~\".+\"")
            .replace("=~\"$instance\"", "=~\".+\"")
            .replace("=~\"$domain\"", "=~\".+\"")
            .replace("=~\"$route\"", "=~\".+\"")
    };
    (out.into_iter().map(|(t, e)| (t, all(&e)))).collect()
}

const RULES: &str = r#"domain: shop
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5}
quota_buckets:
  - bucket: { name: api }
    policy: "gcra:rate=100/s,burst=20"
"#;

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server and prometheus: run scripts/test.sh, or cargo test --features external-servers"
)]
#[test]
fn prometheus_evaluates_the_dashboards_and_every_alert_comes_true() {
    let root = repo();
    let rules_file = root.join("deploy/prometheus/tollgate-alerts.yaml");
    let check = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules_file)
        .output()
        .expect("promtool runs (scripts/test.sh installs prometheus)");
    assert!(check.status.success(), "promtool check rules: {check:?}");
    let fresh = Command::new("python3")
        .arg(root.join("deploy/grafana/dashboards.py"))
        .arg("--check")
        .output()
        .unwrap();
    assert!(fresh.status.success(), "{fresh:?}");

    let dir = ScratchDir::new("prometheus");
    let dir = dir.0.as_path();
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).unwrap();
        dir.join(name).display().to_string()
    };
    let pki = Pki::new();
    // Made 28 days ago and valid for 30: one to two days left.
    let made = Command::new("date")
        .args(["-u", "-d", "28 days ago", "+%F"])
        .output()
        .unwrap();
    let made = String::from_utf8(made.stdout).unwrap();
    pki.issue_made_on("expiring", "DNS:localhost,IP:127.0.0.1", made.trim());
    let file = |name: &str| pki.path(name).display().to_string();
    let tls = |cert: &str| {
        format!(
            "{{cert_file: {}, key_file: {}}}",
            file(&format!("{cert}.pem")),
            file(&format!("{cert}.key"))
        )
    };

    let redis = RedisServers::standalone();
    let rt = testkit::rt();
    let redis_addr: std::net::SocketAddr = redis.url()["redis://".len()..]
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let relay = rt.block_on(DelayRelay::start(redis_addr));
    let ports = testkit::distinct_ports(12);
    let [m_a, m_b, m_c, proxy_port, proxy_metrics, up_api, up_chat, prom, g_a, g_b, nothing, _] =
        ports[..]
    else {
        unreachable!()
    };

    // serve A: Redis through the relay; B: memory, traced into a collector that is
    // not there; C: rules over xDS from a server that is not there.
    write("rules.yaml", RULES);
    let rules_b = write("rules-b.yaml", RULES);
    let serve_config = |name: &str, metrics: u16, cert: &str, rest: &str| {
        write(
            name,
            &format!(
                "listen:\n  metrics: 127.0.0.1:{metrics}\n  metrics_tls: {}\n{rest}",
                tls(cert)
            ),
        )
    };
    let a = serve_config(
        "a.yaml",
        m_a,
        "expiring",
        &format!(
            "rules: [rules.yaml]\nstore:\n  kind: redis\n  url: redis://{}/\n",
            relay.addr
        ),
    );
    let b = serve_config("b.yaml", m_b, "server", "rules: [rules-b.yaml]\n");
    let c = serve_config(
        "c.yaml",
        m_c,
        "server",
        &format!("xds:\n  server: 127.0.0.1:{nothing}\n  start_without_rules: true\n"),
    );
    let serve = |config: &str, grpc: u16| {
        let mut cmd = tollgate();
        cmd.current_dir(dir)
            .args(["serve", "--config", config, "--http", "127.0.0.1:0"]);
        cmd.args(["--grpc", &format!("127.0.0.1:{grpc}")]);
        cmd
    };
    let _a = spawn_server(dir, "serve-a", &mut serve(&a, g_a));
    let mut traced = serve(&b, g_b);
    traced.envs([
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{nothing}"),
        ),
        ("OTEL_TRACES_SAMPLER", "traceidratio".to_string()),
        ("OTEL_TRACES_SAMPLER_ARG", "0.1".to_string()),
    ]);
    let serve_b = spawn_server(dir, "serve-b", &mut traced);
    let g_c = testkit::free_port();
    let mut serve_c = spawn_server(dir, "serve-c", &mut serve(&c, g_c));

    let upstream = |port: u16, extra: &[&str]| {
        let mut cmd = tollgate();
        cmd.args([
            "bench",
            "upstream",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ]);
        cmd.args(extra);
        cmd
    };
    let _up_api = spawn(
        dir,
        "upstream-api",
        &mut upstream(up_api, &["--capacity", "2", "--service", "20ms"]),
    );
    let _up_chat = spawn(
        dir,
        "upstream-chat",
        &mut upstream(up_chat, &["--usage", "30", "--service", "1ms"]),
    );
    wait_listening(up_api);
    wait_listening(up_chat);
    let proxy_yaml = format!(
        r#"proxy:
  listen: 127.0.0.1:{proxy_port}
  metrics: 127.0.0.1:{proxy_metrics}
  metrics_tls: {}
  routes:
    - name: api
      match: {{ path_prefix: /api/ }}
      upstream: http://127.0.0.1:{up_api}
      key: header:X-Api-Key
      policies: ["limit-req:rate=20/s,burst=10,nodelay"]
      adaptive: "gradient:min=2,max=8"
      tiers:
        - name: steady
          values: ["k1"]
          policies: ["limit-req:rate=1000/s,burst=100,nodelay"]
        - name: vip
          values: ["vip"]
          policies: ["limit-req:rate=1000/s,burst=100,nodelay"]
          priority: critical
    - name: chat
      match: {{ path_prefix: /chat/ }}
      upstream: http://127.0.0.1:{up_chat}
      key: header:X-Api-Key
      policies: ["fixed-window:limit=1000000,window=1m"]
      cost: {{ from: "json:usage.total_tokens", estimate: 1 }}
"#,
        tls("server")
    );
    let proxy_config = write("proxy.yaml", &proxy_yaml);
    let mut proxy_cmd = tollgate();
    proxy_cmd.args(["proxy", "--config", &proxy_config, "--store", &redis.url()]);
    let proxy = spawn_server(dir, "proxy", &mut proxy_cmd);

    // Load generators (`tollgate bench`).
    let run = |name: &str, args: Vec<String>| {
        let mut cmd = tollgate();
        cmd.arg("bench").args(&args);
        spawn(dir, name, &mut cmd)
    };
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let grpc = |port: u16| format!("127.0.0.1:{port}");
    let checks = |port: u16, keys: &str, rate: &str, conc: &str, duration: &str| {
        let target = grpc(port);
        strings(&[
            "grpc",
            "--target",
            &target,
            "--domain",
            "shop",
            "--key",
            "user",
            "--keys",
            keys,
            "--rate",
            rate,
            "--concurrency",
            conc,
            "--duration",
            duration,
        ])
    };
    // A's first decisions (connecting to Redis, loading its functions) before the
    // first scrape, so that they are not in its decision times' rates.
    let warm = tollgate()
        .arg("bench")
        .args(checks(g_a, "1000", "100", "2", "2s"))
        .output()
        .unwrap();
    assert!(warm.status.success(), "{warm:?}");

    // Prometheus, every `for:` cut to 5s.
    let alerts = std::fs::read_to_string(&rules_file).unwrap();
    let alerts: String = (alerts.lines())
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 5s", &l[..l.len() - l.trim_start().len()]),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(alerts.matches("for: 5s").count() >= 10);
    let alerts_path = write("alerts.yaml", &alerts);
    let target = |ports: &[u16]| {
        ports
            .iter()
            .map(|p| format!("'127.0.0.1:{p}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let prom_config = write(
        "prometheus.yml",
        &format!(
            "global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}\n\
             rule_files: ['{alerts_path}']\n\
             scrape_configs:\n\
             - job_name: tollgate-serve\n  scheme: https\n  tls_config: {{ca_file: '{ca}'}}\n  static_configs: [{{targets: [{serve}]}}]\n\
             - job_name: tollgate-proxy\n  scheme: https\n  tls_config: {{ca_file: '{ca}'}}\n  static_configs: [{{targets: [{proxy}]}}]\n",
            ca = file("ca.pem"),
            serve = target(&[m_a, m_b, m_c]),
            proxy = target(&[proxy_metrics]),
        ),
    );
    let _prometheus = spawn(
        dir,
        "prometheus",
        Command::new("prometheus")
            .arg(format!("--config.file={prom_config}"))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom}")),
    );
    let api = Api(format!("http://127.0.0.1:{prom}"));
    // Ready: its storage open and its rules loaded.
    let deadline = Instant::now() + Duration::from_secs(30);
    let ready = format!("http://127.0.0.1:{prom}/-/ready");
    while !(Command::new("curl")
        .args(["-sf", "-o", "/dev/null", &ready])
        .status())
    .is_ok_and(|s| s.success())
    {
        assert!(
            Instant::now() < deadline,
            "prometheus not ready: see prometheus.log"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let start = api.now();
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.query("up == 1").len() < 4 {
        assert!(
            Instant::now() < deadline,
            "targets not up: {:?}",
            api.query("up")
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // Steady load, light enough that some seconds of Redis errors are 1 % of the
    // calls (TollgateRedisErrors reads the share over 5 minutes), and running past
    // the longest the test may wait for it.
    let _load_a = run("load-a", checks(g_a, "1000", "20", "2", "900s"));
    let _load_b = run("load-b", checks(g_b, "1000", "60", "2", "900s"));
    let _rlqs = run(
        "rlqs",
        strings(&[
            "rlqs",
            "--target",
            &grpc(g_a),
            "--envoys",
            "3",
            "--buckets",
            "1",
            "--bucket",
            "name=api",
            "--rate",
            "20",
            "--duration",
            "900s",
            "--domain",
            "shop",
        ]),
    );
    let proxy_url = |path: &str| format!("http://127.0.0.1:{proxy_port}{path}");
    let closed_loop = |url: String, key: &str, clients: &str, pause: &str| {
        strings(&[
            "closed-loop",
            "--target",
            &url,
            "--clients",
            clients,
            "--duration",
            "900s",
            "--header",
            &format!("X-Api-Key: {key}"),
            "--pause",
            pause,
        ])
    };
    let _load_api = run(
        "load-api",
        closed_loop(proxy_url("/api/x"), "k1", "1", "50ms"),
    );
    let _load_chat = run(
        "load-chat",
        closed_loop(proxy_url("/chat/x"), "c1", "1", "100ms"),
    );

    // Healthy: only the certificate's and the xDS server's alerts, and slow decisions
    // if they are: a debug build on a machine busy with other work can take 20 ms for
    // its slowest decisions, and then the alert is right.
    std::thread::sleep(Duration::from_secs(25));
    let always = [
        ("TollgateCertificateExpiresSoon", "listener", "metrics"),
        ("TollgateCertificateExpiring", "listener", "metrics"),
        (
            "TollgateXdsStreamDown",
            "instance",
            &*format!("127.0.0.1:{m_c}"),
        ),
    ];
    wait_firing(&api, &always, Duration::from_secs(10));
    let firing = api.firing();
    let unexpected: Vec<_> = (firing.iter())
        .filter(|(name, _)| !always.iter().any(|(n, _, _)| n == name))
        .filter(|(name, _)| name != "TollgateDecisionsSlow")
        .collect();
    assert!(
        unexpected.is_empty(),
        "firing while healthy: {unexpected:?}\n{}",
        api.explain()
    );

    let (inst_a, inst_b, inst_c, inst_proxy) = (
        format!("127.0.0.1:{m_a}"),
        format!("127.0.0.1:{m_b}"),
        format!("127.0.0.1:{m_c}"),
        format!("127.0.0.1:{proxy_metrics}"),
    );
    // Redis slowed: 40 ms each way is past Envoy's 20 ms for every decision of A. When
    // A's decisions were fast so far, the alert must start now.
    let slow_a = |firing: &[(String, Value)]| {
        (firing.iter()).any(|(n, l)| n == "TollgateDecisionsSlow" && l["instance"] == *inst_a)
    };
    let slow_before = slow_a(&firing) || slow_a(&api.firing());
    relay.set_delay(Duration::from_millis(40));
    wait_firing(
        &api,
        &[("TollgateDecisionsSlow", "instance", &inst_a)],
        Duration::from_secs(30),
    );
    relay.set_delay(Duration::ZERO);
    eprintln!("TollgateDecisionsSlow for A firing before Redis was slowed: {slow_before}");

    // Redis paused: serve A and the proxy see it fail. While it fails, a store
    // probes it every 500 ms instead of calling it for every decision, so the share of
    // failed calls over 5 minutes (TollgateRedisErrors) passes 1 % once the failed
    // probes are 1 % of the calls made before the pause: seconds on a quiet machine,
    // longer when it let more traffic through. It must come within 5 minutes (then
    // every call in the window is a failed probe): wait for that share, then for the
    // alerts.
    redis.pause(0);
    let errors = alert_expr(&alerts, "TollgateRedisErrors");
    for instance in [&inst_a, &inst_proxy] {
        wait_true(&api, &errors, instance, Duration::from_secs(330));
    }
    wait_firing(
        &api,
        &[
            ("TollgateRedisFailing", "instance", &inst_a),
            ("TollgateRedisFailing", "instance", &inst_proxy),
            ("TollgateRedisErrors", "instance", &inst_a),
            ("TollgateRedisErrors", "instance", &inst_proxy),
        ],
        Duration::from_secs(60),
    );
    redis.resume(0);

    // One key's burst on B, one on the proxy's api route; critical traffic past the
    // route's adaptive limit.
    let _burst_b = run("burst-b", checks(g_b, "1", "400", "4", "60s"));
    let _burst_api = run(
        "burst-api",
        closed_loop(proxy_url("/api/x"), "k9", "4", "0ms"),
    );
    let _vip = run("vip", closed_loop(proxy_url("/api/x"), "vip", "8", "0ms"));
    // A bad rule file for B and a bad proxy config, each with SIGHUP.
    std::fs::write(&rules_b, "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n").unwrap();
    std::fs::write(&proxy_config, "proxy:\n  routes: [{name: api}]\n").unwrap();
    for pid in [serve_b.0.id(), proxy.0.id()] {
        let _ = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status();
    }
    wait_firing(
        &api,
        &[
            ("TollgateRuleRejectingAboveUsual", "rule", "shop/user"),
            ("TollgateProxyRouteRejectingAboveUsual", "route", "api"),
            ("TollgateCriticalTrafficShed", "route", "api"),
            ("TollgateConfigReloadFailing", "instance", &inst_b),
            ("TollgateConfigReloadFailing", "instance", &inst_proxy),
        ],
        Duration::from_secs(60),
    );

    // Every dashboard expression returns data over the run.
    let end = api.now();
    let mut empty = Vec::new();
    let mut count = 0;
    for board in ["tollgate-serve.json", "tollgate-proxy.json"] {
        for (title, expr) in dashboard_expressions(&root.join("deploy/grafana").join(board)) {
            let data = api.get(
                "query_range",
                &[
                    ("query", &expr),
                    ("start", &start),
                    ("end", &end),
                    ("step", "1"),
                ],
            );
            count += 1;
            // Data: a number somewhere (a 0/0 share or a quantile of nothing is NaN).
            let finite = (data["result"].as_array().into_iter().flatten())
                .flat_map(|series| series["values"].as_array().into_iter().flatten())
                .any(|v| {
                    v[1].as_str()
                        .and_then(|v| v.parse::<f64>().ok())
                        .is_some_and(f64::is_finite)
                });
            if !finite {
                empty.push(format!("{board} {title}: {expr}"));
            }
        }
    }
    assert!(count > 60, "only {count} expressions");
    assert!(empty.is_empty(), "no data for:\n{}", empty.join("\n"));
    // The recording rules record.
    for record in [
        "tollgate:rule_rejected_ratio:rate5m",
        "tollgate:proxy_route_rejected_ratio:rate5m",
    ] {
        assert!(!api.query(record).is_empty(), "{record} recorded nothing");
    }

    // A server gone.
    let _ = serve_c.0.kill();
    let _ = serve_c.0.wait();
    wait_firing(
        &api,
        &[("TollgateDown", "instance", &inst_c)],
        Duration::from_secs(30),
    );
    drop(rt);
}
