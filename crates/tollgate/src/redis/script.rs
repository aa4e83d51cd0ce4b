//! The Lua decision script and the wire between it and Rust: how a policy becomes
//! script arguments, and how a state string the script returns becomes a
//! [`PolicyState`] again.

use std::collections::VecDeque;
use std::sync::OnceLock;
use std::time::Duration;

use tollgate_core::algorithms::*;
use tollgate_core::{Algo, AlgorithmKind, CheckMode, Policy, PolicyState, RuleSet};

use crate::Error;

/// The algorithm files (see [`lua`]); file `i` is bit `1 << i` of a
/// [`Wire::families`] mask.
const FAMILIES: [(&str, &str); 6] = [
    ("gcra", include_str!("../../lua/gcra.lua")),
    ("buckets", include_str!("../../lua/buckets.lua")),
    ("windows", include_str!("../../lua/windows.lua")),
    ("limit_req", include_str!("../../lua/limit_req.lua")),
    ("smooth", include_str!("../../lua/smooth.lua")),
    ("shaper", include_str!("../../lua/shaper.lua")),
];
const ALL_FAMILIES: u8 = (1 << FAMILIES.len()) - 1;
const PRELUDE: &str = include_str!("../../lua/prelude.lua");
const DRIVER: &str = concat!(
    include_str!("../../lua/check.lua"),
    include_str!("../../lua/lease.lua")
);

/// The driver with the algorithm files in `mask`.
fn body(mask: u8) -> String {
    let mut s = String::from(PRELUDE);
    for (i, (_, src)) in FAMILIES.iter().enumerate() {
        if mask & (1 << i) != 0 {
            s.push_str(src);
        }
    }
    s.push_str(DRIVER);
    s
}

/// The driver as an `EVALSHA` script (Redis < 7, or Functions turned off) with only
/// the algorithms of `mask`: a script defines everything it holds on every call, so
/// a call carries only what its policies use.
pub(crate) struct EvalScript {
    pub source: String,
    pub sha1: String,
}

pub(crate) fn eval_script(mask: u8) -> &'static EvalScript {
    static SCRIPTS: [OnceLock<EvalScript>; 64] = [const { OnceLock::new() }; 64];
    SCRIPTS[usize::from(mask & ALL_FAMILIES)].get_or_init(|| {
        let source = body(mask) + include_str!("../../lua/eval.lua");
        EvalScript {
            sha1: redis::Script::new(&source).get_hash().to_string(),
            source,
        }
    })
}

/// The driver as a Redis Functions library, named by a hash of its code so that
/// instances of different tollgate versions on one Redis each call their own.
pub(crate) struct Library {
    /// `FUNCTION LOAD`'s argument.
    pub source: String,
    /// The function that decides a batch (`FCALL`).
    pub function: String,
    /// The function that decides one try, with shorter arguments.
    pub function_try: String,
    /// The function that makes one charge, with the same short arguments.
    pub function_charge: String,
    /// The function that ends and takes leases (`lease.lua`).
    pub function_lease: String,
    /// The read-only function for batches of peeks (`FCALL_RO`).
    pub function_ro: String,
}

pub(crate) fn library() -> &'static Library {
    static LIBRARY: OnceLock<Library> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let body = body(ALL_FAMILIES);
        let hash = redis::Script::new(&body).get_hash().to_string();
        let version = &hash[..12];
        let register = include_str!("../../lua/functions.lua").replace("VERSION", version);
        Library {
            source: format!("#!lua name=tollgate_{version}\n{body}{register}"),
            function: format!("tollgate_{version}"),
            function_try: format!("tollgate_{version}_try"),
            function_charge: format!("tollgate_{version}_charge"),
            function_lease: format!("tollgate_{version}_lease"),
            function_ro: format!("tollgate_{version}_ro"),
        }
    })
}

/// The largest charge sent to the script: a charge never takes more than a policy's
/// room (limit plus debt cap, below 2^42), so a larger one charges the same.
pub(crate) const MAX_CHARGE_SENT: u64 = 1 << 50;

/// Integers the script handles stay below this (doubles are exact below 2^53; the
/// margin leaves room for the sums of two of them).
const LUA_EXACT: u128 = 1 << 52;

