//! The proxy's console pages: its overview, its routes, and their adaptive limits
//! (the figures of routes.rs).

use std::fmt::Write;

use super::figures::Figures;
use super::pages::{chart, count, esc, rate, store_line};
use super::routes::RouteRow;

fn ms_text(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.2} ms"))
}

/// The routes page's live part.
pub fn routes_page(rows: &[RouteRow]) -> String {
    if rows.is_empty() {
        return "<p>No route is in force.</p>".into();
    }
    let mut out = String::new();
    for r in rows {
        let mut statuses = String::new();
        for s in &r.statuses {
            let _ = write!(
                statuses,
                "<tr data-code=\"{}\"><th scope=\"row\">{}</th><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&s.code),
                esc(&s.code),
                rate(s.per_second),
                count(s.total)
            );
        }
        let upstream = r.upstream_ms.map_or("–".into(), |l| {
            format!("{:.2} ms / {:.2} ms", l.p50, l.p99)
        });
        let h = &r.history;
        let _ = write!(
            out,
            "<section class=\"route\" data-route=\"{name}\" aria-labelledby=\"route-{id}\"><h2 id=\"route-{id}\">Route {name}</h2>\
<dl class=\"cards\"><div><dt>Requests /s</dt><dd>{}</dd></div><div><dt>429 /s (its limits)</dt><dd>{}</dd></div><div><dt>503 /s (shed, or its store)</dt><dd>{}</dd></div><div><dt>Upstream p50 / p99</dt><dd>{upstream}</dd></div></dl>\
<div class=\"two\"><table><caption>By status: per second over the last second, and since start (as <code>tollgate_proxy_requests_total</code>)</caption><thead><tr><th scope=\"col\">Status</th><th scope=\"col\">Per second</th><th scope=\"col\">Since start</th></tr></thead><tbody>{statuses}</tbody></table>\
<div>{}{}</div></div></section>",
            rate(r.per_second),
            rate(r.rejected_per_second),
            rate(r.shed_per_second),
            chart(
                &format!("route {}: requests and rejections per second", r.route),
                &[(&h.requests, "allowed", "requests"), (&h.rejected, "rejected", "429 and 503")],
                (560, 120),
                true
            ),
            chart(
                &format!("route {}: upstream p99 (ms)", r.route),
                &[(&h.upstream_p99_ms, "latency", "upstream p99, ms")],
                (560, 70),
                true
            ),
            name = esc(&r.route),
            id = esc(&r.route.replace(|c: char| !c.is_ascii_alphanumeric(), "-")),
        );
    }
    out
}

/// The adaptive page's live part.
pub fn adaptive_page(rows: &[RouteRow]) -> String {
    let mut out = String::new();
    for r in rows {
        let Some(a) = &r.adaptive else { continue };
        let mut shed = String::new();
        for s in &a.shed_by_priority {
            let _ = write!(
                shed,
                "<tr><th scope=\"row\">{}</th><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&s.code),
                rate(s.per_second),
                count(s.total)
            );
        }
        let reasons: Vec<String> = (a.shed_by_reason.iter())
            .map(|(reason, n)| format!("{} {}", esc(reason), count(*n)))
            .collect();
        let h = &r.history;
        let _ = write!(
            out,
            "<section class=\"route\" data-adaptive=\"{name}\" aria-labelledby=\"adaptive-{id}\"><h2 id=\"adaptive-{id}\">Route {name}</h2>\
<dl class=\"cards\"><div><dt>Limit</dt><dd>{}</dd></div><div><dt>In flight</dt><dd>{}</dd></div><div><dt>Queued</dt><dd>{}</dd></div><div><dt>Latency / baseline</dt><dd>{} / {}</dd></div><div><dt>Admitted</dt><dd>{}</dd></div></dl>\
<div class=\"two\"><div>{}{}</div><table><caption>Shed by priority (as <code>tollgate_proxy_adaptive_shed_by_priority_total</code>); by reason since start: {}</caption><thead><tr><th scope=\"col\">Priority</th><th scope=\"col\">Per second</th><th scope=\"col\">Since start</th></tr></thead><tbody>{shed}</tbody></table></div></section>",
            count(a.limit),
            count(a.in_flight),
            count(a.queued),
            ms_text(a.latency_ms),
            ms_text(a.baseline_ms),
            count(a.admitted),
            chart(
                &format!("route {}: limit, in flight and queued", r.route),
                &[(&h.limit, "limit", "limit"), (&h.in_flight, "allowed", "in flight"), (&h.queued, "rejected", "queued")],
                (560, 120),
                true
            ),
            chart(
                &format!("route {}: latency and baseline (ms)", r.route),
                &[(&h.latency_ms, "latency", "latency, ms"), (&h.baseline_ms, "limit", "baseline, ms")],
                (560, 90),
                true
            ),
            if reasons.is_empty() { "–".to_string() } else { reasons.join(", ") },
            name = esc(&r.route),
            id = esc(&r.route.replace(|c: char| !c.is_ascii_alphanumeric(), "-")),
        );
    }
    if out.is_empty() {
        return "<p>No route has an adaptive limit (<code>adaptive:</code> on a route turns one on).</p>".into();
    }
    out
}

