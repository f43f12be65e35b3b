"""The real alert path in a sandbox: an Xid 79 on a node whose agent does not report to the
API reaches it only as dcgm-exporter's series → Prometheus (the shipped gpu-alerts.yml) →
Alertmanager (the shipped routing) → the API's webhook, which opens the incident.

Its own sandbox (2 nodes, no accounting, direct agent reports off), on free loopback ports,
stopped by PID at the end.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from temporalio.service import RPCError

from autoclusters.core.models import IncidentState, workflow_id
from autoclusters.core.settings import load_file
from autoclusters.integrations import temporal
from autoclusters.sandbox import cluster, monitoring
from autoclusters.sandbox.machines import agent_targets
from autoclusters.sandbox.machines.hardware import Hardware, HardwareFault
from autoclusters.sandbox.machines.vms import VmRegistry
from autoclusters.sandbox.runtime import api_tokens
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workflows.remediation import NodeRemediation
from tests.conftest import free_port_base
from tests.helpers import down_leaving_nothing, eventually

pytestmark = pytest.mark.integration

NODE = "gpu-01"


@pytest.fixture
def alert_sandbox(tmp_path: Path) -> Iterator[SandboxConfig]:
    cfg = SandboxConfig(
        state_dir=tmp_path / "alerts", cluster="alerts", nodes=2, port_base=free_port_base(),
        boot_delay_s=1, accounting=False, agent_reports=False, breaker_threshold=100,
    )  # fmt: skip
    try:
        cluster.up(cfg)
        yield cfg
    finally:
        down_leaving_nothing(cfg)


def test_rendered_configs_are_valid_and_keep_the_shipped_files(tmp_path: Path) -> None:
    """promtool and amtool accept what the sandbox writes; the rules are the shipped file,
    the routing the shipped one but for the webhook, its token and the route's waits."""
    cfg = SandboxConfig(state_dir=tmp_path, nodes=2, port_base=30000)
    api_tokens.make(cfg)
    monitoring.prepare(cfg)
    for argv in (
        [
            monitoring.executable("promtool"),
            "check",
            "config",
            str(monitoring.prometheus_file(cfg)),
        ],
        [monitoring.executable("amtool"), "check-config", str(monitoring.alertmanager_file(cfg))],
    ):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
    prom = yaml.safe_load(monitoring.prometheus_file(cfg).read_text())
    assert prom["rule_files"] == [str(monitoring.RULES)]
    [agents_sd] = prom["scrape_configs"][0]["file_sd_configs"]
    agents = json.loads(Path(agents_sd["files"][0]).read_text())
    assert [(t["labels"]["node"], t["targets"]) for t in agents] == [
        ("gpu-01", ["127.0.0.1:30100"]), ("gpu-02", ["127.0.0.1:30101"])
    ]  # fmt: skip
    # A machine made later (a scale up) is scraped once its agent starts, and no longer once
    # it is deleted.
    agent_targets.add(cfg, "gpu-05")
    assert agent_targets.nodes(cfg) == ["gpu-01", "gpu-02", "gpu-05"]
    assert json.loads(Path(agents_sd["files"][0]).read_text())[-1] == {
        "targets": ["127.0.0.1:30104"], "labels": {"node": "gpu-05"}
    }  # fmt: skip
    agent_targets.remove(cfg, "gpu-01")
    assert agent_targets.nodes(cfg) == ["gpu-02", "gpu-05"]
    shipped = yaml.safe_load(monitoring.ROUTING.read_text())
    rendered = yaml.safe_load(monitoring.alertmanager_file(cfg).read_text())
    hook = rendered["receivers"][1]["webhook_configs"][0]
    assert hook["url"] == f"{cfg.api_url}/v1/alerts/alertmanager"
    # Alertmanager shows its own token (role alertmanager), Prometheus a reader's: not the
    # agents', which opens only the agents' routes.
    assert hook["http_config"]["authorization"]["credentials_file"] == str(
        tmp_path / "api" / api_tokens.ALERTMANAGER
    )
    [api_job] = [j for j in prom["scrape_configs"] if j["job_name"] == monitoring.API_JOB]
    assert api_job["authorization"]["credentials_file"] == str(tmp_path / "api" / api_tokens.READER)
    route, shipped_route = rendered["route"]["routes"][0], shipped["route"]["routes"][0]
    assert (route["group_wait"], route["group_interval"]) == ("1s", "5s")
    unchanged = ("matchers", "group_by", "repeat_interval", "continue", "receiver")
    assert {k: route[k] for k in unchanged} == {k: shipped_route[k] for k in unchanged}


