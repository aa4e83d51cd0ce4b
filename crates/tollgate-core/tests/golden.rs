//! Golden vectors from reference implementations, replayed through tollgate.
//!
//! `fixtures/guava.csv` was produced by the real Guava 31.1 RateLimiter on a virtual
//! clock (`tools/guava-golden/generate.sh`); `fixtures/nginx.csv` by the real nginx 1.22
//! `limit_req` module on a frozen, script-driven clock (`tools/nginx-golden/generate.py`).

use std::collections::HashMap;

use tollgate_core::{Op, Policy, PolicyState};

#[test]
fn smooth_limiters_match_guava_to_the_microsecond() {
    let mut reader = csv::Reader::from_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/guava.csv"
    ))
    .unwrap();
    let mut keys: HashMap<String, (Policy, PolicyState)> = HashMap::new();
    let mut checked = 0;
    for (i, row) in reader.records().enumerate() {
        let row = row.unwrap();
        let (spec, t, cost, op, allowed, wait) = (
            &row[0],
            row[1].parse::<u64>().unwrap(),
            row[2].parse::<u64>().unwrap(),
            &row[3],
            &row[4] == "1",
            row[5].parse::<u64>().unwrap(),
        );
        let (policy, state) = keys.entry(spec.to_string()).or_insert_with(|| {
            let p: Policy = spec.parse().unwrap();
            let s = p.init(0);
            (p, s)
        });
        let op = if op == "acquire" {
            Op::Acquire
        } else {
            Op::Try
        };
        let d = policy.check(state, t, cost, op).unwrap();
        assert_eq!(
            (d.allowed, d.wait_us),
            (allowed, wait),
            "vector {} ({spec} t={t} cost={cost} {op:?}): tollgate {:?}",
            i + 2,
            d
        );
        checked += 1;
    }
    assert!(checked >= 4000, "only {checked} vectors");
    assert_eq!(keys.len(), 11);
}

#[test]
fn limit_req_matches_nginx_to_the_millisecond() {
    let mut reader = csv::Reader::from_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/nginx.csv"
    ))
    .unwrap();
    let mut keys: HashMap<(String, String), (Policy, PolicyState)> = HashMap::new();
    let (mut checked, mut rejected, mut delayed) = (0, 0, 0);
    for (i, row) in reader.records().enumerate() {
        let row = row.unwrap();
        let (spec, t, key, allowed) = (
            &row[0],
            row[1].parse::<u64>().unwrap(),
            &row[2],
            &row[3] == "1",
        );
        let wait: Option<u64> = row[4].parse().ok();
        let (policy, state) = keys
            .entry((spec.to_string(), key.to_string()))
            .or_insert_with(|| {
                let p: Policy = spec.parse().unwrap();
                let s = p.init(0);
                (p, s)
            });
        let d = policy.check(state, t, 1, Op::Try).unwrap();
        let ours = (d.allowed, d.allowed.then_some(d.wait_us));
        assert_eq!(
            ours,
            (allowed, wait),
            "vector {} ({spec} key={key} t={t}): tollgate {d:?}",
            i + 2
        );
        checked += 1;
        rejected += usize::from(!allowed);
        delayed += usize::from(wait.is_some_and(|w| w > 0));
    }
    assert!(checked >= 1700, "only {checked} vectors");
    assert!(
        rejected > 100 && delayed > 100,
        "the vectors exercise rejects ({rejected}) and delays ({delayed})"
    );
}
