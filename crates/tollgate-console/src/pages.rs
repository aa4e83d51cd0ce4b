//! The console's HTML: every page rendered here, whole for a first load (usable
//! without JavaScript) and its live part alone for the updates a page asks for.
//! Everything interpolated passes through [`esc`].

use std::fmt::Write;

use super::figures::{Figures, Outcomes, RuleRow};
use tollgate_service::top_keys::KeyCount;

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A count as `/metrics` has it (whole numbers without decimals).
pub fn count(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{n:.0}")
    } else {
        format!("{n:.3}")
    }
}

/// A rate, with one decimal under 100.
pub fn rate(n: f64) -> String {
    if n >= 100.0 {
        format!("{n:.0}")
    } else {
        format!("{n:.1}")
    }
}

/// `serve`'s pages, in the navigation's order: path (under the console), title.
pub const SERVE_PAGES: [(&str, &str); 5] = [
    ("", "Overview"),
    ("rules", "Rules"),
    ("keys", "Keys"),
    ("quota", "Quota buckets"),
    ("try", "Try a policy"),
];

/// The proxy's pages.
pub const PROXY_PAGES: [(&str, &str); 4] = [
    ("", "Overview"),
    ("routes", "Routes"),
    ("adaptive", "Adaptive limits"),
    ("try", "Try a policy"),
];

/// What every page's frame needs.
pub struct Frame<'a> {
    /// The console's path prefix (`/console`).
    pub base: &'a str,
    /// The page's path under it (`""`, `rules`, ...), for the navigation.
    pub page: &'a str,
    /// The open admin session's form token, if any.
    pub form_token: Option<&'a str>,
    /// The navigation: each page's path under the console, and its title.
    pub nav: &'a [(&'a str, &'a str)],
    /// Whether the console has admin actions (a log-in).
    pub admin: bool,
}