/// A rule set as script arguments, prepared once.
#[derive(Debug, Clone)]
pub(crate) struct Wire {
    /// Per-policy key suffixes (`:{index}.{code}`): a changed algorithm starts afresh.
    pub suffixes: Vec<String>,
    /// The rule set as `check.lua` reads it, one string: the TTL margin (ms), `n`,
    /// then each policy's code, shadow, max-wait (`-`: unbounded), debt cap, m and
    /// parameters.
    pub encoded: String,
    /// The same as words (what an `EVALSHA` call sends, after their count).
    pub words: Vec<String>,
    /// Whether a policy needs a per-call nonce (sliding-log members).
    pub needs_nonce: bool,
    /// The algorithm files the policies use (bits of `FAMILIES`).
    pub families: u8,
    /// Each policy's largest cost the script can take exactly.
    max_costs: Vec<u64>,
}

impl Wire {
    /// Encodes `rules` with a TTL margin, or says which policy the Redis store cannot
    /// keep.
    pub fn new(rules: &RuleSet, ttl_margin: Duration) -> Result<Wire, Error> {
        let mut words = vec![
            ttl_margin.as_millis().to_string(),
            rules.policies().len().to_string(),
        ];
        let mut suffixes = Vec::new();
        let mut max_costs = Vec::new();
        let mut families = 0;
        for (i, p) in rules.policies().iter().enumerate() {
            let (params, max_cost) = encode(p)?;
            let code = p.algo().kind().wire_code();
            families |= family(p.algo().kind());
            suffixes.push(format!(":{i}.{code}"));
            words.push(code.to_string());
            words.push(if p.shadow() { "1" } else { "0" }.into());
            words.push(p.max_wait_us().map_or("-".into(), |m| m.to_string()));
            words.push(p.debt_cap().to_string());
            words.push(params.len().to_string());
            words.extend(params);
            max_costs.push(max_cost);
        }
        Ok(Wire {
            suffixes,
            encoded: words.join(" "),
            words,
            needs_nonce: (rules.policies().iter()).any(|p| matches!(p.algo(), Algo::SlidingLog(_))),
            families,
            max_costs,
        })
    }

    /// Refuses a charge a policy cannot take (shaper, concurrency), as the memory
    /// store does; any cost is fine otherwise (see [`MAX_CHARGE_SENT`]).
    pub fn check_charge(&self, rules: &RuleSet) -> Result<(), Error> {
        for p in rules.policies() {
            p.chargeable()?;
        }
        Ok(())
    }

    /// Refuses a cost no policy can admit (as the memory store does) or one too large
    /// for the script's exact arithmetic.
    pub fn check_cost(&self, rules: &RuleSet, cost: u64) -> Result<(), Error> {
        for (p, &max) in rules.policies().iter().zip(&self.max_costs) {
            // The algorithm's own answer on a new state: InsufficientCapacity or ZeroCost.
            let _ = p.check_mode(&mut p.init(0), 0, cost, CheckMode::Try)?;
            if cost > max {
                return Err(Error::Unsupported(format!(
                    "cost {cost} is too large for {} in the Redis store (at most {max})",
                    p.name()
                )));
            }
        }
        Ok(())
    }
}

/// Where the Lua code decides `kind`: the name of its wire code there (`CODE.GCRA`)
/// and its file of `crates/tollgate/lua/` (`None`: not the decision script's;
/// concurrency permits are leases of their own, `RedisConcurrencyLimiter`).
pub(crate) fn lua(kind: AlgorithmKind) -> (&'static str, Option<&'static str>) {
    use AlgorithmKind::*;
    match kind {
        Gcra => ("GCRA", Some("gcra")),
        TokenBucket => ("TOKEN_BUCKET", Some("buckets")),
        LeakyBucket => ("LEAKY_BUCKET", Some("buckets")),
        FixedWindow => ("FIXED_WINDOW", Some("windows")),
        SlidingLog => ("SLIDING_LOG", Some("windows")),
        SlidingWindow => ("SLIDING_WINDOW", Some("windows")),
        SlidingWindowWeighted => ("SLIDING_WINDOW_WEIGHTED", Some("windows")),
        SmoothBursty => ("SMOOTH_BURSTY", Some("smooth")),
        SmoothWarmup => ("SMOOTH_WARMUP", Some("smooth")),
        LimitReq => ("LIMIT_REQ", Some("limit_req")),
        Shaper => ("SHAPER", Some("shaper")),
        Concurrency => ("CONCURRENCY", None),
    }
}

