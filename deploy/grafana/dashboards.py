#!/usr/bin/env python3
"""Writes the Grafana dashboards for `tollgate serve` and `tollgate proxy`
(tollgate-serve.json, tollgate-proxy.json beside this file) from the panel lists below.

    python3 deploy/grafana/dashboards.py          # writes both files
    python3 deploy/grafana/dashboards.py --check  # fails if a file is not what it writes

Every query selects `job=~"$job",instance=~"$instance"` (written SEL below); the
data source is a variable, so a dashboard imports into any Grafana (10 or later) as it
is. The test suite evaluates every expression here against a real Prometheus
(crates/tollgate-server/tests/prometheus.rs).
"""
import json
import os
import sys

SEL = 'job=~"$job",instance=~"$instance"'
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "[$__rate_interval]"


def q(expr, legend="", instant=False, table=False):
    """A query; `SEL` and `RATE` in `expr` are spelled out."""
    target = {
        "datasource": DS,
        "expr": expr.replace("SEL", SEL).replace("RATE", RATE),
        "legendFormat": legend or "__auto",
    }
    if instant:
        target["instant"] = True
        target["range"] = False
    if table:
        target["format"] = "table"
    return target


def panel(kind, title, targets, unit="short", desc="", w=12, h=8, **extra):
    return {"type": kind, "title": title, "description": desc, "datasource": DS,
            "targets": targets, "w": w, "h": h, "unit": unit, **extra}


def series(title, targets, unit="short", desc="", w=12, h=8, stack=False):
    return panel("timeseries", title, targets, unit, desc, w, h, stack=stack)


def stat(title, target, unit="short", desc="", mappings=None):
    return panel("stat", title, [target], unit, desc, w=4, h=4, mappings=mappings)


def bars(title, target, unit="percentunit", desc=""):
    target["instant"], target["range"] = True, False  # the top 10 now, not at any time
    return panel("bargauge", title, [target], unit, desc)


def table(title, target, desc="", w=12, value=None):
    """A table of an instant query's labels; `value` names the value's column (none
    without it)."""
    return panel("table", title, [target], "short", desc, w=w, value=value)


def quantiles(metric, by, legend, match="SEL"):
    """p50 and p99 of histogram `metric`, by the labels `by`."""
    sel = "{" + match + "}"
    return [q(f"histogram_quantile({p}, sum by ({by}le) (rate({metric}_bucket{sel}RATE)))",
              f"p{int(float(p) * 100)} {legend}") for p in ("0.5", "0.99")]


RELOAD_MAPPINGS = [{"type": "value", "options": {
    "0": {"text": "rejected", "color": "red"}, "1": {"text": "in force", "color": "green"}}}]


def process_row():
    return ("Process", [
        series("CPU", [q("rate(process_cpu_seconds_total{SEL}RATE)", "{{instance}}")],
               "percentunit", "CPU time per second (1 = one core)", w=6),
        series("Resident memory", [q("process_resident_memory_bytes{SEL}", "{{instance}}")],
               "bytes", w=6),
        series("Open files", [q("process_open_fds{SEL}", "{{instance}}"),
                              q("process_max_fds{SEL}", "limit {{instance}}")],
               desc="Each connection is one", w=6),
        series("Threads", [q("process_threads{SEL}", "{{instance}}")], w=6),
    ])


def redis_row(extra):
    return ("Store (Redis)", [
        series("Redis call time", quantiles("tollgate_redis_call_duration_seconds",
                                            "store, kind, ", "{{store}} {{kind}}"), "s",
               "From sending a call to its answer, its error or the timeout"),
        series("Redis call errors",
               [q("sum by (store, kind) (rate(tollgate_redis_call_errors_total{SEL}RATE))",
                  "{{store}} {{kind}}")], "ops",
               "Calls that failed or passed the store's timeout"),
        series("Checks per Redis call",
               [q("sum by (store) (rate(tollgate_redis_batch_checks_sum{SEL}RATE))"
                  " / sum by (store) (rate(tollgate_redis_batch_checks_count{SEL}RATE))",
                  "{{store}}")],
               desc="Batching at work: checks each decision call carried"),
    ] + extra)


