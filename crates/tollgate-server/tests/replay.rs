//! `tollgate replay` through the real binary.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

/// Runs `tollgate replay ARGS` with `input` on stdin: (exit code, stdout, stderr).
fn replay(args: &[&str], input: &str) -> (i32, String, String) {
    let mut child = tollgate()
        .arg("replay")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A replay that fails early (a bad policy, a bad header) may exit before reading
    // all of its input: a broken pipe here is part of that, not a test failure.
    if let Err(e) = child.stdin.take().unwrap().write_all(input.as_bytes()) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn gcra_trace_gives_the_documented_decisions() {
    let input = "t_us,key,cost\n0,a,1\n0,a,1\n0,a,1\n0,a,1\n0,a,1\n0,a,1\n0,b,1\n100000,a,1\n";
    let (code, out, err) = replay(&["--policy", "gcra:rate=10/s,burst=5"], input);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "t_us,key,cost,allowed,remaining,wait_us\n\
         0,a,1,1,4,0\n0,a,1,1,3,0\n0,a,1,1,2,0\n0,a,1,1,1,0\n0,a,1,1,0,0\n\
         0,a,1,0,0,100000\n0,b,1,1,4,0\n100000,a,1,1,0,0\n"
    );
}

#[test]
fn acquire_op_column_and_never_fitting_costs() {
    let input = "t_us,key,cost,op\n0,k,2,acquire\n0,k,2,acquire\n0,k,2,try\n0,k,3,\n";
    let (code, out, err) = replay(&["--policy", "token-bucket:rate=2/s,capacity=2"], input);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<&str> = out.lines().skip(1).collect();
    // The second acquire waits 1 s for two tokens; the try behind it is rejected with
    // the time its tokens come back; cost 3 can never fit: rejected, empty wait_us.
    assert_eq!(
        rows,
        [
            "0,k,2,1,0,0",
            "0,k,2,1,0,1000000",
            "0,k,2,0,0,2000000",
            "0,k,3,0,0,"
        ]
    );
}

#[test]
fn concurrency_uses_hold_us_and_limit_req_reports_its_delay() {
    let input = "t_us,key,cost,hold_us\n0,k,1,1000\n10,k,1,1000\n20,k,1,5\n1000,k,1,5\n";
    let (code, out, _) = replay(&["--policy", "concurrency:limit=2"], input);
    assert_eq!(code, 0);
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(
        rows,
        [
            "0,k,1,1,1,0",
            "10,k,1,1,0,0",
            "20,k,1,0,0,980",
            "1000,k,1,1,0,0"
        ]
    );

    let input = "t_us,key,cost\n0,k,1\n0,k,1\n0,k,1\n";
    let (_, out, _) = replay(&["--policy", "limit-req:rate=10/s,burst=1"], input);
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(
        rows,
        ["0,k,1,1,1,0", "0,k,1,1,0,100000", "0,k,1,0,0,100000"]
    );
}

#[test]
fn malformed_rows_name_the_line() {
    let cases = [
        (
            "t_us,key,cost\n0,a,1\n5,a,x\n",
            "line 3: cost 'x' is not a whole number >= 1",
        ),
        (
            "t_us,key,cost\n10,a,1\n5,a,1\n",
            "line 3: t_us 5 is earlier than the previous row's 10",
        ),
        (
            "t_us,key,cost\n-1,a,1\n",
            "line 2: t_us '-1' is not a whole number of microseconds",
        ),
        (
            "t_us,key,cost\n0,a,0\n",
            "line 2: cost '0' is not a whole number >= 1",
        ),
        (
            "t_us,key,cost\n0,a,1,9\n",
            "line 2: 4 fields where the header has 3",
        ),
        (
            "t_us,key,cost,op\n0,a,1,wait\n",
            "line 2: op 'wait' is not try, acquire, charge or count",
        ),
        (
            "time,key,cost\n0,a,1\n",
            "line 1: the header must name the columns t_us,key,cost",
        ),
        (
            "t_us,key,cost\n0,a,99999999999999999999\n",
            "line 2: cost '99999999999999999999' is not a whole number",
        ),
    ];
    for (input, expected) in cases {
        let (code, _, err) = replay(&["--policy", "gcra:rate=1/s"], input);
        assert_eq!(code, 2, "{input}");
        assert!(
            err.contains(expected),
            "{input:?}: stderr {err:?} lacks {expected:?}"
        );
    }
    let huge_key = format!("t_us,key,cost\n0,{},1\n", "k".repeat(5000));
    let (code, _, err) = replay(&["--policy", "gcra:rate=1/s"], &huge_key);
    assert_eq!(code, 2);
    assert!(
        err.contains("line 2: key is 5000 bytes long (at most 4096)"),
        "{err}"
    );
}

#[test]
fn bad_policy_is_a_clear_error() {
    let (code, _, err) = replay(&["--policy", "gcra:rate=10/s,brust=5"], "t_us,key,cost\n");
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "gcra: unknown parameter 'brust' (expected one of: rate, burst, max-wait, shadow, max-debt, margin)"
        ),
        "{err}"
    );
}

