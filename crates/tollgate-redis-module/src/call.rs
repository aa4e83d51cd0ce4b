//! One call of the module, pure: its arguments parsed and checked, every check decided
//! by tollgate-core on the states its keys hold, and the reply the Functions library
//! would give. Reading and writing keys goes through [`Keys`], so this file touches no
//! Redis (`keys.rs` does).
//!
//! The arguments are those of the library's entry points (`lua/check.lua`), with one
//! difference: a rule set is `"margin spec spec ..."` (the TTL margin in ms, then each
//! policy's spec), parsed by tollgate-core, not the Lua parameter words.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use tollgate_core::{AlgorithmKind, Op, PolicyState, RuleSet};

/// One item of a call's answer: a Redis integer or bulk string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out<'a> {
    Int(i64),
    Text(&'a [u8]),
}

/// A call's answer, its items in order; the strings in one buffer (a call answers
/// a few per check, and a server edge pays for every allocation).
#[derive(Debug, Default)]
pub struct Reply {
    items: Vec<Item>,
    text: Vec<u8>,
}

#[derive(Debug, Clone, Copy)]
enum Item {
    Int(i64),
    /// `text[from..to]`.
    Text(usize, usize),
}

impl Reply {
    /// How many items the answer has.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the answer has no items.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The items, in order.
    pub fn iter(&self) -> impl Iterator<Item = Out<'_>> {
        self.items.iter().map(|i| match *i {
            Item::Int(n) => Out::Int(n),
            Item::Text(from, to) => Out::Text(&self.text[from..to]),
        })
    }

    /// `bytes` kept in the buffer (not an item yet): where they are.
    fn keep(&mut self, bytes: &[u8]) -> (usize, usize) {
        let from = self.text.len();
        self.text.extend_from_slice(bytes);
        (from, self.text.len())
    }
}

/// A call's key space: its keys by index (the order they were given in).
pub trait Keys {
    /// The string under key `i` (`None`: no key), or why it cannot be a state.
    fn get(&mut self, i: usize) -> Result<Option<&[u8]>, String>;
    /// Key `i`'s name.
    fn name(&self, i: usize) -> &[u8];
    /// Writes key `i` with a time to live.
    fn set(&mut self, i: usize, value: &[u8], ttl_ms: u64);
    /// Deletes key `i` (a state as new is kept as no key).
    fn delete(&mut self, i: usize);
    /// The server's time, microseconds since the Unix epoch (what `TIME` gives).
    fn time_us(&mut self) -> u64;
}

/// The number of keys of a command's arguments (`numkeys key... rest`, after the
/// command's name), checked against how many there are.
pub fn key_count(args: &[&[u8]]) -> Result<usize, String> {
    let n = number_at(args, 0, "the number of keys")?;
    (usize::try_from(n).ok())
        .filter(|n| *n < args.len())
        .ok_or_else(|| format!("{n} keys, but only {} arguments follow", args.len() - 1))
}

/// A parsed rule set of a call.
pub struct Rules {
    margin_ms: u64,
    rules: RuleSet,
}

/// The algorithms the module decides: those whose state a store keeps as one string
/// ([`AlgorithmKind::state_is_one_string`]; sliding-log keeps a sorted set). The
/// Redis store sends other rule sets to the Functions library.
pub fn decides(kind: AlgorithmKind) -> bool {
    kind.state_is_one_string()
}

/// Rule sets are parsed once per server and kept by their string (a cache: decisions
/// never depend on it), up to this many.
const CACHED: usize = 1000;

thread_local! {
    static CACHE: RefCell<HashMap<Vec<u8>, Rc<Rules>>> = RefCell::new(HashMap::new());
}