SERVE = [
    ("Overview", [
        stat("Decisions", q("sum(rate(tollgate_decisions_total{SEL,domain=~\"$domain\"}RATE))"),
             "ops", "Descriptor decisions per second"),
        stat("Rejected", q("sum(rate(tollgate_decisions_total{SEL,domain=~\"$domain\",outcome=\"rejected\"}RATE))"
                           " / sum(rate(tollgate_decisions_total{SEL,domain=~\"$domain\"}RATE))"),
             "percentunit", "Share of decisions over a limit"),
        stat("Decision time p99", q("histogram_quantile(0.99, sum by (le) (rate(tollgate_decision_duration_seconds_bucket{SEL}RATE)))"),
             "s", "Envoy's rate limit filter gives up after 20 ms by default"),
        stat("Redis failing", q("max(tollgate_redis_events{SEL,event=\"failing\"})"),
             desc="1 while the Redis store fails (the store's on_error decides)",
             mappings=[{"type": "value", "options": {"0": {"text": "no", "color": "green"},
                                                     "1": {"text": "FAILING", "color": "red"}}}]),
        stat("Last rule reload", q("min(tollgate_config_last_reload_successful{SEL})"),
             desc="Rejected: a reload failed and the previous rules stay in force",
             mappings=RELOAD_MAPPINGS),
        stat("Up for", q("time() - max(process_start_time_seconds{SEL})"), "s",
             "Since the newest instance started"),
        table("Builds", q("tollgate_build_info{SEL}", instant=True, table=True),
              "Version and commit of each instance", w=24),
    ]),
    ("Decisions", [
        series("Decisions by outcome",
               [q("sum by (outcome) (rate(tollgate_decisions_total{SEL,domain=~\"$domain\"}RATE))",
                  "{{outcome}}")], "ops", stack=True),
        series("Rejections by rule (top 10)",
               [q("topk(10, sum by (domain, rule) (rate(tollgate_decisions_total{SEL,domain=~\"$domain\",outcome=\"rejected\"}RATE)))",
                  "{{rule}}")], "ops"),
        bars("Rules nearest their limit",
             q("topk(10, sum by (domain, rule) (rate(tollgate_rate_limit_hits_total{SEL,domain=~\"$domain\",stat=~\"near_limit|over_limit\"}RATE))"
               " / sum by (domain, rule) (rate(tollgate_rate_limit_hits_total{SEL,domain=~\"$domain\",stat=\"total_hits\"}RATE)))",
               "{{rule}}"),
             desc="Share of each rule's hits past the near-limit ratio (0.8 of the limit) or over it, per key: the rules whose keys run closest to their limits"),
        bars("Rate against the limit",
             q("topk(10, sum by (domain, rule) (rate(tollgate_rate_limit_hits_total{SEL,domain=~\"$domain\",stat=\"total_hits\"}RATE))"
               " / on (domain, rule) min by (domain, rule) (tollgate_rule_limit{SEL,domain=~\"$domain\"} / tollgate_rule_window_seconds{SEL,domain=~\"$domain\"}))",
               "{{rule}}"),
             desc="Hits per second over the tightest policy's limit per second. Exact for a rule of one value (path=/login); a rule keyed by the request's values (user) has a limit per key, so this sums its keys"),
        series("Shadow mode",
               [q("sum by (domain, rule) (rate(tollgate_decisions_total{SEL,domain=~\"$domain\",outcome=\"shadow_rejected\"}RATE))",
                  "{{rule}}"),
                q("sum(rate(tollgate_global_shadow_mode_total{SEL}RATE))", "service.shadow_mode")],
               "ops", "Over a limit, admitted by the rule's shadow_mode or the service's"),
        series("Counters held (memory store)",
               [q("sum by (domain, rule) (tollgate_keys{SEL,domain=~\"$domain\"})", "{{rule}}")]),
        table("Limits in force",
              q("max by (domain, rule, policy) (tollgate_rule_limit{SEL,domain=~\"$domain\"})",
                instant=True, table=True),
              "Each rule's policies and their headline limits", w=24, value="limit"),
    ]),
    ("Calls and latency", [
        series("Calls by method and code",
               [q("sum by (api, method, code) (rate(tollgate_requests_total{SEL}RATE)) > 0",
                  "{{api}} {{method}} {{code}}")], "reqps"),
        series("Errors by method and code",
               [q("sum by (api, method, code) (rate(tollgate_requests_total{SEL,code!~\"OK|200|429\"}RATE))",
                  "{{api}} {{method}} {{code}}")], "reqps",
               "Calls answered other than OK, 200 or 429 (a 429 is a decision)"),
        series("Decision time", [
            q(f"histogram_quantile({p}, sum by (le) (rate(tollgate_decision_duration_seconds_bucket{{SEL}}RATE)))",
              f"p{n}") for p, n in (("0.5", 50), ("0.9", 90), ("0.99", 99))],
               "s", "To decide one request, all its descriptors"),
        series("Call time by method",
               quantiles("tollgate_request_duration_seconds", "api, method, ", "{{api}} {{method}}"),
               "s"),
    ]),
    redis_row([
        series("Redis failing and fallbacks",
               [q("max by (instance) (tollgate_redis_events{SEL,event=\"failing\"})", "failing {{instance}}"),
                q("sum by (instance) (rate(tollgate_redis_store_events_total{SEL,event=\"fallback_decisions\"}RATE))",
                  "on_error decisions/s {{instance}}")],
               desc="failing is 1 while Redis fails; then the store's on_error decides"),
        series("Leases",
               [q("sum by (event) (rate(tollgate_redis_store_events_total{SEL,event=~\"leases_taken|leases_returned|leases_expired|lease_local_decisions\"}RATE))",
                  "{{event}}")], "ops"),
    ]),
    ("Envoy quota buckets (RLQS)", [
        series("Demand and assignments",
               [q("sum by (domain, bucket, figure) (tollgate_quota_bucket{SEL,figure=~\"demand_per_second|assigned_per_second\"})",
                  "{{bucket}} {{figure}}")], "reqps",
               "What each bucket's Envoys asked for and were assigned, per second"),
        series("Envoys per bucket",
               [q("sum by (domain, bucket) (tollgate_quota_bucket{SEL,figure=\"clients\"})", "{{bucket}}")]),
        series("Reported requests",
               [q("sum by (domain, bucket, outcome) (rate(tollgate_quota_reported_requests_total{SEL}RATE))",
                  "{{bucket}} {{outcome}}")], "reqps", "What the Envoys' usage reports counted"),
        series("Quota streams open", [q("sum by (instance) (tollgate_quota_streams{SEL})", "{{instance}}")]),
    ]),
    ("Workers, reloads, TLS, xDS, traces", [
        series("Worker busy share", [q("tollgate_worker_busy_ratio{SEL}", "{{instance}} {{worker}}")],
               "percentunit", w=8),
        series("Worker connections", [q("tollgate_worker_connections{SEL}", "{{instance}} {{worker}}")],
               w=8),
        series("Rule reloads",
               [q("sum by (instance, result) (increase(tollgate_config_reloads_total{SEL}RATE))",
                  "{{result}} {{instance}}"),
                q("tollgate_config_last_reload_successful{SEL}", "last in force {{instance}}")],
               desc="Files, SIGHUP, POST /v1/reload and xDS versions", w=8),
        series("Certificate days left", [q("tollgate_tls_certificate_expiry_days{SEL}",
                                           "{{instance}} {{listener}}")], "d", w=8),
        series("xDS", [q("tollgate_xds_events{SEL,event=\"stream_up\"}", "stream up {{instance}}"),
                       q("sum by (instance, event) (increase(tollgate_xds_stream_events_total{SEL,event=~\"versions_acked|versions_nacked\"}RATE))",
                         "{{event}} {{instance}}")],
               desc="Rules over xDS: the stream, and the versions acked and refused", w=8),
        series("Trace spans", [q("sum by (outcome) (rate(tollgate_trace_spans_total{SEL}RATE))", "{{outcome}}")],
               "ops", "Exported, dropped (queue full) and failed exports", w=8),
    ]),
    process_row(),
]

