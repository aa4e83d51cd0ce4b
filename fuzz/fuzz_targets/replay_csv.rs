//! The replay CSV reader: any bytes give decisions or an error naming the line;
//! never a panic, for a rate policy, a window policy and a concurrency policy.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::{Op, Policy};
use tollgate_offline::replay::replay;

fuzz_target!(|data: &[u8]| {
    let Some((&choice, csv)) = data.split_first() else {
        return;
    };
    let spec = [
        "gcra:rate=10/s,burst=3",
        "sliding-log:limit=3,window=1s",
        "concurrency:limit=2",
        "limit-req:rate=3/s,burst=2",
    ][usize::from(choice) % 4];
    let policy: Policy = spec.parse().unwrap();
    let op = if choice & 0x80 != 0 {
        Op::Acquire
    } else {
        Op::Try
    };
    let _ = replay(&policy, op, csv, std::io::sink());
});
