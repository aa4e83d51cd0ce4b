//! The reference tables of `docs/semantics.md`, rendered from the list of algorithms
//! (`tollgate_core::AlgorithmKind::ALL`), the Redis store's Lua files and leases, and
//! the prose below: an algorithm added or changed shows up in the docs, or this test
//! fails. `TOLLGATE_BLESS=1 cargo test -p tollgate --all-features --lib docs_tables`
//! rewrites them.

use tollgate_core::{AlgorithmKind, Policy};

use super::algorithms::{file, leasable_kind};

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/semantics.md");

/// What the docs say of one algorithm.
struct Prose {
    /// How the docs head its row: the spec name, plus what selects the row when two
    /// rows share a name.
    title: &'static str,
    /// The parameters as the docs show them.
    syntax: &'static str,
    /// Defaults, and the parameters that are required (a test parses each).
    defaults: &'static str,
    /// What it guarantees.
    guarantee: &'static str,
    /// When to choose it.
    choose: &'static str,
}

fn prose(kind: AlgorithmKind) -> Prose {
    use AlgorithmKind::*;
    match kind {
        FixedWindow => Prose {
            title: "fixed-window",
            syntax: "`limit`, `window`, `align=clock\\|first`, `debt=carry\\|forgive`",
            defaults: "`align=clock`, `debt=carry`; `limit` and `window` are required",
            guarantee: "at most `limit` per window (clock-aligned: windows start at multiples of `window` since the Unix epoch, so `1m` starts on the minute; or opened by the first request)",
            choose: "you want the cheapest counter and can live with up to 2x `limit` around a boundary (Envoy's ratelimit service uses this)",
        },
        SlidingLog => Prose {
            title: "sliding-log",
            syntax: "`limit`, `window`",
            defaults: "none: `limit` and `window` are required",
            guarantee: "at most `limit` in **every** window `(t - window, t]`, exactly",
            choose: "the limit must never be exceeded in any window and limits are small (memory grows with the limit)",
        },
        SlidingWindow => Prose {
            title: "sliding-window` `buckets=K",
            syntax: "`limit`, `window`, `buckets=K`",
            defaults: "none: `limit`, `window` and `buckets` are required",
            guarantee: "at most `limit` in any K consecutive buckets of `window/K`",
            choose: "near-exact with fixed memory (K counters per key)",
        },
        SlidingWindowWeighted => Prose {
            title: "sliding-window` `mode=weighted",
            syntax: "`limit`, `window`, `mode=weighted`",
            defaults: "the mode when `buckets` is absent; `limit` and `window` are required",
            guarantee: "`prev*(window-elapsed)/window + curr + c <= limit` in integers",
            choose: "two counters per key; smooths the fixed-window boundary (Cloudflare's estimate)",
        },
        LeakyBucket => Prose {
            title: "leaky-bucket",
            syntax: "`rate`, `capacity`",
            defaults: "`capacity` = the rate's N",
            guarantee: "meter: the level drains continuously, admits iff `level + c <= capacity`",
            choose: "same decisions as GCRA and token bucket with equal parameters (property-tested)",
        },
        Gcra => Prose {
            title: "gcra",
            syntax: "`rate`, `burst`",
            defaults: "`burst` = the rate's N",
            guarantee: "exactly `burst` at one instant, then one per `period/rate`",
            choose: "one u64 per key, exact, the best default for per-key API limits (governor, redis-cell, `redis_rate`)",
        },
        TokenBucket => Prose {
            title: "token-bucket",
            syntax: "`rate`, `capacity`",
            defaults: "`capacity` = the rate's N",
            guarantee: "starts full (`capacity`), refills continuously, no fractional loss",
            choose: "the classic mental model; exact at odd rates (3/s, 7/m)",
        },
        SmoothBursty => Prose {
            title: "smooth-bursty",
            syntax: "`rate`, `max-burst`",
            defaults: "`max-burst=1s`",
            guarantee: "Guava `RateLimiter.create(rate)`, exactly",
            choose: "porting Java code that relies on Guava's pay-the-previous-debt behaviour",
        },
        SmoothWarmup => Prose {
            title: "smooth-warmup",
            syntax: "`rate`, `warmup`, `cold-factor`",
            defaults: "`cold-factor=3`; `warmup` is required",
            guarantee: "Guava `RateLimiter.create(rate, warmup)`, exactly",
            choose: "a cold backend needs a ramp",
        },
        LimitReq => Prose {
            title: "limit-req",
            syntax: "`rate`, `burst`, `nodelay` or `delay=N`",
            defaults: "`burst=0`, `delay=0`",
            guarantee: "nginx `limit_req`, exactly (ms clock, milli-request excess, burst, delay, nodelay)",
            choose: "matching an nginx config, or delaying instead of rejecting",
        },
        Shaper => Prose {
            title: "shaper",
            syntax: "`rate`, `queue`",
            defaults: "none: `rate` and `queue` are required",
            guarantee: "admitted requests released one by one at `rate`; a full queue rejects",
            choose: "smoothing work to a steady pace (queues, outbound calls)",
        },
        Concurrency => Prose {
            title: "concurrency",
            syntax: "`limit`",
            defaults: "none: `limit` is required",
            guarantee: "at most `limit` in flight",
            choose: "protecting a resource by concurrency, not rate",
        },
    }
}