ROUTE = 'route=~"$route"'
PROXY = [
    ("Overview", [
        stat("Requests", q(f"sum(rate(tollgate_proxy_requests_total{{SEL,{ROUTE}}}RATE))"), "reqps"),
        stat("Rejected (429)", q(f"sum(rate(tollgate_proxy_requests_total{{SEL,{ROUTE},code=\"429\"}}RATE))"
                                 f" / sum(rate(tollgate_proxy_requests_total{{SEL,{ROUTE}}}RATE))"),
             "percentunit", "Share refused by the routes' rate limits"),
        stat("5xx", q(f"sum(rate(tollgate_proxy_requests_total{{SEL,{ROUTE},code=~\"5..\"}}RATE))"
                      f" / sum(rate(tollgate_proxy_requests_total{{SEL,{ROUTE}}}RATE))"),
             "percentunit", "limit_conn and adaptive 503s, upstream 502 and 504, and the upstream's own"),
        stat("Upstream p99", q(f"histogram_quantile(0.99, sum by (le) (rate(tollgate_proxy_upstream_duration_seconds_bucket{{SEL,{ROUTE}}}RATE)))"),
             "s"),
        stat("Last reload", q("min(tollgate_proxy_config_last_reload_successful{SEL})"),
             desc="Rejected: a reload failed and the previous routes stay in force",
             mappings=RELOAD_MAPPINGS),
        stat("Up for", q("time() - max(process_start_time_seconds{SEL})"), "s"),
        table("Builds", q("tollgate_build_info{SEL}", instant=True, table=True), w=24),
    ]),
    ("Routes", [
        series("Requests by route and status",
               [q(f"sum by (route, code) (rate(tollgate_proxy_requests_total{{SEL,{ROUTE}}}RATE))",
                  "{{route}} {{code}}")], "reqps"),
        series("Rejections by route",
               [q(f"sum by (route, code) (rate(tollgate_proxy_requests_total{{SEL,{ROUTE},code=~\"429|503\"}}RATE))",
                  "{{route}} {{code}}")], "reqps",
               "429: the route's rate limits; 503: limit_conn or the adaptive limit"),
        series("Upstream time", quantiles("tollgate_proxy_upstream_duration_seconds", "route, ",
                                          "{{route}}", f"SEL,{ROUTE}"), "s",
               "From sending the request upstream to its response head"),
    ]),
    ("Adaptive limits", [
        series("Limit, in flight, queued",
               [q(f"sum by (route) (tollgate_proxy_adaptive_{m}{{SEL,{ROUTE}}})", f"{{{{route}}}} {m}")
                for m in ("limit", "in_flight", "queued")]),
        series("Latency against baseline",
               [q(f"max by (route) (tollgate_proxy_adaptive_{m}_seconds{{SEL,{ROUTE}}})", f"{{{{route}}}} {m}")
                for m in ("latency", "baseline", "queue_delay")], "s",
               "The last window's trimmed mean, the unloaded latency, the queueing-delay target"),
        series("Shed by reason",
               [q(f"sum by (route, reason) (rate(tollgate_proxy_adaptive_shed_total{{SEL,{ROUTE}}}RATE))",
                  "{{route}} {{reason}}")], "reqps"),
        series("Shed by priority",
               [q(f"sum by (route, priority) (rate(tollgate_proxy_adaptive_shed_by_priority_total{{SEL,{ROUTE}}}RATE))",
                  "{{route}} {{priority}}"),
                q(f"sum by (route) (rate(tollgate_proxy_adaptive_admitted_total{{SEL,{ROUTE}}}RATE))",
                  "{{route}} admitted")], "reqps",
               "Critical traffic shed means the limit is below what the upstream must serve"),
    ]),
    ("Costs", [
        series("Units used", [q(f"sum by (route) (rate(tollgate_proxy_cost_usage_units_total{{SEL,{ROUTE}}}RATE))",
                                "{{route}}")], desc="Per second: the usage responses reported, or the estimate"),
        series("Responses by usage found",
               [q(f"sum by (route, outcome) (rate(tollgate_proxy_cost_responses_total{{SEL,{ROUTE}}}RATE))",
                  "{{route}} {{outcome}}")], "reqps",
               "missing and invalid are charged the estimate"),
    ]),
    redis_row([]),
    ("Reloads and TLS", [
        series("Reloads",
               [q("sum by (instance, result) (increase(tollgate_proxy_config_reloads_total{SEL}RATE))",
                  "{{result}} {{instance}}"),
                q("tollgate_proxy_config_last_reload_successful{SEL}", "last in force {{instance}}")]),
        series("Certificate days left", [q("tollgate_proxy_tls_certificate_expiry_days{SEL}",
                                           "{{instance}} {{listener}}")], "d"),
    ]),
    process_row(),
]


