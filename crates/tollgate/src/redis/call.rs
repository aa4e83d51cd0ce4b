//! One call of the decision driver (`lua/check.lua`): the KEYS and ARGV of several
//! checks put together, and the reply split back into each check's part.

use std::sync::Arc;

use redis::{Cmd, Value};

use super::script::Wire;
use super::StoreError;

/// What one check asks of the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallOp {
    Try,
    Acquire,
    Peek,
    Refund,
}

impl CallOp {
    fn code(self) -> &'static str {
        match self {
            CallOp::Try => "t",
            CallOp::Acquire => "a",
            CallOp::Peek => "p",
            CallOp::Refund => "r",
        }
    }
}

/// One check's part of a call.
#[derive(Debug, Clone)]
pub(crate) struct CheckCall {
    pub op: CallOp,
    /// One state key per policy of `wire`'s rule set, all in one Cluster slot.
    pub keys: Vec<String>,
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

/// Appends the KEYS count, the KEYS and the ARGV of one call deciding `checks` to `cmd`
/// (after the function name or script SHA1).
pub(crate) fn push_call(cmd: &mut Cmd, checks: &[&CheckCall], margin_ms: u64, nonce: &str) {
    let nkeys: usize = checks.iter().map(|c| c.keys.len()).sum();
    cmd.arg(nkeys);
    for c in checks {
        for k in &c.keys {
            cmd.arg(k.as_str());
        }
    }
    cmd.arg(margin_ms).arg(nonce);
    // Each distinct rule set once; checks refer to it by index (limiters are few, so a
    // linear search beats hashing).
    let mut sets: Vec<&Arc<Wire>> = Vec::new();
    let index: Vec<usize> = checks
        .iter()
        .map(
            |c| match sets.iter().position(|w| Arc::ptr_eq(w, &c.wire)) {
                Some(i) => i + 1,
                None => {
                    sets.push(&c.wire);
                    sets.len()
                }
            },
        )
        .collect();
    cmd.arg(sets.len());
    for w in &sets {
        for a in &w.args {
            cmd.arg(a.as_str());
        }
    }
    cmd.arg(checks.len());
    let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
    for (c, i) in checks.iter().zip(index) {
        cmd.arg(c.op.code())
            .arg(i)
            .arg(opt(c.now))
            .arg(opt(c.created))
            .arg(c.cost);
    }
}

/// Splits a call's reply into its checks' parts, in order.
pub(crate) fn split_reply(
    value: Value,
    checks: &[&CheckCall],
) -> Result<Vec<CheckReply>, StoreError> {
    let bad = |what: &str| StoreError::Protocol(format!("script reply: {what}"));
    let Value::Array(items) = value else {
        return Err(bad("not an array"));
    };
    if items.len() != checks.len() + 1 {
        return Err(bad("wrong number of checks"));
    }
    let mut items = items.into_iter();
    let time = match items.next() {
        Some(Value::Int(t)) => Some(u64::try_from(t).map_err(|_| bad("negative time"))?),
        _ => None,
    };
    checks
        .iter()
        .zip(items)
        .map(|(c, item)| {
            let Value::Array(mut parts) = item else {
                return Err(bad("a check's reply is not an array"));
            };
            if parts.len() != c.keys.len() + 1 {
                return Err(bad("wrong number of states"));
            }
            let admitted = matches!(parts[0], Value::Int(1));
            parts.remove(0);
            let now = c.now.or(time).ok_or_else(|| bad("no time"))?;
            Ok(CheckReply {
                now,
                admitted,
                states: parts,
            })
        })
        .collect()
}
