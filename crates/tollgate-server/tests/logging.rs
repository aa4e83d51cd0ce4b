//! What operators read: `tollgate serve`'s log lines on stderr redirected to a file
//! carry no colour escape codes, and `--log-format json` makes each line one JSON
//! object with a level and a message.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// Starts serve with `args`, sends it SIGHUP (a reload: one info line), stops it, and
/// returns what it wrote on stderr.
fn log_of(args: &[&str], env: &[(&str, &str)]) -> String {
    // One directory per call: the tests run side by side, and each removes its own.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tollgate-logging-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: d\ndescriptors:\n  - key: k\n    policies: [\"gcra:rate=1/s,burst=1\"]\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .args(["serve", "--rules", rules.to_str().unwrap()])
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Up when it prints where it listens.
    let mut banner = String::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut banner).unwrap();
    let pid = child.id().to_string();
    Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    // Stopped once the reload has been logged (a busy machine takes a while).
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    while !log.contains("rules reloaded") {
        if stderr.read_line(&mut log).unwrap() == 0 {
            break;
        }
    }
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    std::io::Read::read_to_string(&mut stderr, &mut log).unwrap();
    child.wait().unwrap();
    drop(stdout);
    std::fs::remove_dir_all(&dir).ok();
    log
}

#[test]
fn text_logs_to_a_file_have_no_escape_codes() {
    let log = log_of(&[], &[]);
    assert!(
        log.contains("rules reloaded") && log.contains("reason=\"SIGHUP\""),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    assert!(!log.contains('\x1b'), "escape codes in {log:?}");
}

#[test]
fn json_logs_are_one_object_per_line() {
    for (args, env) in [
        (&["--log-format", "json"][..], &[][..]),
        (&[][..], &[("TOLLGATE_LOG_FORMAT", "json")][..]),
    ] {
        let log = log_of(args, env);
        let lines: Vec<serde_json::Value> = log
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?} in {log:?}")))
            .collect();
        let reload = lines
            .iter()
            .find(|v| v["fields"]["reason"] == "SIGHUP")
            .unwrap_or_else(|| panic!("no reload line in {log}"));
        assert_eq!(reload["level"], "INFO");
        assert!(reload["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("rules reloaded"));
    }
}

#[path = "support/serve.rs"]
mod serve_process;

/// The decision lines of a server started as `command` (stderr piped, JSON logs),
/// read while `send` makes decisions, until `done` says they are enough (or the
/// server has written 200 lines).
async fn decision_lines(
    mut command: Command,
    send: impl Fn(String) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let mut child = command
        .env("TOLLGATE_LOG_FORMAT", "json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = serve_process::attach(child);
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["target"] == "tollgate::decisions" && tx.send(v).is_err() {
                return;
            }
        }
    });
    let mut lines = Vec::new();
    for _ in 0..200 {
        send(server.base.clone()).await;
        while let Ok(v) = rx.recv_timeout(std::time::Duration::from_millis(20)) {
            lines.push(v);
        }
        if done(&lines) {
            break;
        }
    }
    lines
}

/// With `tollgate::decisions` at debug, each decision is one line: the domain, the
/// entries with their values masked, the outcome, the rule, its policy, remaining and
/// reset; past `service.decision_log.per_second` the decisions are counted, and the
/// next line says how many went unlogged. Under `--envoy-env`, `LOG_LEVEL=debug`
/// turns the lines on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_is_one_debug_line_within_its_budget() {
    let dir = tollgate_testkit::ScratchDir::new("decision-log");
    dir.write(
        "rules.yaml",
        "domain: d\ndescriptors:\n  - key: api_key\n    policies: [\"fixed-window:limit=2,window=1h\"]\n",
    );
    let config = dir.write(
        "tollgate.yaml",
        "rules: [rules.yaml]\nservice:\n  decision_log: {per_second: 1}\n",
    );
    let check = |base: String| -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> {
        Box::pin(async move {
            let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"api_key","value":"sk-secret"}]}]}"#;
            serve_process::request_to(&base, "POST", "/v1/check", body, None).await;
        })
    };
    let mut serve = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    serve
        .args(["serve", "--config", &config])
        .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .env("RUST_LOG", "info,tollgate::decisions=debug");
    // Enough once a line says decisions went unlogged (the budget is one a second).
    let lines = decision_lines(serve, check, |lines| {
        lines
            .iter()
            .any(|v| v["fields"]["unlogged"].as_u64() > Some(0))
    })
    .await;
    let fields: Vec<&serde_json::Value> = lines.iter().map(|v| &v["fields"]).collect();
    assert!(
        fields.iter().any(|f| f["unlogged"].as_u64() > Some(0)),
        "no line counted unlogged decisions: {fields:?}"
    );
    let first = fields.first().unwrap_or_else(|| panic!("no decision line"));
    assert_eq!(first["domain"], "d", "{first}");
    assert_eq!(first["outcome"], "OK", "{first}");
    assert_eq!(first["rule"], "d/api_key", "{first}");
    assert_eq!(first["policy"], "fixed-window:limit=2,window=1h", "{first}");
    assert_eq!(first["remaining"], 1, "{first}");
    let entries = first["entries"].as_str().unwrap();
    assert!(
        entries.starts_with("api_key=#") && !entries.contains("secret"),
        "{first}"
    );
    let over = (fields.iter())
        .find(|f| f["outcome"] == "OVER_LIMIT")
        .unwrap_or_else(|| panic!("no rejected decision logged: {fields:?}"));
    // A reject's reset is when it would pass: the hour's window's end.
    let reset_ms = over["reset_ms"].as_f64().unwrap();
    assert!(reset_ms > 0.0 && reset_ms <= 3_600_000.0, "{over}");

    // envoyproxy/ratelimit's LOG_LEVEL=debug, through --envoy-env.
    let root = dir.0.join("srv");
    std::fs::create_dir_all(root.join("ratelimit/config")).unwrap();
    std::fs::copy(
        dir.0.join("rules.yaml"),
        root.join("ratelimit/config/rules.yaml"),
    )
    .unwrap();
    let mut envoy = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    envoy
        .args(["serve", "--envoy-env"])
        .env_remove("RUST_LOG")
        .envs([
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("RUNTIME_ROOT", root.to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("LOG_LEVEL", "debug"),
        ]);
    let lines = decision_lines(envoy, check, |lines| !lines.is_empty()).await;
    assert_eq!(lines[0]["fields"]["domain"], "d", "{lines:?}");
}