def variable(name, label, query, hide=0):
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": name}, "definition": query,
            "refresh": 2, "multi": True, "includeAll": True, "allValue": ".+",
            "current": {"text": "All", "value": "$__all"}, "sort": 1, "hide": hide,
            "options": [], "regex": ""}


def layout(rows):
    panels, y, ident = [], 0, 1
    for title, items in rows:
        panels.append({"type": "row", "title": title, "collapsed": False, "id": ident,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        ident, y, x, row_h = ident + 1, y + 1, 0, 0
        for p in items:
            if x + p["w"] > 24:
                x, y, row_h = 0, y + row_h, 0
            out = {k: v for k, v in p.items()
                   if k not in ("w", "h", "unit", "stack", "mappings", "value")}
            for i, t in enumerate(out["targets"]):
                t["refId"] = chr(ord("A") + i)
            # One neutral step: Grafana's default turns values past 80 red.
            defaults = {"unit": p["unit"], "thresholds": {"mode": "absolute", "steps": [
                {"color": "text", "value": None}]}}
            if p.get("mappings"):
                defaults["mappings"] = p["mappings"]
            if p["type"] == "timeseries":
                defaults["custom"] = {"fillOpacity": 10, "showPoints": "never",
                                      "stacking": {"mode": "normal" if p["stack"] else "none"}}
                out["options"] = {"legend": {"showLegend": True, "displayMode": "table",
                                             "placement": "bottom",
                                             "calcs": ["lastNotNull", "max"]},
                                  "tooltip": {"mode": "multi", "sort": "desc"}}
            elif p["type"] == "stat":
                out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]},
                                  "colorMode": "value", "graphMode": "area"}
            elif p["type"] == "bargauge":
                out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]},
                                  "displayMode": "gradient", "orientation": "horizontal"}
                defaults.update({"min": 0, "max": 1})
            elif p["type"] == "table":
                value = p.get("value")
                out["transformations"] = [{"id": "organize", "options": {
                    "excludeByName": {"Time": True, "Value": not value, "__name__": True},
                    "renameByName": {"Value": value} if value else {}}}]
            out["fieldConfig"] = {"defaults": defaults, "overrides": []}
            out["gridPos"] = {"h": p["h"], "w": p["w"], "x": x, "y": y}
            out["id"] = ident
            panels.append(out)
            ident, x, row_h = ident + 1, x + p["w"], max(row_h, p["h"])
        y += row_h
    return panels


