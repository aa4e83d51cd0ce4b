//! One call of the decision driver (`lua/check.lua`): the KEYS and ARGV of several
//! checks put together, and the reply split back into each check's part.

use std::sync::Arc;

use redis::{Cmd, Value};

use super::script::Wire;
use crate::Error;

/// What one check asks of the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallOp {
    Try,
    Acquire,
    Peek,
    Refund,
    /// A charge, or Envoy's counting (the same change of state; the caller derives
    /// the verdict).
    Charge,
}

/// The call of a decision of `op`.
impl From<tollgate_core::Op> for CallOp {
    fn from(op: tollgate_core::Op) -> CallOp {
        use tollgate_core::Op;
        match op {
            Op::Try => CallOp::Try,
            Op::Acquire => CallOp::Acquire,
            Op::Charge | Op::Count => CallOp::Charge,
        }
    }
}

impl CallOp {
    fn code(self) -> &'static str {
        match self {
            CallOp::Try => "t",
            CallOp::Acquire => "a",
            CallOp::Peek => "p",
            CallOp::Refund => "r",
            CallOp::Charge => "c",
        }
    }
}

/// One check's part of a call.
#[derive(Debug, Clone)]
pub(crate) struct CheckCall {
    pub op: CallOp,
    /// One state key per policy of `wire`'s rule set, all in one Cluster slot.
    pub keys: Vec<String>,
    /// That slot (0 for one node), and the index of the node that holds it (see
    /// `topology.rs`).
    pub slot: u16,
    pub node: usize,
    pub wire: Arc<Wire>,
    /// The decision time (us since the Unix epoch), or `None` for Redis `TIME`.
    pub now: Option<u64>,
    /// When a key without state was created, or `None` for now.
    pub created: Option<u64>,
    pub cost: u64,
}

/// The driver's answer to one check: the time it decided at, and whether it admitted,
/// with each policy's state string (see `check.lua`).
#[derive(Debug)]
pub(crate) struct CheckReply {
    pub now: u64,
    pub admitted: bool,
    pub states: Vec<Value>,
}

/// How a call's arguments are written, after the command (and the function name or
/// script SHA1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form<'a> {
    /// `FCALL`: each rule set as one string of Lua words.
    Function,
    /// `EVALSHA`: the script's first argument (`eval.lua`), then each rule set inline.
    Eval(&'a str),
    /// A `TOLLGATE.*` command of the module: each rule set as its specs.
    Module,
}

/// Appends the KEYS count, the KEYS and the ARGV of one call deciding `checks` to `cmd`
/// (after the function name or script SHA1); see `check.lua`.
pub(crate) fn push_call(cmd: &mut Cmd, checks: &[&CheckCall], nonce: &str, form: Form) {
    let nkeys: usize = checks.iter().map(|c| c.keys.len()).sum();
    cmd.arg(nkeys);
    for c in checks {
        for k in &c.keys {
            cmd.arg(k.as_str());
        }
    }
    if let Form::Eval(first) = form {
        cmd.arg(first);
    }
    cmd.arg(nonce).arg(checks.len());
    // Each distinct rule set once, after the checks, which refer to it by index
    // (limiters are few, so a linear search beats hashing).
    let mut sets: Vec<&Arc<Wire>> = Vec::new();
    for c in checks {
        let index = match sets.iter().position(|w| Arc::ptr_eq(w, &c.wire)) {
            Some(i) => i + 1,
            None => {
                sets.push(&c.wire);
                sets.len()
            }
        };
        cmd.arg(c.op.code()).arg(index);
        push_times(cmd, c.now, c.created);
        cmd.arg(c.cost);
    }
    for w in &sets {
        push_rule_set(cmd, w, form);
    }
}

/// A rule set as one string (a function and the module cache their parse by it), or
/// for `EVALSHA` a word count and the words (a script parses on every call).
fn push_rule_set(cmd: &mut Cmd, wire: &Wire, form: Form) {
    match form {
        Form::Function => cmd.arg(wire.encoded.as_str()),
        Form::Eval(_) => {
            cmd.arg(wire.words.len());
            for w in &wire.words {
                cmd.arg(w.as_str());
            }
            cmd
        }
        Form::Module => cmd.arg(wire.module.as_deref().unwrap_or_default()),
    };
}

/// Appends the KEYS count, the KEYS and the short ARGV of the one-try function
/// (`run_try` in `check.lua`): rule set, cost, times, and a nonce only when a policy
/// needs one.
pub(crate) fn push_try(cmd: &mut Cmd, check: &CheckCall, nonce: &str, form: Form) {
    push_one(cmd, &check.keys, &check.wire, form);
    cmd.arg(check.cost);
    push_times(cmd, check.now, check.created);
    if check.wire.needs_nonce {
        cmd.arg(nonce);
    }
}

/// The start of a call about one key's rule set (the one-try and lease entry points):
/// the KEYS count, the KEYS, the EVALSHA form (if any) and the rule set.
pub(crate) fn push_one(cmd: &mut Cmd, keys: &[String], wire: &Wire, form: Form) {
    cmd.arg(keys.len());
    for k in keys {
        cmd.arg(k.as_str());
    }
    if let Form::Eval(first) = form {
        cmd.arg(first);
    }
    push_rule_set(cmd, wire, form);
}

/// `''` to decide at Redis `TIME`, or `"now created"`.
pub(crate) fn push_times(cmd: &mut Cmd, now: Option<u64>, created: Option<u64>) {
    match (now, created) {
        (None, None) => cmd.arg(""),
        (now, created) => {
            let now = now.expect("a check with a creation time has a time");
            cmd.arg(format!("{now} {}", created.unwrap_or(now)))
        }
    };
}

/// Splits a call's reply into its checks' parts, in order.
pub(crate) fn split_reply(value: Value, checks: &[&CheckCall]) -> Result<Vec<CheckReply>, Error> {
    let bad = |what: &str| Error::Store(format!("script reply: {what}"));
    let Value::Array(items) = value else {
        return Err(bad("not an array"));
    };
    let mut items = items.into_iter();
    let time = match items.next() {
        Some(Value::Int(t)) => Some(u64::try_from(t).map_err(|_| bad("negative time"))?),
        _ => None,
    };
    // Flat: per check, admitted then one state per policy.
    let mut replies = Vec::with_capacity(checks.len());
    for c in checks {
        let admitted = match items.next() {
            Some(Value::Int(a)) => a == 1,
            _ => return Err(bad("expected a check's verdict")),
        };
        let states: Vec<Value> = items.by_ref().take(c.keys.len()).collect();
        if states.len() != c.keys.len() {
            return Err(bad("too few states"));
        }
        let now = c.now.or(time).ok_or_else(|| bad("no time"))?;
        replies.push(CheckReply {
            now,
            admitted,
            states,
        });
    }
    if items.next().is_some() {
        return Err(bad("too many states"));
    }
    Ok(replies)
}

/// A nonce unique to this call: sliding-log members never collide, even for two
/// callers admitted at the same microsecond.
pub(crate) fn nonce() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static PROCESS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let process = *PROCESS.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // A per-process random seed (std's RandomState) mixed with the process id.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{process:x}-{n:x}")
}
