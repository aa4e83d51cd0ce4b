//! `tollgate simulate` through the real binary.

use std::process::Command;

fn simulate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("simulate")
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (code, out, err) = simulate(&all);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn the_same_seed_gives_the_same_traffic_and_numbers() {
    let args = [
        "--pattern",
        "poisson",
        "--rate",
        "300",
        "--duration",
        "5s",
        "--keys",
        "3",
        "--policy",
        "gcra:rate=50/s,burst=10",
        "--policy",
        "sliding-window:limit=60,window=1s",
    ];
    let a = json(&[&args[..], &["--seed", "7"]].concat());
    let b = json(&[&args[..], &["--seed", "7"]].concat());
    let c = json(&[&args[..], &["--seed", "8"]].concat());
    assert_eq!(a, b);
    assert_ne!(a, c);
    let offered = a[0]["offered"].as_u64().unwrap();
    assert!(
        (1300..1700).contains(&offered),
        "about 300/s for 5 s: {offered}"
    );
    assert_eq!(
        a[0]["offered"], a[1]["offered"],
        "every policy sees the same traffic"
    );
}

#[test]
fn the_boundary_pattern_shows_the_fixed_window_double_admission() {
    let v = json(&[
        "--pattern",
        "boundary",
        "--burst",
        "100",
        "--duration",
        "6s",
        "--policy",
        "fixed-window:limit=100,window=1s",
        "--policy",
        "sliding-log:limit=100,window=1s",
    ]);
    assert_eq!(
        v[0]["worst_window"], 200,
        "fixed window: 100 at 0.99 s and 100 at 1.01 s"
    );
    assert_eq!(
        v[1]["worst_window"], 100,
        "sliding log never exceeds its limit"
    );
    assert_eq!(v[1]["rejected"], 300);
    // The table says it in words.
    let (_, table, _) = simulate(&[
        "--pattern",
        "boundary",
        "--burst",
        "100",
        "--duration",
        "6s",
        "--policy",
        "fixed-window:limit=100,window=1s",
    ]);
    assert!(table.contains("200 in 1s vs limit 100"), "{table}");
    assert!(
        !table.contains('\x1b'),
        "no colour when not a terminal / NO_COLOR"
    );
}

#[test]
fn delays_and_waits_are_reported() {
    let v = json(&[
        "--pattern",
        "burst",
        "--burst",
        "20",
        "--rate",
        "10",
        "--duration",
        "4s",
        "--policy",
        "shaper:rate=10/s,queue=50",
        "--policy",
        "limit-req:rate=10/s,burst=5",
    ]);
    assert!(v[0]["delayed"].as_u64().unwrap() > 0);
    assert!(v[0]["p99_wait_us"].as_u64().unwrap() >= 1_000_000);
    assert_eq!(
        v[1]["delayed"],
        v[1]["admitted"].as_u64().unwrap() - 2,
        "limit-req delays every excess request (2 bursts)"
    );
}

#[test]
fn charts_are_valid_svg_and_png_of_the_expected_size() {
    let dir = std::env::temp_dir().join(format!("tollgate-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("c.svg");
    let png = dir.join("c.png");
    for out in [&svg, &png] {
        let (code, _, err) = simulate(&[
            "--pattern",
            "sine",
            "--rate",
            "200",
            "--duration",
            "3s",
            "--policy",
            "token-bucket:rate=100/s,capacity=20",
            "--policy",
            "smooth-warmup:rate=100/s,warmup=1s",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{err}");
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the SVG parses as XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    assert!(text.contains("token-bucket:rate=100/s,capacity=20"));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).unwrap()));
    let info = decoder.read_info().unwrap().info().clone();
    assert_eq!((info.width, info.height), (1200, 50 + 2 * 300));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_options_get_clear_errors() {
    let (code, _, err) = simulate(&["--pattern", "zigzag", "--policy", "gcra:rate=1/s"]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown pattern 'zigzag'"), "{err}");
    let (code, _, err) = simulate(&["--policy", "gcra:rate=1/s,brust=2"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown parameter 'brust'"), "{err}");
    let (code, _, err) = simulate(&["--rate", "0", "--policy", "gcra:rate=1/s"]);
    assert_eq!(code, 2);
    assert!(err.contains("--rate must be a positive number"), "{err}");
    let (code, _, err) = simulate(&["--policy", "gcra:rate=1/s", "--out", "chart.jpg"]);
    assert_eq!(code, 2);
    assert!(err.contains("--out must end in .svg or .png"), "{err}");
    let (code, _, err) = simulate(&[
        "--pattern",
        "trace:/nonexistent.csv",
        "--policy",
        "gcra:rate=1/s",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent.csv"), "{err}");
}

#[test]
fn concurrency_permits_are_held_for_the_hold_time() {
    // 10 requests 50 ms apart, each holding 120 ms: at most 3 overlap.
    let v = json(&[
        "--pattern",
        "steady",
        "--rate",
        "20",
        "--duration",
        "500ms",
        "--hold",
        "120ms",
        "--policy",
        "concurrency:limit=2",
        "--policy",
        "concurrency:limit=3",
    ]);
    assert_eq!(v[0]["offered"], 10);
    assert!(v[0]["rejected"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v[1]["rejected"], 0, "{v}");
}