def dashboard(uid, title, description, rows, extra_vars, own):
    """`own`: a metric only this server exports, whose targets the job and instance
    variables list (both servers export tollgate_build_info)."""
    return {
        "uid": uid, "title": title, "description": description,
        "tags": ["tollgate", "rate-limiting"], "timezone": "browser", "editable": True,
        "graphTooltip": 1, "refresh": "30s", "schemaVersion": 39, "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []}, "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "options": [], "refresh": 1,
             "regex": ""},
            variable("job", "Job", f"label_values({own}, job)"),
            variable("instance", "Instance", f'label_values({own}{{job=~"$job"}}, instance)'),
        ] + extra_vars},
        "panels": layout(rows),
    }


DASHBOARDS = {
    "tollgate-serve.json": dashboard(
        "tollgate-serve", "tollgate serve",
        "Decisions and rejections by rule, limits, latency, the Redis store, RLQS quota buckets, reloads",
        SERVE, [variable("domain", "Domain", 'label_values(tollgate_rule_limit{job=~"$job"}, domain)')],
        "tollgate_config_last_reload_successful"),
    "tollgate-proxy.json": dashboard(
        "tollgate-proxy", "tollgate proxy",
        "Requests and rejections by route, upstream latency, adaptive limits and shedding, costs, reloads",
        PROXY, [variable("route", "Route", 'label_values(tollgate_proxy_requests_total{job=~"$job"}, route)')],
        "tollgate_proxy_config_last_reload_successful"),
}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    stale = []
    for name, board in DASHBOARDS.items():
        text = json.dumps(board, indent=2) + "\n"
        path = os.path.join(here, name)
        if "--check" in sys.argv:
            with open(path) as f:
                if f.read() != text:
                    stale.append(name)
        else:
            with open(path, "w") as f:
                f.write(text)
    if stale:
        sys.exit(f"{', '.join(stale)}: not what deploy/grafana/dashboards.py writes; run it")


if __name__ == "__main__":
    main()
