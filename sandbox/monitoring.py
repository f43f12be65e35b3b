"""The sandbox's alert path: Debian's `prometheus` and `prometheus-alertmanager`, each with its
own config and data dir under the state dir (`monitoring/`) and a loopback port; never the
system services.

- Prometheus (port_base + 92) scrapes, every 2 s, each running node agent's
  dcgm-exporter-named /metrics (the file_sd list `monitoring/agents.json`, labelled `node` =
  the node's name: the shipped rules and the API read the node from it; machines/agent_targets.py),
  and, every 10 s, the worker's /metrics and the API's (what no sandbox alert waits on:
  the worker's is ~80 KB to render), and evaluates the shipped
  `deploy/prometheus/gpu-alerts.yml` itself (not a copy: the rules, their `for:` and labels,
  are the ones a real cluster loads). GpuXidError has no `for:` and fires at the first
  evaluation that sees the Xid; GpuMissing (`for: 2m`) and InfinibandLinkDown (`for: 3m`)
  fire that long after their fault, so in the sandbox the agents' direct reports find those
  first.
- Alertmanager (port_base + 93) routes with `deploy/alertmanager/alertmanager.yml` rendered
  to `monitoring/alertmanager.yml`: the webhook is the sandbox API's (same path), its bearer
  token the sandbox API's token file, and the `autoclusters` route waits 1 s before a group's
  first notification (group_wait; shipped 10 s) and 5 s between a group's notifications
  (group_interval; shipped 1 m), so a fault reaches the API in seconds. Nothing else changes.
- Kubernetes mode: job `inference-gateway` scrapes the inference gateway (port_base + 95:
  request counts, latency histogram, queue), job `inference-server` every inference pod's
  server, from the file_sd list `monitoring/inference-servers.json` the kubelet keeps.

The agents count an Xid for 20 s in the sandbox (dcgm-exporter: 5 min; sandbox/runtime/daemons.py),
so the alert resolves and the next injected Xid on that GPU fires a new one.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from autoclusters.integrations.tls import default_verify
from autoclusters.sandbox.inference import launch as inference_sandbox
from autoclusters.sandbox.machines import agent_targets
from autoclusters.sandbox.runtime import api_tokens
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.daemons import SandboxError

PROMETHEUS = "prometheus"
ALERTMANAGER = "alertmanager"
INTERVAL = "2s"  # scrape and evaluation (a real cluster: 15-30 s)
SERVICE_INTERVAL = "10s"  # the worker and the API
GROUP_WAIT, GROUP_INTERVAL = "1s", "5s"  # the sandbox copy's autoclusters route
DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
RULES = DEPLOY / "prometheus" / "gpu-alerts.yml"
ROUTING = DEPLOY / "alertmanager" / "alertmanager.yml"
AGENT_JOB, WORKER_JOB, API_JOB = agent_targets.JOB, "autoclusters-worker", "autoclusters-api"
# Kubernetes mode: the inference gateway, and each inference pod's server through the
# file_sd list the inference kubelet keeps (sandbox/inference/kubelet.py).
GATEWAY_JOB, SERVER_JOB = "inference-gateway", "inference-server"


def _dir(cfg: SandboxConfig) -> Path:
    return cfg.state_dir / "monitoring"


def _shipped(path: Path) -> Path:
    if not path.is_file():
        raise SandboxError(
            f"{path} is missing: the sandbox's Prometheus and Alertmanager load the shipped "
            "deploy/ files; run the sandbox from a checkout of the repository"
        )
    return path


def executable(*names: str) -> str:
    """The first of `names` installed (Debian names Alertmanager prometheus-alertmanager)."""
    for name in names:
        for d in ("/usr/bin", "/usr/sbin", "/bin"):
            if (Path(d) / name).is_file():
                return str(Path(d) / name)
        found = shutil.which(name)
        if found:
            return found
    raise SandboxError(
        f"{names[0]} not found: apt-get install -y prometheus prometheus-alertmanager "
        "(scripts/system-deps.sh installs them)"
    )


def _targets(port: int, **labels: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"targets": [f"127.0.0.1:{port}"]}
    if labels:
        doc["labels"] = labels
    return doc


def prometheus_config(cfg: SandboxConfig) -> dict[str, Any]:
    token = cfg.state_dir / "api" / api_tokens.READER
    return {
        "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [str(_shipped(RULES))],
        "alerting": {"alertmanagers": [{"static_configs": [_targets(cfg.alertmanager_port)]}]},
        "scrape_configs": [
            {
                "job_name": AGENT_JOB,
                # The agents that run now: a scale up's new machines join
                # (machines/agent_targets.py).
                "file_sd_configs": [{"files": [str(agent_targets.path(cfg))]}],
            },
            {
                "job_name": WORKER_JOB,
                "scrape_interval": SERVICE_INTERVAL,
                "static_configs": [_targets(cfg.worker_metrics_port)],
            },
            {
                "job_name": API_JOB,
                "scrape_interval": SERVICE_INTERVAL,
                # /metrics is open to loopback while the API binds it; a reader's token
                # costs nothing if it asks one.
                "authorization": {"type": "Bearer", "credentials_file": str(token)},
                "static_configs": [_targets(cfg.api_port)],
            },
            *(_inference_jobs(cfg) if cfg.k8s and cfg.inference else []),
        ],
    }


def _inference_jobs(cfg: SandboxConfig) -> list[dict[str, Any]]:
    return [
        {"job_name": GATEWAY_JOB, "static_configs": [_targets(cfg.inference_gateway_port)]},
        {
            "job_name": SERVER_JOB,
            "file_sd_configs": [{"files": [inference_sandbox.file_sd(cfg)]}],
        },
    ]


def alertmanager_config(cfg: SandboxConfig) -> dict[str, Any]:
    """The shipped routing, pointed at this sandbox's API (see the module's docstring)."""
    doc: dict[str, Any] = yaml.safe_load(_shipped(ROUTING).read_text())
    for route in doc["route"].get("routes", []):
        if route.get("receiver") == "autoclusters":
            route["group_wait"], route["group_interval"] = GROUP_WAIT, GROUP_INTERVAL
    for receiver in doc["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = cfg.api_url + urlsplit(hook["url"]).path
            auth = hook.setdefault("http_config", {}).setdefault("authorization", {})
            auth["credentials_file"] = str(cfg.state_dir / "api" / api_tokens.ALERTMANAGER)
    return doc


def prometheus_file(cfg: SandboxConfig) -> Path:
    return _dir(cfg) / "prometheus.yml"


def alertmanager_file(cfg: SandboxConfig) -> Path:
    return _dir(cfg) / "alertmanager.yml"


def prepare(cfg: SandboxConfig) -> None:
    """Write both configs (after the API's token exists); each keeps its data dir."""
    for sub in ("prometheus-data", "alertmanager-data"):
        (_dir(cfg) / sub).mkdir(parents=True, exist_ok=True)
    agent_targets.write(cfg, cfg.node_names())  # the sandbox's own; machines made later add theirs
    servers = Path(inference_sandbox.file_sd(cfg))
    if cfg.k8s and not servers.exists():  # the kubelet rewrites it as servers come and go
        servers.write_text("[]")
    header = "# Written by `autoclusters sandbox up` (sandbox/monitoring.py).\n"
    prometheus_file(cfg).write_text(
        header + yaml.safe_dump(prometheus_config(cfg), sort_keys=False)
    )
    alertmanager_file(cfg).write_text(
        header + f"# From {ROUTING}: the sandbox API's webhook and token; the autoclusters "
        f"route's group_wait {GROUP_WAIT} and group_interval {GROUP_INTERVAL}.\n"
        + yaml.safe_dump(alertmanager_config(cfg), sort_keys=False)
    )


def prometheus_argv(cfg: SandboxConfig) -> list[str]:
    return [
        executable("prometheus"),
        f"--config.file={prometheus_file(cfg)}",
        f"--storage.tsdb.path={_dir(cfg) / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{cfg.prometheus_port}",
        f"--web.external-url={cfg.prometheus_url}/",  # else links carry the host name
        "--storage.tsdb.retention.time=1d",
    ]


def alertmanager_argv(cfg: SandboxConfig) -> list[str]:
    return [
        executable("prometheus-alertmanager", "alertmanager"),
        f"--config.file={alertmanager_file(cfg)}",
        f"--storage.path={_dir(cfg) / 'alertmanager-data'}",
        f"--web.listen-address=127.0.0.1:{cfg.alertmanager_port}",
        f"--web.external-url={cfg.alertmanager_url}/",
        "--cluster.listen-address=",  # empty: no gossip (else *:9094 and a 3 s settle)
    ]


def ready(url: str) -> bool:
    """Prometheus and Alertmanager both answer /-/ready with 200 once they serve."""
    try:
        return httpx.get(f"{url}/-/ready", timeout=2, verify=default_verify()).status_code == 200
    except httpx.HTTPError:
        return False


def prometheus_alerts(cfg: SandboxConfig) -> list[dict[str, Any]]:
    """Prometheus's alerts (pending and firing): GET /api/v1/alerts."""
    doc = httpx.get(
        f"{cfg.prometheus_url}/api/v1/alerts", timeout=5, verify=default_verify()
    ).json()
    alerts: list[dict[str, Any]] = doc["data"]["alerts"]
    return alerts


def alertmanager_alerts(cfg: SandboxConfig) -> list[dict[str, Any]]:
    """The alerts Alertmanager holds: GET /api/v2/alerts."""
    alerts: list[dict[str, Any]] = httpx.get(
        f"{cfg.alertmanager_url}/api/v2/alerts", timeout=5, verify=default_verify()
    ).json()
    return alerts
