//! Every YAML block of the README and docs/ is a configuration `tollgate check-config`
//! accepts, so that no example can drift from the code: a block with `domain:` is a
//! rule file (`--rules`; one with `descriptors:` or `quota_buckets:` alone, a part of
//! one, under a domain of its own), any other a main config (`--config`), checked in a
//! directory of its own where the files it names exist (real certificates from the
//! test PKI for its TLS files, a rule file for each rule path). A block that is not
//! tollgate's (Envoy's own configuration) says so in an HTML comment on the line
//! before its fence: `<!-- not tollgate's: ... -->`.

#[path = "support/docs.rs"]
mod docs;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml_ng::Value;
use tollgate_testkit::{Pki, ScratchDir};

/// A YAML block: where it is, and its text.
struct Block {
    at: String,
    text: String,
}

/// The YAML blocks of `file`, but those marked as not tollgate's.
fn blocks(file: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() != "```yaml" {
            i += 1;
            continue;
        }
        let start = i + 1;
        let end = (start..lines.len())
            .find(|&j| lines[j].starts_with("```"))
            .unwrap_or_else(|| panic!("{}:{start}: unclosed block", file.display()));
        let marked = i > 0 && lines[i - 1].starts_with("<!-- not tollgate's");
        if !marked {
            out.push(Block {
                at: format!("{}:{}", file.display(), i + 1),
                text: lines[start..end].join("\n") + "\n",
            });
        }
        i = end + 1;
    }
    out
}

/// The files a main config names, made in `dir` (its TLS files from `pki`, a rule
/// file for each rule path), with the block's text pointing at them.
fn provide(dir: &Path, pki: &Pki, text: &str) -> String {
    let mut text = text.to_string();
    let config: Value = serde_yaml_ng::from_str(&text).unwrap_or(Value::Null);
    let mut paths = Vec::new();
    collect_paths(&config, &mut paths);
    for (key, path) in paths {
        let made = dir.join(format!("provided-{}", paths_made(dir)));
        let source = match key.as_str() {
            "key_file" => "server.key",
            "client_ca_file" | "ca_file" => "ca.pem",
            _ => "server.pem",
        };
        std::fs::copy(pki.path(source), &made).unwrap();
        text = text.replace(&path, made.to_str().unwrap());
    }
    for rule in rule_paths(&config) {
        let path = dir.join(&rule);
        let doc = "domain: provided\ndescriptors:\n  - key: k\n    policies: [\"gcra:rate=1/s\"]\n";
        if rule.ends_with(".yaml") || rule.ends_with(".yml") {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, doc).unwrap();
        } else {
            std::fs::create_dir_all(&path).unwrap();
            std::fs::write(path.join("provided.yaml"), doc).unwrap();
        }
    }
    text
}

/// How many files `dir` holds (a name for the next one).
fn paths_made(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// Every (key, absolute path) under a `*_file` key of a TLS setting.
fn collect_paths(v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Mapping(m) => {
            for (k, v) in m {
                let key = k.as_str().unwrap_or_default();
                match v.as_str() {
                    Some(path) if key.ends_with("_file") && path.starts_with('/') => {
                        if key != "password_file" && !out.iter().any(|(_, p)| p == path) {
                            out.push((key.to_string(), path.to_string()));
                        }
                    }
                    _ => collect_paths(v, out),
                }
            }
        }
        Value::Sequence(s) => s.iter().for_each(|v| collect_paths(v, out)),
        _ => {}
    }
}

/// The rule paths of a main config's `rules:`.
fn rule_paths(config: &Value) -> Vec<PathBuf> {
    match config.get("rules") {
        Some(Value::Sequence(s)) => s
            .iter()
            .filter_map(|v| v.as_str())
            .map(PathBuf::from)
            .collect(),
        Some(Value::String(s)) => vec![PathBuf::from(s)],
        _ => Vec::new(),
    }
}

#[test]
fn every_yaml_block_of_the_docs_is_a_config_check_config_accepts() {
    let (_, files) = docs::documents();
    let pki = Pki::new();
    let mut checked = 0;
    let mut failed = Vec::new();
    for file in &files {
        for block in blocks(file) {
            let dir = ScratchDir::new("docs-yaml");
            let top = serde_yaml_ng::from_str::<Value>(&block.text).unwrap_or(Value::Null);
            let has = |key: &str| top.get(key).is_some();
            let (flag, text) = match () {
                _ if has("domain") => ("--rules", block.text.clone()),
                // A part of a rule file: under a domain of its own.
                _ if has("descriptors") || has("quota_buckets") => {
                    ("--rules", format!("domain: docs\n{}", block.text))
                }
                _ => ("--config", provide(&dir.0, &pki, &block.text)),
            };
            let path = dir.write("block.yaml", &text);
            let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
                .args(["check-config", flag, &path])
                .env_clear()
                .output()
                .unwrap();
            checked += 1;
            if !out.status.success() {
                failed.push(format!(
                    "{}: {}",
                    block.at,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
    }
    assert!(checked >= 15, "only {checked} blocks found");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
