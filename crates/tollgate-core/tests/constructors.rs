//! The typed constructors are their specs: the same policy, the same errors.

use std::time::Duration;

use tollgate_core::{Policy, Rate};

fn spec(s: &str) -> Policy {
    s.parse().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_typed_constructor_is_the_policy_its_spec_parses_to() {
    let r = Rate::per_second(10).unwrap();
    let w = Duration::from_secs(60);
    let pairs = [
        (Policy::gcra(r, 5), "gcra:rate=10/s,burst=5"),
        (
            Policy::token_bucket(r, 5),
            "token-bucket:rate=10/s,capacity=5",
        ),
        (
            Policy::leaky_bucket(r, 5),
            "leaky-bucket:rate=10/s,capacity=5",
        ),
        (
            Policy::fixed_window(100, w),
            "fixed-window:limit=100,window=1m",
        ),
        (
            Policy::sliding_log(100, w),
            "sliding-log:limit=100,window=1m",
        ),
        (
            Policy::sliding_window(100, w),
            "sliding-window:limit=100,window=1m",
        ),
        (Policy::smooth_bursty(r), "smooth-bursty:rate=10/s"),
        (
            Policy::limit_req(r, 5, true),
            "limit-req:rate=10/s,burst=5,nodelay",
        ),
        (
            Policy::limit_req(r, 5, false),
            "limit-req:rate=10/s,burst=5",
        ),
        (Policy::shaper(r, 5), "shaper:rate=10/s,queue=5"),
        (Policy::concurrency(8), "concurrency:limit=8"),
    ];
    for (typed, text) in pairs {
        assert_eq!(typed.unwrap(), spec(text), "{text}");
    }
    let p = Policy::gcra(Rate::per_minute(3).unwrap(), 1).unwrap();
    let full = p
        .with_max_wait(Duration::from_millis(1500))
        .unwrap()
        .with_max_debt(4)
        .unwrap()
        .in_shadow_mode();
    assert_eq!(
        full,
        spec("gcra:rate=3/m,burst=1,max-wait=1500ms,max-debt=4,shadow=true")
    );
    // Setting a value twice replaces it.
    let again = full.with_max_wait(Duration::from_secs(2)).unwrap();
    assert_eq!(again.max_wait_us(), Some(2_000_000));
}

#[test]
fn typed_constructors_refuse_what_the_spec_refuses_with_its_message() {
    let e = Policy::fixed_window(0, Duration::from_secs(1)).unwrap_err();
    let same = "fixed-window:limit=0,window=1s"
        .parse::<Policy>()
        .unwrap_err();
    assert_eq!(e, same);
    assert!(Rate::per_second(0).is_err());
    assert!(Rate::per(1, Duration::ZERO).is_err());
    let e = Policy::concurrency(3)
        .unwrap()
        .with_max_debt(1)
        .unwrap_err();
    assert!(e.to_string().contains("max-debt"), "{e}");
}