/// The rule set `"margin spec ..."`, parsed or from the cache.
fn rules(text: &[u8]) -> Result<Rc<Rules>, String> {
    if let Some(r) = CACHE.with(|c| c.borrow().get(text).cloned()) {
        return Ok(r);
    }
    let s = std::str::from_utf8(text).map_err(|_| "a rule set is not UTF-8".to_owned())?;
    let mut words = s.split_ascii_whitespace();
    let margin_ms = number(words.next().unwrap_or(""), "a rule set's TTL margin")?;
    let specs: Vec<&str> = words.collect();
    let rules = RuleSet::parse(&specs).map_err(|e| format!("rule set {s:?}: {e}"))?;
    for p in rules.policies() {
        if !decides(p.algorithm().kind()) {
            return Err(format!("{p}: {} is not decided by this module", p.name()));
        }
    }
    let parsed = Rc::new(Rules { margin_ms, rules });
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= CACHED {
            c.clear();
        }
        c.insert(text.to_vec(), parsed.clone());
    });
    Ok(parsed)
}

fn number(w: &str, what: &str) -> Result<u64, String> {
    digits(w.as_bytes()).ok_or_else(|| format!("{what} should be a whole number, not {w:?}"))
}

/// `w` read as `str::parse::<u64>` reads it (digits, an optional leading `+`, no
/// overflow), in one pass over the bytes: a check's four numbers cost Redis about
/// 200 instructions each through `str::parse`, and a few dozen this way.
fn digits(w: &[u8]) -> Option<u64> {
    let w = w.strip_prefix(b"+").unwrap_or(w);
    if w.is_empty() {
        return None;
    }
    w.iter().try_fold(0u64, |n, &b| {
        let d = b.wrapping_sub(b'0');
        (d < 10).then_some(())?;
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

/// Argument `i`, a whole number (`what` names it in an error).
fn number_at(args: &[&[u8]], i: usize, what: &str) -> Result<u64, String> {
    match args.get(i).and_then(|a| digits(a)) {
        Some(n) => Ok(n),
        None => number(word(args, i, what)?, what),
    }
}

fn word<'a>(args: &[&'a [u8]], i: usize, what: &str) -> Result<&'a str, String> {
    let a = args.get(i).ok_or_else(|| format!("missing {what}"))?;
    std::str::from_utf8(a).map_err(|_| format!("{what} is not UTF-8"))
}

/// One check of a call.
struct Check {
    op: Op,
    /// `r` (refund) and `p` (peek) are not ops of the core.
    kind: u8,
    rules: Rc<Rules>,
    /// `None`: at the server's time.
    at: Option<(u64, u64)>,
    cost: u64,
    /// Its first key.
    base: usize,
}

/// "now created", or `None` for `''` (the server's time).
fn times(w: &str) -> Result<Option<(u64, u64)>, String> {
    if w.is_empty() {
        return Ok(None);
    }
    let (now, created) = (w.split_once(' '))
        .ok_or_else(|| format!("a time should be '' or \"now created\", not {w:?}"))?;
    Ok(Some((
        number(now, "a time")?,
        number(created, "a creation time")?,
    )))
}

/// The core op and the wire letter of an op word.
fn op_of(w: &str) -> Result<(Op, u8), String> {
    Ok(match w {
        "t" => (Op::Try, b't'),
        "a" => (Op::Acquire, b'a'),
        "c" => (Op::Charge, b'c'),
        // Peeks and refunds are not ops of the core (see `decide`).
        "p" => (Op::Try, b'p'),
        "r" => (Op::Try, b'r'),
        _ => return Err(format!("unknown op {w:?}")),
    })
}

