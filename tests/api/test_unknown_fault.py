"""A well-formed fault kind that nobody knows is refused, never guessed: the default rule
would otherwise replace a machine for a typo. The refusal is one line that points at
`autoclusters faults` (the catalogue), not the catalogue itself."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.service import RPCError
from typer.testing import CliRunner

from autoclusters.clients.agent.classify import EXTRA_KINDS, POLICY_KINDS
from autoclusters.clients.api.app import create_app
from autoclusters.clients.cli import app as cli
from autoclusters.clients.cli import connect
from autoclusters.clients.inventory import StaticInventory
from autoclusters.clients.web.settings import DEFAULT_ALERT_FAULTS
from autoclusters.core.faults import NAMED_FAULTS, UnknownFaultError, check_known_fault
from autoclusters.core.models import workflow_id
from autoclusters.core.node_report import NodeReport
from autoclusters.core.policy import default_policy
from autoclusters.sandbox.runtime.config import SandboxConfig
from tests.helpers import HermeticSettings

CLI = [sys.executable, "-m", "autoclusters.clients.cli"]
HINT = "see 'autoclusters faults' for the kinds known"
STARTS = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)
runner = CliRunner()


@pytest.mark.parametrize("fault", ["XID_79", "XID_1", "GPU_FELL_OFF_BUS", "IB_LINK_DOWN", "MANUAL"])
def test_known_kinds_pass(fault: str) -> None:
    check_known_fault(fault)


@pytest.mark.parametrize(
    "fault", ["NOT_A_REAL_FAULT", "XID_1234", "GPU_FELL_OF_BUS", "XID_9999x", "A\nB\u2028C"]
)
def test_unknown_kinds_are_refused_in_one_line_pointing_at_the_catalogue(fault: str) -> None:
    with pytest.raises(UnknownFaultError) as e:
        check_known_fault(fault)
    assert str(e.value) == f"unknown fault kind {fault!r}: {HINT}"
    assert len(str(e.value).splitlines()) == 1
    assert "GPU_FELL_OFF_BUS" not in str(e.value)  # the catalogue is not recited


@pytest.fixture
def no_temporal(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_fn: Any, **_: Any) -> Any:
        raise AssertionError("an unknown fault must be refused before Temporal is asked")

    monkeypatch.setattr(connect, "run_client", refuse)


@pytest.mark.usefixtures("no_temporal")
def test_incident_open_refuses_an_unknown_kind_in_one_line_before_temporal() -> None:
    r = runner.invoke(
        cli.app, ["incident", "open", "--node", "gpu-01", "--fault", "NOT_A_REAL_FAULT"]
    )
    assert r.exit_code == 2, r.output
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == [f"refused: unknown fault kind 'NOT_A_REAL_FAULT': {HINT}"], r.stderr


def test_inject_refuses_an_unknown_kind_in_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "gpu-01.json"
    r = runner.invoke(
        cli.app, ["inject", "--node", "gpu-01", "--fault", "XID_9999x", "--fake-file", str(fake)]
    )
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines() == [f"unknown fault kind 'XID_9999x': {HINT}"]
    assert not fake.exists()


def test_the_faults_command_lists_the_catalogue_with_each_rule() -> None:
    r = runner.invoke(cli.app, ["faults", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["fault"]: row for row in json.loads(r.stdout)}
    policy = default_policy()
    assert NAMED_FAULTS <= rows.keys() and "XID_<n>" in rows
    assert set(policy.faults) <= rows.keys()
    for kind, rule in policy.faults.items():
        assert (rows[kind]["severity"], rows[kind]["first_rung"]) == (
            rule.severity,
            rule.first_rung.value,
        )
    d = policy.default_rule
    assert rows["XID_<n>"] == {
        "fault": "XID_<n>", "severity": d.severity, "first_rung": d.first_rung.value,
        "rule": "default",
    }  # fmt: skip
    table = runner.invoke(cli.app, ["faults"])
    assert table.exit_code == 0 and "GPU_FELL_OFF_BUS" in table.stdout


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (
            "/v1/alerts/alertmanager",
            {
                "version": "4", "status": "firing", "receiver": "autoclusters",
                "groupKey": "{}:{}", "groupLabels": {}, "commonLabels": {},
                "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
                "alerts": [
                    {
                        "status": "firing",
                        "labels": {"alertname": "Whatever", "Hostname": "gpu-01",
                                   "fault": "NOT_A_REAL_FAULT"},
                        "annotations": {}, "startsAt": "2026-05-01T10:00:00Z",
                        "endsAt": "0001-01-01T00:00:00Z", "fingerprint": "00000000000000f1",
                    }
                ],
            },
            "alerts[0]",
        ),
        (
            "/v1/reports",
            json.loads(
                NodeReport.build(
                    node="gpu-01", fault="NOT_A_REAL_FAULT", state="firing",
                    observed_at=STARTS, since=STARTS,
                ).model_dump_json()
            ),
            "fault",
        ),
    ],
)  # fmt: skip
async def test_the_api_422_names_the_field_in_one_line(
    path: str, body: dict[str, Any], field: str
) -> None:
    async def no_client() -> Client:
        raise AssertionError("an unknown fault must be refused before Temporal is asked")

    settings = HermeticSettings(
        api_tokens={"alertmanager": "t0ken-0123456789ab", "agent": "t0ken-agent-0123456"},
        api_inventory="static",
        cluster="c",
    )
    token = "t0ken-agent-0123456" if path == "/v1/reports" else "t0ken-0123456789ab"
    app = create_app(settings, no_client, StaticInventory(["gpu-01"]))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as http:
        r = await http.post(path, json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 422, r.text
    answer = r.json()
    assert answer["error"] == "unknown fault kind"
    assert answer["faults"] == ["NOT_A_REAL_FAULT"] and answer["fields"] == [field]
    assert answer["detail"] == (
        f"unknown fault kind 'NOT_A_REAL_FAULT' ({field}): {HINT}; nothing was started"
    )


def test_a_kind_the_cluster_policy_names_is_known() -> None:
    check_known_fault("SITE_SPECIFIC_FAULT", ["SITE_SPECIFIC_FAULT"])


def test_everything_we_emit_is_in_the_catalogue() -> None:
    """The agent's kinds, the alert map's targets and the shipped policy's names: a fault
    AutoClusters itself produces is never refused."""
    emitted = set(POLICY_KINDS) | set(EXTRA_KINDS)
    emitted |= {f for f in DEFAULT_ALERT_FAULTS.values() if "{" not in f}
    emitted |= {f for f in default_policy().faults if not f.startswith("XID_")}
    assert emitted <= NAMED_FAULTS, emitted - NAMED_FAULTS


@pytest.mark.integration
async def test_the_cli_refuses_an_unknown_fault_and_starts_nothing(
    sandbox: SandboxConfig, sandbox_client: Client, cli_env: dict[str, str]
) -> None:
    node = sandbox.node_names()[-1]
    handle = sandbox_client.get_workflow_handle(workflow_id(sandbox.cluster, node))

    async def run_id() -> str | None:
        try:
            return (await handle.describe()).run_id
        except RPCError:
            return None

    before = await run_id()
    r = subprocess.run(
        [*CLI, "incident", "open", "--node", node, "--fault", "NOT_A_REAL_FAULT"],
        env=cli_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2, r
    assert f"unknown fault kind 'NOT_A_REAL_FAULT': {HINT}" in r.stderr
    assert await run_id() == before
