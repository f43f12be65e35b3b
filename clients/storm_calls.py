"""The API's calls in an alert storm (clients/api/intake.py, clients/api/storm.py), where
no request waits for a worker: start a node's incident with its first alerts in the start
request (Temporal's server alone), and send a node's alerts of several fault kinds in one
`report_faults` update, with a start when its incident may have closed or to the run
they joined when it is known."""

from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from autoclusters.clients.incident_opening import opening
from autoclusters.clients.incidents import OpenedIncident
from autoclusters.clients.inventory import NodeInventory
from autoclusters.core.fault_evidence import FaultEvidence
from autoclusters.core.models import FaultReport, workflow_id
from autoclusters.core.policy import Policy
from autoclusters.core.settings import Settings
from autoclusters.workflows.remediation import NodeRemediation


class StartedIncident(BaseModel):
    run_id: str  # the node's incident run: the one this start began, or the one running
    opened: OpenedIncident | None = None  # this start opened it; None: nothing was sent


async def start_incident(
    client: Client,
    settings: Settings,
    node: str,
    fault: str,
    opened_by: str,
    policy: Policy | None = None,
    *,
    inventory: NodeInventory | None = None,
    key: str = "",
    evidence: FaultEvidence | None = None,
    at: datetime | None = None,
    alerts: int = 1,
) -> StartedIncident:
    """Start the node's incident with the report in its request, as `open_incident` would
    open it, but without waiting for a worker: Temporal's server has it when this returns
    (the API's storm path, clients/api/intake.py). When the node's incident runs already,
    nothing is sent to it (`opened` is None) and the answer names the run: the report must
    go as `open_incident` sends it (only the incident's update can say it is still open)."""
    o = await opening(
        client, settings, node, fault, opened_by, policy, inventory, key, evidence, at, alerts
    )
    req = o.req.model_copy(update={"opening": o.report})
    # FAIL, not the opening's USE_EXISTING: the conflict is how this start learns the node's
    # incident runs already (and which run), through the SDK's public error.
    start = {**o.start, "id_conflict_policy": WorkflowIDConflictPolicy.FAIL}
    try:
        handle = await client.start_workflow(NodeRemediation.run, req, **start)
    except WorkflowAlreadyStartedError as running:
        return StartedIncident(run_id=running.run_id or "")
    run_id = handle.result_run_id or handle.run_id or ""
    opened = OpenedIncident(
        incident_id=o.req.incident_id,
        workflow_id=o.start["id"],
        run_id=run_id,
        joined=False,
        opened=True,
    )
    return StartedIncident(run_id=run_id, opened=opened)


async def report_all(
    client: Client,
    settings: Settings,
    node: str,
    reports: list[FaultReport],
    policy: Policy | None = None,
    *,
    inventory: NodeInventory | None = None,
) -> OpenedIncident:
    """Several fault kinds' reports to the node's incident in one update (`report_faults`),
    opening it with the first when none is open, as `open_incident` does. `reports` are
    drafts: their incident id and token are filled in here. The answer is the first's."""
    first = reports[0]
    o = await opening(
        client, settings, node, first.fault, first.source, policy, inventory,
        first.key, first.evidence, first.at, first.alerts,
    )  # fmt: skip
    same = {"incident_id": o.req.incident_id, "open_token": o.report.open_token}
    sent = [o.report, *(r.model_copy(update=same) for r in reports[1:])]
    start = WithStartWorkflowOperation(NodeRemediation.run, o.req, **o.start)
    acks = await client.execute_update_with_start_workflow(
        NodeRemediation.report_faults, sent, start_workflow_operation=start
    )
    handle = await start.workflow_handle()
    return OpenedIncident(
        incident_id=acks[0].incident_id,
        workflow_id=o.start["id"],
        run_id=handle.result_run_id or handle.run_id or "",
        joined=acks[0].joined,
        opened=acks[0].opened,
        repeat=all(a.repeat for a in acks),
    )


async def report_to_run(
    client: Client,
    settings: Settings,
    node: str,
    incident_id: str,
    run_id: str,
    reports: list[FaultReport],
) -> OpenedIncident:
    """`reports` (drafts, as for `report_all`) to the node's incident known to be run
    `run_id`, in one update and nothing else: no start request to build and send. A run
    that ended raises (RPCError NOT_FOUND) and one that is closing refuses (its update's
    check): the caller then sends them with `report_all`, to the node's next incident."""
    wf_id = workflow_id(settings.cluster, node)
    # A token no request carries: these join, whatever they say (never `opened`).
    same = {"incident_id": incident_id, "open_token": uuid.uuid4().hex}
    handle = client.get_workflow_handle(wf_id, run_id=run_id)
    acks = await handle.execute_update(
        NodeRemediation.report_faults, [r.model_copy(update=same) for r in reports]
    )
    return OpenedIncident(
        incident_id=acks[0].incident_id,
        workflow_id=wf_id,
        run_id=run_id,
        joined=True,
        repeat=all(a.repeat for a in acks),
    )
