//! Rules over xDS: `serve` follows a real ADS server (tests/python/xds_server.py, on
//! grpcio, over mutual TLS with certificates made for the test) through versions that
//! change one limit and keep another's counters, a bad version NACKed while the last
//! good one decides, the server going away and coming back; a start without rules; and
//! Envoy Gateway's generated environment, variable by variable, on the binary invoked
//! as `ratelimit`, answering Envoy's calls over TLS.

#[path = "support/serve.rs"]
mod serve_process;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};
use tollgate_testkit::Pki;

/// A day: the unit of the tests' limits, so that no count straddles two windows.
const DAY: Duration = Duration::from_secs(86_400);

/// The xDS server process: commands in, events out.
struct XdsServer {
    child: Child,
    stdin: ChildStdin,
    events: mpsc::Receiver<Value>,
    port: u16,
}

impl XdsServer {
    fn start(pki: &Pki) -> XdsServer {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/xds_server.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(&pki.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs (scripts/test.sh installs grpcio, grpcio-tools, xds-protos)");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let event: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("xds_server.py printed {line:?}: {e}"));
                if tx.send(event).is_err() {
                    break;
                }
            }
        });
        let mut server = XdsServer {
            child,
            stdin,
            events,
            port: 0,
        };
        let listening = server.wait_for("listening", |_| true);
        server.port = listening["port"].as_u64().unwrap() as u16;
        server
    }

    fn send(&mut self, command: Value) {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next event named `name` that `matches`, within 20 s (others are skipped).
    #[allow(clippy::disallowed_methods)] // a deadline on a real process
    fn wait_for(&self, name: &str, matches: impl Fn(&Value) -> bool) -> Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.events.recv_timeout(left) {
                Ok(e) if e["event"] == name && matches(&e) => return e,
                Ok(_) => {}
                Err(_) => panic!("no {name} event from the xDS server within 20 s"),
            }
        }
    }

    /// Sets version `version` and waits for the client's answer to it: the request
    /// that echoes the nonce it was sent with (ACK: `version_info` is it; NACK: an
    /// error).
    fn set(&mut self, version: &str, configs: Value) -> Value {
        self.send(json!({"cmd": "set", "version": version, "configs": configs}));
        self.answer_to(version)
    }

    /// The client's answer to the next sending of `version`.
    fn answer_to(&self, version: &str) -> Value {
        let sent = self.wait_for("sent", |e| e["version"] == version);
        let nonce = sent["nonce"].clone();
        self.wait_for("request", |e| e["nonce"] == nonce)
    }

    /// One ShouldRateLimit from grpcio over TLS with the client certificate.
    fn rls(&mut self, target: &str, domain: &str, entries: &[(&str, &str)]) -> String {
        self.send(json!({"cmd": "rls", "target": target, "domain": domain, "entries": entries}));
        let e = self.wait_for("rls", |_| true);
        match e["code"].as_str() {
            Some(code) => code.to_string(),
            None => format!("{}: {}", e["error"], e["detail"]),
        }
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn limit(key: &str, unit: &str, n: u32) -> Value {
    json!({"key": key, "rate_limit": {"unit": unit, "requests_per_unit": n}})
}

fn resource(name: &str, domain: &str, descriptors: Vec<Value>) -> Value {
    json!({"name": name, "domain": domain, "descriptors": descriptors})
}

fn path(pki: &Pki, name: &str) -> String {
    pki.path(name).display().to_string()
}

async fn check(server: &serve_process::Server, domain: &str, key: &str, value: &str) -> u16 {
    let body =
        json!({"domain": domain, "descriptors": [{"entries": [{"key": key, "value": value}]}]});
    serve_process::request(server, "POST", "/v1/check", &body.to_string(), None)
        .await
        .0
}

async fn get(server: &serve_process::Server, path: &str) -> (u16, Value) {
    let (status, _, body) = serve_process::request(server, "GET", path, "", None).await;
    (status, body)
}

/// Versions 1, 2, a bad 3, the server gone and back (with its versions numbered
/// from the start again), over mutual TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_follows_the_xds_server_through_versions_nacks_and_outages() {
    // Every limit counts per UTC day: the test never straddles two windows.
    tollgate_testkit::clear_of_window_end(DAY, Duration::from_secs(120));
    let pki = Pki::new();
    let mut xds = XdsServer::start(&pki);
    let dir = tollgate_testkit::ScratchDir::new("xds");
    let config = dir.write("tollgate.yaml", &format!(
        "xds:\n  server: 127.0.0.1:{}\n  node_id: envoy-ratelimit\n  headers: {{x-tenant: blue}}\n  \
         backoff_initial: 100ms\n  backoff_max: 400ms\n  \
         tls: {{ca_file: {}, cert_file: {}, key_file: {}}}\n",
        xds.port,
        path(&pki, "ca.pem"),
        path(&pki, "client.pem"),
        path(&pki, "client.key")
    ));
    let server = serve_process::start(&["--config", &config], &[]);
    assert!(
        server
            .banner
            .contains("rules from the xDS server 127.0.0.1:"),
        "{}",
        server.banner
    );

    // The stream opens: the node, the client certificate, the metadata.
    let first = xds.wait_for("request", |_| true);
    assert_eq!(first["node"], "envoy-ratelimit");
    assert_eq!(first["version_info"], "");
    assert_eq!(
        first["type_url"],
        "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
    );
    assert!(
        first["client_names"]
            .to_string()
            .contains("tollgate-client"),
        "{first}"
    );
    assert_eq!(first["metadata"]["x-tenant"], "blue");
    // No rules yet: decisions are unavailable, the health check fails.
    assert_eq!(check(&server, "xds", "user", "u1").await, 503);
    let (status, body) = get(&server, "/healthcheck").await;
    assert_eq!(status, 500, "{body}");
    let (status, body) = get(&server, "/readyz").await;
    assert_eq!(status, 503, "not ready without rules: {body}");

    // Version 1.
    let ack = xds.set(
        "1",
        json!([resource(
            "one",
            "xds",
            vec![limit("user", "DAY", 3), limit("team", "DAY", 2)]
        )]),
    );
    assert_eq!(
        (ack["version_info"].as_str(), &ack["error"]),
        (Some("1"), &Value::Null),
        "{ack}"
    );
    assert_eq!(get(&server, "/healthcheck").await.0, 200);
    let (_, cfg) = get(&server, "/v1/config").await;
    assert_eq!(cfg["xds"]["version"], "1", "{cfg}");
    assert!(
        cfg["domains"][0]["source"]
            .as_str()
            .unwrap()
            .contains("xDS resource 'one' (version 1)"),
        "{cfg}"
    );
    for _ in 0..2 {
        assert_eq!(check(&server, "xds", "user", "u1").await, 200);
    }
    assert_eq!(check(&server, "xds", "team", "t1").await, 200);

    // Version 2: `user` changes (its counters start over), `team` does not (kept).
    let ack = xds.set(
        "2",
        json!([resource(
            "one",
            "xds",
            vec![limit("user", "DAY", 5), limit("team", "DAY", 2)]
        )]),
    );
    assert_eq!(ack["version_info"], "2", "{ack}");
    let team: Vec<u16> = [
        check(&server, "xds", "team", "t1").await,
        check(&server, "xds", "team", "t1").await,
    ]
    .into();
    assert_eq!(team, [200, 429], "team's count went on across the version");
    for _ in 0..5 {
        assert_eq!(
            check(&server, "xds", "user", "u1").await,
            200,
            "user's new limit, fresh"
        );
    }
    assert_eq!(check(&server, "xds", "user", "u1").await, 429);

    // Version 3 is bad: NACKed with the error, version 2 still decides.
    let bad = json!({"key": "user", "rate_limit": {"requests_per_unit": 9}});
    let nack = xds.set("3", json!([resource("one", "xds", vec![bad])]));
    assert_eq!(
        nack["version_info"], "2",
        "a NACK names the version in force: {nack}"
    );
    assert_eq!(nack["error_code"], 3, "INVALID_ARGUMENT: {nack}");
    let error = nack["error"].as_str().unwrap();
    assert!(
        error.contains("xDS resource 'one' (version 3)")
            && error.contains("descriptors[0].rate_limit.unit: missing"),
        "{error}"
    );
    assert_eq!(check(&server, "xds", "user", "u1").await, 429);
    let (_, rlconfig) = get(&server, "/rlconfig").await;
    assert!(
        rlconfig
            .as_str()
            .unwrap()
            .starts_with(&format!("# xDS 127.0.0.1:{}: version 2\n", xds.port)),
        "{rlconfig}"
    );

    // The server goes away: decisions go on with version 2.
    xds.send(json!({"cmd": "stop"}));
    xds.wait_for("stopped", |_| true);
    assert_eq!(check(&server, "xds", "team", "t1").await, 429);
    assert_eq!(check(&server, "xds", "user", "u2").await, 200);
    assert_eq!(get(&server, "/healthcheck").await.0, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // It comes back, numbering its versions from the start again (as Envoy Gateway
    // does after a restart): its "2" is not the "2" in force. The client asks for
    // everything, and takes it.
    xds.send(json!({"cmd": "set", "version": "2", "configs": [
        resource("one", "xds", vec![limit("user", "DAY", 5), limit("team", "DAY", 2)]),
        resource("two", "other", vec![limit("ip", "DAY", 1)]),
    ]}));
    xds.send(json!({"cmd": "start"}));
    xds.wait_for("started", |_| true);
    let hello = xds.wait_for("request", |e| e["nonce"] == "");
    assert_eq!(
        hello["version_info"], "",
        "a new stream asks for everything: {hello}"
    );
    let ack = xds.answer_to("2");
    assert_eq!(ack["version_info"], "2", "{ack}");
    assert_eq!(check(&server, "other", "ip", "a").await, 200);
    assert_eq!(check(&server, "other", "ip", "a").await, 429);
    assert_eq!(
        check(&server, "xds", "team", "t1").await,
        429,
        "unchanged across the outage"
    );
    assert_eq!(get(&server, "/v1/config").await.1["xds"]["version"], "2");
    // A version without a name is refused too.
    let nack = xds.set("", json!([]));
    assert_eq!(nack["version_info"], "2", "{nack}");
    assert!(
        nack["error"]
            .as_str()
            .unwrap()
            .contains("version_info is empty"),
        "{nack}"
    );
    // What happened, in the metrics: two streams, versions 1, 2 and the second 2 in
    // force, 3 and the nameless one refused.
    let (_, metrics) = get(&server, "/metrics").await;
    let metrics = metrics.as_str().unwrap().to_string();
    for line in [
        "tollgate_xds_events{event=\"stream_up\"} 1",
        "tollgate_xds_stream_events_total{event=\"streams_opened\"} 2",
        "tollgate_xds_stream_events_total{event=\"versions_acked\"} 3",
        "tollgate_xds_stream_events_total{event=\"versions_nacked\"} 2",
        // The counts' deprecated gauges, until they are removed.
        "tollgate_xds_events{event=\"versions_nacked\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }
}

/// Envoy Gateway's generated environment (internal/infrastructure/kubernetes/
/// ratelimit/resource.go), variable by variable, on the binary invoked as
/// `ratelimit`. What differs from a cluster: the addresses (loopback and free ports,
/// the xDS server's host `127.0.0.1` in place of `envoy-gateway`) and the files' paths
/// (the test's certificates in place of the `/certs` secret). With
/// `FORCE_START_WITHOUT_INITIAL_CONFIG=true` it serves before the first version:
/// healthy, with Envoy's calls failing as unavailable until the rules arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_environment_runs_the_binary_as_ratelimit() {
    tollgate_testkit::clear_of_window_end(DAY, Duration::from_secs(120));
    let pki = Pki::new();
    let mut xds = XdsServer::start(&pki);
    let dir = tollgate_testkit::ScratchDir::new("xds-gateway");
    let bin = dir.0.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tollgate"), bin.join("ratelimit")).unwrap();
    let (cert, key, ca) = (
        path(&pki, "server.pem"),
        path(&pki, "server.key"),
        path(&pki, "ca.pem"),
    );
    // The ratelimit pod's own certificate is the one the xDS server also trusts.
    let (client_cert, client_key) = (path(&pki, "client.pem"), path(&pki, "client.key"));
    let xds_url = format!("127.0.0.1:{}", xds.port);
    let metrics_port = tollgate_testkit::free_port().to_string();
    let prometheus = format!("127.0.0.1:{metrics_port}");
    let child = Command::new(bin.join("ratelimit"))
        .env_clear()
        .envs([
            // The test's addresses (Envoy Gateway leaves HOST, PORT and GRPC_PORT unset).
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            // resource.go's list, in its order.
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", &xds_url),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &cert),
            ("GRPC_SERVER_TLS_KEY", &key),
            ("GRPC_SERVER_TLS_CA_CERT", &ca),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", &client_cert),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &client_key),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &ca),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", &prometheus),
            ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = serve_process::attach(child);
    let banner = &server.banner;
    assert!(
        banner.contains("over TLS") && banner.contains("rules from the xDS server"),
        "{banner}"
    );
    let (base, grpc) = (
        server.base.clone(),
        server.grpc.trim_start_matches("http://").to_string(),
    );

    // Started without rules: healthy, Envoy's calls unavailable (its failure mode
    // decides), as envoyproxy/ratelimit with FORCE_START_WITHOUT_INITIAL_CONFIG.
    let first = xds.wait_for("request", |_| true);
    assert_eq!(first["node"], "envoy-ratelimit");
    let (status, _, _) = serve_process::request_to(&base, "GET", "/healthcheck", "", None).await;
    assert_eq!(status, 200);
    let refused = xds.rls(&grpc, "gw", &[("generic_key", "default")]);
    assert!(
        refused.contains("UNAVAILABLE") && refused.contains("no rate limit configuration"),
        "{refused}"
    );

    // Envoy Gateway's translation of a BackendTrafficPolicy: domain, nested keys.
    let rule = json!({"key": "httproute/default/backend/rule/0/match/0/example_com", "value": "httproute/default/backend/rule/0/match/0/example_com",
        "descriptors": [{"key": "rule-0-match-0", "value": "rule-0-match-0",
            "rate_limit": {"unit": "DAY", "requests_per_unit": 2}}]});
    let ack = xds.set(
        "1",
        json!([resource("default/eg/http", "default/eg/http", vec![rule])]),
    );
    assert_eq!(ack["version_info"], "1", "{ack}");
    let entries = [
        (
            "httproute/default/backend/rule/0/match/0/example_com",
            "httproute/default/backend/rule/0/match/0/example_com",
        ),
        ("rule-0-match-0", "rule-0-match-0"),
    ];
    let codes: Vec<String> = (0..3)
        .map(|_| xds.rls(&grpc, "default/eg/http", &entries))
        .collect();
    assert_eq!(codes, ["OK", "OK", "OVER_LIMIT"]);

    // Prometheus on PROMETHEUS_ADDR.
    let (status, _, metrics) =
        serve_process::request_to(&format!("http://{prometheus}"), "GET", "/metrics", "", None)
            .await;
    assert_eq!(status, 200);
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("tollgate_config_reloads_total{result=\"ok\"} 1"),
        "{metrics}"
    );
}

/// Bad xDS settings are refused at start, naming the setting.
#[test]
fn bad_xds_settings_are_named() {
    let refused = |config: &str, env: &[(&str, &str)], args: &[&str]| {
        let dir = tollgate_testkit::ScratchDir::new("xds-bad");
        let config = dir.write("tollgate.yaml", config);
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .env_clear()
            .envs(env.iter().copied())
            .args([
                "serve",
                "--config",
                &config,
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "127.0.0.1:0",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    // check-config says where the rules will come from.
    let dir = tollgate_testkit::ScratchDir::new("xds-check");
    let config = dir.write("tollgate.yaml", "xds: {server: 'envoy-gateway:18001'}\n");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config", &config])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("from the xDS server envoy-gateway:18001"),
        "{said}"
    );
    let e = refused("xds: {server: 'envoy-gateway'}\n", &[], &[]);
    assert!(
        e.contains("xds.server \"envoy-gateway\": needs host:port"),
        "{e}"
    );
    let e = refused("rules: [r.yaml]\nxds: {server: 'h:1'}\n", &[], &[]);
    assert!(e.contains("not both"), "{e}");
    let e = refused("xds: {server: 'h:1'}\n", &[], &["--rules", "r.yaml"]);
    assert!(e.contains("--rules"), "{e}");
    let e = refused("xds: {server: 'h:1', tls: {cert_file: c.pem}}\n", &[], &[]);
    assert!(e.contains("cert_file and key_file go together"), "{e}");
    let e = refused(
        "xds: {server: 'h:1', tls: {ca_file: /nonexistent/ca.pem}}\n",
        &[],
        &[],
    );
    assert!(
        e.contains("xds.tls.ca_file /nonexistent/ca.pem: cannot read it"),
        "{e}"
    );
    let e = refused(
        "{}\n",
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "http://x"),
        ],
        &["--envoy-env"],
    );
    assert!(e.contains("xds.server \"http://x\""), "{e}");
}
