"""`autoclusters incident show <systemic id>` through the Typer app, and what the console
reads of systemic incidents (clients/systemic_incidents.py), against a real Temporal dev
server (in this process, on its own thread and event loop) running the real
SystemicIncident workflow (docs/systemic.md). No activity worker: the systemic incident
stays at its first step, and its members join with the real `join` update, as the
members' incidents do.

Aspects covered:
- show finds a systemic incident by its id (its workflow id, no visibility wait) and
  prints its domain, status, the hand-off's state, each member (node, incident, drained)
  and its steps; --json parses as the systemic incident's own `status`;
- an older systemic incident, no longer at its workflow id, is found through visibility;
- an id shaped like one that no workflow holds: exit 1, "no incident";
- the console's reads: the open systemic incidents of the cluster (not another cluster's),
  and one by id; a systemic id read as a node's incident (the console's incident page,
  the API's /v1/incidents/<id>) is SystemicIncidentFound, naming it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from typer.testing import CliRunner

from autoclusters.clients import systemic_incidents
from autoclusters.clients.cli.app import app
from autoclusters.clients.console.sources import LiveSource
from autoclusters.clients.incidents import SystemicIncidentFound
from autoclusters.clients.systemic_incidents import SystemicRead
from autoclusters.core.guard import GuardContext
from autoclusters.core.settings import Settings
from autoclusters.core.systemic import (
    MemberJoin,
    SystemicRequest,
    SystemicState,
    systemic_incident_id,
    systemic_workflow_id,
)
from autoclusters.integrations import temporal
from autoclusters.workflows.systemic_incident import SystemicIncident
from tests.dev_server_thread import ServedQueue, cli_cluster, served_workflows
from tests.fakes.listed_incidents import AT, join_member
from tests.fakes.systems import FakeSlurm

pytestmark = pytest.mark.integration  # a Temporal dev server

Server = ServedQueue


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """A dev server and a worker running SystemicIncident, on a thread of their own: the
    CLI under test runs its own `asyncio.run`, which cannot nest in a running loop."""
    with served_workflows("systemic-cli", [SystemicIncident]) as srv:
        yield srv


async def _open_systemic(
    srv: Server, cluster: str, domain: str, *, wf_id: str | None = None
) -> tuple[str, str]:
    """A systemic incident of `domain` with two members joined (gpu-01 drained), one known
    to the guard only; its incident id and workflow id."""
    incident_id = systemic_incident_id(domain, AT)
    wf_id = wf_id or systemic_workflow_id(cluster, "leaf", domain)
    req = SystemicRequest(
        incident_id=incident_id, cluster=cluster, level="leaf", domain=domain, opened_at=AT,
        nodes=["gpu-01", "gpu-02", "gpu-03"], guard=GuardContext(cluster=cluster),
    )  # fmt: skip
    handle = await srv.client.start_workflow(
        SystemicIncident.run,
        req,
        id=wf_id,
        task_queue=srv.queue,
        execution_timeout=timedelta(minutes=10),
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(temporal.INCIDENT_ID, incident_id),
                SearchAttributePair(temporal.CLUSTER, cluster),
                SearchAttributePair(temporal.NODE, domain),
            ]
        ),
    )
    for node, drained in (("gpu-01", True), ("gpu-02", False)):
        join = MemberJoin(node=node, incident_id=f"inc-20261205-180000-{node}",
                          workflow_id=f"remediation-{cluster}-{node}", fault="IB_LINK_DOWN",
                          drained=drained)  # fmt: skip
        await join_member(handle, join)
    return incident_id, wf_id


def _status(srv: Server, wf_id: str) -> SystemicState:
    handle = srv.client.get_workflow_handle(wf_id)
    state: SystemicState = srv.call(handle.query(SystemicIncident.status))
    return state


@pytest.fixture
def cluster(server: Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh cluster name, the CLI's settings pointed at it and at the server. What a
    test starts ends with the module's server (and within its execution timeout)."""
    return cli_cluster(server, monkeypatch)


def show(*args: str) -> Any:
    return CliRunner().invoke(app, ["incident", "show", *args])


def test_show_prints_the_domain_members_hand_off_and_steps(server: Server, cluster: str) -> None:
    incident_id, wf_id = server.call(_open_systemic(server, cluster, "leaf-01"))
    got = show(incident_id)
    assert got.exit_code == 0, got.output
    out = got.output
    assert incident_id in out and "systemic: leaf leaf-01" in out and "status open" in out
    assert "hand-off: not handed off yet" in out

    def row(node: str) -> list[str]:  # a member's table row, cell by cell
        line = next(x for x in out.splitlines() if f" {node} " in x)
        return [cell.strip() for cell in line.strip("│┃|").split("│") if cell.strip()]

    assert row("gpu-01")[:3] == ["gpu-01", "inc-20261205-180000-gpu-01", "yes"]
    assert row("gpu-02")[:3] == ["gpu-02", "inc-20261205-180000-gpu-02", "no"]
    assert row("gpu-03")[:3] == ["gpu-03", "(not joined)", "no"]
    state = _status(server, wf_id)
    assert state.steps, "the systemic incident has a first step"
    for step in state.steps:  # every step of its own timeline
        assert f" {step.name} " in out, step.name

    as_json = show(incident_id, "--json")
    assert as_json.exit_code == 0, as_json.output
    read = SystemicRead.model_validate(json.loads(as_json.output))
    assert read.workflow_id == wf_id and read.temporal_status == "running"
    assert [(m.node, m.drained) for m in read.state.members] == [
        ("gpu-01", True), ("gpu-02", False), ("gpu-03", False),
    ]  # fmt: skip


def test_an_older_systemic_incident_is_found_through_visibility(
    server: Server, cluster: str
) -> None:
    incident_id, _ = server.call(
        _open_systemic(server, cluster, "leaf-02", wf_id=f"systemic-older-{uuid.uuid4().hex}")
    )
    deadline = time.monotonic() + 30
    while (got := show(incident_id)).exit_code != 0 and time.monotonic() < deadline:
        time.sleep(0.5)  # visibility catches up within a second or two
    assert got.exit_code == 0, got.output
    assert "systemic: leaf leaf-02" in got.output


def test_an_id_no_workflow_holds_is_no_incident(server: Server, cluster: str) -> None:
    got = show("inc-20261205-180005-leaf-09")
    assert got.exit_code == 1
    assert "no incident inc-20261205-180005-leaf-09" in got.output


def test_the_consoles_reads_of_systemic_incidents(server: Server, cluster: str) -> None:
    incident_id, wf_id = server.call(_open_systemic(server, cluster, "leaf-03"))
    other = f"c{uuid.uuid4().hex[:8]}"
    server.call(_open_systemic(server, other, "leaf-03"))  # another cluster's: not listed
    settings = Settings(cluster=cluster)

    async def client() -> Client:
        return server.client

    source = LiveSource(settings, client, FakeSlurm(), timeout_s=10)
    deadline = time.monotonic() + 30
    while not (found := server.call(source.systemic_incidents())) and time.monotonic() < deadline:
        time.sleep(0.5)  # visibility catches up within a second or two
    assert [s.request.incident_id for s in found] == [incident_id]
    read = server.call(source.systemic(incident_id))
    assert read.workflow_id == wf_id and read.state.request.domain == "leaf-03"
    with pytest.raises(SystemicIncidentFound) as e:  # as the API's /v1/incidents/<id> reads
        server.call(source.incident(incident_id))
    assert f"{incident_id} is a systemic incident" in str(e.value)
    assert systemic_incidents.handoff_text(None, None) == "not handed off yet"
