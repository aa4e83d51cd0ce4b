//! Python clients for the tests: a script of `tests/python/` run to its end, bounded.

/// Runs `tests/python/SCRIPT ARGS...`; it must end with "all checks passed".
pub fn run_python(script: &str, args: &[String]) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let mut command = std::process::Command::new("python3");
    command.arg(&script).args(args);
    // Bounded: a client that hangs fails the test with what it printed.
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/test.sh installs its packages)");
    let pid = child.id();
    let (done, waited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let (out, hung) = match waited.recv_timeout(std::time::Duration::from_secs(120)) {
        Ok(out) => (out.unwrap(), ""),
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
            (
                waited.recv().unwrap().unwrap(),
                " (killed: no exit within 120 s)",
            )
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{} failed{hung}:\n{stdout}\n{stderr}",
        script.display()
    );
}
