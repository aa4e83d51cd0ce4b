//! The tollgate Redis module's arguments, as a server hands them over: any words give
//! an answer or an error naming what is wrong, never a panic (one would reach the
//! server), and a call that succeeds succeeds again on the states it wrote (each reads
//! back); `TOLLGATE.COUNT`'s arguments too. Words are split on NUL; the keys live in a map.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use tollgate_redis_module::call::{self, Keys};
use tollgate_redis_module::counter::{self, Counters};

struct Map<'a> {
    names: &'a [&'a [u8]],
    args: &'a [&'a [u8]],
    values: HashMap<Vec<u8>, Vec<u8>>,
}

/// Window counters in the same map, as the server keeps them (decimal text).
impl Counters for Map<'_> {
    fn count(&mut self, i: usize) -> Result<Option<u64>, String> {
        match self.values.get(self.names[i]) {
            None => Ok(None),
            Some(v) => (std::str::from_utf8(v).ok())
                .and_then(|t| t.parse().ok())
                .map(Some)
                .ok_or_else(|| "not a count".to_string()),
        }
    }
    fn make(&mut self, i: usize, arg: usize, _ttl_ms: u64) {
        self.values.insert(self.names[i].to_vec(), self.args[arg].to_vec());
    }
    fn raise(&mut self, i: usize, after: u64, _by_arg: usize, _ttl_ms: u64) {
        self.values.insert(self.names[i].to_vec(), after.to_string().into_bytes());
    }
    fn lower(&mut self, i: usize, after: u64, _by: u64) {
        self.values.insert(self.names[i].to_vec(), after.to_string().into_bytes());
    }
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
        args: rest,
        values: HashMap::new(),
    };
    if entry % 5 == 4 {
        // Window counters: an answer or an error (a second call may rightly fail: a
        // count past 2^63).
        let _ = counter::count(n, rest, &mut keys);
        return;
    }
    let run = |keys: &mut Map| match entry % 5 {
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