fn spec_table() -> String {
    let mut s = String::from(
        "| algorithm | parameters | defaults, and what is required | in Redis | leased |\n|---|---|---|---|---|\n",
    );
    for &kind in AlgorithmKind::ALL {
        let p = prose(kind);
        let redis = match file(kind) {
            Some(file) => format!("`lua/{file}.lua`"),
            None => "permits with leases (`RedisConcurrencyLimiter`)".into(),
        };
        let leased = if leasable_kind(kind) { "yes" } else { "no" };
        s += &format!(
            "| `{}` | {} | {} | {redis} | {leased} |\n",
            p.title, p.syntax, p.defaults
        );
    }
    s
}

fn choice_table() -> String {
    let mut s = String::from("| algorithm | guarantees | choose it when |\n|---|---|---|\n");
    for &kind in AlgorithmKind::ALL {
        let p = prose(kind);
        s += &format!("| `{}` | {} | {} |\n", p.title, p.guarantee, p.choose);
    }
    s
}

/// `doc` with the block between `<!-- table:NAME -->` and `<!-- /table -->` replaced.
fn with_block(doc: &str, name: &str, body: &str) -> String {
    let open = format!("<!-- table:{name} -->\n");
    let start = doc
        .find(&open)
        .unwrap_or_else(|| panic!("{DOC} lacks {open}"))
        + open.len();
    let end = start
        + doc[start..]
            .find("<!-- /table -->")
            .expect("an unclosed table");
    format!("{}{body}{}", &doc[..start], &doc[end..])
}

#[test]
fn docs_tables_follow_the_list_of_algorithms() {
    let doc = std::fs::read_to_string(DOC).unwrap();
    let want = with_block(&doc, "specs", &spec_table());
    let want = with_block(&want, "choices", &choice_table());
    if std::env::var_os("TOLLGATE_BLESS").is_some() {
        std::fs::write(DOC, &want).unwrap();
        return;
    }
    assert!(
        doc == want,
        "docs/semantics.md differs from the list of algorithms; rerun with TOLLGATE_BLESS=1 and review the diff"
    );
}

/// Each algorithm's row of docs/semantics.md: its title, the smallest spec, the defaults
/// written out as the docs say them, and its required parameters.
const DEFAULT_ROWS: &[(&str, &str, &[&str], &[&str])] = &[
    (
        "fixed-window",
        "fixed-window:limit=5,window=1s",
        &["align=clock", "debt=carry"],
        &["limit", "window"],
    ),
    (
        "sliding-log",
        "sliding-log:limit=5,window=1s",
        &[],
        &["limit", "window"],
    ),
    (
        "sliding-window` `buckets=K",
        "sliding-window:limit=5,window=1s,buckets=4",
        &[],
        &["limit", "window"],
    ),
    (
        "sliding-window` `mode=weighted",
        "sliding-window:limit=5,window=1s",
        &["mode=weighted"],
        &["limit", "window"],
    ),
    (
        "leaky-bucket",
        "leaky-bucket:rate=7/s",
        &["capacity=7"],
        &["rate"],
    ),
    ("gcra", "gcra:rate=7/s", &["burst=7"], &["rate"]),
    (
        "token-bucket",
        "token-bucket:rate=7/s",
        &["capacity=7"],
        &["rate"],
    ),
    (
        "smooth-bursty",
        "smooth-bursty:rate=7/s",
        &["max-burst=1s"],
        &["rate"],
    ),
    (
        "smooth-warmup",
        "smooth-warmup:rate=7/s,warmup=2s",
        &["cold-factor=3"],
        &["rate", "warmup"],
    ),
    (
        "limit-req",
        "limit-req:rate=7/s",
        &["burst=0", "delay=0"],
        &["rate"],
    ),
    ("shaper", "shaper:rate=7/s,queue=3", &[], &["rate", "queue"]),
    ("concurrency", "concurrency:limit=3", &[], &["limit"]),
];

/// Every default the table documents is the one the parser applies, and every
/// parameter it calls required is refused when missing.
#[test]
fn documented_defaults_are_the_parsers() {
    let parse = |s: &str| s.parse::<Policy>().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(DEFAULT_ROWS.len(), AlgorithmKind::ALL.len());
    for (title, min, defaults, required) in DEFAULT_ROWS {
        let row = (AlgorithmKind::ALL.iter())
            .map(|k| prose(*k))
            .find(|p| p.title == *title)
            .unwrap();
        let base = parse(min);
        for d in *defaults {
            let (k, v) = d.split_once('=').unwrap();
            // The docs say N for "the rate's N": here 7.
            let said = if v == "7" {
                format!("`{k}` = the rate's N")
            } else {
                format!("`{d}`")
            };
            assert!(
                row.defaults.contains(&said) || row.defaults.contains("the mode when"),
                "{title}: {said} not in {}",
                row.defaults
            );
            assert_eq!(parse(&format!("{min},{d}")), base, "{title}: {d}");
        }
        for r in *required {
            assert!(
                row.defaults.contains(&format!("`{r}`")) || *r == "rate",
                "{title}: {r} not said required in {}",
                row.defaults
            );
            let without: Vec<&str> = min
                .split_once(':')
                .unwrap()
                .1
                .split(',')
                .filter(|p| !p.starts_with(&format!("{r}=")))
                .collect();
            let spec = format!("{}:{}", min.split_once(':').unwrap().0, without.join(","));
            let e = spec.parse::<Policy>().unwrap_err().to_string();
            assert!(
                e.contains(&format!("missing parameter '{r}'")),
                "{spec}: {e}"
            );
        }
    }
}
