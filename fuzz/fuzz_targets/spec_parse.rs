//! The policy spec parser: any text either is refused with an error or parses to a
//! policy that prints back as a spec parsing to the same policy, and decides.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::{Op, Policy};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(policy) = text.parse::<Policy>() else {
        return;
    };
    let printed = policy.to_string();
    let again: Policy = printed
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which does not parse: {e}"));
    assert_eq!(again, policy, "{text:?} printed as {printed:?}");
    assert_eq!(again.to_string(), printed);
    let mut state = policy.init(0);
    for (t, cost) in [(0, 1), (1, 2), (1_000_000, 1), (u32::MAX as u64, 3)] {
        let _ = policy.check(&mut state, t, cost, Op::Try);
    }
});
