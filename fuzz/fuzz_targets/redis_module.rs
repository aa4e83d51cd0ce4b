//! The tollgate Redis module's arguments, as a server hands them over: any words give
//! an answer or an error naming what is wrong, never a panic (one would reach the
//! server), and a call that succeeds succeeds again on the states it wrote (each reads
//! back). Words are split on NUL; the keys live in a map.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use tollgate_redis_module::call::{self, Keys};

struct Map<'a> {
    names: &'a [&'a [u8]],
    values: HashMap<Vec<u8>, Vec<u8>>,
}

impl Keys for Map<'_> {
    fn get(&mut self, i: usize) -> Result<Option<&[u8]>, String> {
        Ok(self.values.get(self.names[i]).map(|v| v.as_slice()))
    }
    fn name(&self, i: usize) -> &[u8] {
        self.names[i]
    }
    fn set(&mut self, i: usize, value: &[u8], _ttl_ms: u64) {
        self.values.insert(self.names[i].to_vec(), value.to_vec());
    }
    fn delete(&mut self, i: usize) {
        self.values.remove(self.names[i]);
    }
    fn time_us(&mut self) -> u64 {
        1_764_000_000_000_000
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&entry, data)) = data.split_first() else {
        return;
    };
    let words: Vec<&[u8]> = data.split(|b| *b == 0).collect();
    let Ok(n) = call::key_count(&words) else {
        return;
    };
    let (names, rest) = words[1..].split_at(n);
    let mut keys = Map {
        names,
        values: HashMap::new(),
    };
    let run = |keys: &mut Map| match entry % 4 {
        0 => call::batch(n, rest, false, keys),
        1 => call::batch(n, rest, true, keys),
        2 => call::one(n, rest, false, keys),
        _ => call::one(n, rest, true, keys),
    };
    if run(&mut keys).is_ok() {
        // The second call reads what the first wrote.
        if let Err(e) = run(&mut keys) {
            panic!("a call that succeeded fails on its own states: {e}");
        }
    }
});
