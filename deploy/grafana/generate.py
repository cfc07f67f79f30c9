#!/usr/bin/env python3
"""Generates deploy/grafana/kvgate.json (the committed dashboard) from the panel list below.

Edit the panels here, then:  python3 deploy/grafana/generate.py > deploy/grafana/kvgate.json
go test ./deploy/ checks that the JSON matches this script and that every metric and label exists
in pkg/metrics. Standard library only.
"""
import json

SEL = 'instance=~"$instance",service=~"$service"'
RI = '$__rate_interval'
pid = [0]
panels = []
y = [0]

def nid():
    pid[0] += 1
    return pid[0]

def row(title):
    panels.append({"type": "row", "title": title, "id": nid(), "collapsed": False,
                   "gridPos": {"h": 1, "w": 24, "x": 0, "y": y[0]}, "panels": []})
    y[0] += 1

x = [0]
rowh = [0]

def place(w, h):
    if x[0] + w > 24:
        x[0] = 0
        y[0] += rowh[0]
        rowh[0] = 0
    g = {"h": h, "w": w, "x": x[0], "y": y[0]}
    x[0] += w
    rowh[0] = max(rowh[0], h)
    return g

def flush():
    if x[0]:
        y[0] += rowh[0]
    x[0] = 0
    rowh[0] = 0

def ts(title, targets, unit="short", w=12, h=8, desc="", stack=False, kind="timeseries"):
    p = {"type": kind, "title": title, "id": nid(), "gridPos": place(w, h),
         "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "description": desc,
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
         "targets": []}
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                                                  "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
        p["options"] = {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
    for i, (expr, legend) in enumerate(targets):
        p["targets"].append({"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                             "datasource": {"type": "prometheus", "uid": "${datasource}"}})
    panels.append(p)
    return p

def stat(title, targets, unit="short", w=4, h=5, desc="", thresholds=None):
    p = ts(title, targets, unit, w, h, desc, kind="stat")
    p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "background", "graphMode": "area", "textMode": "auto"}
    if thresholds:
        p["fieldConfig"]["defaults"]["thresholds"] = {"mode": "absolute", "steps": thresholds}
    return p

green_red = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
red_green = [{"color": "red", "value": None}, {"color": "green", "value": 1}]

# ---------------- Engagement (docs/deploy.md, go/no-go) ----------------
row("Engagement: is KV-aware routing deciding? (spec §9)")
stat("Tier-1.5 hits (range)",
     [(f'sum(increase(loxilb_pd_kv_tier15_hits_total{{{SEL}}}[$__range]))', "hits")],
     desc="Must advance on warm traffic. Flat while blocks > 0 means broken parity: you are measuring the fallback (spec §9.1).",
     thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}])
stat("Hit ratio",
     [(f'sum(rate(loxilb_pd_kv_tier15_hits_total{{{SEL}}}[{RI}])) / clamp_min(sum(rate(kvgate_decisions_total{{{SEL}}}[{RI}])), 1e-9)', "hit ratio")],
     unit="percentunit", desc="Tier-1.5 hits over all routing decisions.")
stat("Fallthrough ratio",
     [(f'sum(rate(loxilb_pd_kv_tier15_fallthrough_total{{{SEL}}}[{RI}])) / clamp_min(sum(rate(kvgate_decisions_total{{{SEL}}}[{RI}])), 1e-9)', "fallthrough")],
     unit="percentunit", desc="Requests that left the KV tier for the topology fallback. Should stay low under warm traffic.",
     thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 0.3}, {"color": "red", "value": 0.6}])
stat("Zero-hit watchdog (range)",
     [('sum(increase(loxilb_pd_kv_zero_hit_watchdog_total{instance=~"$instance",service_id=~"$service"}[$__range]))', "watchdog")],
     desc=f"Lookups after LOXILB_KV_ZERO_HIT_N consecutive zero-overlap lookups against a non-empty inventory: a parity alarm (seed, block size, hash algorithm or tokenizer).",
     thresholds=green_red)
stat("Subscribers connected",
     [(f'sum(loxilb_kv_subscriber_connected{{{SEL}}})', "connected"),
      (f'count(loxilb_kv_subscriber_connected{{{SEL}}})', "subscribed endpoints")],
     desc="Should equal the number of subscribed (prefill, in mode 1) endpoints per gateway (spec §9.3).")
stat("Inventory blocks",
     [(f'sum(loxilb_pd_kv_blocks{{{SEL}}})', "blocks")],
     desc="Mirrored blocks over all subscribed endpoints. Zero after warm traffic: events are not arriving (spec §9.1, §9.2).",
     thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}])
