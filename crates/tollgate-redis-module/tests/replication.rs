//! The module's writes reach a replica (and the AOF) as effects: the replica holds the
//! same state strings as its master, with the same absolute expiry whatever its own
//! clock says, and a denied check writes nothing.

use tollgate_testkit as testkit;

use testkit::RedisServers;

#[test]
#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: scripts/test.sh runs it (--all-features)"
)]
fn a_replica_holds_what_the_module_wrote_with_the_same_expiry() {
    let module = testkit::with_module();
    let args: Vec<&str> = module.iter().map(String::as_str).collect();
    let s = RedisServers::master_and_replica(&args, None);
    let fw = "100 fixed-window:limit=2,window=60s";
    let pair = "5000 gcra:rate=10/s,burst=3 token-bucket:rate=5/s,capacity=5";
    for _ in 0..3 {
        s.cli(0, &["TOLLGATE.TRY", "1", "fw", fw, "1", ""]);
    }
    let batch = s.cli(
        0,
        &[
            "TOLLGATE.BATCH",
            "3",
            "g",
            "tb",
            "fw",
            "n",
            "2",
            "t",
            "1",
            "",
            "2",
            "t",
            "2",
            "",
            "1",
            pair,
            fw,
        ],
    );
    // The batch's second check, the fixed window's third request, is denied.
    let lines: Vec<&str> = batch.lines().collect();
    assert_eq!(lines.get(4), Some(&"0"), "{batch}");
    assert_eq!(s.cli(0, &["WAIT", "1", "5000"]).trim(), "1");
    for key in ["fw", "g", "tb"] {
        let on = |i| {
            (
                s.cli(i, &["GET", key]).trim().to_owned(),
                s.cli(i, &["PEXPIRETIME", key]).trim().to_owned(),
            )
        };
        let (master, replica) = (on(0), on(1));
        assert!(!master.0.is_empty(), "{key}: no state on the master");
        assert!(
            master.1.parse::<i64>().unwrap() > 0,
            "{key}: no expiry ({master:?})"
        );
        assert_eq!(master, replica, "{key}: master and replica differ");
    }
    // The fixed window counted two admits; its key lives until the window's end, plus
    // 1 ms and the margin.
    let state = s.cli(0, &["GET", "fw"]);
    let start: i64 = state.split_whitespace().next().unwrap().parse().unwrap();
    assert!(state.trim().ends_with(" 2"), "{state}");
    let expiry: i64 = s.cli(0, &["PEXPIRETIME", "fw"]).trim().parse().unwrap();
    let end_ms = start / 1000 + 60_000;
    assert!(
        (end_ms..=end_ms + 102).contains(&expiry),
        "{expiry} vs window end {end_ms}"
    );
}
