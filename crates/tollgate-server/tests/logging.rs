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