flush()

# ---------------- KV tier ----------------
row("KV tier (Tier 1.5)")
ts("Tier-1.5 hits by endpoint",
   [(f'sum by (service, ep_idx) (rate(loxilb_pd_kv_tier15_hits_total{{{SEL}}}[{RI}]))', "s{{service}} ep{{ep_idx}}")],
   unit="reqps", desc="loxilb_pd_kv_tier15_hits_total: the decision proof.", stack=True)
ts("Miss reasons",
   [(f'sum by (reason) (rate(loxilb_pd_kv_tier15_miss_reason_total{{{SEL}}}[{RI}]))', "{{reason}}")],
   unit="reqps", stack=True,
   desc="Guard ladder misses (spec §7): no_worker = no endpoint overlaps; tokenize = tokenizer missing for the model slug; model_empty = no model in body/X-Model; shallow = overlap below LLB_KV_MIN_MATCH_TOKENS.")
ts("Fallthrough",
   [(f'sum by (service) (rate(loxilb_pd_kv_tier15_fallthrough_total{{{SEL}}}[{RI}]))', "s{{service}} fallthrough"),
    (f'sum by (service) (rate(kvgate_decisions_total{{{SEL}}}[{RI}]))', "s{{service}} all decisions")],
   unit="reqps")
ts("Decisions by tier",
   [(f'sum by (tier) (rate(kvgate_decisions_total{{{SEL}}}[{RI}]))', "tier {{tier}}")],
   unit="reqps", stack=True, desc="1-session, 1-trie, 1.5 (KV overlap), 2 (P/D min-load), selector (mode-3 fallback), decode-only.")
ts("Spills by endpoint",
   [(f'sum by (service, ep_idx) (rate(loxilb_pd_kv_tier15_spills_total{{{SEL}}}[{RI}]))', "s{{service}} ep{{ep_idx}}")],
   unit="reqps", desc="Decisions the bounded-load blend moved off the best-overlap endpoint (LOXILB_KV_LB_MODE).")
ts("Cold seeds by endpoint",
   [(f'sum by (service, ep_idx) (rate(loxilb_pd_kv_tier15_cold_seeds_total{{{SEL}}}[{RI}]))', "s{{service}} ep{{ep_idx}}")],
   unit="reqps", desc="Hits redirected to a cold endpoint (LOXILB_KV_COLDSTART_SEED_N).")
ts("Zero-hit watchdog",
   [('sum by (instance, service_id) (rate(loxilb_pd_kv_zero_hit_watchdog_total{instance=~"$instance",service_id=~"$service"}[$__rate_interval]))', "{{instance}} s{{service_id}}")],
   unit="reqps", desc="Non-zero = parity alarm: walk docs/deploy.md's preflight.")
ts("Tier-1 affinity hits",
   [(f'sum by (service) (rate(kvgate_tier1_session_hits_total{{{SEL}}}[{RI}]))', "s{{service}} session"),
    (f'sum by (service) (rate(kvgate_tier1_trie_hits_total{{{SEL}}}[{RI}]))', "s{{service}} trie")],
   unit="reqps")
flush()

# ---------------- Inventory and subscribers ----------------
row("Inventory and KV-event subscribers")
ts("Inventory blocks per endpoint",
   [(f'max by (service, ep_idx) (loxilb_pd_kv_blocks{{{SEL}}})', "s{{service}} ep{{ep_idx}}")],
   desc="Mirrored GPU blocks per subscribed endpoint (prefill endpoints in mode 1). Zero after warm traffic: kvZmqPort, ep_role or kvBlockSize is wrong (spec §9.2).")
ts("Subscriber connected",
   [(f'min by (service, ep) (loxilb_kv_subscriber_connected{{{SEL}}})', "s{{service}} ep{{ep}}")],
   desc="1 when every rank of the endpoint's ZeroMQ subscriber is connected (ep = ep_idx). Should equal the number of prefill endpoints (spec §9.3).")
ts("Subscriber reconnects and receive errors",
   [(f'sum by (service, ep) (rate(loxilb_kv_subscriber_reconnect_total{{{SEL}}}[{RI}]))', "reconnect s{{service}} ep{{ep}}"),
    (f'sum by (service, ep) (rate(loxilb_kv_subscriber_recv_error_total{{{SEL}}}[{RI}]))', "recv error s{{service}} ep{{ep}}")],
   unit="ops")
ts("Sequence gaps by kind",
   [(f'sum by (kind) (rate(kvgate_kv_subscriber_gaps_total{{{SEL}}}[{RI}]))', "{{kind}}")],
   unit="ops", desc="small gaps are refilled by replay; large gaps and restarts clear the rank's inventory.")
