//! The algorithm table: every algorithm tollgate has, once. The spec parser reads
//! names and parameters from it, the Redis store its wire codes, Lua files and whether
//! it can be leased, and the reference tables in `docs/` are checked against it (the
//! test `docs_tables_follow_the_algorithm_table`). Adding an algorithm adds a row
//! here, its state machine in [`crate::algorithms`], its Lua code and its cases in the
//! conformance suite.

/// Which algorithm a policy runs. The discriminant is the algorithm's wire code: the
/// number the Redis store sends for it, part of its Redis key names (so it never
/// changes), named `CODE.<lua_name>` in the Lua code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AlgorithmKind {
    /// `gcra`.
    Gcra = 1,
    /// `token-bucket`.
    TokenBucket = 2,
    /// `leaky-bucket` (the meter).
    LeakyBucket = 3,
    /// `fixed-window`.
    FixedWindow = 4,
    /// `sliding-log`.
    SlidingLog = 5,
    /// `sliding-window` with `buckets=K`.
    SlidingWindow = 6,
    /// `sliding-window` with `mode=weighted` (the default).
    SlidingWindowWeighted = 7,
    /// `smooth-bursty`.
    SmoothBursty = 8,
    /// `smooth-warmup`.
    SmoothWarmup = 9,
    /// `limit-req`.
    LimitReq = 10,
    /// `shaper`.
    Shaper = 11,
    /// `concurrency`.
    Concurrency = 12,
}

/// One row of [`ALGORITHM_TABLE`].
#[derive(Debug)]
pub struct AlgorithmInfo {
    /// The algorithm this row describes.
    pub kind: AlgorithmKind,
    /// Its name in a policy spec (two rows may share one: `sliding-window`).
    pub spec_name: &'static str,
    /// How the docs head its row: the spec name, plus what selects the row when two
    /// rows share a name.
    pub title: &'static str,
    /// The parameters the spec name takes, besides `max-wait` and `shadow` (the same
    /// list on rows that share a name).
    pub params: &'static [&'static str],
    /// The parameters as the docs show them.
    pub syntax: &'static str,
    /// Defaults of parameters that have one, and the parameters that are required, as
    /// the docs show them (a test parses each documented default).
    pub defaults: &'static str,
    /// The name of its wire code in the Lua code (`CODE.GCRA`).
    pub lua_name: &'static str,
    /// The file of `crates/tollgate/lua/` that decides it in Redis; `None` when the
    /// decision script does not (concurrency permits are leases of their own).
    pub lua_file: Option<&'static str>,
    /// Whether a Redis lease can keep it exactly (a slice of its budget decided
    /// locally without ever admitting more than the algorithm would).
    pub leasable: bool,
    /// Whether its limit is stated per window of a length (the window algorithms), so
    /// that `tollgate simulate` marks a window holding more as over the limit.
    pub per_window: bool,
    /// What it guarantees, for the docs.
    pub guarantee: &'static str,
    /// When to choose it, for the docs.
    pub choose: &'static str,
}

