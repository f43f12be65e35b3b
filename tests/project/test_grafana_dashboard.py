"""deploy/grafana/autoclusters.json queries only series the code exports.

Aspects covered:
- every PromQL expression of the dashboard (panel targets and template variables) names
  only series the worker's and the API's registries export (a histogram's _bucket, _sum,
  _count; a counter's _total), or that the node agent exports (its dcgm-exporter and
  node-exporter names, clients/agent/dcgm_series.py and ib_series.py);
- every panel kind the Command Center needs is there: incidents, step durations, job and
  capacity recovery, the fleet guard, alerts, Slack, each GPU series per node;
- the PromQL name extraction itself, on expressions with labels, ranges, groupings,
  functions and Grafana variables.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from temporalio.client import Client

from autoclusters.clients.agent import dcgm_series, ib_series
from autoclusters.clients.api.metrics import ApiMetrics
from autoclusters.workers.metrics import WorkerMetrics
from autoclusters.workers.metrics_collector import TemporalCollector

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "autoclusters.json"

# The node agent's /metrics (clients/agent/metrics.py): dcgm-exporter's and node-exporter's.
AGENT_SERIES = (
    {name for name, *_ in dcgm_series.FIELDS}
    | {dcgm_series.XID_ERRORS, dcgm_series.XID_COUNT}
    | {ib_series.PREFIX + key for key in ib_series.HELP}
    | {ib_series.PREFIX + name for name, _ in ib_series.COUNTERS.values()}
)
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
}
# PromQL words that look like names: aggregation modifiers, operators, literals.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
KEYWORDS |= {"and", "or", "unless", "inf", "nan", "atan2"}


def exported(registry: CollectorRegistry) -> set[str]:
    names = set()
    for fam in registry.collect():
        names |= {fam.name + s for s in SUFFIXES.get(fam.type, ("",))}
    return names


def series_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", e)  # label matchers, ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        rest = e[m.end() :].lstrip()
        if rest.startswith("(") or m.group() in KEYWORDS:
            continue  # a function call or a keyword
        if m.start() > 0 and e[m.start() - 1] in "$.0123456789":
            continue  # a Grafana variable, or a number's exponent
        names.add(m.group())
    return names


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and template variable query."""
    out = []
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", q)
            out.append((f"${v['name']}", m.group(1) if m else q))
    return out


def test_the_name_extraction() -> None:
    assert series_in(
        'histogram_quantile(0.99, sum by (le, activity) (rate(a_seconds_bucket{outcome="ok",'
        'x=~"$cluster"}[$__rate_interval]))) / on(job) group_left(node) b_total offset 5m'
    ) == {"a_seconds_bucket", "b_total"}
    assert series_in("max by (Hostname, gpu) (DCGM_FI_DEV_XID_ERRORS) > 1e3") == {
        "DCGM_FI_DEV_XID_ERRORS"
    }
    assert series_in("sum(rate(x_total[5m])) and y") == {"x_total", "y"}


async def test_every_query_names_an_exported_series() -> None:
    nowhere = await Client.connect("127.0.0.1:1", lazy=True)
    worker = WorkerMetrics()
    # Built on this loop, a scrape from it serves the (empty) cache: names, not values.
    worker.registry.register(TemporalCollector(nowhere))
    known = exported(worker.registry) | exported(ApiMetrics().registry) | AGENT_SERIES
    dashboard = json.loads(DASHBOARD.read_text())
    found = expressions(dashboard)
    assert len(found) >= 20
    unknown = {
        (where, name) for where, expr in found for name in series_in(expr) if name not in known
    }
    assert not unknown, f"queries name series nobody exports: {sorted(unknown)}"
    assert all(series_in(expr) for _, expr in found), "a query that reads no series"


def test_the_dashboard_shows_what_the_command_center_needs() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = {name for _, expr in expressions(dashboard) for name in series_in(expr)}
    needed = {
        "autoclusters_incidents",
        "autoclusters_incidents_closed_total",
        "autoclusters_worker_step_duration_seconds_bucket",
        "autoclusters_incident_job_recovery_seconds_bucket",
        "autoclusters_incident_capacity_recovery_seconds_bucket",
        "autoclusters_guard_breaker_tripped",
        "autoclusters_guard_waiting",
        "autoclusters_guard_admissions_total",
        "autoclusters_api_alerts_received_total",
        "autoclusters_api_alerts_deduplicated_total",
        "autoclusters_api_alerts_rejected_total",
        "autoclusters_api_alerts_truncated_total",
        "autoclusters_slack_deliveries_total",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_XID_ERRORS",
    }
    assert needed <= used, sorted(needed - used)
    gpu = [e for _, e in expressions(dashboard) if "DCGM_FI_DEV_" in e and "(" in e]
    assert all("Hostname" in e for e in gpu), "GPU panels are per node (Hostname)"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_agent_list_is_the_agents() -> None:
    """The names above are the agent's own (a change there shows up here)."""
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS"} <= AGENT_SERIES
    assert "node_infiniband_link_downed_total" in AGENT_SERIES
