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
    assert!(
        table.contains("200 in 1s (limit 100, promise 200)"),
        "{table}"
    );
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

/// The guarantee of priorities at capacity, on a service whose times jitter +-20 %:
/// 8 critical clients (demand = the capacity C = 8) beside 16 sheddable ones are
/// neither shed nor slowed past twice the unloaded latency; and at 4x C, one class,
/// the adaptive limit serves at least 95 % of what a static limit of exactly C does.
#[test]
fn critical_work_at_the_capacity_is_kept_whole_on_a_jittery_service() {
    let classes = json(&[
        "--pattern",
        "closed-loop",
        "--duration",
        "30s",
        "--jitter",
        "0.2",
        "--clients",
        "8:critical",
        "--clients",
        "16:sheddable",
        "--adaptive",
        "gradient",
    ]);
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap();
    let critical = &classes[0];
    assert!(f(critical, "success_pct") >= 99.0, "{classes}");
    assert!(f(critical, "p99_ms") <= 40.0, "{classes}");
    assert!(
        f(&classes[1], "ok_per_s") > 0.0,
        "sheddable takes the rest: {classes}"
    );
    let one = json(&[
        "--pattern",
        "closed-loop",
        "--duration",
        "30s",
        "--jitter",
        "0.2",
        "--clients",
        "32",
        "--limit",
        "8",
        "--adaptive",
        "gradient",
    ]);
    let (fixed, adaptive) = (f(&one[0], "ok_per_s"), f(&one[1], "ok_per_s"));
    assert!(
        adaptive >= 0.95 * fixed,
        "adaptive {adaptive} vs static C {fixed}: {one}"
    );
}