@pytest.mark.parametrize("report", [True, False])
def test_agent_without_direct_reports_still_sends_snapshots(tmp_path: Path, report: bool) -> None:
    """report_faults off: the agent's reports are logged, never sent; its health snapshots
    (the health gate's evidence) still go to the API."""
    from autoclusters.clients.agent import fake_backend
    from autoclusters.clients.agent.reporter import HttpSender, PrintSink, Reporter
    from autoclusters.clients.agent.settings import AgentSettings
    from autoclusters.clients.cli import agent as agent_cli

    fake = tmp_path / "gpu-01.json"
    fake_backend.write_node(fake, fake_backend.healthy_node())
    settings = AgentSettings(api_url="http://127.0.0.1:9", report_faults=report)
    agent = agent_cli._build(
        "gpu-01", settings, "fake", fake, None, print_=False, spool_dir=tmp_path / "spool"
    )
    try:
        assert isinstance(agent.sink, Reporter if report else PrintSink)
        assert isinstance(agent.snapshots, HttpSender)
    finally:
        assert agent.backend is not None
        agent.backend.close()


async def test_xid_79_opens_the_incident_through_prometheus_and_alertmanager(
    alert_sandbox: SandboxConfig,
) -> None:
    cfg = alert_sandbox
    prom, am = cfg.prometheus_url, cfg.alertmanager_url

    async def get(url: str, **params: str) -> Any:
        async with httpx.AsyncClient(timeout=5) as http:
            r = await http.get(url, params=params)
            r.raise_for_status()
            return r.json()

    async def targets_up() -> set[str] | None:
        doc = await get(f"{prom}/api/v1/targets")
        up = {
            t["labels"].get("node") or t["labels"]["job"]
            for t in doc["data"]["activeTargets"]
            if t["health"] == "up"
        }
        want = {"gpu-01", "gpu-02", monitoring.WORKER_JOB, monitoring.API_JOB}
        return up if want <= up else None

    await eventually(targets_up, 60, "Prometheus scraping both agents, the worker and the API")

    vm = VmRegistry(cfg.state_dir).get(NODE)
    assert vm is not None
    Hardware(cfg.state_dir).inject(NODE, vm.vm_id, HardwareFault(fault="XID_79"))

    async def prometheus_firing() -> dict[str, Any] | None:
        doc = await get(f"{prom}/api/v1/alerts")
        return next(
            (
                a
                for a in doc["data"]["alerts"]
                if a["labels"]["alertname"] == "GpuXidError"
                and a["labels"].get("node") == NODE
                and a["state"] == "firing"
            ),
            None,
        )

    fired = await eventually(prometheus_firing, 60, "GpuXidError firing in Prometheus")
    assert fired["labels"]["xid"] == "79"
    assert fired["labels"]["fault"] == "XID_79"
    assert fired["labels"]["Hostname"] == NODE

    async def in_alertmanager() -> dict[str, Any] | None:
        alerts = await get(f"{am}/api/v2/alerts")
        return next(
            (
                a
                for a in alerts
                if a["labels"]["alertname"] == "GpuXidError" and a["labels"].get("node") == NODE
            ),
            None,
        )

    held = await eventually(in_alertmanager, 30, "the alert in Alertmanager")
    assert held["status"]["state"] == "active"
    assert [r["name"] for r in held["receivers"]] == ["autoclusters"]

    client = await temporal.connect(load_file(cfg.settings_file))
    handle = client.get_workflow_handle_for(NodeRemediation.run, workflow_id(cfg.cluster, NODE))

    async def incident() -> IncidentState | None:
        try:
            return await handle.query(NodeRemediation.status)
        except RPCError:
            return None

    state = await eventually(incident, 60, "the incident opened by the webhook")
    assert state.request.opened_by == "alertmanager"
    assert state.request.fault == "XID_79"
    [seen] = state.faults
    assert seen.source == "alertmanager"
    assert seen.evidence[0].labels["alertname"] == "GpuXidError"
    assert seen.evidence[0].labels["node"] == NODE

    # The agent saw the Xid but sent no report: the API counted none from it.
    async with httpx.AsyncClient(timeout=5) as http:
        text = (await http.get(f"{cfg.api_url}/metrics")).text
    received = {
        (s.labels["source"], s.labels["status"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "autoclusters_api_alerts_received"
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert received.get(("alertmanager", "firing"), 0) >= 1
    assert received.get(("agent", "firing"), 0) == 0

    # And Prometheus scraped the API counting it.
    async def api_series_scraped() -> list[Any] | None:
        q = 'autoclusters_api_alerts_received_total{source="alertmanager",status="firing"}'
        doc = await get(f"{prom}/api/v1/query", query=q)
        return [r for r in doc["data"]["result"] if float(r["value"][1]) >= 1] or None

    await eventually(api_series_scraped, 30, "the API's counter in Prometheus")
