//! `tollgate replay`: a request trace through a policy on a virtual clock (docs/cli.md: `tollgate replay`).
//!
//! Streams: one row in, one row out, state only per key, so a trace of any length
//! runs in memory proportional to its number of distinct keys.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use tollgate_runtime::progress::Progress;

use anyhow::Context;
use clap::{Parser, ValueEnum};

use tollgate::error::CheckError;
use tollgate::policy::PolicyState;
use tollgate::{Decision, Op, Policy, RateLimiter};

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
    /// The store failed (e.g. Redis unreachable).
    #[error("store: {0}")]
    Store(String),
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

/// Where a replay keeps its state.
#[derive(Debug, Clone)]
pub enum ReplayStore {
    /// In this process (the core, directly).
    Memory,
    /// In Redis (a `redis://` or `redis+cluster://` URL), through the same scripts as
    /// the Redis store, with the trace time passed in.
    Redis(String),
}

/// One decision as the output columns: (allowed, remaining, wait_us).
type OutputRow = (bool, u64, Option<u64>);

/// Decides rows, keeping the state of each key.
trait Backend {
    fn decide(
        &mut self,
        key: &str,
        t: u64,
        cost: u64,
        hold: Option<u64>,
        op: Op,
    ) -> Result<OutputRow, String>;
}

struct Memory<'a> {
    policy: &'a Policy,
    keys: HashMap<String, PolicyState>,
}

impl Backend for Memory<'_> {
    fn decide(
        &mut self,
        key: &str,
        t: u64,
        cost: u64,
        hold: Option<u64>,
        op: Op,
    ) -> Result<OutputRow, String> {
        let policy = self.policy;
        let state = match self.keys.get_mut(key) {
            Some(s) => s,
            None => self
                .keys
                .entry(key.to_string())
                .or_insert_with(|| policy.init(0)),
        };
        let decision = policy.check_hold(state, t, cost, hold, op);
        columns_of(policy, state, t, decision, op)
    }
}

struct Redis {
    runtime: tokio::runtime::Runtime,
    limiter: tollgate::redis::RedisLimiter,
    keys: std::collections::HashSet<String>,
}