/// Every algorithm, in the order the docs list them.
pub const ALGORITHM_TABLE: [AlgorithmInfo; 12] = [
    AlgorithmInfo {
        kind: AlgorithmKind::FixedWindow,
        spec_name: "fixed-window",
        title: "fixed-window",
        params: &["limit", "window", "align"],
        syntax: "`limit`, `window`, `align=clock\\|first`",
        defaults: "`align=clock`; `limit` and `window` are required",
        lua_name: "FIXED_WINDOW",
        lua_file: Some("windows"),
        leasable: true,
        per_window: true,
        guarantee: "at most `limit` per window (clock-aligned: windows start at multiples of `window` since the Unix epoch, so `1m` starts on the minute; or opened by the first request)",
        choose: "you want the cheapest counter and can live with up to 2x `limit` around a boundary (Envoy's ratelimit service uses this)",
    },
    AlgorithmInfo {
        kind: AlgorithmKind::SlidingLog,
        spec_name: "sliding-log",
        title: "sliding-log",
        params: &["limit", "window"],
        syntax: "`limit`, `window`",
        defaults: "none: `limit` and `window` are required",
        lua_name: "SLIDING_LOG",
        lua_file: Some("windows"),
        leasable: false,
        per_window: true,
        guarantee: "at most `limit` in **every** window `(t - window, t]`, exactly",
        choose: "the limit must never be exceeded in any window and limits are small (memory grows with the limit)",
    },
    AlgorithmInfo {
        kind: AlgorithmKind::SlidingWindow,
        spec_name: "sliding-window",
        title: "sliding-window` `buckets=K",
        params: &["limit", "window", "buckets", "mode"],
        syntax: "`limit`, `window`, `buckets=K`",
        defaults: "none: `limit`, `window` and `buckets` are required",
        lua_name: "SLIDING_WINDOW",
        lua_file: Some("windows"),
        leasable: true,
        per_window: true,
        guarantee: "at most `limit` in any K consecutive buckets of `window/K`",
        choose: "near-exact with fixed memory (K counters per key)",
    },
    AlgorithmInfo {
        kind: AlgorithmKind::SlidingWindowWeighted,
        spec_name: "sliding-window",
        title: "sliding-window` `mode=weighted",
        params: &["limit", "window", "buckets", "mode"],
        syntax: "`limit`, `window`, `mode=weighted`",
        defaults: "the mode when `buckets` is absent; `limit` and `window` are required",
        lua_name: "SLIDING_WINDOW_WEIGHTED",
        lua_file: Some("windows"),
        leasable: true,
        per_window: true,
        guarantee: "`prev*(window-elapsed)/window + curr + c <= limit` in integers",
        choose: "two counters per key; smooths the fixed-window boundary (Cloudflare's estimate)",
    },
    AlgorithmInfo {
        kind: AlgorithmKind::LeakyBucket,
        spec_name: "leaky-bucket",
        title: "leaky-bucket",
        params: &["rate", "capacity"],
        syntax: "`rate`, `capacity`",
        defaults: "`capacity` = the rate's N",
        lua_name: "LEAKY_BUCKET",
        lua_file: Some("buckets"),
        leasable: true,
        per_window: false,
        guarantee: "meter: the level drains continuously, admits iff `level + c <= capacity`",
        choose: "same decisions as GCRA and token bucket with equal parameters (property-tested)",
    },
    AlgorithmInfo {
        kind: AlgorithmKind::Gcra,
        spec_name: "gcra",
        title: "gcra",
        params: &["rate", "burst"],
        syntax: "`rate`, `burst`",
        defaults: "`burst` = the rate's N",
        lua_name: "GCRA",
        lua_file: Some("gcra"),
        leasable: true,
        per_window: false,
        guarantee: "exactly `burst` at one instant, then one per `period/rate`",
        choose: "one u64 per key, exact, the best default for per-key API limits (governor, redis-cell, `redis_rate`)",
    },
    AlgorithmInfo {
        kind: AlgorithmKind::TokenBucket,
        spec_name: "token-bucket",
        title: "token-bucket",
        params: &["rate", "capacity"],
        syntax: "`rate`, `capacity`",
        defaults: "`capacity` = the rate's N",
        lua_name: "TOKEN_BUCKET",
        lua_file: Some("buckets"),
        leasable: true,
        per_window: false,
        guarantee: "starts full (`capacity`), refills continuously, no fractional loss",
        choose: "the classic mental model; exact at odd rates (3/s, 7/m)",
    },
    AlgorithmInfo {
        kind: AlgorithmKind::SmoothBursty,
        spec_name: "smooth-bursty",
        title: "smooth-bursty",
        params: &["rate", "max-burst"],
        syntax: "`rate`, `max-burst`",
        defaults: "`max-burst=1s`",
        lua_name: "SMOOTH_BURSTY",
        lua_file: Some("smooth"),
        leasable: false,
        per_window: false,
        guarantee: "Guava `RateLimiter.create(rate)`, exactly",
        choose: "porting Java code that relies on Guava's pay-the-previous-debt behaviour",
    },
    AlgorithmInfo {
        kind: AlgorithmKind::SmoothWarmup,
        spec_name: "smooth-warmup",
        title: "smooth-warmup",
        params: &["rate", "warmup", "cold-factor"],
        syntax: "`rate`, `warmup`, `cold-factor`",
        defaults: "`cold-factor=3`; `warmup` is required",
        lua_name: "SMOOTH_WARMUP",
        lua_file: Some("smooth"),
        leasable: false,
        per_window: false,
        guarantee: "Guava `RateLimiter.create(rate, warmup)`, exactly",
        choose: "a cold backend needs a ramp",
    },
    AlgorithmInfo {
        kind: AlgorithmKind::LimitReq,
        spec_name: "limit-req",
        title: "limit-req",
        params: &["rate", "burst", "nodelay", "delay"],
        syntax: "`rate`, `burst`, `nodelay` or `delay=N`",
        defaults: "`burst=0`, `delay=0`",
        lua_name: "LIMIT_REQ",
        lua_file: Some("limit_req"),
        leasable: false,
        per_window: false,
        guarantee: "nginx `limit_req`, exactly (ms clock, milli-request excess, burst, delay, nodelay)",
        choose: "matching an nginx config, or delaying instead of rejecting",
    },
    AlgorithmInfo {
        kind: AlgorithmKind::Shaper,
        spec_name: "shaper",
        title: "shaper",
        params: &["rate", "queue"],
        syntax: "`rate`, `queue`",
        defaults: "none: `rate` and `queue` are required",
        lua_name: "SHAPER",
        lua_file: Some("shaper"),
        leasable: false,
        per_window: false,
        guarantee: "admitted requests released one by one at `rate`; a full queue rejects",
        choose: "smoothing work to a steady pace (queues, outbound calls)",
    },
    AlgorithmInfo {
        kind: AlgorithmKind::Concurrency,
        spec_name: "concurrency",
        title: "concurrency",
        params: &["limit"],
        syntax: "`limit`",
        defaults: "none: `limit` is required",
        lua_name: "CONCURRENCY",
        lua_file: None,
        leasable: false,
        per_window: false,
        guarantee: "at most `limit` in flight",
        choose: "protecting a resource by concurrency, not rate",
    },
];