/// The proxy's overview: its requests, each route at a glance, and the process.
pub fn overview_page(fig: &Figures) -> String {
    let o = &fig.overview;
    let store = store_line(o);
    let mut rows = String::new();
    for r in &fig.routes {
        let _ = write!(
            rows,
            "<tr data-route=\"{}\"><th scope=\"row\">{}</th><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(&r.route),
            esc(&r.route),
            rate(r.per_second),
            rate(r.rejected_per_second),
            rate(r.shed_per_second),
            ms_text(r.upstream_ms.map(|l| l.p99)),
            r.adaptive.as_ref().map_or("–".into(), |a| count(a.limit)),
        );
    }
    let h = &fig.history;
    format!(
        "<section aria-labelledby=\"now\"><h2 id=\"now\">Now</h2><dl class=\"cards\">\
<div><dt>Passed /s</dt><dd>{}</dd></div><div><dt>Rejected /s (429, 503)</dt><dd>{}</dd></div><div><dt>Store</dt><dd>{store}</dd></div><div><dt>Routes</dt><dd>{}</dd></div></dl></section>\
<section aria-labelledby=\"chart\"><h2 id=\"chart\">Requests per second</h2>{}</section>\
<section aria-labelledby=\"by-route\"><h2 id=\"by-route\">By route</h2><table><thead><tr><th scope=\"col\">Route</th><th scope=\"col\">Requests /s</th><th scope=\"col\">429 /s</th><th scope=\"col\">503 /s</th><th scope=\"col\">Upstream p99</th><th scope=\"col\">Adaptive limit</th></tr></thead><tbody>{rows}</tbody></table></section>\
<section aria-labelledby=\"totals\"><h2 id=\"totals\">Since start</h2><table><thead><tr><th scope=\"col\">Passed</th><th scope=\"col\">Rejected (429, 503)</th><th scope=\"col\">Reloads ok</th><th scope=\"col\">Reloads refused</th><th scope=\"col\">Version</th><th scope=\"col\">Up</th></tr></thead>\
<tbody><tr data-row=\"totals\"><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{} ({})</td><td>{}</td></tr></tbody></table></section>",
        rate(o.per_second.allowed),
        rate(o.per_second.rejected),
        fig.routes.len(),
        chart(
            "requests passed and rejected per second",
            &[(&h.allowed, "allowed", "passed"), (&h.rejected, "rejected", "rejected (429, 503)")],
            (720, 160),
            true
        ),
        count(o.decisions.allowed),
        count(o.decisions.rejected),
        count(o.reloads_ok),
        count(o.reloads_failed),
        esc(&o.version),
        esc(&o.commit),
        super::pages::uptime(o.uptime_seconds),
    )
}