impl Redis {
    fn connect(policy: &Policy, url: &str) -> Result<Redis, ReplayError> {
        let store_err = |e: tollgate::Error| ReplayError::Store(e.to_string());
        if matches!(
            policy.algorithm(),
            tollgate::policy::AnyAlgorithm::Concurrency(_)
        ) {
            return Err(ReplayError::Store(
                "concurrency: --store redis replays rate policies (concurrency permits in Redis are leases held by live processes)".into(),
            ));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let opts = tollgate::redis::RedisOptions {
            // Trace time is virtual: keys must outlive the replay, not the trace.
            ttl_margin: std::time::Duration::from_secs(600),
            timeout: std::time::Duration::from_secs(5),
            ..Default::default()
        };
        let store = runtime
            .block_on(tollgate::redis::RedisStore::connect_with(url, opts))
            .map_err(store_err)?;
        runtime.block_on(store.ping()).map_err(store_err)?;
        // A name of its own: a replay starts from empty state and touches nothing else.
        let name = format!(
            "replay-{}-{:x}",
            std::process::id(),
            std::time::SystemTime::UNIX_EPOCH
                .elapsed()
                .map_or(0, |d| d.as_nanos() as u64)
        );
        let limiter =
            tollgate::redis::RedisLimiter::new(store, &name, policy.clone()).map_err(store_err)?;
        Ok(Redis {
            runtime,
            limiter,
            keys: Default::default(),
        })
    }
}

impl Backend for Redis {
    fn decide(
        &mut self,
        key: &str,
        t: u64,
        cost: u64,
        _hold: Option<u64>,
        op: Op,
    ) -> Result<OutputRow, String> {
        if !self.keys.contains(key) {
            self.keys.insert(key.to_owned());
        }
        let limiter = &self.limiter;
        self.runtime.block_on(async {
            match limiter.check_at(key, t, 0, cost, op).await {
                Ok(d) => Ok(output_of(&d.decision, op)),
                Err(tollgate::Error::Check(e @ CheckError::NotChargeable { .. })) => {
                    Err(e.to_string())
                }
                Err(tollgate::Error::Check(_)) => {
                    let peek = limiter.peek_at(key, t, 0, 0).await;
                    Ok((false, peek.map_or(0, |d| d.decision.remaining), None))
                }
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        // Leave nothing behind (the TTLs would, later).
        let limiter = &self.limiter;
        let keys = std::mem::take(&mut self.keys);
        self.runtime.block_on(async {
            for k in keys {
                let _ = limiter.reset(&k).await;
            }
        });
    }
}

/// Replays the CSV trace in `input` through `policy` on the memory store, writing one
/// decision per row to `output`. `op` applies to rows without an `op` column value.
pub fn replay(
    policy: &Policy,
    op: Op,
    input: impl Read,
    output: impl Write,
) -> Result<u64, ReplayError> {
    let mut quiet = Progress::shown_if(false, "replay", None);
    replay_on(policy, op, &ReplayStore::Memory, input, output, &mut quiet)
}

/// One trace row, checked.
struct TraceRow<'a> {
    t: u64,
    key: &'a str,
    cost: u64,
    op: Op,
    hold: Option<u64>,
}

impl<'a> TraceRow<'a> {
    /// Reads `record` (`op`: the default when the row names none); `last_t` is the
    /// previous row's time. The error says what is wrong with which field.
    fn parse(
        record: &'a csv::StringRecord,
        cols: &Columns,
        op: Op,
        last_t: u64,
    ) -> Result<TraceRow<'a>, String> {
        let field = |i: usize| record.get(i).unwrap_or("").trim();
        let t: u64 = field(cols.t).parse().map_err(|_| {
            format!(
                "t_us '{}' is not a whole number of microseconds",
                field(cols.t)
            )
        })?;
        if t < last_t {
            return Err(format!("t_us {t} is earlier than the previous row's {last_t} (the trace must be in time order)"));
        }
        let key = field(cols.key);
        if key.len() > MAX_KEY_BYTES {
            return Err(format!(
                "key is {} bytes long (at most {MAX_KEY_BYTES})",
                key.len()
            ));
        }
        let op = match cols.op.map(field) {
            None | Some("") => op,
            Some("try") => Op::Try,
            Some("acquire") => Op::Acquire,
            Some("charge") => Op::Charge,
            Some("count") => Op::Count,
            Some(other) => {
                return Err(format!("op '{other}' is not try, acquire, charge or count"))
            }
        };
        // A charge or count of 0 is a look; a try or acquire needs a unit.
        let least = if op.charges() { 0 } else { 1 };
        let cost: u64 = field(cols.cost)
            .parse()
            .ok()
            .filter(|&c| c >= least)
            .ok_or_else(|| {
                format!(
                    "cost '{}' is not a whole number >= {least}",
                    field(cols.cost)
                )
            })?;
        let hold = match cols.hold.map(field) {
            None | Some("") => None,
            Some(h) => Some(
                h.parse::<u64>()
                    .map_err(|_| format!("hold_us '{h}' is not a whole number of microseconds"))?,
            ),
        };
        Ok(TraceRow {
            t,
            key,
            cost,
            op,
            hold,
        })
    }
}

/// [`replay`] on a chosen store, telling `progress` the input's bytes read.
pub fn replay_on(
    policy: &Policy,
    op: Op,
    store: &ReplayStore,
    input: impl Read,
    output: impl Write,
    progress: &mut Progress,
) -> Result<u64, ReplayError> {
    let mut backend: Box<dyn Backend> = match store {
        ReplayStore::Memory => Box::new(Memory {
            policy,
            keys: HashMap::new(),
        }),
        ReplayStore::Redis(url) => Box::new(Redis::connect(policy, url)?),
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(input);
    let cols = Columns::from_header(reader.headers()?)?;
    let mut writer = csv::Writer::from_writer(output);
    writer.write_record(["t_us", "key", "cost", "allowed", "remaining", "wait_us"])?;
    let mut record = csv::StringRecord::new();
    let mut last_t = 0u64;
    let mut rows = 0u64;
    let chargeable = policy.chargeable().map_err(|e| e.to_string());
    while reader.read_record(&mut record).map_err(|e| row_error(&e))? {
        let line = record.position().map_or(rows + 2, |p| p.line());
        let row = TraceRow::parse(&record, &cols, op, last_t)
            .map_err(|message| ReplayError::Row { line, message })?;
        if let (true, Err(message)) = (row.op.charges(), &chargeable) {
            return Err(ReplayError::Row {
                line,
                message: message.clone(),
            });
        }
        last_t = row.t;
        let (allowed, remaining, wait) = backend
            .decide(row.key, row.t, row.cost, row.hold, row.op)
            .map_err(|e| ReplayError::Store(format!("line {line}: {e}")))?;
        let field = |i: usize| record.get(i).unwrap_or("").trim();
        writer.write_record([
            field(cols.t),
            row.key,
            field(cols.cost),
            if allowed { "1" } else { "0" },
            &remaining.to_string(),
            &wait.map(|w| w.to_string()).unwrap_or_default(),
        ])?;
        rows += 1;
        if rows % 4096 == 0 {
            let read = record.position().map_or(0, |p| p.byte());
            progress.update(read, || format!("{rows} rows"));
        }
    }
    writer.flush()?;
    Ok(rows)
}

/// The output columns for one decision: (allowed, remaining, wait_us). A cost that
/// can never fit is a reject with an empty wait_us; a policy that cannot be charged
/// fails the row.
fn columns_of(
    policy: &Policy,
    state: &PolicyState,
    t: u64,
    decision: Result<Decision, CheckError>,
    op: Op,
) -> Result<(bool, u64, Option<u64>), String> {
    match decision {
        Ok(d) => Ok(output_of(&d, op)),
        Err(e @ CheckError::NotChargeable { .. }) => Err(e.to_string()),
        Err(_) => Ok((false, policy.remaining(state, t), None)),
    }
}

/// (allowed, remaining, wait_us) of a decision: wait_us is the retry time of a
/// reject, the wait of an admission, and for a charge the time until a unit request
/// fits again (its debt paid back; 0 when not in debt).
fn output_of(d: &Decision, op: Op) -> (bool, u64, Option<u64>) {
    if op == Op::Charge {
        return (true, d.remaining, Some(d.retry_after_us.unwrap_or(0)));
    }
    if d.allowed {
        (true, d.remaining, Some(d.wait_us))
    } else {
        (false, d.remaining, d.retry_after_us)
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

#[derive(Debug, Clone, Copy, ValueEnum)]
/// `--op`.
pub enum OpArg {
    /// Reject what does not fit now.
    Try,
    /// Wait up to the policy's max-wait.
    Acquire,
    /// Charge the cost after the fact, into debt if need be.
    Charge,
    /// Envoy's counting: a try whose cost is charged even when rejected.
    Count,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
/// `--store`.
pub enum StoreArg {
    /// In this process.
    Memory,
    /// The Redis scripts, at the trace's time.
    Redis,
}

#[derive(Debug, Parser)]
/// `tollgate replay` arguments.
pub struct ReplayArgs {
    /// The policy spec, e.g. 'gcra:rate=10/s,burst=5'.
    #[arg(long)]
    pub policy: String,
    /// What each request does when the trace has no `op` column: try (reject) or
    /// acquire (wait up to the policy's max-wait).
    #[arg(long, value_enum, default_value = "try")]
    pub op: OpArg,
    /// Where state is kept: memory, or redis (the Redis scripts, with the trace time
    /// passed in: the decisions must be identical).
    #[arg(long, value_enum, default_value = "memory")]
    pub store: StoreArg,
    /// The Redis URL for --store redis (`redis://host:port/db`,
    /// `redis+cluster://host:port,host:port` or
    /// `redis+sentinel://host:port,host:port/master-name`; `rediss...` over TLS).
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    pub redis_url: String,
    /// Read the trace from this file instead of standard input.
    #[arg(long, short)]
    pub input: Option<PathBuf>,
    /// Write decisions to this file instead of standard output. The file appears only
    /// when the whole trace replayed without error.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

/// `tollgate replay`: the trace from a file or standard input, decisions to a file (which
/// appears only when the whole trace replayed) or standard output.
pub fn command(args: ReplayArgs) -> anyhow::Result<()> {
    let policy = Policy::parse(&args.policy)?;
    let store = match args.store {
        StoreArg::Memory => ReplayStore::Memory,
        StoreArg::Redis => ReplayStore::Redis(args.redis_url.clone()),
    };
    let op = match args.op {
        OpArg::Try => Op::Try,
        OpArg::Acquire => Op::Acquire,
        OpArg::Charge => Op::Charge,
        OpArg::Count => Op::Count,
    };
    // Its share of the input file's bytes (of stdin's: not known).
    let size = (args.input.as_ref()).and_then(|p| std::fs::metadata(p).ok().map(|m| m.len()));
    let mut progress = Progress::new("tollgate replay", size);
    let input: Box<dyn io::Read> = match &args.input {
        Some(path) => Box::new(BufReader::new(
            File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
        )),
        None => Box::new(io::stdin().lock()),
    };
    match &args.output {
        Some(path) => {
            // Write beside the target and rename, so a failed replay leaves no half file.
            let tmp = path.with_extension("partial");
            let file =
                File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
            let result = replay_on(
                &policy,
                op,
                &store,
                input,
                BufWriter::new(file),
                &mut progress,
            );
            if let Err(e) = result {
                let _ = std::fs::remove_file(&tmp);
                return Err(e.into());
            }
            std::fs::rename(&tmp, path)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        None => {
            let stdout = io::stdout().lock();
            replay_on(
                &policy,
                op,
                &store,
                input,
                BufWriter::with_capacity(1 << 16, stdout),
                &mut progress,
            )?;
        }
    }
    io::stdout().flush()?;
    Ok(())
}