impl AlgorithmKind {
    /// Its row of [`ALGORITHM_TABLE`].
    pub fn info(self) -> &'static AlgorithmInfo {
        ALGORITHM_TABLE
            .iter()
            .find(|row| row.kind == self)
            .expect("every kind has a row (test every_kind_has_one_row)")
    }

    /// Its wire code (the discriminant).
    pub fn wire_code(self) -> u8 {
        self as u8
    }

    /// Its name in a policy spec.
    pub fn spec_name(self) -> &'static str {
        self.info().spec_name
    }
}

/// The algorithm names a spec may start with, each once, in table order.
pub fn spec_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for row in &ALGORITHM_TABLE {
        if !names.contains(&row.spec_name) {
            names.push(row.spec_name);
        }
    }
    names
}

/// The parameters spec name `name` takes (besides `max-wait` and `shadow`); `None`
/// for a name no algorithm has.
pub fn params_of(name: &str) -> Option<&'static [&'static str]> {
    ALGORITHM_TABLE
        .iter()
        .find(|row| row.spec_name == name)
        .map(|row| row.params)
}

/// The block of `prelude.lua` that names each wire code (`local CODE = {...}`), as
/// this table says it must read.
pub fn lua_codes() -> String {
    let mut rows: Vec<&AlgorithmInfo> = ALGORITHM_TABLE.iter().collect();
    rows.sort_by_key(|row| row.kind.wire_code());
    let mut s = String::from("local CODE = {\n");
    for row in rows {
        s.push_str(&format!("  {} = {},\n", row.lua_name, row.kind.wire_code()));
    }
    s.push('}');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_row_and_codes_and_lua_names_are_unique() {
        for (i, a) in ALGORITHM_TABLE.iter().enumerate() {
            for b in &ALGORITHM_TABLE[i + 1..] {
                assert_ne!(a.kind, b.kind);
                assert_ne!(a.lua_name, b.lua_name);
                if a.spec_name == b.spec_name {
                    assert_eq!(a.params, b.params, "rows of one spec name take one list");
                }
            }
        }
        // The codes run 1..=N without a gap, so the table covers every variant.
        let mut codes: Vec<u8> = ALGORITHM_TABLE.iter().map(|r| r.kind.wire_code()).collect();
        codes.sort();
        assert_eq!(codes, (1..=ALGORITHM_TABLE.len() as u8).collect::<Vec<_>>());
    }

    #[test]
    fn names_and_parameters_come_from_the_table() {
        assert_eq!(
            spec_names().len(),
            11,
            "sliding-window is one name for two rows"
        );
        assert_eq!(params_of("gcra"), Some(&["rate", "burst"][..]));
        assert_eq!(params_of("gcrb"), None);
        assert_eq!(AlgorithmKind::LimitReq.spec_name(), "limit-req");
        assert!(lua_codes().contains("  GCRA = 1,\n"));
    }
}
