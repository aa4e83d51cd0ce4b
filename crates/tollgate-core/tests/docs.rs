//! The reference tables of `docs/semantics.md` are rendered from the algorithm table
//! (`tollgate_core::ALGORITHM_TABLE`): a row added or changed there shows up here.
//! `TOLLGATE_BLESS=1 cargo test -p tollgate-core --test docs` rewrites them.

use tollgate_core::ALGORITHM_TABLE;

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/semantics.md");

fn spec_table() -> String {
    let mut s = String::from(
        "| algorithm | parameters | defaults, and what is required | in Redis | leased |\n|---|---|---|---|---|\n",
    );
    for row in &ALGORITHM_TABLE {
        let redis = match row.lua_file {
            Some(file) => format!("`lua/{file}.lua`"),
            None => "permits with leases (`RedisConcurrencyLimiter`)".into(),
        };
        let leased = if row.leasable { "yes" } else { "no" };
        s += &format!(
            "| `{}` | {} | {} | {redis} | {leased} |\n",
            row.title, row.syntax, row.defaults
        );
    }
    s
}

fn choice_table() -> String {
    let mut s = String::from("| algorithm | guarantees | choose it when |\n|---|---|---|\n");
    for row in &ALGORITHM_TABLE {
        s += &format!("| `{}` | {} | {} |\n", row.title, row.guarantee, row.choose);
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
fn docs_tables_follow_the_algorithm_table() {
    let doc = std::fs::read_to_string(DOC).unwrap();
    let want = with_block(&doc, "specs", &spec_table());
    let want = with_block(&want, "choices", &choice_table());
    if std::env::var_os("TOLLGATE_BLESS").is_some() {
        std::fs::write(DOC, &want).unwrap();
    }
    assert!(
        doc == want,
        "docs/semantics.md differs from the algorithm table; rerun with TOLLGATE_BLESS=1 and review the diff"
    );
}

/// Every default the table documents is the one the parser applies, and every
/// parameter it calls required is refused when missing.
#[test]
fn documented_defaults_are_the_parsers() {
    use tollgate_core::Policy;
    let parse = |s: &str| s.parse::<Policy>().unwrap_or_else(|e| panic!("{e}"));
    // (the row's title, the smallest spec, [(a default written out, as the docs say it)],
    // [required parameters])
    let rows: &[(&str, &str, &[&str], &[&str])] = &[
        (
            "fixed-window",
            "fixed-window:limit=5,window=1s",
            &["align=clock"],
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
    assert_eq!(rows.len(), ALGORITHM_TABLE.len());
    for (title, min, defaults, required) in rows {
        let row = ALGORITHM_TABLE.iter().find(|r| r.title == *title).unwrap();
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