/// Whether a lease can keep `kind` exactly: a slice of its budget decided locally
/// never admits more than the algorithm would (see `lease.rs`).
pub(crate) fn leasable_kind(kind: AlgorithmKind) -> bool {
    use AlgorithmKind::*;
    matches!(
        kind,
        Gcra | TokenBucket | LeakyBucket | FixedWindow | SlidingWindow | SlidingWindowWeighted
    )
}

/// The block of `prelude.lua` that names each wire code (`local CODE = {...}`), as
/// [`lua`] says it must read.
#[cfg(test)]
fn lua_codes() -> String {
    let mut kinds = AlgorithmKind::ALL.to_vec();
    kinds.sort_by_key(|k| k.wire_code());
    let mut s = String::from("local CODE = {\n");
    for kind in kinds {
        s.push_str(&format!("  {} = {},\n", lua(kind).0, kind.wire_code()));
    }
    s.push('}');
    s
}

/// The bit of the algorithm file that decides `kind`.
fn family(kind: AlgorithmKind) -> u8 {
    let file = lua(kind).1;
    let i = FAMILIES.iter().position(|(name, _)| Some(*name) == file);
    1 << i.expect("every algorithm the script decides has its file in FAMILIES")
}

fn bounded(what: &str, p: &Policy, v: u128) -> Result<String, Error> {
    if v >= LUA_EXACT {
        return Err(Error::Unsupported(format!(
            "{p}: {what} ({v}) is beyond the exact integer range of the Redis scripts (2^52)"
        )));
    }
    Ok(v.to_string())
}

/// (parameters, largest cost) of one policy; see the `.lua` files.
fn encode(p: &Policy) -> Result<(Vec<String>, u64), Error> {
    let big = |what: &str, v: u128| bounded(what, p, v);
    let exact_costs = |per: u128| (LUA_EXACT / per.max(1)).min(u128::from(u64::MAX)) as u64;
    Ok(match p.algo() {
        Algo::Gcra(a) => {
            let r = a.rate();
            let tau = u128::from(a.burst()) * u128::from(r.interval_ticks());
            let params = vec![
                r.scale().to_string(),
                r.interval_ticks().to_string(),
                big("burst * interval", tau)?,
            ];
            (params, u64::MAX)
        }
        // The two buckets share their units (see buckets.lua).
        Algo::TokenBucket(_) | Algo::LeakyBucket(_) => {
            let (r, capacity) = match p.algo() {
                Algo::TokenBucket(a) => (a.rate(), a.capacity_tokens()),
                Algo::LeakyBucket(a) => (a.rate(), a.capacity_units()),
                _ => unreachable!(),
            };
            let cap = u128::from(capacity) * u128::from(r.interval_ticks());
            let params = vec![
                r.interval_ticks().to_string(),
                r.scale().to_string(),
                big("capacity * interval", cap)?,
            ];
            (params, u64::MAX)
        }
        Algo::FixedWindow(a) => {
            let first = matches!(a.align(), Align::First);
            let params = vec![
                big("limit", a.limit_per_window().into())?,
                big("window", a.window_us().into())?,
                u8::from(first).to_string(),
            ];
            (params, u64::MAX)
        }
        Algo::SlidingLog(a) => {
            let params = vec![
                big("limit", a.limit_per_window().into())?,
                big("window", a.window_us().into())?,
            ];
            (params, u64::MAX)
        }
        Algo::SlidingWindow(a) => {
            let params = vec![
                big("limit", a.limit_per_window().into())?,
                big("window", a.window_us().into())?,
                a.buckets().to_string(),
                (a.window_us() / a.buckets()).to_string(),
            ];
            (params, u64::MAX)
        }
        Algo::SlidingWindowWeighted(a) => {
            let lw = u128::from(a.limit_per_window()) * u128::from(a.window_us());
            big("limit * window", lw)?;
            let params = vec![
                a.limit_per_window().to_string(),
                a.window_us().to_string(),
            ];
            (params, u64::MAX)
        }
        Algo::SmoothBursty(a) | Algo::SmoothWarmup(a) => {
            // `{:?}` prints the shortest string that parses back to the same double.
            let g = a.guava_params();
            let params = g.iter().map(|x| format!("{x:?}")).collect();
            // A cost's price in us must stay an exact integer in a double.
            let max = (LUA_EXACT as f64 / g[0].max(1.0)) as u64;
            (params, max)
        }
        Algo::LimitReq(a) => {
            let delay = match a.delay() {
                Delay::All => 0i128,
                Delay::After(n) => i128::from(n) * 1000,
                Delay::Never => -1,
            };
            let params = vec![
                a.rate_milli().to_string(),
                big("burst * 1000", u128::from(a.burst()) * 1000)?,
                delay.to_string(),
            ];
            (params, u64::MAX)
        }
        Algo::Shaper(a) => {
            let r = a.rate();
            let params = vec![
                r.scale().to_string(),
                r.interval_ticks().to_string(),
                a.queue().to_string(),
            ];
            (params, exact_costs(r.interval_ticks().into()))
        }
        Algo::Concurrency(_) => {
            return Err(Error::Unsupported(format!(
                "{p}: concurrency limits in Redis are held by RedisConcurrencyLimiter (permits with leases), not by the decision script"
            )))
        }
    })
}

