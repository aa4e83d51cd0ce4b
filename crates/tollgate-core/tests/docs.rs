//! The reference tables of `docs/semantics.md` are rendered from the algorithm table
//! (`tollgate_core::ALGORITHM_TABLE`): a row added or changed there shows up here.
//! `TOLLGATE_BLESS=1 cargo test -p tollgate-core --test docs` rewrites them.

use tollgate_core::ALGORITHM_TABLE;

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/semantics.md");

fn spec_table() -> String {
    let mut s = String::from(
        "| algorithm | parameters | defaults | in Redis | leased |\n|---|---|---|---|---|\n",
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