#[test]
fn closed_loop_compares_concurrency_limits_on_a_modelled_upstream() {
    let dir = std::env::temp_dir().join(format!("tollgate-sim-closed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("closed.svg");
    let args = [
        "--pattern",
        "closed-loop",
        "--duration",
        "8s",
        "--capacity",
        "8",
        "--service",
        "20ms",
        "--schedule",
        "4s=4",
        "--clients",
        "4:critical:checkout",
        "--clients",
        "20:sheddable:batch",
        "--limit",
        "none",
        "--limit",
        "8",
        "--adaptive",
        "gradient",
        "--out",
        svg.to_str().unwrap(),
    ];
    let a = json(&args);
    assert_eq!(a, json(&args), "the same world gives the same numbers");
    // One row per limit and group: no limit, static 8, gradient x (critical, sheddable).
    let rows = a.as_array().unwrap();
    assert_eq!(rows.len(), 6);
    let row = |limit: &str, group: &str| {
        rows.iter()
            .find(|r| r["limit"] == limit && r["group"].as_str().unwrap().contains(group))
            .unwrap_or_else(|| panic!("{limit} {group} in {a}"))
    };
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap();
    // Priorities: the adaptive limit keeps critical work whole; a static limit
    // rejects it as often as the rest.
    assert!(f(row("gradient", "critical"), "success_pct") >= 99.0, "{a}");
    assert!(f(row("static 8", "critical"), "success_pct") < 50.0, "{a}");
    assert!(
        f(row("no limit", "critical"), "p99_ms") > 2.0 * f(row("gradient", "critical"), "p99_ms")
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    roxmltree::Document::parse(&text).expect("the SVG parses as XML");
    for panel in [
        "limit (permits)",
        "in flight at the upstream",
        "goodput (req/s)",
        "p99 latency (ms)",
    ] {
        assert!(text.contains(panel), "{panel}");
    }
    // Mistakes.
    let (code, _, err) = simulate(&["--pattern", "closed-loop", "--limit", "0"]);
    assert!(
        code != 0 && err.contains("--limit 0: expected a number above 0 or none"),
        "{err}"
    );
    let (code, _, err) = simulate(&[
        "--pattern",
        "closed-loop",
        "--adaptive",
        "gradient:min=9,max=3",
    ]);
    assert!(code != 0 && err.contains("min=9 is above max=3"), "{err}");
    let (code, _, err) = simulate(&["--pattern", "closed-loop", "--policy", "gcra:rate=1/s"]);
    assert!(code != 0 && err.contains("not --policy"), "{err}");
    let (code, _, err) = simulate(&["--pattern", "poisson", "--limit", "4"]);
    assert!(
        code != 0 && err.contains("under --pattern closed-loop"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--usage`: costs known after the work, charged into debt. A fixed window is in
/// debt until it ends; a cap (`max-debt`) bounds how deep a key goes; the same seed
/// gives the same numbers; a policy that cannot be charged is refused.
#[test]
fn usage_after_the_fact_goes_into_debt_and_max_debt_bounds_it() {
    let args = [
        "--pattern",
        "steady",
        "--rate",
        "5",
        "--duration",
        "30s",
        "--usage",
        "800:0.5",
        "--usage-after",
        "1s",
        "--policy",
        "fixed-window:limit=10000,window=1m",
        "--policy",
        "gcra:rate=10000/m,burst=10000,max-debt=1500",
    ];
    let a = json(&args);
    assert_eq!(a, json(&args), "seeded: the same numbers");
    let (fixed, capped) = (&a[0], &a[1]);
    // The window's budget is spent within seconds, then every request is refused.
    let used = fixed["used_units"].as_u64().unwrap();
    assert!(used > 10_000, "{fixed}");
    assert!(fixed["deepest_debt"].as_u64().unwrap() > 0, "{fixed}");
    assert!(fixed["rejected"].as_u64().unwrap() > 100, "{fixed}");
    // Debt capped at 1,500 units, paid back at the rate: more admitted.
    assert!(capped["deepest_debt"].as_u64().unwrap() <= 1500, "{capped}");
    assert!(
        capped["admitted"].as_u64() > fixed["admitted"].as_u64(),
        "{a}"
    );
    let (code, _, err) = simulate(&["--usage", "100", "--policy", "shaper:rate=10/s,queue=5"]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot be charged"), "{err}");
    let (code, _, err) = simulate(&["--usage", "lots", "--policy", "gcra:rate=10/s"]);
    assert_ne!(code, 0);
    assert!(err.contains("expected MEDIAN[:SIGMA]"), "{err}");
}

#[test]
fn each_policy_is_judged_against_its_promise_not_its_headline() {
    // The run: GCRA's 96 in a third of a second is within its promise
    // (burst + rate x w = 100), a fixed window's 208 in 1 s is its boundary burst
    // (over its limit of 150, within its promise of 300), and smooth-warmup has no
    // "limit of 1 per 5 s".
    let v = json(&[
        "--pattern",
        "sine",
        "--rate",
        "200",
        "--duration",
        "20s",
        "--policy",
        "gcra:rate=150/s,burst=50",
        "--policy",
        "fixed-window:limit=150,window=1s",
        "--policy",
        "smooth-warmup:rate=150/s,warmup=5s",
        "--policy",
        "sliding-log:limit=150,window=1s",
    ]);
    for p in v.as_array().unwrap() {
        let ratio = p["envelope_ratio"].as_f64().unwrap();
        assert!(ratio <= 1.0, "{}: {ratio}", p["policy"]);
    }
    let (gcra, fixed, warmup, log) = (&v[0], &v[1], &v[2], &v[3]);
    assert!(gcra["worst_window"].as_u64().unwrap() > gcra["limit"].as_u64().unwrap());
    assert_eq!(gcra["envelope"], 100);
    assert_eq!(
        gcra["over_headline"], false,
        "a burst plus the rate is the promise"
    );
    assert!(fixed["worst_window"].as_u64().unwrap() > 150);
    assert_eq!(fixed["envelope"], 300);
    assert_eq!(
        fixed["over_headline"], true,
        "the boundary burst, said as such"
    );
    assert_eq!(warmup["envelope"], 751);
    assert_eq!(warmup["over_headline"], false);
    assert!(log["worst_window"].as_u64().unwrap() <= 150);
    assert_eq!(log["over_headline"], false);
    // GCRA uses all it promises over some window (the traffic exceeds its rate).
    assert_eq!(gcra["envelope_ratio"], 1.0);
}