fn nums<T: std::str::FromStr>(s: &str) -> Result<Vec<T>, Error> {
    s.split_ascii_whitespace()
        .map(|w| {
            w.parse()
                .map_err(|_| Error::Store(format!("bad number {w:?} in state {s:?}")))
        })
        .collect()
}

fn exactly<const N: usize, T: Copy>(v: Vec<T>, s: &str) -> Result<[T; N], Error> {
    v.try_into()
        .map_err(|_| Error::Store(format!("state {s:?} should have {N} numbers")))
}

/// Ticks `us * scale + frac` as the core keeps them.
fn ticks(us: u64, frac: u64, scale: u64) -> u64 {
    u64::try_from(u128::from(us) * u128::from(scale) + u128::from(frac)).unwrap_or(u64::MAX)
}

/// Whether `p` can be leased exactly (see `lease.lua`), or why not.
pub(crate) fn leasable(p: &Policy) -> Result<(), String> {
    if p.shadow() {
        return Err(format!(
            "{p}: a shadow policy cannot be leased (a lease charges every policy it admits for)"
        ));
    }
    if leasable_kind(p.algo().kind()) {
        return Ok(());
    }
    let mut keep: Vec<&str> = (AlgorithmKind::ALL.iter())
        .filter(|k| leasable_kind(**k))
        .map(|k| k.spec_name())
        .collect();
    keep.dedup();
    Err(format!(
        "{p}: {} cannot be leased exactly (leases keep {})",
        p.name(),
        keep.join(", ")
    ))
}

/// `state` as the Lua code stores it for `p` (the inverse of [`parse_state`]), for the
/// algorithms a lease keeps.
pub(crate) fn encode_state(p: &Policy, state: &PolicyState) -> Result<String, Error> {
    Ok(match (p.algo(), state) {
        (Algo::Gcra(a), PolicyState::Gcra(g)) => {
            let scale = a.rate().scale();
            let (us, frac) = (g.tat / scale, g.tat % scale);
            if frac == 0 {
                us.to_string()
            } else {
                format!("{us} {frac}")
            }
        }
        (Algo::TokenBucket(_), PolicyState::TokenBucket(t)) => format!("{} {}", t.tokens, t.last),
        (Algo::LeakyBucket(_), PolicyState::LeakyBucket(l)) => format!("{} {}", l.level, l.last),
        (Algo::FixedWindow(_), PolicyState::FixedWindow(w)) => format!("{} {}", w.start, w.count),
        (Algo::SlidingWindow(_), PolicyState::SlidingWindow(w)) => {
            let counts = w.counts.iter().map(u64::to_string).collect::<Vec<_>>();
            format!("{} {} {}", w.newest, w.total, counts.join(" "))
        }
        (Algo::SlidingWindowWeighted(_), PolicyState::SlidingWindowWeighted(w)) => {
            format!("{} {} {}", w.win, w.prev, w.curr)
        }
        _ => {
            return Err(Error::Unsupported(format!(
                "{p}: no lease encoding for this state"
            )))
        }
    })
}

