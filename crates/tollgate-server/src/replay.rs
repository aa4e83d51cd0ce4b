//! `tollgate replay`: a request trace through a policy on a virtual clock (DESIGN §4).
//!
//! Streams: one row in, one row out, state only per key, so a trace of any length
//! runs in memory proportional to its number of distinct keys.

use std::collections::HashMap;
use std::io::{Read, Write};

use tollgate::{CheckError, Decision, Op, Policy, PolicyState};

/// The longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 4096;

/// Why a replay stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A row of the trace is malformed; `line` is 1-based, counting the header.
    #[error("line {line}: {message}")]
    Row {
        /// The line number.
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// The header lacks a required column.
    #[error("line 1: the header must name the columns t_us,key,cost (optional: op, hold_us); {0}")]
    Header(String),
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The CSV layer failed (e.g. invalid UTF-8 or a wrong number of fields).
    #[error("{0}")]
    Csv(#[from] csv::Error),
}

struct Columns {
    t: usize,
    key: usize,
    cost: usize,
    op: Option<usize>,
    hold: Option<usize>,
}

impl Columns {
    fn from_header(header: &csv::StringRecord) -> Result<Self, ReplayError> {
        let find = |name: &str| header.iter().position(|h| h.trim() == name);
        let need = |name: &str| {
            find(name).ok_or_else(|| ReplayError::Header(format!("missing column '{name}'")))
        };
        Ok(Columns {
            t: need("t_us")?,
            key: need("key")?,
            cost: need("cost")?,
            op: find("op"),
            hold: find("hold_us"),
        })
    }
}

/// Replays the CSV trace in `input` through `policy`, writing one decision per row to
/// `output`. `op` applies to rows without an `op` column value.
pub fn replay(
    policy: &Policy,
    op: Op,
    input: impl Read,
    output: impl Write,
) -> Result<u64, ReplayError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(input);
    let cols = Columns::from_header(reader.headers()?)?;
    let mut writer = csv::Writer::from_writer(output);
    writer.write_record(["t_us", "key", "cost", "allowed", "remaining", "wait_us"])?;
    let mut keys: HashMap<String, PolicyState> = HashMap::new();
    let mut record = csv::StringRecord::new();
    let mut last_t = 0u64;
    let mut rows = 0u64;
    while reader.read_record(&mut record).map_err(|e| row_error(&e))? {
        let line = record.position().map_or(rows + 2, |p| p.line());
        let bad = |message: String| ReplayError::Row { line, message };
        let field = |i: usize| record.get(i).unwrap_or("").trim();
        let t: u64 = field(cols.t).parse().map_err(|_| {
            bad(format!(
                "t_us '{}' is not a whole number of microseconds",
                field(cols.t)
            ))
        })?;
        if t < last_t {
            return Err(bad(format!("t_us {t} is earlier than the previous row's {last_t} (the trace must be in time order)")));
        }
        let key = field(cols.key);
        if key.len() > MAX_KEY_BYTES {
            return Err(bad(format!(
                "key is {} bytes long (at most {MAX_KEY_BYTES})",
                key.len()
            )));
        }
        let cost: u64 = field(cols.cost)
            .parse()
            .ok()
            .filter(|&c| c >= 1)
            .ok_or_else(|| {
                bad(format!(
                    "cost '{}' is not a whole number >= 1",
                    field(cols.cost)
                ))
            })?;
        let row_op = match cols.op.map(field) {
            None | Some("") => op,
            Some("try") => Op::Try,
            Some("acquire") => Op::Acquire,
            Some(other) => return Err(bad(format!("op '{other}' is not try or acquire"))),
        };
        let hold = match cols.hold.map(field) {
            None | Some("") => None,
            Some(h) => Some(h.parse::<u64>().map_err(|_| {
                bad(format!(
                    "hold_us '{h}' is not a whole number of microseconds"
                ))
            })?),
        };
        last_t = t;
        let state = match keys.get_mut(key) {
            Some(s) => s,
            None => keys
                .entry(key.to_string())
                .or_insert_with(|| policy.init(0)),
        };
        let decision = policy.check_hold(state, t, cost, hold, row_op);
        let (allowed, remaining, wait) = columns_of(policy, state, t, decision);
        writer.write_record([
            field(cols.t),
            key,
            field(cols.cost),
            if allowed { "1" } else { "0" },
            &remaining.to_string(),
            &wait.map(|w| w.to_string()).unwrap_or_default(),
        ])?;
        rows += 1;
    }
    writer.flush()?;
    Ok(rows)
}

/// The output columns for one decision: (allowed, remaining, wait_us). A cost that
/// can never fit is a reject with an empty wait_us.
fn columns_of(
    policy: &Policy,
    state: &PolicyState,
    t: u64,
    decision: Result<Decision, CheckError>,
) -> (bool, u64, Option<u64>) {
    match decision {
        Ok(d) if d.allowed => (true, d.remaining, Some(d.wait_us)),
        Ok(d) => (false, d.remaining, d.retry_after_us),
        Err(_) => {
            let remaining = policy.peek(state, t, 1).map_or(0, |d| d.remaining);
            (false, remaining, None)
        }
    }
}

fn row_error(e: &csv::Error) -> ReplayError {
    let line = e.position().map_or(0, |p| p.line());
    ReplayError::Row {
        line,
        message: match e.kind() {
            csv::ErrorKind::UnequalLengths {
                expected_len, len, ..
            } => {
                format!("{len} fields where the header has {expected_len}")
            }
            csv::ErrorKind::Utf8 { .. } => "not valid UTF-8".into(),
            _ => e.to_string(),
        },
    }
}