ts("Replays by outcome",
   [(f'sum by (outcome) (rate(kvgate_kv_subscriber_replays_total{{{SEL}}}[{RI}]))', "{{outcome}}"),
    (f'sum(rate(kvgate_kv_subscriber_replayed_batches_total{{{SEL}}}[{RI}]))', "replayed batches")],
   unit="ops")
ts("Event batches, clears and cap evictions",
   [(f'sum by (service) (rate(kvgate_kv_subscriber_batches_total{{{SEL}}}[{RI}]))', "s{{service}} live batches"),
    (f'sum by (reason) (rate(kvgate_kv_subscriber_clears_total{{{SEL}}}[{RI}]))', "clear {{reason}}"),
    (f'sum by (service) (rate(loxilb_kv_inv_cap_evictions_total{{{SEL}}}[{RI}]))', "s{{service}} cap evictions")],
   unit="ops")
flush()

# ---------------- Proxy ----------------
row("Proxy")
ts("Request rate by endpoint and outcome",
   [(f'sum by (ep_idx, outcome) (rate(kvgate_requests_total{{{SEL}}}[{RI}]))', "ep{{ep_idx}} {{outcome}}")],
   unit="reqps", stack=True)
ts("Request duration p50 / p99 by endpoint",
   [(f'histogram_quantile(0.5, sum by (le, ep_idx) (rate(kvgate_request_duration_seconds_bucket{{{SEL}}}[{RI}])))', "p50 ep{{ep_idx}}"),
    (f'histogram_quantile(0.99, sum by (le, ep_idx) (rate(kvgate_request_duration_seconds_bucket{{{SEL}}}[{RI}])))', "p99 ep{{ep_idx}}")],
   unit="s")
ts("Request duration p99 by outcome",
   [(f'histogram_quantile(0.99, sum by (le, outcome) (rate(kvgate_request_duration_seconds_bucket{{{SEL}}}[{RI}])))', "p99 {{outcome}}")],
   unit="s")
ts("Time to first byte (TTFB) quantiles",
   [(f'histogram_quantile({q}, sum by (le) (rate(loxilb_proxy_http_ttfb_seconds_bucket{{{SEL}}}[{RI}])))', f"p{int(q*100)}")
    for q in (0.5, 0.9, 0.99)],
   unit="s", desc="loxilb_proxy_http_ttfb_seconds: forwarding the request to the backend's first response byte. KV hits should pull it down.")
ts("Decision stage latency p99",
   [(f'histogram_quantile(0.99, sum by (le, stage) (rate(kvgate_decision_stage_seconds_bucket{{{SEL}}}[{RI}])))', "p99 {{stage}}")],
   unit="s", desc="extract, tokenize, hash, score, select.")
ts("Decision stage latency p50",
   [(f'histogram_quantile(0.5, sum by (le, stage) (rate(kvgate_decision_stage_seconds_bucket{{{SEL}}}[{RI}])))', "p50 {{stage}}")],
   unit="s")
ts("In-flight per endpoint",
   [(f'sum by (service, ep_idx) (kvgate_endpoint_inflight{{{SEL}}})', "s{{service}} ep{{ep_idx}}")],
   desc="The bounded-load cap's input.")
ts("Backend connect failures and select failures",
   [(f'sum by (ep_idx) (rate(kvgate_backend_connect_failures_total{{{SEL}}}[{RI}]))', "connect fail ep{{ep_idx}}"),
    (f'sum by (service) (rate(loxilb_lb_select_failure_shutdown_total{{{SEL}}}[{RI}]))', "no endpoint s{{service}}")],
   unit="ops")
flush()

# ---------------- P/D ----------------
row("P/D (kvExactMode 1) and admission")
pd = [("loxilb_pd_fallback_to_normal_total", "decode-only fallback"),
      ("loxilb_pd_admission_shed_total", "shed (429)"),
      ("loxilb_pd_admission_queued_total", "parked"),
      ("kvgate_pd_admission_park_timeout_total", "park timeout (504)"),
      ("loxilb_pd_prefill_ep_died_total", "prefill endpoint died"),
      ("loxilb_pd_decode_ep_died_total", "decode endpoint died"),
      ("loxilb_pd_decode_zero_byte_eof_total", "decode zero-byte EOF"),
      ("loxilb_pd_connect_failover_total", "prefill failover")]
ts("P/D events",
   [(f'sum(rate({m}{{{SEL}}}[{RI}]))', l) for m, l in pd], unit="ops")
