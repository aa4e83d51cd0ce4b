//! The proxy's adaptive limit end to end, as real processes: `tollgate bench upstream`
//! (capacity 8 at 20 ms; past it every request slows down), `tollgate proxy` in front
//! of it, and `tollgate bench closed-loop` clients. The load tests run one at a time
//! (a lock) so that they do not share the two cores; the margins below are looser than
//! the figures `scripts/bench-adaptive.sh` measures (docs/adaptive.md), for noisy CI.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use tollgate_testkit::{distinct_ports, Killed};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Stack {
    _upstream: Killed,
    proxy: Killed,
    addr: String,
    metrics: String,
    config: PathBuf,
    dir: PathBuf,
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

/// Reads the first line a process prints (its banner).
fn banner(child: &mut std::process::Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    line
}

fn proxy_config(px: u16, mx: u16, up: u16, routes: &str) -> String {
    format!(
        "proxy:\n  listen: 127.0.0.1:{px}\n  metrics: 127.0.0.1:{mx}\n  routes:\n{}",
        routes.replace("UPSTREAM", &format!("http://127.0.0.1:{up}"))
    )
}

/// The upstream and a proxy with `routes` (YAML list items; `UPSTREAM` is replaced).
fn start(routes: &str) -> Stack {
    let ports = distinct_ports(3);
    let (up, px, mx) = (ports[0], ports[1], ports[2]);
    let dir = std::env::temp_dir().join(format!("tollgate-adaptive-{}-{px}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut upstream = tollgate()
        .args(["bench", "upstream", "--listen", &format!("127.0.0.1:{up}")])
        .args(["--capacity", "8", "--service", "20ms"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(banner(&mut upstream).contains("capacity 8"));
    let config = dir.join("proxy.yaml");
    std::fs::write(&config, proxy_config(px, mx, up, routes)).unwrap();
    let mut proxy = tollgate()
        .args(["proxy", "--config", config.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = banner(&mut proxy);
    assert!(line.contains("metrics on"), "{line}");
    Stack {
        _upstream: Killed(upstream),
        proxy: Killed(proxy),
        addr: format!("127.0.0.1:{px}"),
        metrics: format!("127.0.0.1:{mx}"),
        config,
        dir,
    }
}

/// What `tollgate bench closed-loop` reports.
#[derive(Debug, Clone, Copy)]
struct Totals {
    ok_per_s: f64,
    shed_per_s: f64,
    success_pct: f64,
    p99_us: f64,
    errors: f64,
}

fn closed_loop(
    stack: &Stack,
    path: &str,
    clients: usize,
    secs: u32,
    headers: &[&str],
) -> std::process::Child {
    let mut cmd = tollgate();
    cmd.args([
        "bench",
        "closed-loop",
        "--target",
        &format!("http://{}{path}", stack.addr),
    ])
    .args([
        "--clients",
        &clients.to_string(),
        "--duration",
        &format!("{secs}s"),
    ])
    .args(["--settle", "2s"])
    .stdout(Stdio::piped());
    for h in headers {
        cmd.args(["--header", h]);
    }
    cmd.spawn().unwrap()
}

fn totals(child: std::process::Child) -> Totals {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default().to_string();
    let field = |name: &str| -> f64 {
        let after = line
            .split(&format!("{name}: "))
            .nth(1)
            .unwrap_or_else(|| panic!("{name} in {line:?}"));
        after.split([' ', '%']).next().unwrap().parse().unwrap()
    };
    Totals {
        ok_per_s: field("ok/s"),
        shed_per_s: field("shed/s"),
        success_pct: field("success"),
        p99_us: field("p99_us"),
        errors: field("errors"),
    }
}

fn run(stack: &Stack, path: &str, clients: usize, secs: u32, headers: &[&str]) -> Totals {
    totals(closed_loop(stack, path, clients, secs, headers))
}

/// A metric of route `route` from the proxy's `/metrics`.
fn metric(stack: &Stack, name: &str, route: &str) -> f64 {
    metric_of(stack, name, &format!("route=\"{route}\""))
}

/// Reloads the proxy has tried (put in force or refused).
fn reloads(stack: &Stack) -> f64 {
    let mut s = TcpStream::connect(&stack.metrics).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    (text.lines())
        .filter(|l| l.starts_with("tollgate_proxy_config_reloads_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Writes `config` and waits until the proxy has tried to reload it (its file
/// watcher looks once a second; a busy machine takes longer).
fn reload(stack: &Stack, config: &str) {
    let before = reloads(stack);
    std::fs::write(&stack.config, config).unwrap();
    for _ in 0..300 {
        if reloads(stack) > before {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the proxy never reloaded {config}");
}

/// A metric with exactly `labels` (`route="a",priority="critical"`).
fn metric_of(stack: &Stack, name: &str, labels: &str) -> f64 {
    let mut s = TcpStream::connect(&stack.metrics).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let prefix = format!("tollgate_proxy_adaptive_{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{prefix} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

const ROUTES: &str = "    - { name: none, match: { path_prefix: /none/ }, upstream: UPSTREAM }
    - { name: api, match: { path_prefix: /api/ }, upstream: UPSTREAM, adaptive: gradient }
    - name: classes
      match: { path_prefix: /classes/ }
      upstream: UPSTREAM
      adaptive: gradient
      key: header:x-api-key
      priority: sheddable
      tiers: [ { name: checkout, values: [checkout], priority: critical } ]
";

/// One client's latency through the proxy (3 s), and whether the machine is quiet
/// enough to measure a controller by: its p99 within 1.25x the 20 ms service time.
/// A machine whose two cores are busy with something else (a build beside the test
/// command) stretches every service time at random, and the controller rightly reads
/// that as a smaller capacity: there, only what holds under any load is checked (the
/// goals are measured on a quiet machine: `scripts/bench-adaptive.sh`).
fn quiet(stack: &Stack) -> (Totals, bool) {
    let t = run(stack, "/none/", 1, 3, &[]);
    let quiet = t.p99_us <= 25_000.0;
    if !quiet {
        eprintln!(
            "a busy machine (one client's p99 {:.1} ms for a 20 ms service): checking only what holds under any load",
            t.p99_us / 1000.0
        );
    }
    (t, quiet)
}

#[test]
fn under_4x_overload_the_limit_finds_the_capacity_and_keeps_latency_low() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let stack = start(ROUTES);
    let (unloaded, before) = quiet(&stack);
    let t = run(&stack, "/api/", 32, 7, &[]);
    let limit = metric(&stack, "limit", "api");
    eprintln!("unloaded {unloaded:?}; 32 clients {t:?}; limit {limit}");
    assert_eq!(t.errors, 0.0);
    assert!(
        t.ok_per_s > 0.0 && (1.0..=1000.0).contains(&limit),
        "{t:?} {limit}"
    );
    if !(before && quiet(&stack).1) {
        return;
    }
    // Capacity: 8 / 20 ms = 400 requests a second on a quiet machine; as measured in
    // this run, 8 times what one client gets unloaded (a noisy machine stretches every
    // service time, and with it the capacity).
    let capacity = (8.0 * unloaded.ok_per_s).min(400.0);
    assert!(t.ok_per_s >= 0.9 * capacity, "goodput {t:?} of {capacity}");
    // Twice the unloaded p99 on a quiet machine (bench-adaptive: 1.96x); 3x here,
    // since a build beside the tests may burst between the two quiet checks. No
    // limit gives 3.6–3.8x.
    assert!(
        t.p99_us <= 3.0 * unloaded.p99_us,
        "p99 {} vs unloaded {}",
        t.p99_us,
        unloaded.p99_us
    );
    assert!((6.0..=12.0).contains(&limit), "limit {limit}");
    assert!(metric(&stack, "baseline_seconds", "api") < 0.03);
}

/// Half the capacity: (next to) nothing shed. Not "not one" here: on a machine whose
/// two cores are also busy with a build, every service time stretches at random and
/// 0.75x C (6 clients) saw 2 % shed once; `scripts/bench-adaptive.sh` measures 0.8x C
/// on a quiet machine (0 shed).
#[test]
fn below_capacity_next_to_nothing_is_shed() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let stack = start(ROUTES);
    let before = quiet(&stack).1;
    let t = run(&stack, "/api/", 4, 5, &[]);
    assert_eq!(t.errors, 0.0, "{t:?}");
    if !(before && quiet(&stack).1) {
        return;
    }
    assert!(t.success_pct >= 99.5, "{t:?}");
    assert!(t.ok_per_s > 100.0, "{t:?}");
}

#[test]
fn critical_requests_get_through_while_sheddable_ones_are_shed() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let stack = start(ROUTES);
    let before = quiet(&stack).1;
    let critical = closed_loop(&stack, "/classes/", 4, 7, &["x-api-key: checkout"]);
    let sheddable = run(&stack, "/classes/", 20, 7, &["x-api-key: batch"]);
    let critical = totals(critical);
    eprintln!("critical {critical:?}; sheddable {sheddable:?}");
    // Under any load, the order of the classes holds.
    assert!(
        critical.success_pct >= sheddable.success_pct,
        "{critical:?} {sheddable:?}"
    );
    if !(before && quiet(&stack).1) {
        return;
    }
    assert!(critical.success_pct >= 98.0, "{critical:?}");
    assert!(sheddable.shed_per_s > 100.0, "{sheddable:?}");
    let shed = |class: &str| {
        metric_of(
            &stack,
            "shed_by_priority_total",
            &format!("route=\"classes\",priority=\"{class}\""),
        )
    };
    assert!(
        shed("sheddable") > 100.0 * shed("critical"),
        "{} vs {}",
        shed("sheddable"),
        shed("critical")
    );
}

#[test]
fn a_reload_keeps_the_learned_limit_and_bad_settings_are_refused() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut stack = start(ROUTES);
    run(&stack, "/api/", 32, 3, &[]);
    let admitted = metric(&stack, "admitted_total", "api");
    let limit = metric(&stack, "limit", "api");
    assert!(admitted > 500.0, "{admitted}");
    // A changed route (a rate policy added) keeps its unchanged adaptive limit.
    let text = std::fs::read_to_string(&stack.config).unwrap();
    let changed = text.replace(
        "adaptive: gradient }",
        "adaptive: gradient, policies: [\"gcra:rate=10000/s\"] }",
    );
    assert_ne!(text, changed);
    reload(&stack, &changed);
    assert!(
        metric(&stack, "admitted_total", "api") >= admitted,
        "the learned state carried over"
    );
    assert_eq!(metric(&stack, "limit", "api"), limit);
    // A bad controller is refused with the old routes kept.
    reload(
        &stack,
        &changed.replace(
            "adaptive: gradient,",
            "adaptive: \"gradient:min=10,max=5\",",
        ),
    );
    assert!(metric(&stack, "admitted_total", "api") >= admitted);
    // A changed listener takes a restart: the reload says so, and keeps serving.
    let moved = changed.replace(
        &format!("metrics: {}", stack.metrics),
        "metrics: 127.0.0.1:1",
    );
    assert_ne!(moved, changed);
    reload(&stack, &moved);
    assert!(metric(&stack, "admitted_total", "api") >= admitted);
    let _ = stack.proxy.0.kill();
    let _ = stack.proxy.0.wait();
    let mut log = String::new();
    stack
        .proxy
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(log.contains("take a restart"), "{log}");
    // The same mistakes at start: clear errors naming the field.
    let ports = distinct_ports(3);
    for (routes, expected) in [
        (
            "    - { name: a, upstream: UPSTREAM, adaptive: \"gradient:min=10,max=5\" }\n",
            "proxy.routes[0].adaptive: invalid adaptive spec 'gradient:min=10,max=5': gradient: min=10 is above max=5",
        ),
        (
            "    - { name: a, upstream: UPSTREAM, adaptive: cubic }\n",
            "unknown controller 'cubic' (expected one of: gradient, aimd, vegas)",
        ),
        (
            "    - { name: a, upstream: UPSTREAM, adaptive: gradient, priority: urgent }\n",
            "proxy.routes[0].priority: invalid priority 'urgent'",
        ),
        (
            "    - { name: a, upstream: UPSTREAM, fair_share: true }\n",
            "proxy.routes[0].fair_share: applies to the route's adaptive limit, and proxy.routes[0] has none (add e.g. adaptive: gradient)",
        ),
    ] {
        let path = stack.dir.join("bad.yaml");
        std::fs::write(&path, proxy_config(ports[0], ports[1], ports[2], routes)).unwrap();
        // At start, and by check-config before any start.
        for command in ["proxy", "check-config"] {
            let out = tollgate().args([command, "--config", path.to_str().unwrap()]).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{command}");
            assert!(stderr.contains(expected), "{command}: {expected:?} not in {stderr}");
        }
    }
    let good = stack.dir.join("good.yaml");
    std::fs::write(&good, proxy_config(ports[0], ports[1], ports[2], ROUTES)).unwrap();
    let out = tollgate()
        .args(["check-config", "--config", good.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    // A proxy's config names no rules: serve's built-in example is not reported.
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ok: proxy: 3 route(s)\n"
    );
}
