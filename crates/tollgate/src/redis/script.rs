//! The Lua decision script and the wire between it and Rust: how a policy becomes
//! script arguments, and how a state string the script returns becomes a
//! [`PolicyState`] again.

use std::sync::OnceLock;
use std::time::Duration;

use tollgate_core::{AlgorithmKind, AnyAlgorithm, CheckMode, Policy, RuleSet};

#[cfg(test)]
use super::algorithms::lua_name;
use super::algorithms::{encode, file, leasable_kind};
pub(crate) use super::algorithms::{encode_state, parse_state};

use crate::Error;

/// The algorithm files (see `algorithms::file`); file `i` is bit `1 << i` of a
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
    // One per mask, sized from FAMILIES: a new Lua file cannot index past the end.
    const MASKS: usize = ALL_FAMILIES as usize + 1;
    static SCRIPTS: [OnceLock<EvalScript>; MASKS] = [const { OnceLock::new() }; MASKS];
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
    /// The rule set as the tollgate module reads it (`"margin spec spec ..."`), when
    /// the module decides every policy of it (see
    /// [`AlgorithmKind::state_is_one_string`]).
    pub module: Option<String>,
    /// Whether a policy needs a per-call nonce (sliding-log members).
    pub needs_nonce: bool,
    /// The algorithm files the policies use (bits of `FAMILIES`).
    pub families: u8,
    /// Each policy's largest cost the script can take exactly.
    max_costs: Vec<u64>,
    /// Set when the rule set is kept as window counters (`counter.rs`), not by the
    /// scripts or the module.
    pub counter: Option<super::counter::WindowCounter>,
}

impl Wire {
    /// Encodes `rules` with a TTL margin, or says which policy the Redis store cannot
    /// keep; with `window_counters`, a rule set that qualifies is kept as window
    /// counters.
    pub fn new(
        rules: &RuleSet,
        ttl_margin: Duration,
        window_counters: bool,
    ) -> Result<Wire, Error> {
        let mut words = vec![
            ttl_margin.as_millis().to_string(),
            rules.policies().len().to_string(),
        ];
        let mut suffixes = Vec::new();
        let mut max_costs = Vec::new();
        let mut families = 0;
        for (i, p) in rules.policies().iter().enumerate() {
            let (params, max_cost) = encode(p)?;
            let code = p.algorithm().kind().wire_code();
            families |= family(p.algorithm().kind());
            suffixes.push(format!(":{i}.{code}"));
            words.push(code.to_string());
            words.push(if p.shadow() { "1" } else { "0" }.into());
            words.push(p.max_wait_us().map_or("-".into(), |m| m.to_string()));
            words.push(p.debt_cap().to_string());
            words.push(params.len().to_string());
            words.extend(params);
            max_costs.push(max_cost);
        }
        let specs: Vec<String> = rules.policies().iter().map(|p| p.to_string()).collect();
        let module = (rules.policies().iter())
            .all(|p| p.algorithm().kind().state_is_one_string())
            .then(|| format!("{} {}", words[0], specs.join(" ")))
            // A spec is one word (a test of the specs' printing holds it); never split one.
            .filter(|m| m.split_ascii_whitespace().count() == 1 + specs.len());
        Ok(Wire {
            suffixes,
            module,
            encoded: words.join(" "),
            words,
            needs_nonce: (rules.policies().iter())
                .any(|p| matches!(p.algorithm(), AnyAlgorithm::SlidingLog(_))),
            families,
            max_costs,
            counter: window_counters
                .then(|| {
                    let margin_ms = u64::try_from(ttl_margin.as_millis()).unwrap_or(u64::MAX);
                    super::counter::WindowCounter::of(rules, margin_ms)
                })
                .flatten(),
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

/// The block of `prelude.lua` that names each wire code (`local CODE = {...}`), as
/// [`lua_name`] says it must read.
#[cfg(test)]
fn lua_codes() -> String {
    let mut kinds = AlgorithmKind::ALL.to_vec();
    kinds.sort_by_key(|k| k.wire_code());
    let mut s = String::from("local CODE = {\n");
    for kind in kinds {
        s.push_str(&format!("  {} = {},\n", lua_name(kind), kind.wire_code()));
    }
    s.push('}');
    s
}

/// The bit of the algorithm file that decides `kind`.
fn family(kind: AlgorithmKind) -> u8 {
    let file = file(kind);
    let i = FAMILIES.iter().position(|(name, _)| Some(*name) == file);
    1 << i.expect("every algorithm the script decides has its file in FAMILIES")
}

/// Whether `p` can be leased exactly (see `lease.lua`), or why not.
pub(crate) fn leasable(p: &Policy) -> Result<(), String> {
    if p.shadow() {
        return Err(format!(
            "{p}: a shadow policy cannot be leased (a lease charges every policy it admits for)"
        ));
    }
    if leasable_kind(p.algorithm().kind()) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lua_code_names_follow_the_list_of_algorithms() {
        assert!(
            PRELUDE.contains(&lua_codes()),
            "lua/prelude.lua must name the wire codes exactly as `lua_name` does:\n{}",
            lua_codes()
        );
        for &kind in AlgorithmKind::ALL {
            let Some(file) = file(kind) else { continue };
            let name = lua_name(kind);
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
