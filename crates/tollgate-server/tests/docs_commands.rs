//! Every `tollgate` command in a code block of the README and docs/ is one the CLI
//! takes, so that no example can drift from the flags: an example (`$ tollgate
//! simulate ...`) is parsed whole by the CLI's own parser; a synopsis (`tollgate bench
//! redis --redis-url URL [--keys K]`, with placeholders and alternatives) has each of
//! its `--flags` checked against the command's arguments. Other lines are not run
//! here: a script of this repository must exist; curl, podman, cargo and the like
//! are the user's tools.

#[path = "support/docs.rs"]
mod docs;

use clap::{CommandFactory, Parser};
use tollgate_server::cli::Cli;

/// The command lines of `text`'s code blocks (continuations joined, a `$ ` prompt,
/// environment assignments and a trailing comment taken off), with their line.
fn command_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut tag = "";
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        if let Some(t) = line.strip_prefix("```") {
            in_block = !in_block;
            tag = if in_block { t.trim() } else { "" };
            continue;
        }
        if !in_block || !matches!(tag, "" | "sh" | "bash" | "text" | "console") {
            continue;
        }
        let (at, joined) = match pending.take() {
            Some((at, before)) => (at, format!("{before} {}", line.trim())),
            None => (i + 1, line.trim().to_string()),
        };
        if let Some(cont) = joined.strip_suffix('\\') {
            pending = Some((at, cont.trim_end().to_string()));
            continue;
        }
        let mut cmd = joined.strip_prefix("$ ").unwrap_or(&joined).to_string();
        if let Some(comment) = cmd.find(" #") {
            cmd.truncate(comment);
        }
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let start = (words.iter())
            .position(|w| {
                !(w.contains('=') && w.chars().next().is_some_and(|c| c.is_ascii_uppercase()))
            })
            .unwrap_or(words.len());
        if start < words.len() {
            out.push((at, words[start..].join(" ")));
        }
    }
    out
}

/// `line` split as a shell would, for the quoting examples use ('...' and "...").
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            (None, c) => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    words
}

/// The (sub)command a synopsis names (`bench redis` goes two deep) and the long
/// flags it takes.
fn flags_of(words: &[String]) -> (String, Vec<String>) {
    let mut cmd = Cli::command();
    let mut path = Vec::new();
    for w in &words[1..] {
        // `http|grpc`: alternatives of one place, taking the same flags.
        let Some(sub) = w.split('|').find_map(|alt| cmd.find_subcommand(alt)) else {
            break;
        };
        path.push(sub.get_name().to_string());
        cmd = sub.clone();
    }
    let mut flags: Vec<String> = (cmd.get_arguments())
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    flags.extend(["help".to_string(), "log-format".to_string()]);
    (path.join(" "), flags)
}

#[test]
fn every_tollgate_command_in_the_docs_is_one_the_cli_takes() {
    let (root, files) = docs::documents();
    let (mut examples, mut synopses, mut failed) = (0, 0, Vec::new());
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (line, cmd) in command_lines(&text) {
            let at = format!("{}:{line}", file.strip_prefix(&root).unwrap().display());
            let first = cmd.split_whitespace().next().unwrap_or_default();
            if first.starts_with("scripts/") {
                if !root.join(first).is_file() {
                    failed.push(format!("{at}: no script {first}"));
                }
                continue;
            }
            if first != "tollgate" {
                continue;
            }
            let words = shell_words(&cmd);
            let synopsis = words.iter().skip(1).any(|w| w.contains(['[', ']', '|']))
                || words.iter().any(|w| {
                    w.chars()
                        .all(|c| c.is_ascii_uppercase() || c == '_' || c == ':' || c == '.')
                        && w.len() > 1
                });
            if synopsis {
                synopses += 1;
                let (sub, flags) = flags_of(&words);
                for w in &words {
                    for flag in w
                        .split(['[', ']', '|', '='])
                        .filter(|f| f.starts_with("--"))
                    {
                        let name = flag.trim_start_matches("--").trim_end_matches("...");
                        if !flags.iter().any(|f| f == name) {
                            failed.push(format!("{at}: tollgate {sub} takes no --{name}"));
                        }
                    }
                }
            } else {
                examples += 1;
                if let Err(e) = Cli::try_parse_from(&words) {
                    failed.push(format!("{at}: {cmd}: {}", e.kind()));
                }
            }
        }
    }
    assert!(
        examples >= 5 && synopses >= 10,
        "{examples} examples, {synopses} synopses"
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