#[test]
fn output_file_appears_only_after_a_complete_replay() {
    let dir = std::env::temp_dir().join(format!("tollgate-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("decisions.csv");
    let good = dir.join("good.csv");
    std::fs::write(&good, "t_us,key,cost\n0,a,1\n").unwrap();
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "t_us,key,cost\n0,a,1\n0,a,oops\n").unwrap();

    let run = |input: &std::path::Path| {
        tollgate()
            .args(["replay", "--policy", "gcra:rate=1/s", "--input"])
            .arg(input)
            .arg("--output")
            .arg(&out)
            .status()
            .unwrap()
    };
    assert!(!run(&bad).success());
    assert!(!out.exists(), "a failed replay leaves no output file");
    assert!(!dir.join("decisions.partial").exists());
    assert!(run(&good).success());
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "t_us,key,cost,allowed,remaining,wait_us\n0,a,1,1,0,0\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn replay_streams_rows_before_the_input_ends() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    let mut child = tollgate()
        .args(["replay", "--policy", "sliding-log:limit=5,window=1s"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let progress = written.clone();
    // Feed 300k rows from a thread and read the output concurrently: decisions must
    // come out while most of the input is still unwritten (a replay that kept rows or
    // output in memory until the end would print nothing before it).
    let writer = std::thread::spawn(move || {
        stdin.write_all(b"t_us,key,cost\n").unwrap();
        for chunk in 0..300u64 {
            let mut buf = String::new();
            for i in chunk * 1000..(chunk + 1) * 1000 {
                buf.push_str(&format!("{},k{},1\n", i * 10, i % 7));
            }
            stdin.write_all(buf.as_bytes()).unwrap();
            progress.store((chunk + 1) * 1000, Ordering::SeqCst);
        }
    });
    let mut lines = BufReader::new(stdout).lines();
    assert_eq!(
        lines.next().unwrap().unwrap(),
        "t_us,key,cost,allowed,remaining,wait_us"
    );
    assert_eq!(lines.next().unwrap().unwrap(), "0,k0,1,1,4,0");
    let written_at_first_output = written.load(Ordering::SeqCst);
    assert!(
        written_at_first_output < 100_000,
        "first decision only after {written_at_first_output} rows were written"
    );
    assert_eq!(lines.count(), 299_999);
    writer.join().unwrap();
    assert!(child.wait().unwrap().success());
}

/// Charges after the fact in a trace: `op` charge (into debt, wait_us = the time
/// until a unit fits again) and count (Envoy's: charged even when rejected).
#[test]
fn charge_and_count_rows_go_into_debt() {
    let input = "t_us,key,cost,op\n0,k,1,try\n0,k,12,charge\n1000000,k,1,try\n1000000,j,0,charge\n1000000,j,3,count\n1000000,j,3,count\n1000000,j,0,count\n";
    let (code, out, err) = replay(&["--policy", "fixed-window:limit=10,window=60s"], input);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(
        rows,
        [
            "0,k,1,1,9,0",
            // 13 counted of 10: in debt until the window ends at 60 s.
            "0,k,12,1,0,60000000",
            "1000000,k,1,0,0,59000000",
            // A charge of 0 changes nothing.
            "1000000,j,0,1,10,0",
            "1000000,j,3,1,7,0",
            "1000000,j,3,1,4,0",
            "1000000,j,0,1,4,0",
        ]
    );
    let (code, _, err) = replay(
        &["--policy", "shaper:rate=1/s,queue=2"],
        "t_us,key,cost,op\n0,k,1,charge\n",
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("line 2") && err.contains("cannot be charged"),
        "{err}"
    );
    let (code, _, err) = replay(
        &["--policy", "gcra:rate=1/s"],
        "t_us,key,cost,op\n0,k,1,refund\n",
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("op 'refund' is not try, acquire, charge or count"),
        "{err}"
    );
}

/// A long command shows a progress line on stderr when stderr is a terminal (here a
/// pseudo-terminal from util-linux's `script`), and none when it is not: `bench
/// http` for two seconds against `bench ceiling`.
#[test]
fn a_long_command_shows_a_progress_line_only_on_a_terminal() {
    let port = tollgate_testkit::free_port();
    let target = format!("127.0.0.1:{port}");
    let _ceiling = tollgate_testkit::Killed(
        tollgate()
            .args(["bench", "ceiling", "--listen", &target])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    while std::net::TcpStream::connect(&target).is_err() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let bench = format!(
        "{} bench http --target {target} --duration 2s --concurrency 1",
        env!("CARGO_BIN_EXE_tollgate")
    );
    let dir = tollgate_testkit::ScratchDir::new("progress");
    let typescript = dir.0.join("typescript");
    let status = Command::new("script")
        .args(["-qfec", &bench])
        .arg(&typescript)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let seen = String::from_utf8_lossy(&std::fs::read(&typescript).unwrap()).into_owned();
    assert!(
        seen.contains("\rtollgate bench: ") && seen.contains(" req/s, 0 errors)"),
        "{seen:?}"
    );
    // Cleared before the summary.
    assert!(seen.contains("\r\r") || seen.contains(" \r"), "{seen:?}");
    assert!(seen.contains("req/s: "), "{seen:?}");
    let out = tollgate()
        .args([
            "bench",
            "http",
            "--target",
            &target,
            "--duration",
            "2s",
            "--concurrency",
            "1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("tollgate bench:") && !err.contains('\r'),
        "{err:?}"
    );
}
