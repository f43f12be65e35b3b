"""POST /v1/health-snapshots over real HTTP against a Temporal dev server (test_api.py's set-up):

- with an incident open on the node, the snapshot becomes its `health_evidence` update;
  a resend is answered without a second update;
- without one: 202, nothing started; forwarded only to the cluster's provisioning or
  scaling whose health gate waits for that node's agent;
- unknown node: 404 naming it; malformed: 422 naming the field; no token: 401.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from autoclusters.clients.web.settings import ApiSettings
from autoclusters.core.cluster import provisioning_workflow_id
from autoclusters.core.models import HealthCheck, workflow_id
from autoclusters.core.node_report import SNAPSHOTS_PATH, HealthSnapshot, NodeReport
from autoclusters.workflows.agent_gate import AgentGate
from tests.api.test_api import (  # noqa: F401  (fixtures)
    AGENT_AUTH,
    dev_server_env,
    http,
    pytestmark,
    settings,
    started,
    task_queue,
)


def _snapshot(node: str) -> HealthSnapshot:
    return HealthSnapshot.build(
        node=node, observed_at=datetime.now(UTC), boot_id="b1", gpu_count=8, backend="fake"
    )


async def _updates(client: Client, s: ApiSettings, node: str) -> list[str]:
    history = await client.get_workflow_handle(workflow_id(s.cluster, node)).fetch_history()
    accepted = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    return [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        for e in history.events
        if e.event_type == accepted
    ]


async def test_a_snapshot_goes_to_the_open_incident_only(
    env: WorkflowEnvironment,  # noqa: F811
    settings: ApiSettings,  # noqa: F811
    http: httpx.AsyncClient,  # noqa: F811
) -> None:
    at = datetime.now(UTC)
    rep = NodeReport.build(node="gpu-070", fault="XID_79", state="firing", observed_at=at, since=at)
    r = await http.post("/v1/reports", content=rep.model_dump_json(), headers=AGENT_AUTH)
    assert r.status_code == 202, r.text
    incident_id = r.json()["incidents"][0]["incident_id"]

    snap = _snapshot("gpu-070")
    r = await http.post(SNAPSHOTS_PATH, content=snap.model_dump_json(), headers=AGENT_AUTH)
    assert r.status_code == 202, r.text
    assert r.json()["forwarded"] and r.json()["incident_id"] == incident_id
    # A resend (or a snapshot that says nothing new) is accepted and not recorded again.
    r = await http.post(SNAPSHOTS_PATH, content=snap.model_dump_json(), headers=AGENT_AUTH)
    assert r.status_code == 202, r.text
    assert not r.json()["forwarded"] and r.json()["detail"] == "nothing new"
    assert await _updates(env.client, settings, "gpu-070") == ["report_fault", "health_evidence"]

    r = await http.post(
        SNAPSHOTS_PATH, content=_snapshot("gpu-071").model_dump_json(), headers=AGENT_AUTH
    )
    assert r.status_code == 202, r.text
    assert r.json() | {"detail": ""} == {
        "node": "gpu-071", "forwarded": False, "incident_id": None, "detail": "",
        "workflow_id": workflow_id(settings.cluster, "gpu-071"),
    }  # fmt: skip
    assert not await started(env.client, settings, "gpu-071")


async def test_unknown_malformed_and_unauthorized_snapshots_are_refused(
    env: WorkflowEnvironment,  # noqa: F811
    settings: ApiSettings,  # noqa: F811
    http: httpx.AsyncClient,  # noqa: F811
) -> None:
    r = await http.post(
        SNAPSHOTS_PATH, content=_snapshot("gpu-404").model_dump_json(), headers=AGENT_AUTH
    )
    assert r.status_code == 404 and r.json()["nodes"] == ["gpu-404"]

    bad = _snapshot("gpu-072").model_dump(mode="json") | {"gpu_count": -1}
    r = await http.post(SNAPSHOTS_PATH, json=bad, headers=AGENT_AUTH)
    assert r.status_code == 422 and r.json()["fields"] == ["gpu_count"]
    missing = {k: v for k, v in bad.items() if k != "observed_at"} | {"gpu_count": 8}
    r = await http.post(SNAPSHOTS_PATH, json=missing, headers=AGENT_AUTH)
    assert r.status_code == 422 and r.json()["fields"] == ["observed_at"]

    r = await http.post(SNAPSHOTS_PATH, content=_snapshot("gpu-072").model_dump_json())
    assert r.status_code == 401
    assert not await started(env.client, settings, "gpu-072")


@workflow.defn(name="GateStandIn")
class GateStandIn(AgentGate):
    """The agent half of a provisioning's gate, alone: waits for one node's agent."""

    @workflow.init
    def __init__(self, node: str) -> None:
        self._init_agent_gate()

    @workflow.run
    async def run(self, node: str) -> list[HealthCheck]:
        return await self._agent_gate(node, workflow.now() - timedelta(minutes=1), 8, 60)


async def test_without_an_open_incident_a_snapshot_goes_to_the_clusters_waiting_gate(
    env: WorkflowEnvironment,  # noqa: F811
    settings: ApiSettings,  # noqa: F811
    http: httpx.AsyncClient,  # noqa: F811
) -> None:
    tq = f"gate-{uuid.uuid4()}"
    # Unsandboxed: this module (HTTP clients and all) is not a workflow module.
    runner = UnsandboxedWorkflowRunner()
    async with Worker(env.client, task_queue=tq, workflows=[GateStandIn], workflow_runner=runner):
        gate = await env.client.start_workflow(
            GateStandIn.run, "gpu-073", id=provisioning_workflow_id(settings.cluster), task_queue=tq
        )
        # Another node's snapshot is nobody's: the gate waits for gpu-073's agent only.
        r = await http.post(
            SNAPSHOTS_PATH, content=_snapshot("gpu-074").model_dump_json(), headers=AGENT_AUTH
        )
        assert r.status_code == 202 and not r.json()["forwarded"], r.text
        r = await http.post(
            SNAPSHOTS_PATH, content=_snapshot("gpu-073").model_dump_json(), headers=AGENT_AUTH
        )
        assert r.status_code == 202, r.text
        assert r.json()["forwarded"] and r.json()["workflow_id"] == gate.id
        checks = await gate.result()
    assert checks and all(c.passed for c in checks), checks
    assert not await started(env.client, settings, "gpu-073")