/// The state the script returned for `p` (`""`: a key without state, created at
/// `created`).
pub(crate) fn parse_state(p: &Policy, s: &str, created: u64) -> Result<PolicyState, Error> {
    if s.is_empty() {
        return Ok(p.init(created));
    }
    Ok(match p.algo() {
        Algo::Gcra(a) => {
            // "us" or "us frac" (see gcra.lua).
            let v: Vec<u64> = nums(s)?;
            let (us, frac) = match v[..] {
                [us] => (us, 0),
                [us, frac] => (us, frac),
                _ => return Err(Error::Store(format!("bad gcra state {s:?}"))),
            };
            PolicyState::Gcra(GcraState {
                tat: ticks(us, frac, a.rate().scale()),
            })
        }
        Algo::TokenBucket(_) => {
            let [tokens, last] = exactly::<2, i64>(nums(s)?, s)?;
            PolicyState::TokenBucket(TokenBucketState {
                tokens,
                last: last as u64,
            })
        }
        Algo::LeakyBucket(_) => {
            let [level, last] = exactly::<2, i64>(nums(s)?, s)?;
            PolicyState::LeakyBucket(LeakyBucketState {
                level,
                last: last as u64,
            })
        }
        Algo::FixedWindow(_) => {
            let [start, count] = exactly(nums(s)?, s)?;
            PolicyState::FixedWindow(FixedWindowState { start, count })
        }
        Algo::SlidingLog(_) => {
            let v: Vec<u64> = nums(s)?;
            let mut entries: VecDeque<(u64, u64)> = VecDeque::with_capacity(v.len() / 2);
            let mut total = 0;
            // One member per admission in Redis; the core merges equal times.
            for pair in v.chunks_exact(2) {
                let (ts, c) = (pair[0], pair[1]);
                total += c;
                match entries.back_mut() {
                    Some(back) if back.0 == ts => back.1 += c,
                    _ => entries.push_back((ts, c)),
                }
            }
            PolicyState::SlidingLog(SlidingLogState { entries, total })
        }
        Algo::SlidingWindow(a) => {
            let v: Vec<u64> = nums(s)?;
            if v.len() as u64 != a.buckets() + 2 {
                return Err(Error::Store(format!(
                    "sliding-window state should have {} numbers",
                    a.buckets() + 2
                )));
            }
            PolicyState::SlidingWindow(SlidingWindowState {
                newest: v[0],
                total: v[1],
                counts: v[2..].into(),
            })
        }
        Algo::SlidingWindowWeighted(_) => {
            let [win, prev, curr] = exactly(nums(s)?, s)?;
            PolicyState::SlidingWindowWeighted(WeightedState { win, prev, curr })
        }
        Algo::SmoothBursty(_) | Algo::SmoothWarmup(_) => {
            let (stored, next) = s
                .split_once(' ')
                .ok_or_else(|| Error::Store(format!("bad smooth state {s:?}")))?;
            let state = SmoothState {
                stored: stored
                    .parse()
                    .map_err(|_| Error::Store(format!("bad stored permits {stored:?}")))?,
                next_free: exactly::<1, u64>(nums(next)?, s)?[0],
            };
            match p.algo() {
                Algo::SmoothBursty(_) => PolicyState::SmoothBursty(state),
                _ => PolicyState::SmoothWarmup(state),
            }
        }
        Algo::LimitReq(_) => {
            let [last_ms, excess] = exactly::<2, i64>(nums(s)?, s)?;
            PolicyState::LimitReq(LimitReqState {
                last_ms: last_ms as u64,
                excess,
            })
        }
        Algo::Shaper(a) => {
            let v: Vec<u64> = nums(s)?;
            if v.len() < 2 {
                return Err(Error::Store(format!("bad shaper state {s:?}")));
            }
            PolicyState::Shaper(ShaperState {
                last: Some(ticks(v[0], v[1], a.rate().scale())),
                pending: v[2..].iter().copied().collect(),
            })
        }
        Algo::Concurrency(_) => unreachable!("refused by Wire::new"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lua_code_names_follow_the_list_of_algorithms() {
        assert!(
            PRELUDE.contains(&lua_codes()),
            "lua/prelude.lua must name the wire codes exactly as `lua` does:\n{}",
            lua_codes()
        );
        for &kind in AlgorithmKind::ALL {
            let (name, Some(file)) = lua(kind) else {
                continue;
            };
            let (_, src) = FAMILIES.iter().find(|(f, _)| *f == file).unwrap();
            assert!(
                src.contains(&format!("ALGOS[CODE.{name}]")),
                "{file}.lua should define ALGOS[CODE.{name}]"
            );
            assert_ne!(family(kind), 0);
        }
        // No bare wire code is left in the decision code.
        let all = body(ALL_FAMILIES);
        assert!(
            !all.contains("ALGOS[1") && !all.contains("ALGOS[2"),
            "a bare code"
        );
    }
}