/// A call of `keys` keys deciding a batch (`run_batch`): `nonce count (op set at
/// cost)... set...`. `read_only`: peeks only.
pub fn batch(
    n_keys: usize,
    args: &[&[u8]],
    read_only: bool,
    keys: &mut impl Keys,
) -> Result<Reply, String> {
    let count = number_at(args, 1, "the number of checks")?;
    let count = usize::try_from(count).map_err(|_| "too many checks".to_owned())?;
    let first_set = count
        .checked_mul(4)
        .and_then(|n| n.checked_add(2))
        .filter(|&n| n <= args.len())
        .ok_or_else(|| match count.checked_mul(4) {
            Some(n) => format!("{count} checks need {n} more arguments"),
            None => format!("{count} checks: too many"),
        })?;
    let sets = (args[first_set..].iter())
        .map(|s| rules(s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut checks = Vec::with_capacity(count);
    let mut base = 0;
    for c in 0..count {
        let i = 2 + 4 * c;
        let (op, kind) = op_of(word(args, i, "an op")?)?;
        if read_only && kind != b'p' {
            return Err("only peeks are read-only".into());
        }
        let set = number_at(args, i + 1, "a rule set index")?;
        let rules = (usize::try_from(set).ok())
            .and_then(|s| s.checked_sub(1))
            .and_then(|s| sets.get(s))
            .ok_or_else(|| format!("no rule set {set}"))?
            .clone();
        let check = Check {
            op,
            kind,
            at: times(word(args, i + 2, "a time")?)?,
            cost: number_at(args, i + 3, "a cost")?,
            base,
            rules,
        };
        base += check.rules.rules.policies().len();
        checks.push(check);
    }
    if base != n_keys {
        return Err(format!("the checks have {base} keys, the call {n_keys}"));
    }
    run(&checks, keys)
}

/// A call deciding one try or charge (`run_try`): `set cost at [nonce]`.
pub fn one(
    n_keys: usize,
    args: &[&[u8]],
    charging: bool,
    keys: &mut impl Keys,
) -> Result<Reply, String> {
    let rules = rules(args.first().ok_or("missing the rule set")?)?;
    let n = rules.rules.policies().len();
    if n != n_keys {
        return Err(format!(
            "the rule set has {n} policies, the call {n_keys} keys"
        ));
    }
    let (op, kind) = if charging {
        (Op::Charge, b'c')
    } else {
        (Op::Try, b't')
    };
    let check = Check {
        op,
        kind,
        at: times(word(args, 2, "a time")?)?,
        cost: number_at(args, 1, "a cost")?,
        base: 0,
        rules,
    };
    run(&[check], keys)
}

/// Decides `checks` in order: `{now, admitted, state before...}` per check as the
/// library answers (`now` once, `''` when no check used the server's time).
fn run(checks: &[Check], keys: &mut impl Keys) -> Result<Reply, String> {
    // A policy's state has a key of its own (the store's keys end in `:i.code`):
    // two policies of one check on one key would read each other's states.
    for (n, c) in checks.iter().enumerate() {
        let k = c.rules.rules.policies().len();
        for i in c.base..c.base + k {
            if (c.base..i).any(|j| keys.name(j) == keys.name(i)) {
                return Err(format!("check {}: two of its policies share a key", n + 1));
            }
        }
    }
    let mut reply = Reply {
        items: Vec::with_capacity(
            1 + checks
                .iter()
                .map(|c| 1 + c.rules.rules.policies().len())
                .sum::<usize>(),
        ),
        text: Vec::with_capacity(64 * checks.len()),
    };
    let time = match checks.iter().any(|c| c.at.is_none()) {
        true => {
            let t = keys.time_us();
            reply.items.push(Item::Int(
                i64::try_from(t).map_err(|_| "a time past 2^63 us")?,
            ));
            t
        }
        false => {
            reply.items.push(Item::Text(0, 0));
            0
        }
    };
    let mut scratch = Scratch::default();
    for c in checks {
        let (now, created) = c.at.unwrap_or((time, time));
        decide(c, now, created, keys, &mut reply, &mut scratch)?;
    }
    Ok(reply)
}

/// Buffers one call reuses from check to check.
#[derive(Default)]
struct Scratch {
    states: Vec<PolicyState>,
    /// Where each state before is in the reply's buffer.
    before: Vec<(usize, usize)>,
    text: String,
}

/// One check: its states read, decided, written where changed; its reply appended.
fn decide(
    c: &Check,
    now: u64,
    created: u64,
    keys: &mut impl Keys,
    reply: &mut Reply,
    scratch: &mut Scratch,
) -> Result<(), String> {
    let policies = c.rules.rules.policies();
    let Scratch {
        states,
        before,
        text,
    } = scratch;
    states.clear();
    before.clear();
    for (k, p) in policies.iter().enumerate() {
        let (from, to) = reply.keep(keys.get(c.base + k)?.unwrap_or_default());
        let s = std::str::from_utf8(&reply.text[from..to]).map_err(|_| {
            let name = String::from_utf8_lossy(keys.name(c.base + k));
            format!("key {name} holds no tollgate state (not UTF-8)")
        })?;
        states.push(p.parse_state(s, created).map_err(|e| e.0)?);
        before.push((from, to));
    }
    let (admitted, write) = match c.kind {
        b'p' => (true, false),
        b'r' => {
            c.rules.rules.refund(states, now, c.cost);
            (true, true)
        }
        _ => {
            let d = (c.rules.rules)
                .decide(states, now, c.cost, c.op)
                .map_err(|e| e.to_string())?;
            (d.allowed, d.allowed)
        }
    };
    reply.items.push(Item::Int(i64::from(admitted)));
    // A refund answers the states after it, every other op those before.
    if c.kind != b'r' {
        (reply.items).extend(before.iter().map(|&(from, to)| Item::Text(from, to)));
    }
    if !write {
        return Ok(());
    }
    for (k, (p, s)) in policies.iter().zip(states.iter()).enumerate() {
        text.clear();
        if !p.write_state(s, text) {
            return Err(format!("{p}: no state string"));
        }
        let (from, to) = before[k];
        let was = &reply.text[from..to];
        if text.is_empty() && !was.is_empty() {
            keys.delete(c.base + k);
        } else if text.as_bytes() != was {
            let ttl_ms = p.reset_after(s, now) / 1000 + 1 + c.rules.margin_ms;
            keys.set(c.base + k, text.as_bytes(), ttl_ms);
        }
        if c.kind == b'r' {
            let (from, to) = reply.keep(text.as_bytes());
            reply.items.push(Item::Text(from, to));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_as_str_parse_reads_them() {
        let words = [
            "0",
            "7",
            "+7",
            "007",
            "18446744073709551615",
            "18446744073709551616",
            "",
            "+",
            "-1",
            "1 ",
            " 1",
            "1.5",
            "1e3",
            "++1",
            "99999999999999999999",
            "٣",
            "0x10",
        ];
        for w in words {
            assert_eq!(digits(w.as_bytes()), w.parse::<u64>().ok(), "{w:?}");
        }
        assert_eq!(digits(&[b'1', 0xff]), None);
        let args: [&[u8]; 2] = [b"12", &[0xff]];
        assert_eq!(number_at(&args, 0, "n"), Ok(12));
        assert_eq!(number_at(&args, 1, "n"), Err("n is not UTF-8".to_owned()));
        assert_eq!(number_at(&args, 2, "n"), Err("missing n".to_owned()));
        let bad = number_at(&[b"1x"], 0, "a cost");
        assert_eq!(
            bad,
            Err("a cost should be a whole number, not \"1x\"".to_owned())
        );
    }

    /// A call's keys by name (a name may come more than once), in a map, at a fixed
    /// server time.
    struct Map {
        names: Vec<&'static str>,
        values: HashMap<&'static str, (String, u64)>,
        now: u64,
    }

    impl Keys for Map {
        fn get(&mut self, i: usize) -> Result<Option<&[u8]>, String> {
            Ok(self.values.get(self.names[i]).map(|v| v.0.as_bytes()))
        }
        fn name(&self, i: usize) -> &[u8] {
            self.names[i].as_bytes()
        }
        fn set(&mut self, i: usize, value: &[u8], ttl_ms: u64) {
            let value = String::from_utf8(value.to_vec()).unwrap();
            self.values.insert(self.names[i], (value, ttl_ms));
        }
        fn delete(&mut self, i: usize) {
            self.values.remove(self.names[i]);
        }
        fn time_us(&mut self) -> u64 {
            self.now
        }
    }

    fn map(names: &[&'static str]) -> Map {
        Map {
            names: names.to_vec(),
            values: HashMap::new(),
            now: 5_000_000,
        }
    }

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    /// A reply's items, the strings owned.
    #[derive(Debug, PartialEq, Eq)]
    enum Owned {
        Int(i64),
        Text(String),
    }

    fn call(m: &mut Map, words: &[&str]) -> Result<Vec<Owned>, String> {
        let a = args(words);
        let refs: Vec<&[u8]> = a.iter().map(|v| v.as_slice()).collect();
        let reply = batch(m.names.len(), &refs, false, m)?;
        Ok((reply.iter())
            .map(|o| match o {
                Out::Int(i) => Owned::Int(i),
                Out::Text(t) => Owned::Text(String::from_utf8(t.to_vec()).unwrap()),
            })
            .collect())
    }

    #[test]
    fn a_batch_decides_in_order_and_keeps_states_as_the_library_does() {
        let mut m = map(&["k", "k", "k"]);
        let set = "100 fixed-window:limit=2,window=1s";
        let r = call(
            &mut m,
            &[
                "n", "3", "t", "1", "", "1", "t", "1", "", "1", "t", "1", "", "1", set,
            ],
        )
        .unwrap();
        let t = |s: &str| Owned::Text(s.into());
        assert_eq!(
            r,
            [
                Owned::Int(5_000_000),
                Owned::Int(1),
                t(""),
                Owned::Int(1),
                t("5000000 1"),
                Owned::Int(0),
                t("5000000 2")
            ]
        );
        // Full again at the window's end, plus 1 ms and the margin.
        assert_eq!(m.values["k"], ("5000000 2".into(), 1000 + 1 + 100));
    }

    #[test]
    fn bad_arguments_are_named_and_change_nothing() {
        let mut m = map(&["k"]);
        let set = "0 gcra:rate=1/s";
        for (words, msg) in [
            (vec!["n", "1", "t", "1", "", "1"], "no rule set 1"),
            (
                vec!["n", "2", "t", "1", "", "1", set],
                "2 checks need 8 more arguments",
            ),
            (vec!["n", "1", "x", "1", "", "1", set], "unknown op \"x\""),
            (
                vec!["n", "1", "t", "1", "", "-1", set],
                "a cost should be a whole number, not \"-1\"",
            ),
            (
                vec!["n", "1", "t", "1", "soon", "1", set],
                "a time should be '' or \"now created\", not \"soon\"",
            ),
            (
                vec![
                    "n",
                    "1",
                    "t",
                    "1",
                    "",
                    "1",
                    "0 sliding-log:limit=1,window=1s",
                ],
                "sliding-log is not decided by this module",
            ),
            (
                vec!["n", "1", "t", "1", "", "1", "0 gcra:rate=0/s"],
                "rule set",
            ),
            (
                vec!["n", "99999999999999999999"],
                "the number of checks should be a whole number",
            ),
            // A count whose arguments could not even be counted (a fuzzer's find).
            (
                vec!["n", "18446744073709551615"],
                "18446744073709551615 checks: too many",
            ),
        ] {
            let e = call(&mut m, &words).unwrap_err();
            assert!(e.contains(msg), "{words:?}: {e}");
            assert!(m.values.is_empty());
        }
        // A charge of nothing leaves a sliding window as new: kept as no key, and the
        // call decides again on what it left.
        let mut two = map(&["a", "b"]);
        let pair = "0 fixed-window:limit=1,window=1s sliding-window:limit=8,window=1s,buckets=2";
        for _ in 0..2 {
            let a = args(&[pair, "0", ""]);
            let refs: Vec<&[u8]> = a.iter().map(|v| v.as_slice()).collect();
            assert!(one(2, &refs, true, &mut two).is_ok());
            assert!(!two.values.contains_key("b"), "{:?}", two.values);
        }
        let mut same = map(&["a", "a"]);
        let e = call(&mut same, &["n", "1", "t", "1", "", "1", pair]).unwrap_err();
        assert_eq!(e, "check 1: two of its policies share a key");
        let mut two = map(&["a", "b"]);
        let e = call(&mut two, &["n", "1", "t", "1", "", "1", set]).unwrap_err();
        assert_eq!(e, "the checks have 1 keys, the call 2");
    }
}