ts("P/D timeouts and retries",
   [(f'sum by (kind) (rate(kvgate_pd_timeouts_total{{{SEL}}}[{RI}]))', "{{kind}}"),
    (f'sum by (leg) (rate(kvgate_pd_retries_total{{{SEL}}}[{RI}]))', "retry {{leg}}")],
   unit="ops")
ts("P/D leg latency p50 / p99",
   [(f'histogram_quantile(0.5, sum by (le, leg) (rate(kvgate_pd_leg_duration_seconds_bucket{{{SEL}}}[{RI}])))', "p50 {{leg}}"),
    (f'histogram_quantile(0.99, sum by (le, leg) (rate(kvgate_pd_leg_duration_seconds_bucket{{{SEL}}}[{RI}])))', "p99 {{leg}}")],
   unit="s", desc="prefill: to its response; decode: to its first byte.")
ts("Circuit breakers and sessions",
   [(f'max by (service, ep_idx) (kvgate_circuit_breaker_state{{{SEL}}})', "breaker s{{service}} ep{{ep_idx}} (0 closed, 1 open, 2 half-open)"),
    (f'sum by (service) (loxilb_pd_sessions_active{{{SEL}}})', "sessions s{{service}}")])
flush()

# ---------------- Health ----------------
row("Endpoint health")
ts("Probe up / admin down",
   [(f'min by (service, ep_idx) (kvgate_endpoint_probe_up{{{SEL}}})', "probe up s{{service}} ep{{ep_idx}}"),
    (f'max by (service, ep_idx) (kvgate_endpoint_admin_down{{{SEL}}})', "admin down s{{service}} ep{{ep_idx}}")])
ts("Engine queue and capacity",
   [(f'max by (service, ep_idx) (kvgate_endpoint_engine_waiting{{{SEL}}})', "waiting s{{service}} ep{{ep_idx}}"),
    (f'max by (service, ep_idx) (kvgate_endpoint_capacity_blocks{{{SEL}}})', "capacity blocks s{{service}} ep{{ep_idx}}")])
flush()

# ---------------- Data path ----------------
row("Data path and build")
p = ts("Data path in use",
   [('max by (instance, path) (kvgate_datapath_info{instance=~"$instance"})', "{{instance}} {{path}}")],
   w=8, h=6, kind="table", desc="kvgate_datapath_info: sockmap (eBPF splice) or userspace (copy).")
p["options"] = {"showHeader": True}
p["targets"][0]["format"] = "table"
p["targets"][0]["instant"] = True
ts("Spliced bytes by path",
   [('sum by (path) (rate(kvgate_spliced_bytes_total{instance=~"$instance"}[$__rate_interval]))', "{{path}}")],
   unit="Bps", w=8, h=6, desc="Response body bytes moved backend to client; the sockmap figure comes from BPF counters.")
p = ts("Build and rules",
   [('max by (instance, version, revision, goversion) (kvgate_build_info{instance=~"$instance"})', "{{instance}} {{version}}"),
    ('max by (instance) (kvgate_rules{instance=~"$instance"})', "{{instance}} rules")],
   w=8, h=6, kind="table")
p["options"] = {"showHeader": True}
for t in p["targets"]:
    t["format"] = "table"
    t["instant"] = True
flush()

dash = {
    "title": "kvgate",
    "uid": "kvgate-overview",
    "description": "kvgate: KV-cache-aware routing for vLLM fleets. Metric names: pkg/metrics, docs/api.md.",
    "tags": ["kvgate", "vllm", "llm-inference"],
    "timezone": "utc",
    "editable": True,
    "graphTooltip": 1,
    "schemaVersion": 39,
    "version": 1,
    "refresh": "30s",
    "time": {"from": "now-1h", "to": "now"},
    "__requires": [{"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
                   {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"}],
    "templating": {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "current": {}, "hide": 0, "refresh": 1},
        {"name": "instance", "label": "Gateway", "type": "query",
         "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "query": {"query": "label_values(kvgate_build_info, instance)", "refId": "instance"},
         "definition": "label_values(kvgate_build_info, instance)",
         "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1, "current": {}},
        {"name": "service", "label": "Rule (service_id)", "type": "query",
         "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "query": {"query": 'label_values(loxilb_pd_kv_tier15_fallthrough_total{instance=~"$instance"}, service)', "refId": "service"},
         "definition": 'label_values(loxilb_pd_kv_tier15_fallthrough_total{instance=~"$instance"}, service)',
         "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 3, "current": {}},
    ]},
    "annotations": {"list": []},
    "panels": panels,
}
print(json.dumps(dash, indent=2))