/// A whole page: the frame, navigation, `body`.
pub fn page(f: &Frame, title: &str, body: &str) -> String {
    let base = esc(f.base);
    let mut nav = String::new();
    for (path, name) in f.nav {
        let current = if *path == f.page {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(nav, "<a href=\"{base}/{path}\"{current}>{name}</a>");
    }
    let session = match f.form_token {
        Some(token) => format!(
            "<form method=\"post\" action=\"{base}/logout\" class=\"inline\"><input type=\"hidden\" name=\"form_token\" value=\"{}\"><span class=\"admin\">admin</span> <button type=\"submit\">Log out</button></form>",
            esc(token)
        ),
        None if f.admin => format!("<a href=\"{base}/login\">Admin log-in</a>"),
        None => "<span class=\"note-inline\">read-only</span>".into(),
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{} · tollgate</title><link rel=\"stylesheet\" href=\"{base}/static/console.css\"><script src=\"{base}/static/console.js\" defer></script></head><body><header><strong>tollgate</strong><nav aria-label=\"Pages\">{nav}</nav><div class=\"session\">{session}</div></header><main><h1>{}</h1>{body}</main></body></html>",
        esc(title),
        esc(title)
    )
}

/// The live part of a page, replaced by the updates (`page` names the stream).
pub fn live(base: &str, page: &str, inner: &str) -> String {
    format!(
        "<div id=\"live\" data-events=\"{}/events?page={}\">{inner}</div>",
        esc(base),
        esc(page)
    )
}

/// A small line chart of `series` (values, colour class, label), oldest first, one
/// point a second; with its legend when `legend`.
pub fn chart(
    label: &str,
    series: &[(&[f64], &str, &str)],
    (width, height): (u32, u32),
    legend: bool,
) -> String {
    let max = (series.iter())
        .flat_map(|(v, _, _)| v.iter().copied())
        .fold(0.0f64, f64::max);
    let top = if max > 0.0 { max * 1.1 } else { 1.0 };
    let (w, h) = (f64::from(width), f64::from(height));
    let mut out = format!(
        "<svg class=\"chart\" role=\"img\" aria-label=\"{}\" viewBox=\"0 0 {width} {height}\" width=\"{width}\" height=\"{height}\"><rect x=\"0\" y=\"0\" width=\"{width}\" height=\"{height}\" class=\"frame\"/>",
        esc(label)
    );
    for (values, class, _) in series {
        // At most a point per two pixels: the largest of each run, so a spike shows.
        let most = (width as usize / 2).max(2);
        let thinned: Vec<f64>;
        let values: &[f64] = if values.len() > most {
            let run = values.len().div_ceil(most);
            thinned = (values.chunks(run))
                .map(|c| c.iter().copied().fold(f64::MIN, f64::max))
                .collect();
            &thinned
        } else {
            values
        };
        let n = values.len().max(2) - 1;
        let points: Vec<String> = (values.iter().enumerate())
            .map(|(i, v)| {
                let x = w * i as f64 / n as f64;
                let y = h - 2.0 - (h - 4.0) * v / top;
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ = write!(
            out,
            "<polyline class=\"{class}\" points=\"{}\"/>",
            points.join(" ")
        );
    }
    let _ = write!(
        out,
        "<text x=\"4\" y=\"12\" class=\"scale\">{}</text>",
        rate(max)
    );
    let seconds = series.first().map_or(0, |s| s.0.len());
    if legend && seconds > 1 {
        // The time axis: one point a second, the newest at the right.
        let span = (seconds - 1) as f64;
        let y = h - 4.0;
        let _ = write!(
            out,
            "<text x=\"4\" y=\"{y}\" class=\"scale\">−{}</text>\
<text x=\"{:.0}\" y=\"{y}\" class=\"scale\" text-anchor=\"middle\">−{}</text>\
<text x=\"{:.0}\" y=\"{y}\" class=\"scale\" text-anchor=\"end\">now</text>",
            uptime(span),
            w / 2.0,
            uptime(span / 2.0),
            w - 4.0,
        );
    }
    out.push_str("</svg>");
    if !legend {
        return out;
    }
    let keys: Vec<String> = (series.iter())
        .map(|(_, class, name)| format!("<span class=\"key {class}\">{}</span>", esc(name)))
        .collect();
    out + &format!(
        "<div class=\"legend\">{} — the last {}, one point a second</div>",
        keys.join(" "),
        uptime(seconds as f64)
    )
}

fn outcome_cells(o: &Outcomes) -> String {
    format!(
        "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>",
        count(o.allowed),
        count(o.rejected),
        count(o.shadow_rejected)
    )
}

/// The store and its state (the failing nodes named, when some are), as both
/// overviews show it.
pub fn store_line(o: &super::figures::Overview) -> String {
    if !o.store_failing {
        return format!("{} — ok", esc(&o.store));
    }
    let failing = &o.failing_nodes;
    let nodes = if failing.is_empty() || failing.len() >= o.nodes {
        String::new()
    } else {
        format!(
            " (node {}; the other {} decide as usual)",
            esc(&failing.join(", ")),
            o.nodes - failing.len()
        )
    };
    format!(
        "{} — <strong class=\"bad\">failing</strong>{nodes}",
        esc(&o.store)
    )
}

/// The overview's live part.
pub fn overview(fig: &Figures) -> String {
    let o = &fig.overview;
    let latency = o.latency_ms.map_or("–".to_string(), |l| {
        format!("{:.3} ms / {:.3} ms", l.p50, l.p99)
    });
    let store = store_line(o);
    let reload = if o.last_reload_ok {
        "ok"
    } else {
        "<strong class=\"bad\">refused</strong> (the rules before it are in force)"
    };
    let h = &fig.history;
    format!(
        "<section aria-labelledby=\"now\"><h2 id=\"now\">Now</h2><dl class=\"cards\">\
<div><dt>Allowed /s</dt><dd data-figure=\"allowed_per_second\">{}</dd></div>\
<div><dt>Rejected /s</dt><dd data-figure=\"rejected_per_second\">{}</dd></div>\
<div><dt>Shadow-rejected /s</dt><dd data-figure=\"shadow_rejected_per_second\">{}</dd></div>\
<div><dt>Decision time p50 / p99</dt><dd data-figure=\"latency\">{latency}</dd></div>\
<div><dt>Store</dt><dd data-figure=\"store\">{store}</dd></div>\
<div><dt>Keys held</dt><dd data-figure=\"keys\">{}</dd></div></dl></section>\
<section aria-labelledby=\"chart\"><h2 id=\"chart\">Decisions per second</h2>{}{}</section>\
<section aria-labelledby=\"totals\"><h2 id=\"totals\">Since start</h2><table><thead><tr><th scope=\"col\">Allowed</th><th scope=\"col\">Rejected</th><th scope=\"col\">Shadow-rejected</th><th scope=\"col\">Reloads ok</th><th scope=\"col\">Reloads refused</th><th scope=\"col\">Last reload</th><th scope=\"col\">Version</th><th scope=\"col\">Up</th></tr></thead>\
<tbody><tr data-row=\"totals\">{}<td class=\"n\" data-figure=\"reloads_ok\">{}</td><td class=\"n\" data-figure=\"reloads_failed\">{}</td><td>{reload}</td><td>{} ({})</td><td>{}</td></tr></tbody></table></section>",
        rate(o.per_second.allowed),
        rate(o.per_second.rejected),
        rate(o.per_second.shadow_rejected),
        keys_held(&o.store, o.keys),
        chart(
            "allowed and rejected per second",
            &[(&h.allowed, "allowed", "allowed"), (&h.rejected, "rejected", "rejected")],
            (720, 160),
            true
        ),
        chart(
            "p99 decision time (ms)",
            &[(&h.p99_ms, "latency", "p99 decision time, ms")],
            (720, 80),
            true
        ),
        outcome_cells(&o.decisions),
        count(o.reloads_ok),
        count(o.reloads_failed),
        esc(&o.version),
        esc(&o.commit),
        uptime(o.uptime_seconds),
    )
}

/// A duration in seconds, as people say it.
pub fn uptime(s: f64) -> String {
    let s = s as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

/// The rules page's live part.
pub fn rules(fig: &Figures) -> String {
    if fig.rules.is_empty() {
        return "<p>No rules are in force.</p>".into();
    }
    let mut rows = String::new();
    for r in &fig.rules {
        rows.push_str(&rule_row(r, &fig.overview.store));
    }
    format!(
        "<table class=\"rules\"><caption>Decisions by rule: per second over the last second, and since start (as <code>tollgate_decisions_total</code>); the last minutes drawn <span class=\"key allowed\">allowed</span> and <span class=\"key rejected\">rejected</span></caption><thead><tr>\
<th scope=\"col\">Rule</th><th scope=\"col\">Policies</th><th scope=\"col\">Source</th><th scope=\"col\">Allowed /s</th><th scope=\"col\">Rejected /s</th><th scope=\"col\" title=\"hits past the near-limit ratio or over the limit, over the last second\">Near or over limit</th><th scope=\"col\">Allowed</th><th scope=\"col\">Rejected</th><th scope=\"col\">Shadow-rejected</th><th scope=\"col\">Keys</th><th scope=\"col\">Last minutes</th></tr></thead><tbody>{rows}</tbody></table>"
    )
}

fn rule_row(r: &RuleRow, store: &str) -> String {
    let mut flags = String::new();
    if r.info.shadow {
        flags.push_str(" <span class=\"flag\">shadow</span>");
    }
    if r.info.unlimited {
        flags.push_str(" <span class=\"flag\">unlimited</span>");
    }
    if r.info.banned {
        flags.push_str(" <span class=\"flag bad\">banned</span>");
    }
    let name = r
        .info
        .name
        .as_deref()
        .map_or(String::new(), |n| format!(" <small>({})</small>", esc(n)));
    let policies = if r.info.banned {
        "refuses every request (<code>requests_per_unit: 0</code>)".to_string()
    } else if r.info.policies.is_empty() {
        "–".to_string()
    } else {
        (r.info.policies.iter())
            .map(|p| format!("<code>{}</code>", esc(p)))
            .collect::<Vec<_>>()
            .join("<br>")
    };
    let spark = match &r.history {
        Some(h) => chart(
            &format!("{}: allowed and rejected per second", r.info.rule),
            &[
                (&h.allowed, "allowed", "allowed"),
                (&h.rejected, "rejected", "rejected"),
            ],
            (160, 32),
            false,
        ),
        None => "–".into(),
    };
    format!(
        "<tr data-rule=\"{}\"><th scope=\"row\">{}{name}{flags}</th><td>{policies}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.0}%</td>{}<td class=\"n\">{}</td><td>{spark}</td></tr>",
        esc(&format!("{}|{}", r.info.domain, r.info.rule)),
        esc(&r.info.rule),
        esc(&r.info.source),
        rate(r.per_second.allowed),
        rate(r.per_second.rejected + r.per_second.shadow_rejected),
        r.near_limit_share * 100.0,
        outcome_cells(&r.decisions),
        keys_held(store, r.keys),
    )
}

/// Keys held, as the memory store counts them; the Redis store keeps its keys in
/// Redis, where this server does not count them.
fn keys_held(store: &str, keys: f64) -> String {
    if store.starts_with("redis") {
        "<span title=\"kept in Redis, not counted here\">in Redis</span>".into()
    } else {
        count(keys)
    }
}

/// A counter key as the look-up form takes it: its domain, and its entries as
/// `key=value, key=value`.
pub fn split_counter(key: &str) -> (String, String) {
    let mut parts = key.split('\u{1f}');
    let domain = parts.next().unwrap_or("").to_string();
    (domain, parts.collect::<Vec<_>>().join(", "))
}

/// The keys page's live part: the keys used most and rejected most.
/// A counter key with each entry's value replaced by a digest of it: which key it is,
/// without what it is (a descriptor value may be an API key).
pub fn masked(key: &str) -> String {
    let mut parts = key.split('\u{1f}');
    let mut out = parts.next().unwrap_or("").to_string();
    for entry in parts {
        let (k, v) = entry.split_once('=').unwrap_or((entry, ""));
        let digest = tollgate_service::decision_log::value_digest(v);
        out.push('\u{1f}');
        out.push_str(&format!("{k}={digest}"));
    }
    out
}

/// The keys page's live part: the keys used most and rejected most, their values
/// shown only when `reveal` (else masked: [`masked`]).
pub fn keys(base: &str, used: &[KeyCount], rejected: &[KeyCount], reveal: bool) -> String {
    let table = |caption: &str, id: &str, list: &[KeyCount]| {
        let mut rows = String::new();
        for k in list {
            if !reveal {
                let (domain, entries) = split_counter(&masked(&k.key));
                let _ = write!(
                    rows,
                    "<tr><td>{}</td><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                    esc(&domain),
                    esc(&entries),
                    k.count,
                    k.error
                );
                continue;
            }
            let (domain, entries) = split_counter(&k.key);
            let query = format!(
                "domain={}&entries={}",
                url_encode(&domain),
                url_encode(&entries)
            );
            let _ = write!(
                rows,
                "<tr><td>{}</td><td><a href=\"{}/keys?{}#lookup\">{}</a></td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&domain),
                esc(base),
                esc(&query),
                esc(&entries),
                k.count,
                k.error
            );
        }
        if list.is_empty() {
            rows = "<tr><td colspan=\"4\">None yet.</td></tr>".into();
        }
        format!(
            "<table id=\"{id}\"><caption>{caption}</caption><thead><tr><th scope=\"col\">Domain</th><th scope=\"col\">Entries</th><th scope=\"col\">Decisions (about)</th><th scope=\"col\">Of which maybe others'</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    };
    let note = if reveal {
        ""
    } else {
        "<p class=\"note\">Values are shown as a digest (<code>#...</code>): a descriptor value may be an API key. An admin session shows them, with links to look each up.</p>"
    };
    format!(
        "{note}<div class=\"two\">{}{}</div>",
        table(
            "Used most (recent decisions, one in 16 counted; counts halve every minute)",
            "used",
            used
        ),
        table(
            "Rejected most (shadow-rejected included)",
            "rejected",
            rejected
        )
    )
}

/// Percent-encodes a query value.
pub fn url_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// The quota page's live part.
pub fn quota(fig: &Figures) -> String {
    if fig.quota.is_empty() {
        return "<p>No quota bucket is reported on now (Envoy's rate limit quota filter opens them).</p>".into();
    }
    let mut rows = String::new();
    for b in &fig.quota {
        let figure = |name: &str| {
            (b.figures.iter())
                .find(|(n, _)| n == name)
                .map_or("–".to_string(), |(_, v)| rate(*v))
        };
        let value = |name: &str| b.figures.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
        let clients = (b.figures.iter())
            .find(|(n, _)| n == "clients" || n == "streams")
            .map_or("–".to_string(), |(n, v)| format!("{} {n}", count(*v)));
        // Each Envoy's share on average: /metrics has no series per Envoy (a label
        // per client would grow without bound), so neither has the page.
        let share = match (value("assigned_per_second"), value("clients")) {
            (Some(a), Some(n)) if n > 0.0 => rate(a / n),
            _ => "–".into(),
        };
        let _ = write!(
            rows,
            "<tr><td>{}</td><th scope=\"row\">{}</th><td>{} <code>{}</code></td><td class=\"n\">{clients}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{share}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(&b.domain),
            esc(&b.bucket),
            esc(&b.rule),
            esc(&b.budget),
            figure("demand_per_second"),
            figure("assigned_per_second"),
            figure("reserved_per_second"),
            count(b.reported_allowed),
            count(b.reported_denied)
        );
    }
    format!(
        "<table><caption>Each bucket (as <code>tollgate_quota_bucket</code>): rates per second, over every server sharing it</caption><thead><tr><th scope=\"col\">Domain</th><th scope=\"col\">Bucket</th><th scope=\"col\">Rule and budget</th><th scope=\"col\">Envoys</th><th scope=\"col\">Demand /s</th><th scope=\"col\">Assigned /s</th><th scope=\"col\">Per Envoy /s (average)</th><th scope=\"col\">Reserved /s</th><th scope=\"col\">Reported allowed</th><th scope=\"col\">Reported denied</th></tr></thead><tbody>{rows}</tbody></table>"
    )
}

/// A message box: `kind` is `error` or `note`.
pub fn message(kind: &str, text: &str) -> String {
    let role = if kind == "error" { "alert" } else { "status" };
    format!("<p class=\"{kind}\" role=\"{role}\">{}</p>", esc(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_everywhere_it_is_interpolated() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        let html = keys(
            "/console",
            &[KeyCount {
                key: "d\u{1f}k=<script>".into(),
                count: 3,
                error: 0,
            }],
            &[],
            true,
        );
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("entries=k%3D%3Cscript%3E"), "{html}");
    }

    #[test]
    fn values_are_masked_unless_revealed() {
        let key = KeyCount {
            key: "d\u{1f}api_key=sk-secret\u{1f}path=/x".into(),
            count: 1,
            error: 0,
        };
        let hidden = keys("/console", std::slice::from_ref(&key), &[], false);
        assert!(
            !hidden.contains("sk-secret") && hidden.contains("api_key=#"),
            "{hidden}"
        );
        assert!(!hidden.contains("<a href"), "{hidden}");
        let shown = keys("/console", &[key], &[], true);
        assert!(shown.contains("api_key=sk-secret"), "{shown}");
    }

    #[test]
    fn a_quota_bucket_shows_its_budget_and_the_average_share() {
        let fig = Figures {
            quota: vec![super::super::figures::BucketRow {
                domain: "envoy".into(),
                bucket: "name=api".into(),
                rule: "api".into(),
                budget: "gcra:rate=100/s,burst=20".into(),
                figures: vec![
                    ("clients".into(), 4.0),
                    ("assigned_per_second".into(), 100.0),
                ],
                reported_allowed: 7.0,
                reported_denied: 1.0,
            }],
            ..Figures::default()
        };
        let html = quota(&fig);
        for part in [
            "name=api",
            "gcra:rate=100/s,burst=20",
            "4 clients",
            ">25.0<",
            ">7<",
        ] {
            assert!(html.contains(part), "{part} in {html}");
        }
    }

    #[test]
    fn counts_print_as_metrics_do() {
        assert_eq!(count(12.0), "12");
        assert_eq!(count(0.5), "0.500");
        assert_eq!(rate(3.25), "3.2");
        assert_eq!(rate(1234.5), "1234");
    }
}
